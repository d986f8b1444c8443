"""Replay engine, event by event: rounding, pools, best fit, splitting, merging, streams.

Expected values follow the model in docs/internals/allocator_facts.md §6.
Helpers here are reused by the other test_simulator_*.py modules.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from allocconf_widget.core.sim.engine import Engine
from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.simulator import SimResult, simulate, simulate_many
from allocconf_widget.core.sim.trace.codes import SEG_NAMES
from tests.trace_builder import TraceBuilder

MiB = 1 << 20
KiB = 1 << 10


# ------------------------------------------------------------------ helpers
def settings(**kw: Any) -> SimSettings:
    kw.setdefault("torch_version", (2, 12))
    return SimSettings(**kw)


def run(b: TraceBuilder, s: SimSettings | None = None, **kw: Any) -> SimResult:
    """Replay a builder's trace, keeping the simulated segment events."""
    return simulate(b.build(), s or settings(), record_segments=True, **kw)


def segs(result: SimResult) -> list[tuple[str, int]]:
    """Segment events as (action name, size in bytes)."""
    return [(SEG_NAMES[kind], size) for _, kind, _, size in result.segment_events]


def engine(b: TraceBuilder, s: SimSettings | None = None, **kw: Any) -> Engine:
    """An engine that has replayed the whole trace, for looking at its cache."""
    eng = Engine(b.build(), s or settings(), record_segments=True, **kw)
    eng.run()
    return eng


def cached(eng: Engine) -> list[int]:
    """Sizes of all cached (free, mapped) blocks, ascending."""
    sizes = [blk.size for fl in eng.small_lists + eng.large_lists for blk in fl.blocks.values()]
    return sorted(sizes)


# ------------------------------------------------------- §6.16 worked examples
def test_700_kib_request_uses_a_small_2_mib_segment_and_splits() -> None:
    b = TraceBuilder()
    b.alloc(700 * KiB)
    eng = engine(b)
    assert eng.reserved == 2 * MiB
    assert cached(eng) == [1_380_352]
    assert eng.allocated == 716_800


def test_3_mib_request_carves_a_20_mib_segment() -> None:
    b = TraceBuilder()
    b.alloc(3 * MiB)
    eng = engine(b)
    assert [e[3] for e in eng.seg_events] == [20 * MiB]
    assert cached(eng) == [17 * MiB]


def test_15_mib_plus_1_gets_a_16_mib_segment_without_split() -> None:
    b = TraceBuilder()
    b.alloc(15 * MiB + 1)
    eng = engine(b)
    assert eng.reserved == 16 * MiB
    assert cached(eng) == []  # leftover 1,048,064 B <= 1 MiB: not split
    assert eng.allocated == 16 * MiB
    assert eng.requested == 15 * MiB + 1


def test_1300_mib_with_4_divisions_rounds_to_1536_mib() -> None:
    b = TraceBuilder()
    b.alloc(1300 * MiB)
    result = run(b, settings(roundup_slots=(4,) * 16))
    assert segs(result) == [("segment_alloc", 1536 * MiB)]
    assert result.peak_allocated_bytes == 1536 * MiB


def test_oversize_cached_block_is_refused_for_a_much_smaller_oversize_request() -> None:
    # GIVEN max_split_size_mb:128 and a cached 300 MiB block
    b = TraceBuilder()
    b.free(b.alloc(300 * MiB))
    # WHEN 200 MiB is requested (300 >= 200 + 20: too much larger)
    b.alloc(200 * MiB)
    eng = engine(b, settings(max_split_bytes=128 * MiB))
    # THEN a new 200 MiB segment is made and the 300 MiB block stays cached
    assert [e[3] for e in eng.seg_events] == [300 * MiB, 200 * MiB]
    assert cached(eng) == [300 * MiB]


def test_oversize_block_within_the_slack_is_reused_whole() -> None:
    b = TraceBuilder()
    b.free(b.alloc(60 * MiB))
    b.alloc(45 * MiB)  # >= max_split, and 60 < 45 + 20
    eng = engine(b, settings(max_split_bytes=32 * MiB))
    assert [e[3] for e in eng.seg_events] == [60 * MiB]
    assert eng.allocated == 60 * MiB  # oversize blocks are never split
    assert cached(eng) == []


def test_normal_request_never_takes_an_oversize_block() -> None:
    b = TraceBuilder()
    b.free(b.alloc(64 * MiB))
    b.alloc(12 * MiB)  # < max_split, and the only cached block is >= max_split
    eng = engine(b, settings(max_split_bytes=32 * MiB))
    assert [e[3] for e in eng.seg_events] == [64 * MiB, 12 * MiB]


# ------------------------------------------------------------ split rules
@pytest.mark.parametrize(
    ("request_bytes", "splits"),
    [
        (19 * MiB, False),  # 20 MiB segment, leftover exactly 1 MiB: kept whole
        (19 * MiB - 512, True),  # leftover 1 MiB + 512: split
    ],
)
def test_large_pool_splits_only_above_1_mib_leftover(request_bytes: int, splits: bool) -> None:
    b = TraceBuilder()
    b.alloc(request_bytes)
    eng = engine(b)
    assert eng.reserved == 20 * MiB
    assert cached(eng) == ([20 * MiB - request_bytes] if splits else [])


def test_largest_small_request_leaves_1_mib_cached() -> None:
    b = TraceBuilder()
    b.alloc(MiB)  # rounded 1 MiB is still the small pool
    eng = engine(b)
    assert eng.reserved == 2 * MiB
    assert cached(eng) == [MiB]


def test_small_request_leaving_512_bytes_splits() -> None:
    b = TraceBuilder()
    b.alloc(MiB - 512)
    b.alloc(MiB - 512)
    b.alloc(512)  # takes exactly the 1024 B left... from the 2 MiB segment
    eng = engine(b)
    assert eng.reserved == 2 * MiB
    assert cached(eng) == [512]


def test_request_at_max_split_is_not_split() -> None:
    b = TraceBuilder()
    b.free(b.alloc(100 * MiB))
    b.alloc(90 * MiB)
    eng = engine(b, settings(max_split_bytes=64 * MiB))
    assert cached(eng) == []
    assert eng.allocated == 100 * MiB


def test_rounding_below_512_and_to_512_multiples() -> None:
    b = TraceBuilder()
    b.alloc(1)
    b.alloc(513)
    eng = engine(b)
    assert eng.allocated == 512 + 1024


# ----------------------------------------------------------- best fit / merge
def test_best_fit_takes_the_smallest_block_that_fits() -> None:
    b = TraceBuilder()
    big, small = b.alloc(40 * MiB), b.alloc(12 * MiB)
    b.free(big)
    b.free(small)
    b.alloc(11 * MiB)  # fits both; the 12 MiB one is the best fit
    eng = engine(b)
    assert cached(eng) == [40 * MiB]  # 12 - 11 = 1 MiB is not split off


def test_free_merges_with_free_neighbours_of_the_same_segment() -> None:
    # GIVEN three 3 MiB blocks carved from one 20 MiB segment
    b = TraceBuilder()
    x, y, z = b.alloc(3 * MiB), b.alloc(3 * MiB), b.alloc(3 * MiB)
    b.free(y)
    b.free(x)
    # THEN x and y merged, the tail is separate (z is still allocated between)
    eng = engine(b)
    assert cached(eng) == [6 * MiB, 11 * MiB]
    # WHEN z goes too, everything merges back into the whole segment
    b.free(z)
    eng = engine(b)
    assert cached(eng) == [20 * MiB]
    (blk,) = [blk for fl in eng.large_lists for blk in fl.blocks.values()]
    assert blk.prev is None and blk.next is None


def test_blocks_of_different_segments_never_merge() -> None:
    b = TraceBuilder()
    x, y = b.alloc(12 * MiB), b.alloc(12 * MiB)  # two 12 MiB segments, adjacent addresses
    b.free(x)
    b.free(y)
    eng = engine(b)
    assert cached(eng) == [12 * MiB, 12 * MiB]


def test_streams_never_share_blocks() -> None:
    b = TraceBuilder()
    b.free(b.alloc(3 * MiB, stream=1), stream=1)
    b.alloc(3 * MiB, stream=2)
    result = run(b)
    assert segs(result) == [("segment_alloc", 20 * MiB), ("segment_alloc", 20 * MiB)]


def test_same_stream_reuses_the_cached_block() -> None:
    b = TraceBuilder()
    b.free(b.alloc(3 * MiB, stream=1), stream=1)
    b.alloc(3 * MiB, stream=1)
    assert segs(run(b)) == [("segment_alloc", 20 * MiB)]


def test_pending_free_is_not_reused_until_completed() -> None:
    # GIVEN a block freed while record_stream events are outstanding
    b = TraceBuilder()
    x = b.alloc(12 * MiB)
    b.free_requested(x)
    b.alloc(12 * MiB)  # cannot use x yet: new segment
    b.free_completed(x)
    b.alloc(12 * MiB)  # now it can
    result = run(b)
    assert segs(result) == [("segment_alloc", 12 * MiB)] * 2
    assert result.peak_allocated_bytes == 24 * MiB
    assert result.peak_active_bytes == 24 * MiB


def test_active_counts_pending_blocks_but_allocated_does_not() -> None:
    b = TraceBuilder()
    x = b.alloc(12 * MiB)
    b.free_requested(x)
    eng = engine(b)
    assert eng.allocated == 0
    assert eng.active == 12 * MiB
    assert eng.requested == 12 * MiB


def test_unknown_free_is_ignored() -> None:
    b = TraceBuilder()
    b.free(0x1234)
    b.alloc(3 * MiB)
    result = run(b)
    assert result.partial_trace
    assert segs(result) == [("segment_alloc", 20 * MiB)]


# ---------------------------------------------------------------- result
def test_result_peaks_counters_and_json() -> None:
    b = TraceBuilder()
    x = b.alloc(3 * MiB)
    y = b.alloc(30 * MiB)
    b.free(x)
    b.free(y)
    result = run(b)
    assert result.peak_reserved_bytes == 50 * MiB
    assert result.peak_allocated_bytes == 33 * MiB
    assert result.final_reserved_bytes == 50 * MiB
    assert result.final_allocated_bytes == 0
    assert result.num_device_alloc == 2 and result.num_device_free == 0
    assert result.oom is None and result.num_ooms == 0
    assert result.events == 6 and not result.stopped_early
    doc = result.to_json()
    json.dumps(doc)
    assert doc["peak_reserved_bytes"] == 50 * MiB
    assert doc["oom"] is None


def test_series_is_bounded_and_keeps_the_peak() -> None:
    b = TraceBuilder()
    for i in range(3000):
        x = b.alloc((i % 50 + 1) * MiB)
        if i == 1500:
            spike = b.alloc(900 * MiB)
            b.free(spike)
        b.free(x)
    result = simulate(b.build(), settings(), series_points=100)
    s = result.series
    assert 0 < len(s.event_index) <= 100
    assert max(s.reserved_bytes) == result.peak_reserved_bytes
    assert max(s.allocated_bytes) == result.peak_allocated_bytes
    assert list(s.event_index) == sorted(s.event_index)
    assert all(0.0 <= f <= 1.0 for f in s.fragmentation)


def test_empty_trace() -> None:
    result = simulate(TraceBuilder().build(), settings())
    assert result.peak_reserved_bytes == 0 and result.events == 0


def test_simulate_many_matches_single_runs_in_order() -> None:
    b = TraceBuilder()
    keep = []
    for i in range(200):
        x = b.alloc((i % 17 + 1) * 700 * KiB)
        if i % 3:
            b.free(x)
        else:
            keep.append(x)
    trace = b.build()
    configs = [settings(), settings(expandable_segments=True), settings(roundup_slots=(4,) * 16)]
    parallel = simulate_many(trace, configs, workers=2)
    single = [simulate(trace, c) for c in configs]
    assert [r.settings for r in parallel] == configs
    assert [r.peak_reserved_bytes for r in parallel] == [r.peak_reserved_bytes for r in single]
    assert simulate_many(trace, configs[:1])[0].peak_reserved_bytes == single[0].peak_reserved_bytes
