"""A recording that ends at the OOM that ended the program.

The trace stops at the request that failed: a setting that serves it gets past the crash, into
a part of the run nobody recorded. Such a row must not read "no OOM" as if the whole run had
been replayed: every view says the rest was never recorded, and the report says it once.
"""

from __future__ import annotations

from allocconf_widget.app.simulate import SimulationRequest, simulate
from allocconf_widget.app.sources import TraceSource
from allocconf_widget.core.sim.outcome import Outcome, outcome_of
from allocconf_widget.core.sim.result import SimResult
from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.simulator import simulate as replay
from allocconf_widget.core.sim.trace.model import Trace
from allocconf_widget.core.versions import TorchVersion
from allocconf_widget.views.text.forecast import outcome_cell
from allocconf_widget.views.text.simulate import report_json
from tests.trace_builder import TraceBuilder

MiB = 1 << 20
V211 = TorchVersion(2, 11)


def _died(then_caught: bool = False) -> TraceBuilder:
    """50 MiB held, then a 40 MiB request failed (on an 80 MiB device); optionally the program
    catches it and allocates again."""
    b = TraceBuilder()
    b.segment("segment_alloc", 0x10000000, 50 * MiB)
    b.alloc(50 * MiB)
    b.oom(40 * MiB, device_free=0)
    if then_caught:
        b.segment("segment_alloc", 0x20000000, 20 * MiB)
        b.alloc(20 * MiB)
    return b


def _replay(trace: Trace, device_total: int) -> SimResult:
    return replay(trace, SimSettings(torch_version=V211), device_total=device_total, check=True)


def test_a_setting_that_serves_the_failed_request_is_past_the_recording_not_oom_free():
    trace = _died().build()
    assert trace.ends_at_its_oom()
    roomy = _replay(trace, 200 * MiB)
    assert roomy.oom is None and roomy.outlives_recording
    assert outcome_cell(roomy).startswith("past the recorded OOM; the rest of the run was never recorded")
    assert roomy.to_json()["outlives_recording"] is True
    tight = _replay(trace, 80 * MiB)  # the recorded failure again: a dead run, as recorded
    assert tight.oom is not None and tight.oom.recorded and tight.oom_fatal
    assert not tight.outlives_recording and outcome_of(tight) is Outcome.RUNS_OUT


def test_a_program_that_caught_its_oom_did_not_end_there():
    trace = _died(then_caught=True).build()
    assert trace.program_catches_ooms() and not trace.ends_at_its_oom()
    roomy = _replay(trace, 200 * MiB)
    assert roomy.oom is None and not roomy.outlives_recording
    assert not outcome_cell(roomy).startswith("past")


def test_the_report_says_once_that_the_recording_ends_at_the_oom():
    source = TraceSource(_died().snapshot(), "died", V211, 200 * MiB, 0)
    report = simulate(source, SimulationRequest(confs=("", "expandable_segments:True"), workers=1))
    said = [n for n in report.all_notes() if "up to the request that failed" in n]
    assert len(said) == 1 and said[0].startswith("the recording ends at the OOM that ended the program")
    assert all(row.result.outlives_recording for row in report.rows)
    assert all(doc["outlives_recording"] for doc in report_json(report))


def test_a_completed_run_gets_no_such_note():
    b = TraceBuilder()
    b.segment("segment_alloc", 0x10000000, 50 * MiB)
    b.free(b.alloc(50 * MiB))
    report = simulate(TraceSource(b.snapshot(), "done", V211, 200 * MiB, 0),
                      SimulationRequest(confs=("",), workers=1))
    assert not any("up to the request that failed" in n for n in report.all_notes())
    assert not report.rows[0].result.outlives_recording
