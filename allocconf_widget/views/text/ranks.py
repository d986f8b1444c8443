"""The one text rendering of a :class:`~allocconf_widget.app.ranks.RanksReport` (magic, terminal)."""

from __future__ import annotations

from allocconf_widget.app.ranks import RanksReport
from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.text.table import aligned_table


def _bytes(value: int | None) -> str:
    return "—" if value is None else format_bytes(value)


def _settings(match: bool | None, text: str | None) -> str:
    shown = text if text else "(torch defaults)"
    if match is None:
        return shown
    return f"{shown} {'✓' if match else '≠ kernel'}"


def render_ranks(report: RanksReport, *, max_rows: int | None = None) -> str:
    """A line of summary, one row per rank and device, then OOMs and unreadable files.

    ``max_rows`` caps the table (the widget's); a line then says how many rows were left out.
    """
    lines = [report.summary()]
    if report.channel is not None:
        lines.append(f"channel: {report.channel}")
    if report.ranks:
        rows = [["rank", "pid", "state", "GPU", "reserved", "allocated", "peak reserved",
                 "peak allocated", "retries", "settings"]]
        for view in report.ranks:
            devices = view.devices or ()
            if not devices:
                rows.append([str(view.rank), str(view.pid), view.state, "—", "—", "—", "—", "—", "—",
                             _settings(view.settings_match, view.settings_text)])
            for d in devices:
                rows.append([str(view.rank), str(view.pid), view.state, str(d.device), _bytes(d.reserved),
                             _bytes(d.allocated), _bytes(d.reserved_peak), _bytes(d.allocated_peak),
                             "—" if d.num_alloc_retries is None else f"{d.num_alloc_retries:,}",
                             _settings(view.settings_match, view.settings_text)])
        hidden = 0
        if max_rows is not None and len(rows) - 1 > max_rows:
            hidden = len(rows) - 1 - max_rows
            rows = rows[: max_rows + 1]
        lines += ["", *aligned_table(rows)]
        if hidden:
            lines.append(f"… {hidden:,} more rows (rank, GPU) not shown: %allocconf ranks status "
                         "lists them all")
        if report.kernel_settings is not None:
            lines.append(f"kernel's applied settings: {report.kernel_settings or '(torch defaults)'}")
    lines += [f"OOM: {view.oom_text}" for view in report.ranks if view.oom_text]
    lines += [f"rank {view.rank}: {view.state_text}" for view in report.ranks
              if view.state in ("silent", "died", "failed", "waiting")]
    lines += [f"note (rank {view.rank}): {view.note}" for view in report.ranks if view.note]
    lines += [f"unreadable: {problem}" for problem in report.problems]
    return "\n".join(lines) + "\n"
