"""Decoding snapshot traces into replay arrays (core/sim/trace/)."""

from __future__ import annotations

import pickle

import pytest

from allocconf_widget._errors import SnapshotError
from allocconf_widget.core.memory.snapshot import load_snapshot
from allocconf_widget.core.sim.trace.codes import (
    OP_ALLOC,
    OP_ALLOC_FREED_NEXT,
    OP_EMPTY_CACHE,
    OP_FREE,
    OP_FREE_COMPLETED,
    OP_FREE_REQUESTED,
    OP_OOM,
    SEG_ALLOC,
    SEG_FREE,
)
from allocconf_widget.core.sim.trace.decode import decode_entries
from allocconf_widget.core.sim.trace.extract import extract_trace, guess_torch_version
from tests.trace_builder import TraceBuilder

MiB = 1 << 20


def test_fused_free_and_interned_addresses() -> None:
    # GIVEN two allocations on different streams, one freed the usual way
    b = TraceBuilder()
    x = b.alloc(1000, stream=0)
    y = b.alloc(3 * MiB, stream=7)
    b.free(x)
    # WHEN decoded
    t = b.build()
    # THEN the free pair is one FREE op and addresses are dense ids
    assert list(t.ops) == [OP_ALLOC, OP_ALLOC, OP_FREE]
    assert list(t.addr_ids) == [0, 1, 0]
    assert list(t.sizes[:2]) == [1000, 3 * MiB]
    assert t.lane_streams == (0, 7)
    assert list(t.lanes) == [0, 1, 0]
    assert list(t.op_index) == [0, 1, 2]
    assert t.num_events == 4 and t.num_addresses == 2
    assert not t.partial
    assert y


def test_pending_free_is_two_ops() -> None:
    # GIVEN a free whose completion lags (record_stream)
    b = TraceBuilder()
    x = b.alloc(4096)
    b.free_requested(x)
    b.alloc(4096)
    b.free_completed(x)
    t = b.build()
    assert list(t.ops) == [OP_ALLOC, OP_FREE_REQUESTED, OP_ALLOC, OP_FREE_COMPLETED]


def test_free_completed_without_requested_is_a_whole_free() -> None:
    # skip_actions=["free_requested"] (2.11+) leaves only the completions
    b = TraceBuilder()
    x = b.alloc(4096)
    b.free_completed(x)
    assert list(b.build().ops) == [OP_ALLOC, OP_FREE]


def test_partial_trace_detected() -> None:
    # GIVEN a ring buffer that lost the allocation of 0x1000
    entries = [
        {"action": "free_requested", "addr": 0x1000, "size": 10, "stream": 0},
        {"action": "free_completed", "addr": 0x1000, "size": 10, "stream": 0},
        {"action": "alloc", "addr": 0x2000, "size": 10, "stream": 0},
        {"action": "free_completed", "addr": 0x3000, "size": 10, "stream": 0},
    ]
    t = decode_entries(entries)
    assert t.partial
    assert t.unknown_frees == 2 and t.first_unknown_free == 0
    assert list(t.ops) == [OP_ALLOC]
    assert "PARTIAL" in t.describe()


def test_segment_events_kept_aside_and_empty_cache_inferred() -> None:
    b = TraceBuilder()
    b.segment("segment_alloc", 0x100000, 2 * MiB)
    x = b.alloc(1000)
    b.free(x)
    # a release burst followed by an alloc: nothing in malloc explains it -> empty_cache()
    b.segment("segment_free", 0x100000, 2 * MiB)
    b.alloc(1000)
    t = b.build()
    assert list(t.seg_kinds) == [SEG_ALLOC, SEG_FREE]
    assert list(t.seg_sizes) == [2 * MiB, 2 * MiB]
    assert list(t.seg_index) == [0, 4]
    assert OP_EMPTY_CACHE in list(t.ops)
    assert t.empty_cache_calls == 1
    assert t.recorded_reserved_peak() == 2 * MiB


def test_release_burst_before_new_segment_is_left_to_the_recorded_limit() -> None:
    # a release right before a new segment is malloc's OOM path only if the new segment did
    # not fit under the limit the run had; the decoder records what it needed (reserved + size)
    b = TraceBuilder()
    b.segment("segment_alloc", 0x100000, 20 * MiB)
    b.segment("segment_free", 0x100000, 20 * MiB)
    b.segment("segment_alloc", 0x200000, 40 * MiB)
    b.alloc(40 * MiB)
    t = b.build()
    assert list(t.ops) == [OP_EMPTY_CACHE, OP_ALLOC]
    assert t.sizes[0] == 60 * MiB
    assert t.ambiguous_releases == 1


def test_release_burst_before_an_oom_is_allocator_internal() -> None:
    b = TraceBuilder()
    b.segment("segment_alloc", 0x100000, 20 * MiB)
    b.segment("segment_free", 0x100000, 20 * MiB)
    b.oom(40 * MiB, device_free=10 * MiB)
    t = b.build()
    assert OP_EMPTY_CACHE not in list(t.ops)
    assert t.empty_cache_calls == 0


def test_oom_entry_and_inferred_capacity() -> None:
    b = TraceBuilder()
    b.segment("segment_alloc", 0x100000, 100 * MiB)
    b.alloc(100 * MiB)
    b.oom(60 * MiB, device_free=30 * MiB)
    t = b.build()
    assert list(t.ops) == [OP_ALLOC, OP_OOM]
    assert t.ooms[0].size == 60 * MiB and t.ooms[0].device_free == 30 * MiB
    assert t.inferred_usable_bytes() == 130 * MiB


def test_pool_ids_make_separate_lanes() -> None:
    b = TraceBuilder()
    b.alloc(1000, stream=0)
    b.alloc(1000, stream=0, pool_id=(1, 2))
    t = b.build()
    assert t.lane_pools == ((0, 0), (1, 2))
    assert list(t.lanes) == [0, 1]


def test_no_history_is_a_helpful_error() -> None:
    with pytest.raises(SnapshotError) as info:
        extract_trace({"segments": [], "device_traces": [[]]})
    text = str(info.value)
    assert "_record_memory_history(max_entries=1_000_000)" in text
    assert "_dump_snapshot" in text
    with pytest.raises(SnapshotError):
        extract_trace({"segments": []})


def test_extract_picks_busiest_device_and_rejects_empty_one() -> None:
    b = TraceBuilder()
    b.alloc(1000)
    snap = {"segments": [], "device_traces": [[], list(b.entries)]}
    assert extract_trace(snap).device == 1
    with pytest.raises(SnapshotError, match="device 0 has no trace"):
        extract_trace(snap, device=0)


def test_non_dict_entry_is_rejected() -> None:
    with pytest.raises(SnapshotError, match="not a dict"):
        decode_entries([["alloc", 1, 2]])


def test_arrays_pickle_compactly() -> None:
    b = TraceBuilder()
    for _ in range(1000):
        b.free(b.alloc(4096))
    t = b.build()
    data = pickle.dumps(t)
    # five int64 columns and one byte column per row, pickled as raw buffers
    assert len(data) < 45 * t.num_ops + 2000
    assert list(pickle.loads(data).ops) == list(t.ops)


def test_round_trip_through_snapshot_loader() -> None:
    b = TraceBuilder()
    b.free(b.alloc(4096))
    raw = pickle.dumps(b.snapshot({"max_split_size": -1}))
    t = extract_trace(load_snapshot(raw))
    assert t.num_events == 3


def test_guess_torch_version_from_keys() -> None:
    assert guess_torch_version({"segments": []})[0] == (2, 0)
    assert guess_torch_version({"allocator_settings": {}})[0] == (2, 3)
    snap = {"allocator_settings": {}, "device_traces": [[{"action": "alloc", "user_metadata": ""}]]}
    assert guess_torch_version(snap)[0] == (2, 11)
    assert guess_torch_version({"allocator_settings": {"max_round_threshold": 1}})[0] == (2, 13)


def test_replay_columns_are_cached_and_not_pickled() -> None:
    b = TraceBuilder()
    for _ in range(50):
        b.free(b.alloc(3 * MiB))
    t = b.build()
    cols = t.replay_columns()
    assert t.replay_columns() is cols
    # every allocation here is freed by the next row: a temporary (tests/unit/test_temporaries.py)
    assert cols[0] == [OP_ALLOC_FREED_NEXT if op == OP_ALLOC else op for op in t.ops]
    assert cols[2] == list(t.sizes)
    assert len({id(v) for v in cols[2] if v == 3 * MiB}) == 1  # equal sizes share one object
    clone = pickle.loads(pickle.dumps(t))
    assert "_columns" not in clone.__dict__
    assert clone.replay_columns() == cols
