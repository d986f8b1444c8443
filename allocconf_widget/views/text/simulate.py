"""The one text rendering of a :class:`~allocconf_widget.app.simulate.SimulationReport`.

``allocconf simulate`` and ``%allocconf simulate`` print this, so the same trace gives the
same table, header and reasons in a terminal and in a notebook. In a notebook the table is
also offered as HTML (:class:`SimulationDisplay`): the text table is ~130 characters wide and
wrapped in a 1400 px window (each row's "OOM" cell on a line of its own); the HTML table
wraps inside its cells instead and fits the output area. Both carry the same cells.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from allocconf_widget.app.simulate import SimulationReport, SimulationRow
from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.text.forecast import outcome_cell, result_peak
from allocconf_widget.views.text.reasons import row_reason
from allocconf_widget.views.text.table import aligned_table

_HEADER = ("settings", "peak reserved", "peak allocated", "1 − alloc/res", "cudaMalloc/map",
           "retries", "OOM")


def _oom_cell(report: SimulationReport, row: SimulationRow) -> str:
    return outcome_cell(row.result, estimate=report.estimate)


def _header_lines(report: SimulationReport) -> list[str]:
    fid = report.fidelity
    device = format_bytes(report.device_total) if report.device_total is not None else "unlimited"
    if report.usable_bytes is not None and report.usable_bytes != report.device_total:
        device += f" ({format_bytes(report.usable_bytes)} usable by PyTorch)"  # as the dry run says
    if report.limit_bytes is not None:
        device += f", a memory fraction's limit of {format_bytes(report.limit_bytes)}"
    lines = [
        f"trace: {report.source_label} — {report.trace_summary}",
        f"torch {report.torch_version}; device: {device}",
        "self-check (replay under the recorded settings): "
        + (fid.summary() if fid is not None else "not run"),
    ]
    if report.start_state:
        lines.append(f"start: {report.start_state}")
    return lines


def _cells(report: SimulationReport) -> list[list[str]]:
    rows = [list(_HEADER)]
    for row in report.rows:
        r = row.result
        rows.append([row.label, result_peak(r), format_bytes(r.peak_allocated_bytes),
                     f"{r.fragmentation_at_peak:.1%}", f"{r.num_device_alloc:,}",
                     f"{r.num_alloc_retries:,}", _oom_cell(report, row)])
    return rows


def _reasons(report: SimulationReport) -> list[str]:
    return ([f"{row.rank}. {row.label}: {row_reason(report, row)}" for row in report.rows]
            if report.ranked else [])


def progress_line(what: str) -> str:
    """One line of a simulation under way, the CLI's (a terminal's stderr) and the magic's (its
    cell) alike: ``what`` is a stage or :func:`replay_count`."""
    return f"allocconf simulate: {what}…"


def replay_count(done: int, total: int) -> str:
    """How far the replays have got; the recorded settings' self-check counts as a setting."""
    return f"replaying: {done} of {total} settings done"


def render_simulation(report: SimulationReport) -> str:
    """Header (trace, torch, device, self-check), the table, and for a ranking the reasons."""
    lines = [*_header_lines(report), ""]
    lines += aligned_table(_cells(report))
    if report.ranked:
        lines += ["", "why:"]
        lines += [f"  {reason}" for reason in _reasons(report)]
    return "\n".join(lines) + "\n"


_TD = "padding:1px 8px;vertical-align:top;"


def render_simulation_html(report: SimulationReport) -> str:
    """The same header, table and reasons as HTML: a table that wraps inside its cells."""
    head, *body = _cells(report)

    def cell(text: str) -> str:
        # "608.00 MiB (608.00 MiB–714.00 MiB by GPU timing)" wrapped over four lines in a
        # narrow output area: the value, then its parenthesis, each on one line
        value, paren, rest = text.partition(" (")
        nowrap = "<span style='white-space:nowrap'>{}</span>"
        if not paren:
            return html.escape(text)
        return nowrap.format(html.escape(value)) + "<br>" + nowrap.format(html.escape("(" + rest))

    def row(cells: list[str], tag: str) -> str:
        first, *rest = cells
        return (f"<tr><{tag} style='{_TD}text-align:left'>{html.escape(first)}</{tag}>"
                + "".join(f"<{tag} style='{_TD}text-align:right'>{cell(c)}</{tag}>" for c in rest)
                + "</tr>")

    parts = ["<div class='allocconf-simulate' style='max-width:100%'>",
             "<br>".join(html.escape(line) for line in _header_lines(report)),
             "<table style='border-collapse:collapse;font-size:12px;margin:6px 0;"
             "table-layout:auto;max-width:100%'>",
             row(head, "th"), *(row(cells, "td") for cells in body), "</table>"]
    if report.ranked:
        items = "".join(f"<li>{html.escape(f'{row.label}: {row_reason(report, row)}')}</li>"
                        for row in report.rows)
        parts.append(f"<div>why:</div><ol style='margin:2px 0'>{items}</ol>")
    parts.append("</div>")
    return "".join(parts)


@dataclass(frozen=True)
class SimulationDisplay:
    """What ``%allocconf simulate`` shows in a notebook: HTML there, the text table elsewhere."""

    report: SimulationReport

    def _repr_html_(self) -> str:
        return render_simulation_html(self.report)

    def __repr__(self) -> str:
        return render_simulation(self.report).rstrip("\n")


def headline(report: SimulationReport) -> list[str]:
    """The lines the What if? tab heads its rows with."""
    lines = [f"What if? Replaying {report.source_label} ({report.num_events:,} events) under "
             f"{len(report.rows)} settings."]
    if report.fidelity is not None:
        lines.append(f"Model check on the recorded settings: {report.fidelity.summary()}")
    return lines


def report_json(report: SimulationReport) -> list[dict[str, Any]]:
    """``allocconf simulate --json``: one object per row, in order (ranked with a ranking).

    Each carries the replay's facts, its ``outcome`` (the one verdict every view words) with
    ``fits`` (true, false, or null where the replay cannot say), the table's ``oom_verdict``
    words, the limit it ran under and, for a ranking, its rank and reason. Strings from the
    file are kept exact here (JSON escapes them).
    """
    docs = []
    for row in report.rows:
        doc = row.result.to_json()
        doc.pop("series", None)
        doc["conf"] = row.conf
        doc["recorded_settings"] = row.is_current
        doc["outcome"] = row.outcome.value
        doc["fits"] = row.outcome.fits
        doc["oom_verdict"] = outcome_cell(row.result, estimate=report.estimate)
        doc["row_limit_bytes"] = row.limit.bytes if row.limit is not None else None
        if row.rank is not None:
            doc["rank"] = row.rank
            doc["reason"] = row_reason(report, row)
            doc["is_current"] = row.is_current
            if row.is_draft:
                doc["is_staged_draft"] = True
        if report.ranked:
            doc["fidelity"] = report.fidelity.to_json() if report.fidelity is not None else None
        doc["limit_bytes"] = report.limit_bytes  # the cap every row replayed under, or null
        doc["limit_read_off_ooms_bytes"] = None if report.limit_range is None else list(report.limit_range)
        doc["recorded_cpu_ran_ahead"] = report.host_ran_ahead
        docs.append(doc)
    return docs
