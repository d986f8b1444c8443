"""Device limits, the OOM path (§6.8), fractions, GC (§6.9), rejections and recorded OOMs."""

from __future__ import annotations

import dataclasses

import pytest

from allocconf_widget.core.sim.simulator import simulate, simulate_many
from tests.trace_builder import TraceBuilder
from tests.unit.test_simulator import KiB, MiB, cached, engine, run, segs, settings


def _cache_12_busy_24() -> TraceBuilder:
    b = TraceBuilder()
    x = b.alloc(12 * MiB)
    b.alloc(24 * MiB)
    b.free(x)  # a whole 12 MiB segment is cached, 24 MiB in use
    return b


def test_oom_path_frees_all_cached_and_retries() -> None:
    # GIVEN 40 MiB usable, 36 MiB reserved of which 12 MiB cached
    b = _cache_12_busy_24()
    b.alloc(14 * MiB)  # 36 + 14 > 40: cudaMalloc fails
    result = run(b, device_total=40 * MiB)
    # THEN the cache is released, the retry is counted and succeeds
    assert segs(result) == [
        ("segment_alloc", 12 * MiB),
        ("segment_alloc", 24 * MiB),
        ("segment_free", 12 * MiB),
        ("segment_alloc", 14 * MiB),
    ]
    assert result.num_alloc_retries == 1
    assert result.num_sync_all_streams == 1
    assert result.num_ooms == 0 and result.oom is None
    assert result.peak_reserved_bytes == 38 * MiB


def test_oom_when_nothing_left_to_release() -> None:
    b = _cache_12_busy_24()
    b.alloc(14 * MiB)
    b.alloc(20 * MiB)  # 38 + 20 > 40 and nothing cached
    b.alloc(1 * MiB)  # never reached
    result = run(b, device_total=40 * MiB)
    assert result.num_ooms == 1
    assert result.num_alloc_retries == 2
    oom = result.oom
    assert oom is not None
    assert oom.event_index == 5
    assert (oom.requested_bytes, oom.rounded_bytes, oom.segment_bytes) == (20 * MiB,) * 3
    assert oom.reserved_bytes == 38 * MiB
    assert oom.allocated_bytes == 38 * MiB
    assert not oom.recorded and not oom.rejected
    assert result.stopped_early and result.events == 6


def test_replay_can_continue_past_an_oom() -> None:
    b = _cache_12_busy_24()
    b.alloc(30 * MiB)  # 24 + 30 > 50 even after releasing the cached 12 MiB
    b.alloc(2 * MiB)  # a 20 MiB segment fits after the release
    result = run(b, device_total=50 * MiB, stop_at_oom=False)
    assert result.num_ooms == 1 and not result.stopped_early
    assert segs(result)[-1] == ("segment_alloc", 20 * MiB)


def test_non_pytorch_memory_shrinks_the_device() -> None:
    b = TraceBuilder()
    b.alloc(30 * MiB)
    assert run(b, device_total=40 * MiB, non_pytorch_bytes=5 * MiB).oom is None
    assert run(b, device_total=40 * MiB, non_pytorch_bytes=15 * MiB).oom is not None


def test_release_of_oversize_blocks_before_freeing_everything() -> None:
    # GIVEN max_split 32 MiB, a cached oversize 64 MiB segment and a cached small one
    b = TraceBuilder()
    big = b.alloc(64 * MiB)
    small = b.alloc(12 * MiB)
    b.free(big)
    b.free(small)
    b.alloc(40 * MiB)  # 64 >= 40 + 20: refused; 76 + 40 > 100: cudaMalloc fails
    result = run(b, settings(max_split_bytes=32 * MiB), device_total=100 * MiB)
    # THEN only the oversize block is released, and no retry is counted
    assert segs(result)[2:] == [("segment_free", 64 * MiB), ("segment_alloc", 40 * MiB)]
    assert result.num_alloc_retries == 0
    assert result.num_sync_all_streams == 0


def test_oversize_release_frees_several_from_the_largest_down() -> None:
    b = TraceBuilder()
    blocks = [b.alloc(n * MiB) for n in (40, 50, 60)]
    for x in blocks:
        b.free(x)
    b.alloc(100 * MiB)  # larger than any cached block: release 60 + 50 (>= 100)
    result = run(b, settings(max_split_bytes=32 * MiB), device_total=160 * MiB)
    assert segs(result)[3:] == [
        ("segment_free", 60 * MiB),
        ("segment_free", 50 * MiB),
        ("segment_alloc", 100 * MiB),
    ]


def test_fraction_limit_refuses_without_cudamalloc() -> None:
    b = TraceBuilder()
    b.alloc(30 * MiB)
    b.alloc(30 * MiB)  # 60 > 0.5 * 100
    result = run(b, settings(per_process_memory_fraction=0.5), device_total=100 * MiB)
    assert result.oom is not None
    assert result.num_ooms == 1 and result.num_alloc_retries == 1


def test_fraction_needs_a_device_total() -> None:
    b = TraceBuilder()
    b.alloc(900 * MiB)
    assert run(b, settings(per_process_memory_fraction=0.1)).oom is None


def _gc_trace() -> TraceBuilder:
    # three whole cached segments of increasing age, then a miss
    b = TraceBuilder()
    b.free(b.alloc(12 * MiB))
    b.free(b.alloc(14 * MiB))
    b.free(b.alloc(16 * MiB))
    b.alloc(18 * MiB)
    return b


def test_gc_releases_old_whole_segments_when_over_threshold() -> None:
    # allowed 50 MiB, threshold 0.6 -> budget 30 MiB; 42 MiB reserved at the miss
    s = settings(per_process_memory_fraction=0.5, gc_threshold=0.6)
    result = run(_gc_trace(), s, device_total=100 * MiB)
    # ages 3, 2, 1 (clock ticks per lookup); mean 2: the 12 and 14 MiB blocks go
    assert segs(result)[3:] == [
        ("segment_free", 12 * MiB),
        ("segment_free", 14 * MiB),
        ("segment_alloc", 18 * MiB),
    ]
    assert result.final_reserved_bytes == 34 * MiB
    assert result.num_alloc_retries == 0


def test_gc_does_nothing_without_a_fraction() -> None:
    s = settings(gc_threshold=0.6)
    result = run(_gc_trace(), s, device_total=100 * MiB)
    assert [name for name, _ in segs(result)] == ["segment_alloc"] * 4
    assert result.final_reserved_bytes == 60 * MiB


@pytest.mark.parametrize(("fraction", "device_total", "acts"), [
    (0.5, 100 * MiB, True),  # budget 30 MiB, the twin reaches 60: the collector frees segments
    (0.5, 200 * MiB, False),  # budget 60 MiB: the twin never exceeds it
    (None, 100 * MiB, False),  # no fraction: the collector never runs
])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_gc_setting_beside_its_twin_gives_the_replay_it_would_get_alone(
        fraction: float | None, device_total: int, acts: bool, workers: int) -> None:
    """simulate_many reuses the twin's replay (same settings without the threshold) only where
    the collector could never act; either way the GC row is exactly what replaying it alone
    gives, so a user comparing the two reads the same numbers as before the reuse."""
    trace = _gc_trace().build()
    twin = settings(per_process_memory_fraction=fraction)
    gc = settings(per_process_memory_fraction=fraction, gc_threshold=0.6)
    many = simulate_many(trace, [gc, twin], device_total=device_total, workers=workers)
    alone = simulate(trace, gc, device_total=device_total)
    assert many[0].settings == gc and many[1].settings == twin
    assert dataclasses.replace(many[0], seconds=0.0) == dataclasses.replace(alone, seconds=0.0)
    assert (many[0].final_reserved_bytes != many[1].final_reserved_bytes) == acts


@pytest.mark.parametrize("workers", [1, 2])
def test_settings_asked_for_twice_replay_once_and_each_row_reads_as_alone(workers: int) -> None:
    """The recorded row and the same settings' own row (``allocconf simulate --conf ''`` on a
    run made under the defaults) are one replay; each row is what replaying it alone gives,
    and only the row that asked for the self-check carries its score."""
    trace = _gc_trace().build()
    plain = settings(per_process_memory_fraction=0.5)
    gc = settings(per_process_memory_fraction=0.5, gc_threshold=0.6)
    configs = [plain, gc, plain, gc, plain]
    check = [False, False, True, False, False]
    many = simulate_many(trace, configs, device_total=100 * MiB, workers=workers, check=check)
    for s, flag, got in zip(configs, check, many, strict=True):
        alone = simulate(trace, s, device_total=100 * MiB, check=flag)
        assert dataclasses.replace(got, seconds=0.0) == dataclasses.replace(alone, seconds=0.0)
    assert [r.fidelity is not None for r in many] == check


def test_gc_with_fraction_1_acts_only_up_to_2_9() -> None:
    old = settings(per_process_memory_fraction=1.0, gc_threshold=0.3, torch_version=(2, 9))
    new = settings(per_process_memory_fraction=1.0, gc_threshold=0.3, torch_version=(2, 10))
    assert run(_gc_trace(), old, device_total=100 * MiB).num_device_free == 2
    assert run(_gc_trace(), new, device_total=100 * MiB).num_device_free == 0


def test_throw_on_cudamalloc_oom_rejects_without_the_retry_chain() -> None:
    b = _cache_12_busy_24()
    b.alloc(80 * MiB)  # 36 + 80 > 100, and 24 + 80 > 100 after releasing the cache
    s = settings(throw_on_cudamalloc_oom=True)
    result = run(b, s, device_total=100 * MiB)
    assert result.num_oom_rejections == 1
    assert result.num_ooms == 0 and result.num_alloc_retries == 0
    assert result.oom is not None and result.oom.rejected
    assert [name for name, _ in segs(result)] == ["segment_alloc"] * 2  # cache kept
    # before 2.12 the option does not exist: the normal OOM path runs
    result = run(b, settings(throw_on_cudamalloc_oom=True, torch_version=(2, 11)),
                 device_total=100 * MiB)
    assert result.num_ooms == 1 and result.num_alloc_retries == 1


def test_recorded_oom_is_retried_and_never_stops_the_replay() -> None:
    # GIVEN a trace whose program survived an OOM of 70 MiB
    b = _cache_12_busy_24()
    b.oom(70 * MiB, device_free=4 * MiB)
    b.alloc(2 * MiB)
    # WHEN replayed on the same device, it fails again (after releasing the cache)
    same = run(b, device_total=50 * MiB)
    assert same.recorded_ooms == 1 and same.recorded_ooms_avoided == 0
    assert same.num_ooms == 1 and not same.stopped_early
    assert same.oom is not None and same.oom.recorded
    assert ("segment_free", 12 * MiB) in segs(same)
    # WHEN replayed with room to spare, the OOM is avoided and the block cached
    roomy = run(b, device_total=200 * MiB)
    assert roomy.recorded_ooms_avoided == 1 and roomy.num_ooms == 0 and roomy.oom is None
    # the 2 MiB request is then carved from the cached 12 MiB segment
    assert roomy.final_reserved_bytes == 36 * MiB + 70 * MiB
    assert roomy.num_device_alloc == 3


def test_empty_cache_in_trace_releases_whole_segments_and_pending_frees() -> None:
    # GIVEN a cached 12 MiB segment, a 14 MiB one pending (record_stream), a split one in use
    b = TraceBuilder()
    x = b.alloc(12 * MiB)
    z = b.alloc(14 * MiB)
    b.alloc(3 * MiB)
    b.free(x)
    b.free_requested(z)
    b.segment("segment_free", 0xDEAD, 12 * MiB)  # all that empty_cache() leaves in a trace
    b.alloc(1 * KiB)
    eng = engine(b)
    # THEN the pending free is completed first, then whole segments go in size order
    assert eng.num_sync_all_streams == 1
    assert [(e[1], e[3]) for e in eng.seg_events][3:] == [
        (1, 12 * MiB), (1, 14 * MiB), (0, 2 * MiB)]
    assert cached(eng) == [2 * MiB - 1024, 17 * MiB]


def test_oom_keeps_stats_consistent_when_continuing() -> None:
    b = TraceBuilder()
    x = b.alloc(30 * MiB)
    b.alloc(30 * MiB)
    b.free(x)
    result = simulate(b.build(), settings(), device_total=40 * MiB, stop_at_oom=False)
    assert result.final_allocated_bytes == 0
    assert result.final_reserved_bytes == 30 * MiB
