"""The batch planner's curve: predicted peak reserved per batch size, one line per setting and GPU.

plotly is imported inside the function (``import allocconf_widget`` stays light).
"""

from __future__ import annotations

from typing import Any

from allocconf_widget.app.dryrun import BatchPlan
from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.charts.style import COLORS, byte_unit


def plan_figure(plan: BatchPlan, *, title: str | None = None) -> Any:
    """Lines of predicted peak reserved vs batch size per (GPU, setting); OOM sizes are left out
    of a line (the line stops), each GPU's usable memory is a dashed line."""
    import plotly.graph_objects as go

    peaks = [c.prediction.peak_reserved for c in plan.cells if c.prediction is not None]
    usables = {c.gpu: c.prediction.usable for c in plan.cells if c.prediction is not None}
    factor, unit = byte_unit(max([*peaks, *usables.values(), 1]))
    fig = go.Figure()
    for gpu in plan.gpus:
        for conf in plan.confs:
            xs, ys = [], []
            for size in plan.sizes:
                cell = next(c for c in plan.cells if c.batch == size and c.conf == conf and c.gpu == gpu)
                if cell.prediction is not None and cell.prediction.fits:
                    xs.append(size)
                    ys.append(round(cell.prediction.peak_reserved / factor, 3))
            name = f"{conf or '(torch defaults)'}" + (f" · {gpu}" if len(plan.gpus) > 1 else "")
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=name,
                                     hovertemplate="batch %{x}: %{y:.2f} " + unit + "<extra></extra>"))
        usable = usables.get(gpu)
        if usable:
            fig.add_hline(y=usable / factor, line={"color": COLORS["oom"], "dash": "dash"},
                          annotation_text=f"{gpu}: {format_bytes(usable)} usable")
    fig.update_layout(title={"text": title or "predicted peak reserved per batch size (dry run, estimate)"},
                      xaxis={"title": {"text": "batch size"}}, yaxis={"title": {"text": unit}},
                      template="plotly_white", height=340, margin={"l": 55, "r": 20, "t": 45, "b": 50})
    return fig
