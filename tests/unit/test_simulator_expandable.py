"""Expandable segments (§6.12): page-granular mapping, growable best fit, unmapping."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest

from allocconf_widget.core.sim import sorted_keys
from tests.trace_builder import TraceBuilder
from tests.unit.test_simulator import KiB, MiB, cached, engine, run, segs, settings

ES = {"expandable_segments": True}


def test_first_request_maps_one_large_page_and_splits() -> None:
    b = TraceBuilder()
    b.alloc(3 * MiB)
    eng = engine(b, settings(**ES))
    assert [(e[1], e[3]) for e in eng.seg_events] == [(2, 20 * MiB)]  # segment_map
    assert eng.reserved == 20 * MiB
    assert cached(eng) == [17 * MiB]


def test_small_pool_pages_are_2_mib() -> None:
    b = TraceBuilder()
    b.alloc(700 * KiB)
    assert segs(run(b, settings(**ES))) == [("segment_map", 2 * MiB)]


def test_growth_maps_only_the_missing_pages_after_free_space() -> None:
    # GIVEN 17 MiB free at the end of the mapped range
    b = TraceBuilder()
    b.alloc(3 * MiB)
    b.alloc(30 * MiB)  # 17 free + one more 20 MiB page = 37 >= 30
    result = run(b, settings(**ES))
    assert segs(result) == [("segment_map", 20 * MiB), ("segment_map", 20 * MiB)]
    assert result.peak_reserved_bytes == 40 * MiB
    assert result.num_device_alloc == 2


def test_page_size_follows_large_segment_size_from_2_11() -> None:
    b = TraceBuilder()
    b.alloc(3 * MiB)
    new = settings(**ES, large_segment_bytes=64 * MiB, torch_version=(2, 11))
    old = settings(**ES, large_segment_bytes=64 * MiB, torch_version=(2, 10))
    assert segs(run(b, new)) == [("segment_map", 64 * MiB)]
    assert segs(run(b, old)) == [("segment_map", 20 * MiB)]


def test_large_request_maps_whole_pages() -> None:
    b = TraceBuilder()
    b.alloc(45 * MiB)
    result = run(b, settings(**ES))
    assert segs(result) == [("segment_map", 60 * MiB)]
    eng = engine(b, settings(**ES))
    assert cached(eng) == [15 * MiB]  # split even above 1 MiB rules: leftover >= 512


def test_freed_blocks_merge_across_former_map_boundaries() -> None:
    b = TraceBuilder()
    x = b.alloc(3 * MiB)
    y = b.alloc(30 * MiB)
    b.free(x)
    b.free(y)
    eng = engine(b, settings(**ES))
    assert cached(eng) == [40 * MiB]


def test_oom_path_unmaps_other_streams_pages_then_retries() -> None:
    # GIVEN 40 MiB mapped and cached on stream 0, 60 MiB usable
    b = TraceBuilder()
    x = b.alloc(3 * MiB, stream=0)
    y = b.alloc(30 * MiB, stream=0)
    b.free(x)
    b.free(y)
    # WHEN stream 1 needs 30 MiB (two pages: 40 + 40 > 60)
    b.alloc(30 * MiB, stream=1)
    result = run(b, settings(**ES), device_total=60 * MiB)
    # THEN stream 0's whole pages are unmapped and the retry maps stream 1's
    assert segs(result) == [
        ("segment_map", 20 * MiB),
        ("segment_map", 20 * MiB),
        ("segment_unmap", 40 * MiB),
        ("segment_map", 40 * MiB),
    ]
    assert result.num_alloc_retries == 1
    assert result.num_device_free == 1
    assert result.oom is None


def test_unmap_keeps_partial_pages_mapped() -> None:
    # GIVEN a live 3 MiB block at the start and a free [3, 40) MiB block after it
    b = TraceBuilder()
    b.alloc(3 * MiB)
    y = b.alloc(30 * MiB)
    b.free(y)
    b.segment("segment_free", 0xDEAD, 1)  # empty_cache()
    eng = engine(b, settings(**ES))
    # THEN only the page [20, 40) is unmapped; [3, 20) stays mapped and cached
    assert [(e[1], e[3]) for e in eng.seg_events][-1] == (3, 20 * MiB)
    assert eng.reserved == 20 * MiB
    assert cached(eng) == [17 * MiB]


def test_expandable_blocks_are_not_released_by_gc() -> None:
    b = TraceBuilder()
    b.free(b.alloc(30 * MiB))
    b.alloc(50 * MiB, stream=1)
    s = settings(**ES, per_process_memory_fraction=0.5, gc_threshold=0.1)
    result = run(b, s, device_total=200 * MiB)
    assert "segment_unmap" not in [name for name, _ in segs(result)]


def test_fraction_check_uses_the_segment_size_not_the_mapping() -> None:
    # 3 MiB request: alloc_size 20 MiB is what the limit check adds
    b = TraceBuilder()
    b.alloc(3 * MiB)
    s = settings(**ES, per_process_memory_fraction=0.15)
    assert run(b, s, device_total=100 * MiB).oom is not None  # 20 > 15
    s = settings(**ES, per_process_memory_fraction=0.25)
    assert run(b, s, device_total=100 * MiB).oom is None


def test_best_fit_prefers_the_block_that_would_grow_least() -> None:
    # GIVEN two free blocks: A (20 MiB, in the middle, cannot grow) and B (18 MiB at the
    # mapped end, growable by the whole unmapped reservation)
    b = TraceBuilder()
    a = b.alloc(20 * MiB)
    keep = b.alloc(2 * MiB)
    tail = b.alloc(18 * MiB)
    b.free(a)
    b.free(tail)
    # WHEN 17 MiB is requested, B is the first fit by size but A grows less
    b.alloc(17 * MiB)
    eng = engine(b, settings(**ES))
    assert sorted(cached(eng)) == [3 * MiB, 18 * MiB]
    assert keep


@pytest.mark.parametrize("load", [None, 1])
def test_best_fit_prefers_the_block_that_would_grow_least_in_a_long_free_list(load: int | None) -> None:
    # GIVEN free blocks of 16 MiB, 18 MiB at the mapped end (growable) and 20 MiB (cannot
    # grow) in three 20 MiB pages, their keys in one list or (LOAD 1) in chunks of ≤ 2 keys
    b = TraceBuilder()
    a = b.alloc(20 * MiB)
    keep = b.alloc(2 * MiB)
    c = b.alloc(16 * MiB)
    keep2 = b.alloc(4 * MiB)
    tail = b.alloc(18 * MiB)
    for addr in (a, c, tail):
        b.free(addr)
    # WHEN 17 MiB is requested, 18 MiB is the first fit by size but 20 MiB grows less
    b.alloc(17 * MiB)
    with mock.patch.object(sorted_keys, "LOAD", load or sorted_keys.LOAD):
        eng = engine(b, settings(**ES))
    assert sorted(cached(eng)) == [3 * MiB, 16 * MiB, 18 * MiB]
    assert (eng.large_lists[0].keys.one is None) == (load == 1)
    assert keep and keep2


def test_no_expandable_segments_before_2_1() -> None:
    b = TraceBuilder()
    b.alloc(3 * MiB)
    assert segs(run(b, settings(**ES, torch_version=(2, 0)))) == [("segment_alloc", 20 * MiB)]


def test_private_pools_use_expandable_segments_from_2_11() -> None:
    """Measured on the H200 with 2.11 (benchmarks/gpu/probe_private_pools.py): a MemPool's and a
    CUDA graph's pool were both mapped as expandable segments. Before 2.11 not modelled so."""
    b = TraceBuilder()
    b.alloc(3 * MiB, pool_id=(1, 0))
    assert segs(run(b, settings(**ES, torch_version=(2, 12)))) == [("segment_map", 20 * MiB)]
    assert segs(run(b, settings(**ES, torch_version=(2, 11)))) == [("segment_map", 20 * MiB)]
    assert segs(run(b, settings(**ES, torch_version=(2, 10)))) == [("segment_alloc", 20 * MiB)]


def test_the_room_search_answers_as_torchs_walk_on_holes_and_random_traces(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The room search resumes from its records (issue 22.6); with CHECK_ROOM_SEARCH every
    search is also answered by torch's plain walk over every unmapped range, and they must
    agree: on the expandable-holes shape and on random traces with frees, releases and a
    second stream."""
    import random

    from allocconf_widget.core.sim import expandable
    from allocconf_widget.core.sim.simulator import SimSettings, decode_entries, simulate
    from tests.hostile.replay_shapes import expandable_holes

    monkeypatch.setattr(expandable, "CHECK_ROOM_SEARCH", True)
    on = SimSettings.from_string("expandable_segments:True", "2.11")
    simulate(decode_entries(expandable_holes(6000)), on)
    for seed in range(6):
        rng = random.Random(seed)
        b = TraceBuilder()
        live: list[tuple[int, int]] = []
        for step in range(1500):
            if live and rng.random() < 0.45:
                addr, stream = live.pop(rng.randrange(len(live)))
                b.free(addr, stream)
            elif step % 97 == 96:
                b.segment("segment_unmap", 0x7000_0000_0000 + step * MiB, 20 * MiB)  # empty_cache()
            else:
                stream = rng.choice((0, 0, 7))
                size = rng.choice((1, 3, 12, 19, 21, 40, 64)) * MiB + rng.randrange(0, MiB, 512)
                live.append((b.alloc(size, stream), stream))
        simulate(b.build(), on)


def test_the_room_search_answers_as_torchs_walk_on_recorded_runs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The H200 CNN recordings replayed under expandable segments (with and without
    max_split_size_mb, from the start and from a start state cut mid-run), every room search
    checked against torch's walk. A search that stopped at a run once recorded that run's
    partial sum as its size, so a larger request later skipped a run that could hold it."""
    import tarfile

    from allocconf_widget.core.memory.snapshot import load_snapshot
    from allocconf_widget.core.sim import expandable
    from allocconf_widget.core.sim.simulator import SimSettings, extract_trace, simulate

    monkeypatch.setattr(expandable, "CHECK_ROOM_SEARCH", True)
    with tarfile.open(Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "cnn.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    for name in ("default", "expandable_split128"):
        trace = extract_trace(load_snapshot(tmp_path / f"cnn__{name}.pickle"))
        for conf in ("expandable_segments:True", "expandable_segments:True,max_split_size_mb:128"):
            simulate(trace, SimSettings.from_string(conf, (2, 11)), device_total=150 * 10**9)
