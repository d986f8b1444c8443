"""The OOM card's HTML: the memory breakdown, the settings in effect and what to do.

Shared by the plain OOM card (:mod:`allocconf_widget.views.widgets.oom`) and the flight
recorder's fuller view (:mod:`allocconf_widget.views.widgets.flight`), which re-renders it
once its replay verdict is in, so the rules of thumb never contradict the verdict.
"""

from __future__ import annotations

from html import escape

from allocconf_widget.app.oom import OomRecommendation, OomReport
from allocconf_widget.core.memory.oom import MemoryBreakdown
from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.text.oom import advice_action, advice_heading

_PART_COLORS = {
    "allocated by PyTorch": "#ff7f0e",
    "reserved by PyTorch, unallocated": "#1f77b4",
    "this process, outside PyTorch": "#7f7f7f",
    "other processes": "#8c564b",
    "outside PyTorch (this process or others)": "#bcbcbc",
    "free": "#e8eef5",
}
_ATTR = "_allocconf_oom_assistant"


def _bar_html(b: MemoryBreakdown) -> str:
    cells = []
    for label, size in b.parts():
        share = 100 * size / b.total if b.total else 0
        cells.append(f'<div title="{escape(label)}: {format_bytes(size)}" style="width:{share:.3f}%;'
                     f'background:{_PART_COLORS.get(label, "#999")};min-width:2px"></div>')
    legend = " · ".join(
        f'<span style="color:{_PART_COLORS.get(label, "#999")}">■</span> {escape(label)} '
        f"<b>{format_bytes(size)}</b>" for label, size in b.parts())
    return (f'<div style="display:flex;height:18px;border:1px solid #ccc;max-width:720px">'
            f'{"".join(cells)}</div><div style="font-size:12px;margin:4px 0">{legend}</div>')


def report_html(report: OomReport, recommendation: OomRecommendation | None = None) -> str:
    """The report as HTML for an ``ipywidgets.HTML`` (no scripts, everything escaped).

    Beside a replay verdict (``recommendation.by_replay``), the rules of thumb are headed as
    such and say that the verdict decides; those that disagree with it are muted.
    """
    parts = [f'<div style="font-weight:600;color:#d62728">{escape(report.headline)}</div>']
    if report.breakdown is not None:
        parts.append(_bar_html(report.breakdown))
    if report.observed is not None:
        o = report.observed
        parts.append(f"<div>torch's OOM observer: GPU {o.device} could not get "
                     f"{format_bytes(o.alloc)}; {format_bytes(o.device_free)} free</div>")
    parts.append(f"<div>settings in effect: <code>{escape(report.settings_text)}</code></div>")
    if report.advice:
        agree = dict(recommendation.rules) if recommendation is not None else {}
        muted = " style='color:#777'"
        items = "".join(
            f"<li{'' if agree.get(a, True) else muted}>"
            f"<b>{escape(advice_action(a, recommendation))}</b>: {escape(a.reason)}</li>"
            for a in report.advice)
        parts.append(f"<div class='allocconf-oom-advice-heading'>{escape(advice_heading(recommendation))}:"
                     f"</div><ul style='margin-top:2px'>{items}</ul>")
    return f'<div class="allocconf-oom-report">{"".join(parts)}</div>'
