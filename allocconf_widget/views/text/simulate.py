"""The one text rendering of a :class:`~allocconf_widget.app.simulate.SimulationReport`.

``allocconf simulate`` and ``%allocconf simulate`` print this, so the same trace gives the
same table, header and reasons in a terminal and in a notebook.
"""

from __future__ import annotations

from allocconf_widget.app.simulate import SimulationReport, SimulationRow
from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.text.table import aligned_table

_HEADER = ("settings", "peak reserved", "peak allocated", "1 − alloc/res", "cudaMalloc/map",
           "retries", "OOM")


def _oom_cell(row: SimulationRow) -> str:
    result = row.result
    oom = result.oom
    if oom is None:
        text = result.oom_verdict()  # "no" only beside a confident self-check
        return text + ("; the latest GPU timing runs out" if result.timing_oom else "")
    if not result.oom_fatal:  # a program that catches its OOMs: never a dead run
        if not result.stopped_early:
            return f"caught at event {oom.event_index:,}, as recorded"
        return (f"at event {oom.event_index:,} ({format_bytes(oom.segment_bytes)}): the program "
                "catches it; its handler decides what follows")
    return (f"at event {oom.event_index:,} ({format_bytes(oom.segment_bytes)}"
            + (", as recorded)" if oom.recorded else ")"))


def _peak_cell(row: SimulationRow) -> str:
    """The peak, and its range where GPU timing of cross-stream frees can move it."""
    result = row.result
    text = format_bytes(result.peak_reserved_bytes)
    if result.timing_dependent:
        low, high = result.reserved_range
        text += f" ({format_bytes(low)}–{format_bytes(high)} by GPU timing)"
    return text


def render_simulation(report: SimulationReport) -> str:
    """Header (trace, torch, device, self-check), the table, and for a ranking the reasons."""
    fid = report.fidelity
    device = format_bytes(report.device_total) if report.device_total is not None else "unlimited"
    lines = [
        f"trace: {report.source_label} — {report.trace_summary}",
        f"torch {report.torch_version}; device: {device}",
        "self-check (replay under the recorded settings): "
        + (fid.summary() if fid is not None else "not run"),
    ]
    if report.start_state:
        lines.append(f"start: {report.start_state}")
    lines.append("")
    rows = [list(_HEADER)]
    for row in report.rows:
        r = row.result
        rows.append([row.label, _peak_cell(row), format_bytes(r.peak_allocated_bytes),
                     f"{r.fragmentation_at_peak:.1%}", f"{r.num_device_alloc:,}",
                     f"{r.num_alloc_retries:,}", _oom_cell(row)])
    lines += aligned_table(rows)
    if report.ranked:
        lines += ["", "why:"]
        lines += [f"  {row.rank}. {row.label}: {row.reason}" for row in report.rows]
    return "\n".join(lines) + "\n"
