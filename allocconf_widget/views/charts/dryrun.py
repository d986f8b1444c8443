"""The batch planner's curve: predicted peak reserved per batch size, one line per setting and GPU.

plotly is imported inside the function (``import allocconf_widget`` stays light).
"""

from __future__ import annotations

from typing import Any

from allocconf_widget.app.dryrun import BatchPlan
from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.charts.style import COLORS, byte_unit

#: line styles for settings whose lines coincide with an earlier one's (drawn over it)
_DASHES = ("dot", "dashdot", "longdash", "longdashdot")


def plan_figure(plan: BatchPlan, *, title: str | None = None) -> Any:
    """Lines of predicted peak reserved vs batch size per (GPU, setting); OOM sizes are left out
    of a line (the line stops), each GPU's usable memory is a dashed line. A line with the same
    points as an earlier one is drawn over it, dotted and named "same as …", so neither hides."""
    import plotly.graph_objects as go

    peaks = [c.prediction.peak_reserved for c in plan.cells if c.prediction is not None]
    usables = {c.gpu: c.prediction.usable for c in plan.cells if c.prediction is not None}
    factor, unit = byte_unit(max([*peaks, *usables.values(), 1]))
    fig = go.Figure()
    drawn: dict[tuple[tuple[int, ...], tuple[float, ...]], str] = {}
    repeats: dict[tuple[tuple[int, ...], tuple[float, ...]], int] = {}
    for gpu in plan.gpus:
        for conf in plan.confs:
            xs, ys = [], []
            for size in plan.sizes:
                cell = plan.cell(size, conf, gpu)
                if cell is not None and cell.prediction is not None and cell.prediction.fits:
                    xs.append(size)
                    ys.append(round(cell.prediction.peak_reserved / factor, 3))
            name = f"{conf or '(torch defaults)'}" + (f" · {gpu}" if len(plan.gpus) > 1 else "")
            key = (tuple(xs), tuple(ys))
            same = drawn.get(key) if xs else None
            line: dict[str, Any] = {}
            marker: dict[str, Any] = {}
            if same is not None:
                repeats[key] = repeats.get(key, 0) + 1
                line = {"dash": _DASHES[(repeats[key] - 1) % len(_DASHES)], "width": 3}
                marker = {"symbol": "x", "size": 9}
                name = f"{name} (same as {same})"
            else:
                drawn[key] = name
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=name, line=line, marker=marker,
                                     hovertemplate="batch %{x}: %{y:.2f} " + unit + "<extra></extra>"))
        usable = usables.get(gpu)
        if usable:
            fig.add_hline(y=usable / factor, line={"color": COLORS["oom"], "dash": "dash"},
                          annotation_text=f"{gpu}: {format_bytes(usable)} usable")
    fig.update_layout(title={"text": title or "predicted peak reserved per batch size (dry run, estimate)"},
                      xaxis={"title": {"text": "batch size"}}, yaxis={"title": {"text": unit}},
                      template="plotly_white", height=340, margin={"l": 55, "r": 20, "t": 45, "b": 50})
    return fig
