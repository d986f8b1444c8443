"""A temporary (an allocation freed by the very next row) is skipped by the replay where the
cache serves it: the split and the merge undo each other. Skipping must change nothing a
user reads: every field of every result equals the replay of every row, on random traces
full of temporaries under every kind of setting and on the recorded runs in ``tests/data``.
"""

from __future__ import annotations

import dataclasses
from array import array
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocconf_widget.core.memory.snapshot import load_snapshot
from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.simulator import simulate
from allocconf_widget.core.sim.trace import model as trace_module
from allocconf_widget.core.sim.trace.codes import (
    OP_ALLOC,
    OP_ALLOC_FREED_NEXT,
    OP_FREE,
    OP_FREE_COMPLETED,
    OP_FREE_REQUESTED,
)
from allocconf_widget.core.sim.trace.decode import decode_entries
from allocconf_widget.core.sim.trace.extract import extract_trace
from allocconf_widget.core.sim.trace.model import Trace
from allocconf_widget.core.versions import TorchVersion
from tests.trace_builder import TraceBuilder

MiB = 1 << 20
DATA = Path(__file__).resolve().parents[1] / "data"


def _every_row(ops: array[int], addr_ids: array[int]) -> list[int]:
    return list(ops)


def _result(trace: Trace, s: SimSettings, **kw: Any) -> dict[str, Any]:
    # one chunk of the series per 2 rows at most: a temporary whose free opens the next chunk
    # is replayed row by row, and a short trace's chunks are one row each at 1000 points
    kw.setdefault("series_points", 2)
    out = dataclasses.asdict(simulate(trace, s, **kw))
    out.pop("seconds")
    return out


def _both(make: Any, s: SimSettings, **kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(skipping temporaries, replaying every row), each on a trace decoded afresh: the replay
    columns are built once per trace."""
    skipped = _result(make(), s, **kw)
    with mock.patch.object(trace_module, "ops_marking_temporaries", _every_row):
        every = _result(make(), s, **kw)
    return skipped, every


# ------------------------------------------------------------------ which rows are marked
def test_only_an_allocation_whose_own_free_is_the_next_row_is_a_temporary() -> None:
    b = TraceBuilder()
    a = b.alloc(4 * MiB)  # row 0: freed at once -> temporary
    b._add("free_requested", a, 0, 0)
    b._add("free_completed", a, 0, 0)
    c = b.alloc(MiB)  # row 2: another address is freed next -> not one
    d = b.alloc(MiB)  # row 3: freed next -> temporary
    b.free(d)
    b.free(c)
    e = b.alloc(MiB)  # row 6: its free waits on another stream -> not one
    b.free_requested(e)
    b.alloc(MiB)  # the last row: nothing follows
    b.free_completed(e)
    trace = b.build()
    assert list(trace.ops) == [OP_ALLOC, OP_FREE, OP_ALLOC, OP_ALLOC, OP_FREE, OP_FREE, OP_ALLOC,
                               OP_FREE_REQUESTED, OP_ALLOC, OP_FREE_COMPLETED]
    marked = trace.replay_columns()[0]
    assert [i for i, op in enumerate(marked) if op == OP_ALLOC_FREED_NEXT] == [0, 3]
    # the trace itself is untouched: the timing orders and the checks read it
    assert OP_ALLOC_FREED_NEXT not in trace.ops


def test_a_temporary_on_top_of_the_live_set_still_sets_the_peaks() -> None:
    # GIVEN a 40 MiB segment cached (a 20 MiB block allocated, then freed), then 10 MiB held
    b = TraceBuilder()
    first = b.alloc(20 * MiB)
    b.free(first)
    held = b.alloc(10 * MiB)
    # WHEN a 6 MiB temporary is served by the cache
    b.free(b.alloc(6 * MiB))
    b.free(held)
    s = SimSettings(torch_version=TorchVersion(2, 11))
    skipped, every = _both(b.build, s)
    # THEN the peaks count it, and nothing differs from the replay of every row
    assert skipped == every
    assert skipped["peak_allocated_bytes"] == 20 * MiB  # the first block alone was larger
    assert skipped["num_device_alloc"] == 1
    b2 = TraceBuilder()
    first = b2.alloc(12 * MiB)
    b2.free(first)
    held = b2.alloc(10 * MiB)
    b2.free(b2.alloc(8 * MiB))  # 10 + 8 MiB: above any moment without it
    b2.free(held)
    skipped, every = _both(b2.build, s)
    assert skipped == every
    assert skipped["peak_allocated_bytes"] == skipped["peak_active_bytes"] == 18 * MiB


# ------------------------------------------------------------------ random traces
sizes = st.one_of(st.integers(1, MiB), st.integers(MiB + 1, 24 * MiB),
                  st.sampled_from([512, MiB, 2 * MiB, 20 * MiB, 64 * MiB, 130 * MiB]))
steps = st.lists(st.tuples(st.sampled_from(["alloc", "temp", "temp", "free", "empty"]), sizes,
                           st.sampled_from([0, 0, 7])), min_size=4, max_size=90)


@st.composite
def configs(draw: st.DrawFn) -> tuple[SimSettings, int | None]:
    device = draw(st.sampled_from([None, 160 * MiB, 400 * MiB]))
    fraction = draw(st.sampled_from([None, 0.5, 0.9])) if device else None
    s = SimSettings(
        max_split_bytes=draw(st.sampled_from([None, 64 * MiB, 128 * MiB])),
        roundup_slots=(draw(st.sampled_from([0, 2, 4])),) * 16,
        gc_threshold=draw(st.sampled_from([0.0, 0.5])) if fraction else 0.0,
        expandable_segments=draw(st.booleans()),
        per_process_memory_fraction=fraction,
        torch_version=TorchVersion(2, draw(st.sampled_from([9, 11, 12]))),
    )
    return s, device


def _entries(plan: list[tuple[str, int, int]]) -> list[dict[str, Any]]:
    b = TraceBuilder(reuse_addresses=True)
    live: list[tuple[int, int]] = []
    for kind, size, stream in plan:
        if kind == "alloc":
            live.append((b.alloc(size, stream=stream), stream))
        elif kind == "temp":
            b.free(b.alloc(size, stream=stream), stream=stream)
        elif kind == "free" and live:
            addr, on = live.pop(size % len(live))
            b.free(addr, stream=on)
        elif kind == "empty":  # a release burst: decoded as an empty_cache() row
            b.segment("segment_free", 0x10_0000_0000, 20 * MiB)
    return b.entries


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=steps, config=configs(), stop=st.booleans(), points=st.sampled_from([1, 3, 1000]))
def test_skipping_temporaries_changes_no_result_on_random_traces(
        plan: list[tuple[str, int, int]], config: tuple[SimSettings, int | None], stop: bool,
        points: int) -> None:
    s, device = config
    entries = _entries(plan)
    skipped, every = _both(lambda: decode_entries(entries), s, device_total=device,
                           stop_at_oom=stop, record_segments=True, series_points=points)
    assert skipped == every


# ------------------------------------------------------------------ recorded runs
RECORDED = sorted(DATA.glob("*.pickle.gz"))
#: settings under which temporaries are skipped (the exclusions have cases of their own above)
SETTINGS = ("", "max_split_size_mb:128", "roundup_power2_divisions:4")


@pytest.mark.slow
@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name.split(".")[0])
def test_skipping_temporaries_changes_no_result_on_recorded_runs(path: Path) -> None:
    snap = load_snapshot(path)
    for conf in SETTINGS:
        s = dataclasses.replace(SimSettings.from_string(conf, (2, 11)), per_process_memory_fraction=0.3)
        skipped, every = _both(lambda: extract_trace(snap), s, device_total=80 << 30,
                               stop_at_oom=False, check=True, record_segments=True, series_points=1000)
        assert skipped == every, (path.name, conf)


# ------------------------------------------------------------------ where a temporary counts
def _two_cached_segments_then(b: TraceBuilder, *, temporary: int) -> None:
    """Two 20 MiB segments cached (made in that order), a temporary served by the first, a
    20 MiB allocation held, and a release burst (``empty_cache()``)."""
    first, second = b.alloc(20 * MiB), b.alloc(20 * MiB)
    b.free(first)
    b.free(second)
    b.free(b.alloc(temporary))
    b.alloc(20 * MiB)
    b.segment("segment_free", 0x10_0000_0000, 20 * MiB)


def test_under_the_counter_tie_break_a_split_temporary_moves_its_block_behind_its_twin() -> None:
    """torch 2.12 breaks ties between equal free blocks by a registration counter: splitting a
    block for a temporary registers a new block, and the merge on its free keeps that one, so
    the next 20 MiB request takes the *other* segment and ``empty_cache()`` releases the first.
    The replay must not skip such a temporary (``EngineRules.tie_by_address`` is False)."""
    b = TraceBuilder()
    _two_cached_segments_then(b, temporary=8 * MiB)
    s = SimSettings(torch_version=TorchVersion(2, 12))
    skipped, every = _both(b.build, s, record_segments=True)
    assert skipped == every
    released = [addr for _, kind, addr, _ in every["segment_events"] if kind == 1]
    made = [addr for _, kind, addr, _ in every["segment_events"] if kind == 0]
    assert released == made[:1]  # the first segment, which the temporary re-registered
    # (with the temporary skipped, the held request would take it and the second would go)
    s211 = SimSettings(torch_version=TorchVersion(2, 11))
    skipped, every = _both(b.build, s211, record_segments=True)
    assert skipped == every


def test_under_garbage_collection_a_temporary_makes_its_block_young_again() -> None:
    """GC releases the cached segments at least as old as the average: a temporary served by
    one of two equally old segments resets its age (torch's ``free_block``), so GC releases
    only the other one. The replay must not skip temporaries while GC is on."""
    b = TraceBuilder()
    first, second, held = b.alloc(20 * MiB), b.alloc(20 * MiB), b.alloc(20 * MiB)
    b.free(first)
    b.free(second)
    b.free(b.alloc(8 * MiB))  # the temporary
    b.alloc(30 * MiB)  # no cached block fits: GC runs first (60 MiB reserved, 50 MiB allowed)
    del held
    s = SimSettings(gc_threshold=0.5, per_process_memory_fraction=0.5,
                    torch_version=TorchVersion(2, 11))
    skipped, every = _both(b.build, s, device_total=200 * MiB, record_segments=True)
    assert skipped == every
    assert [kind for _, kind, _, _ in every["segment_events"]] == [0, 0, 0, 1, 0]  # one released
