"""The what-if at its edges (issue 23): programs that catch their own OOMs, and peaks that
depend on GPU timing (frees waiting on other streams), given as a range.

The real cases are H200 recordings in ``benchmarks/data``: ``batchfind`` (accelerate's
``find_executable_batch_size`` written out, under memory fractions of 2, 3 and 5 GiB: the
program catches its OOMs and completes) and ``streams3`` (two streams and ``record_stream``,
each setting recorded three times).
"""

from __future__ import annotations

import dataclasses
import json
import tarfile
from pathlib import Path

import pytest

from allocconf_widget.app.simulate import SimulationReport
from allocconf_widget.core.memory.snapshot import load_snapshot
from allocconf_widget.core.sim.outcome import Outcome, outcome_of
from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.simulator import extract_trace, simulate
from allocconf_widget.core.sim.trace.codes import OP_FREE_COMPLETED, OP_FREE_REQUESTED
from allocconf_widget.views.text.forecast import outcome_cell
from allocconf_widget.views.text.simulate import report_json
from tests.reasons import candidate_reason
from tests.trace_builder import TraceBuilder

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks" / "data"


def _extract(archive: str, tmp_path: Path) -> Path:
    with tarfile.open(DATA / archive) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path


def _caught_then_smaller() -> TraceBuilder:
    """A batch finder in miniature: 30 MiB fails on a 40 MiB device, the handler frees and
    retries with 10 MiB, which fits."""
    b = TraceBuilder()
    weights = b.alloc(8 * MiB)
    act = b.alloc(20 * MiB)
    b.oom(30 * MiB, device_free=12 * MiB)
    b.free(act)
    for _ in range(3):
        b.free(b.alloc(10 * MiB))
    b.free(weights)
    return b


# ------------------------------------------------------------------ 1. caught OOMs
def test_an_oom_the_program_caught_is_not_a_dead_run() -> None:
    trace = _caught_then_smaller().build()
    assert trace.program_catches_ooms()
    result = simulate(trace, SimSettings(), device_total=40 * MiB)
    assert result.oom is not None and result.oom.recorded
    assert result.oom_fatal is False and not result.stopped_early
    assert result.events == trace.num_events  # the replay followed the whole run
    doc = result.to_json()
    assert doc["oom_fatal"] is False and doc["oom"] is not None
    assert outcome_of(result) is Outcome.CAUGHT_AS_RECORDED and "caught" in outcome_cell(result)


def test_an_oom_where_the_recording_had_none_leaves_the_rest_to_the_handler() -> None:
    # a smaller device: the 20 MiB activation already fails, where the recording served it
    trace = _caught_then_smaller().build()
    result = simulate(trace, SimSettings(), device_total=24 * MiB)
    assert result.oom is not None and not result.oom.recorded
    assert result.stopped_early and result.oom_fatal is False
    assert outcome_of(result) is Outcome.HANDLER_DECIDES and "handler" in outcome_cell(result)
    from allocconf_widget.core.sim.recommend import recommend

    rec = recommend(trace, torch_version=(2, 11), device_total=24 * MiB, workers=1)
    reasons = " ".join(candidate_reason(rec, c) for c in rec.candidates)
    assert "handler decides what follows" in reasons
    assert "dies" not in reasons


def test_a_new_oom_after_a_caught_one_is_the_handlers_in_every_view() -> None:
    """The replay follows a caught OOM the recording had, then meets one it did not have (the
    weights still live): the verdict says the handler decides, as the reasons do, not
    "caught, as recorded" because the first OOM was a recorded one."""
    b = _caught_then_smaller()
    keep = b.alloc(8 * MiB)
    b.free(b.alloc(36 * MiB))  # served in the recording; 44 MiB live on a 40 MiB device here
    b.free(keep)
    result = simulate(b.build(), SimSettings(), device_total=40 * MiB)
    # the OOM the row names is the one the replay stopped at, not the recorded one before it
    assert result.oom is not None and not result.oom.recorded and result.oom.requested_bytes == 36 * MiB
    assert result.stopped_early and outcome_of(result) is Outcome.HANDLER_DECIDES and not result.oom_fatal
    assert outcome_cell(result).endswith("the program catches it; its handler decides what follows")


def test_a_program_that_dies_of_its_oom_is_still_told_so() -> None:
    b = TraceBuilder()
    x = b.alloc(20 * MiB)
    b.oom(30 * MiB, device_free=12 * MiB)
    b.free(x)  # the exception unwinds: frees, and nothing more is allocated
    trace = b.build()
    assert not trace.program_catches_ooms()
    result = simulate(trace, SimSettings(), device_total=30 * MiB)
    assert result.oom is not None and result.oom_fatal is True
    assert outcome_of(result) is Outcome.RUNS_OUT and outcome_cell(result).startswith("yes, at event")


def test_where_the_handler_decides_every_view_names_the_oom_the_replay_stopped_at(tmp_path: Path) -> None:
    """The batch finder under 2 GiB: its recorded OOM (entry 55) is caught again under every
    setting; under some settings a later request fails where the recording had none and the
    replay stops there. The row names that OOM (its event is the last replayed), not entry 55,
    which was said as "where the recording did not" (it did)."""
    root = _extract("batchfind.tar.xz", tmp_path)
    snapshot = load_snapshot(root / "batchfind__default_f2g.pickle")
    meta = json.loads((root / "batchfind__default_f2g.json").read_text())
    trace = extract_trace(snapshot)
    stopped = 0
    for conf in ("roundup_power2_divisions:4", "max_split_size_mb:256,max_non_split_rounding_mb:512", ""):
        settings = dataclasses.replace(SimSettings.from_string(conf, (2, 11)),
                                       per_process_memory_fraction=meta["fraction"])
        result = simulate(trace, settings, device_total=meta["device_total_bytes"])
        assert result.oom is not None
        if outcome_of(result) is Outcome.HANDLER_DECIDES:
            stopped += 1
            assert not result.oom.recorded
            assert result.oom.event_index > 55
        else:
            assert result.oom.recorded and result.oom.event_index == 55
    assert stopped >= 1


# ------------------------------------------------------------------ 2. timing ranges
def test_a_trace_without_cross_stream_frees_has_a_point_range() -> None:
    b = TraceBuilder()
    for _ in range(4):
        b.free(b.alloc(30 * MiB))
    result = simulate(b.build(), SimSettings())
    assert result.reserved_range == (result.peak_reserved_bytes,) * 2
    assert result.to_json()["peak_reserved_range_bytes"] == [result.peak_reserved_bytes] * 2
    assert not result.timing_dependent


def one_free_waiting_on_another_stream() -> TraceBuilder:
    """A 30 MiB block freed with record_stream completes only after the next 30 MiB request:
    as recorded a second segment is needed; had the GPU caught up, one would do."""
    b = TraceBuilder()
    x = b.alloc(30 * MiB)
    b.free_requested(x)
    y = b.alloc(30 * MiB)
    b.free_completed(x)
    b.free(y)
    return b


def test_a_free_waiting_on_another_stream_gives_a_range() -> None:
    result = simulate(one_free_waiting_on_another_stream().build(), SimSettings())
    assert result.peak_reserved_bytes == 60 * MiB
    assert result.reserved_range == (30 * MiB, 60 * MiB)
    assert result.to_json()["peak_reserved_range_bytes"] == [30 * MiB, 60 * MiB]


def _report_of(b: TraceBuilder) -> SimulationReport:
    from allocconf_widget.app.simulate import SimulationRequest
    from allocconf_widget.app.simulate import simulate as simulate_source
    from allocconf_widget.app.sources import TraceSource
    from allocconf_widget.core.versions import TorchVersion

    source = TraceSource(b.snapshot(), "built", TorchVersion(2, 11), None, 0)
    return simulate_source(source, SimulationRequest(confs=("", "expandable_segments:True"), workers=1))


def cpu_kept_pace() -> TraceBuilder:
    """The program of :func:`one_free_waiting_on_another_stream`, recorded with a CPU that never
    got ahead of its GPU: each free completes before the next allocation."""
    b = TraceBuilder()
    up, down = b.alloc(30 * MiB), b.alloc(30 * MiB)  # a layer's two weights, as `offload`'s
    b.free_requested(up)
    b.free_requested(down)
    b.free_completed(up)  # at the next malloc's look at the events, before its own entry
    b.free_completed(down)
    b.free(b.alloc(30 * MiB))
    return b


def test_a_recording_whose_cpu_kept_pace_says_its_ranges_hold_for_that_pace_only() -> None:
    """Round 20: the same weight-streaming program peaked 3.1 times higher with its CPU running
    ahead than with a CPU that waited (a slow host): from the second's recording the range has
    no width, and the report must not let that read as "timing cannot move this peak"."""
    from allocconf_widget.core.sim.timing import host_ran_ahead
    from allocconf_widget.core.sim.trace_notes import HOST_KEPT_PACE as HOST_KEPT_PACE_NOTE

    paced = cpu_kept_pace()
    assert host_ran_ahead(paced.build()) is False
    report = _report_of(paced)
    assert HOST_KEPT_PACE_NOTE in report.all_notes()
    for doc in report_json(report):
        assert doc["recorded_cpu_ran_ahead"] is False
        assert doc["peak_reserved_range_bytes"] == [60 * MiB, 60 * MiB]
    ahead = _report_of(one_free_waiting_on_another_stream())
    assert HOST_KEPT_PACE_NOTE not in ahead.all_notes()
    assert {doc["recorded_cpu_ran_ahead"] for doc in report_json(ahead)} == {True}
    plain = TraceBuilder()
    plain.free(plain.alloc(30 * MiB))
    assert {doc["recorded_cpu_ran_ahead"] for doc in report_json(_report_of(plain))} == {None}


def test_a_completion_after_other_frees_but_before_the_next_allocation_kept_pace() -> None:
    from allocconf_widget.core.sim.timing import host_ran_ahead

    b = TraceBuilder()
    x, z = b.alloc(30 * MiB), b.alloc(2 * MiB)
    b.free_requested(x)
    b.free(z)  # a free between the request and its completion is no allocation
    b.free_completed(x)
    assert b.build().deferred_frees
    b.free(b.alloc(30 * MiB))
    assert host_ran_ahead(b.build()) is False
    w = b.alloc(4 * MiB)
    b.free_requested(w)
    b.free(b.alloc(4 * MiB))
    b.free_completed(w)  # one completion past an allocation is enough
    assert host_ran_ahead(b.build()) is True


def test_a_free_still_waiting_at_the_snapshot_with_allocations_after_it_ran_ahead() -> None:
    """A snapshot taken mid-step leaves some record_stream frees pending. Allocations after
    such a request show the CPU ahead of the GPU: the report once said it "never got ahead"
    (an attack pass, round 21), because only completed frees were looked at."""
    from allocconf_widget.core.sim.timing import host_ran_ahead

    b = TraceBuilder()
    for _ in range(3):  # paced: each completes before the next allocation
        x = b.alloc(8 * MiB)
        b.free_requested(x)
        b.free_completed(x)
    last = b.alloc(8 * MiB)
    b.free_requested(last)  # never completes before the dump
    assert host_ran_ahead(b.build()) is False  # nothing allocated after it yet
    b.free(b.alloc(1 * MiB))
    assert host_ran_ahead(b.build()) is True
    only_pending = TraceBuilder()
    only_pending.free_requested(only_pending.alloc(8 * MiB))
    only_pending.free(only_pending.alloc(2 * MiB))
    assert host_ran_ahead(only_pending.build()) is True


def test_the_late_order_does_not_wait_for_an_address_the_recording_reused() -> None:
    """A free completed quickly in the recording, whose address the next request got again,
    must still wait in the late order (as long as the recording's longest wait): in a run whose
    GPU lags that much, that request gets other memory, so the late peak counts both blocks."""
    b = TraceBuilder(reuse_addresses=True)
    a = b.alloc(20 * MiB)
    b.free_requested(a)
    for _ in range(6):
        b.free(b.alloc(1024))
    b.free_completed(a)  # waited 13 rows: the recording's longest wait
    x = b.alloc(30 * MiB)
    b.free_requested(x)
    scratch = b.alloc(1024)
    b.free_completed(x)  # waited 2 rows ...
    y = b.alloc(30 * MiB)  # ... and its address was handed out again at once
    assert y == x
    b.free(scratch)
    b.free(y)
    result = simulate(b.build(), SimSettings())
    assert result.peak_reserved_bytes == 52 * MiB  # as recorded: y reuses x's block
    assert result.reserved_range == (52 * MiB, 82 * MiB)  # late: x still pending when y comes


@pytest.mark.slow
@pytest.mark.parametrize(("workload", "source", "runs", "inside_at_least"), [
    ("streams3", "default", 12, 12),  # CPU waits every 6 steps: every real peak inside
    ("prefetch", "default", 20, 20),  # a data loader's side-stream copies
    ("streams2idle", "default", 20, 19),  # no sync at all: one run's GPU lagged further still
    ("d2h", "default", 15, 15),  # held out: written and recorded after the late order changed
    ("buckets", "default", 15, 15),  # held out (round 11): DDP-style gradient buckets
    ("pipe2", "default", 15, 15),  # held out (round 11): a two-stage inference pipeline
    # another default run as the recording (which one a user records is luck): the run of
    # `buckets` that peaked low held 9/15 with the recorded longest wait, 15/15 with twice it
    ("buckets", "default_r2", 15, 15),
    ("prefetch", "default_r4", 20, 20),  # 19/20 with the recorded wait
    ("streams2idle", "default_r3", 20, 17),  # 15/20 with the recorded wait
])
def test_real_two_stream_peaks_lie_in_their_ranges(tmp_path: Path, workload: str, source: str, runs: int,
                                                   inside_at_least: int) -> None:
    """Two-stream programs on the H200, each setting recorded several times alone on the GPU:
    one default run's trace replayed under each setting gives a range holding the real peaks of
    the repeats, at most 3× wide (from the first default run the point prediction alone is exact
    for 9/12, 9/20, 2/20 and 14/15 of them; a late bound held back by the recorded reuse of an
    address held 12/12, 14/20, 17/20 and 15/15)."""
    root = _extract(f"{workload}.tar.xz", tmp_path)
    base = extract_trace(load_snapshot(root / f"{workload}__{source}.pickle"))
    inside = checked = 0
    for meta_path in sorted(root.glob(f"{workload}__*.json")):
        meta = json.loads(meta_path.read_text())
        settings = SimSettings.from_allocator_settings(meta["allocator_settings"], (2, 11))
        total = meta["device_total_bytes"]
        result = simulate(base, settings, device_total=total,
                          non_pytorch_bytes=total - meta["free_at_start_bytes"])
        low, high = result.reserved_range
        real = meta["stats"]["reserved_bytes.all.peak"]
        inside += low <= real <= high
        assert high <= 3 * low
        checked += 1
    assert checked == runs
    assert inside >= inside_at_least


def test_the_late_order_lags_twice_the_longest_recorded_wait() -> None:
    """A run can lag further than the recorded one (the longest wait of identical runs varied up
    to 6×): the late order holds every completion twice the recording's longest wait, in rows."""
    from allocconf_widget.core.sim.timing import LATE_LAG_FACTOR, timing_variants

    b = TraceBuilder()
    a = b.alloc(4 * MiB)
    b.free_requested(a)
    for _ in range(3):
        b.alloc(MiB)
    b.free_completed(a)  # 4 rows after its request: the longest wait
    x = b.alloc(4 * MiB)
    b.free_requested(x)
    b.alloc(MiB)
    b.free_completed(x)  # 2 rows after its request (the first block's completion is now between)
    for _ in range(20):
        b.alloc(MiB)
    trace = b.build()
    variants = timing_variants(trace)
    assert variants is not None
    late = variants.late
    rows = list(late.ops)
    request = rows.index(OP_FREE_REQUESTED, rows.index(OP_FREE_REQUESTED) + 1)
    done = len(rows) - 1 - rows[::-1].index(OP_FREE_COMPLETED)  # the second block's completion
    assert LATE_LAG_FACTOR == 2 and done - request == 2 * 4


def test_completions_moved_past_the_end_come_once() -> None:
    """The late order moved a completion near the end to the end of the trace twice (once with
    the last cut, once after it): a duplicated row, found when the lag doubled."""
    from allocconf_widget.core.sim.timing import timing_variants

    b = TraceBuilder()
    first = b.alloc(4 * MiB)
    b.free_requested(first)
    for _ in range(10):
        b.free(b.alloc(MiB))
    b.free_completed(first)  # the longest wait: 21 rows
    last = b.alloc(4 * MiB)
    b.free_requested(last)
    b.alloc(MiB)
    b.free_completed(last)  # 2 rows, but near the end: the late order puts it at the end
    trace = b.build()
    variants = timing_variants(trace)
    assert variants is not None
    late = variants.late
    assert sorted(late.op_index) == sorted(trace.op_index)
    assert late.op_index[-1] == trace.op_index[-1]  # the last completion, moved to the end


def test_timing_variants_keep_every_event() -> None:
    from allocconf_widget.core.sim.timing import timing_variants

    b = TraceBuilder()
    xs = [b.alloc(4 * MiB) for _ in range(5)]
    for x in xs:
        b.free_requested(x)
    b.alloc(MiB)
    for x in xs:
        b.free_completed(x)
    trace = b.build()
    variants = timing_variants(trace)
    assert variants is not None
    assert sorted(variants.late.op_index) == sorted(trace.op_index)
    assert len(variants.early.ops) == len(trace.ops) - 5
    assert dataclasses.replace(trace) is not trace
