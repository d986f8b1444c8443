"""``simulate_many`` takes a ``max_split_size_mb`` row from its twin without it where the split
limit could never act (no segment that large was ever held, in any GPU timing). A user reads
exactly what replaying the row alone gives; the only difference is one replay fewer.

The twin's reuse shows as the same ``seconds`` on both rows (the result is copied); a row
replayed on its own took its own, different, time.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from allocconf_widget.core.memory.snapshot import load_snapshot
from allocconf_widget.core.sim.result import SimResult
from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.simulator import extract_trace, simulate, simulate_many
from allocconf_widget.core.sim.trace.model import Trace
from tests.reasons import candidate_reason
from tests.snapshot_builders import block, segment
from tests.trace_builder import TraceBuilder
from tests.unit.test_simulator_start_state import BASE, entry, free, seeded

MiB = 1 << 20
DATA = Path(__file__).resolve().parents[1] / "data"


def _s(**kw: object) -> SimSettings:
    kw.setdefault("torch_version", (2, 11))
    return SimSettings(**kw)  # type: ignore[arg-type]


def _mixed_sizes() -> Trace:
    """Small and large requests (the largest segment 200 MiB), freed and reused, so a split
    limit below 200 MiB changes which cached block serves what."""
    b = TraceBuilder()
    for _ in range(3):
        big = b.alloc(200 * MiB)
        mid = [b.alloc(30 * MiB) for _ in range(3)]
        b.free(big)
        small = [b.alloc(40 * MiB) for _ in range(4)]
        for x in mid + small:
            b.free(x)
    return b.build()


def _alike(a: SimResult, b: SimResult) -> bool:
    return dataclasses.replace(a, seconds=0.0) == dataclasses.replace(b, seconds=0.0)


@pytest.mark.parametrize(("split_mib", "reused"), [(64, False), (200, False), (201, True), (4096, True)])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_split_limit_above_every_segment_is_its_twins_replay(split_mib: int, reused: bool,
                                                                workers: int) -> None:
    trace = _mixed_sizes()
    twin, split = _s(), _s(max_split_bytes=split_mib * MiB)
    many = simulate_many(trace, [split, twin], workers=workers, device_total=4096 * MiB)
    assert many[0].settings == split and many[1].settings == twin
    assert _alike(many[0], simulate(trace, split, device_total=4096 * MiB))
    assert (many[0].seconds == many[1].seconds) == reused
    assert many[1].largest_segment_bytes == 200 * MiB


def test_a_split_limit_that_acts_changes_the_row() -> None:
    """The control: below the largest segment the limit does act here, so reusing the twin
    would have shown a wrong number."""
    trace = _mixed_sizes()
    split, twin = simulate_many(trace, [_s(max_split_bytes=64 * MiB), _s()], workers=1)
    assert (split.num_device_alloc, split.peak_reserved_bytes) != (
        twin.num_device_alloc, twin.peak_reserved_bytes)


def test_with_garbage_collection_both_options_must_be_idle_in_the_twin() -> None:
    """``split + gc`` beside the plain settings and beside ``split`` alone: every row reads as
    replayed alone, whichever twin it came from or whether it replayed."""
    trace = _mixed_sizes()
    total = 1000 * MiB
    configs = [
        _s(per_process_memory_fraction=0.5),
        _s(per_process_memory_fraction=0.5, max_split_bytes=4096 * MiB),
        _s(per_process_memory_fraction=0.5, gc_threshold=0.9),
        _s(per_process_memory_fraction=0.5, gc_threshold=0.3),  # the collector acts
        _s(per_process_memory_fraction=0.5, max_split_bytes=4096 * MiB, gc_threshold=0.9),
        _s(per_process_memory_fraction=0.5, max_split_bytes=64 * MiB, gc_threshold=0.9),
        _s(per_process_memory_fraction=0.5, max_split_bytes=64 * MiB),
    ]
    many = simulate_many(trace, configs, device_total=total, workers=1)
    for s, got in zip(configs, many, strict=True):
        assert got.settings == s
        assert _alike(got, simulate(trace, s, device_total=total)), s.describe()
    assert many[1].seconds == many[0].seconds  # the split limit never acts: the plain replay
    assert many[3].seconds != many[0].seconds  # the collector acts: replayed


def test_expandable_segments_never_take_a_twin() -> None:
    trace = _mixed_sizes()
    exp, exp_split = _s(expandable_segments=True), _s(expandable_segments=True, max_split_bytes=4096 * MiB)
    a, b = simulate_many(trace, [exp_split, exp], workers=1)
    assert a.seconds != b.seconds and _alike(a, simulate(trace, exp_split))


@pytest.mark.parametrize("name", ["streams2__frac_default", "cnn__default", "transformer__default",
                                  "growing__frac_default", "mempool__default"])
def test_real_recordings_read_as_replayed_alone(name: str) -> None:
    """H200 recordings (two streams with timing ranges, a memory fraction, private pools)
    under split limits around their largest segment, with and without the collector."""
    meta = json.loads((DATA / f"{name}.json").read_text())
    trace = extract_trace(load_snapshot(DATA / f"{name}.pickle.gz"))
    total = meta["device_total_bytes"]
    fraction = meta.get("fraction") or None
    plain = _s(per_process_memory_fraction=fraction)
    largest = simulate(trace, plain, device_total=total).largest_segment_bytes
    assert largest > 0
    limits = sorted({max(21 * MiB, largest - 2 * MiB), largest, largest + 2 * MiB, 512 * MiB})
    configs = [plain, *(dataclasses.replace(plain, max_split_bytes=m) for m in limits),
               dataclasses.replace(plain, max_split_bytes=largest + 2 * MiB, gc_threshold=0.6)]
    many = simulate_many(trace, configs, device_total=total, workers=1)
    for s, got in zip(configs, many, strict=True):
        assert _alike(got, simulate(trace, s, device_total=total)), (name, s.describe())
    reused = [s.max_split_bytes for s, got in zip(configs[1:-1], many[1:-1], strict=True)
              if got.seconds == many[0].seconds]
    assert reused == [m for m in limits if m > largest]


def test_the_reason_says_a_split_limit_never_acts_where_no_segment_reaches_it() -> None:
    """``max_split_size_mb:512``, the advice pasted most often, on a trace whose largest segment
    is 200 MiB: the row says it can do nothing here and why, instead of a mechanism that does
    not apply; a limit below 200 MiB keeps its mechanism."""
    from allocconf_widget.core.sim.recommend import recommend

    rec = recommend(_mixed_sizes(), torch_version=(2, 11), workers=1,
                    extra_confs=("max_split_size_mb:1024,roundup_power2_divisions:4",))
    reasons = {c.conf: candidate_reason(rec, c) for c in rec.candidates}
    for conf in ("max_split_size_mb:256", "max_split_size_mb:512"):
        assert "never acts" in reasons[conf] and "largest is 200.00 MiB" in reasons[conf], reasons[conf]
        assert "never split" not in reasons[conf]
    combo = reasons["max_split_size_mb:1024,roundup_power2_divisions:4"]
    assert "split limit of 1.00 GiB" in combo and "never acts" in combo and "never split" not in combo
    assert "never acts" not in reasons["max_split_size_mb:128"]


def test_a_start_states_cached_segment_counts_as_held() -> None:
    """A recording that starts mid-run with a 300 MiB segment cached: a 256 MiB split limit can
    act on that block (it is oversize, so a 40 MiB request does not split it) even though the
    replay never creates a segment that large; a 512 MiB limit cannot."""
    idle = [segment(block(300 * MiB, "inactive"), address=BASE)]
    entries = [entry("alloc", BASE + 1024 * MiB, 40 * MiB), *free(BASE + 1024 * MiB, 40 * MiB),
               entry("alloc", BASE + 1100 * MiB, 40 * MiB)]
    trace = extract_trace(seeded(idle, entries))
    plain, acts, idle_limit = _s(), _s(max_split_bytes=256 * MiB), _s(max_split_bytes=512 * MiB)
    many = simulate_many(trace, [acts, idle_limit, plain], workers=1)
    assert many[2].largest_segment_bytes == 300 * MiB
    for s, got in zip((acts, idle_limit, plain), many, strict=True):
        assert _alike(got, simulate(trace, s)), s.describe()
    assert many[0].seconds != many[2].seconds and many[1].seconds == many[2].seconds
    assert many[0].num_device_alloc != many[2].num_device_alloc  # the limit did act
