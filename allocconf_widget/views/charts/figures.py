"""plotly figure builders from plain data: the memory timeline and the what-if charts.

No display calls here: callers show a figure (``fig.show()``, a
``go.FigureWidget``, ``fig.to_html()``) as their front end allows. plotly is
optional: it is imported inside the functions (``import allocconf_widget``
never loads it), and everything used exists in plotly 5.24 (Colab) through 7.

Sizes are bounded so a figure stays small: the timeline gets a decimated
:class:`~allocconf_widget.core.memory.timeline.RenderPayload` (≤ N points per series),
and values are sent in the axis unit rounded to 4 significant digits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from allocconf_widget.core.memory.timeline import Marker, RenderPayload
from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.charts.style import (
    BYTE_SERIES,
    COLORS,
    LABELS,
    RATIO_SERIES,
    byte_unit,
)


def _go() -> Any:
    try:
        import plotly.graph_objects as go
    except ImportError as exc:  # pragma: no cover - exercised where plotly is missing
        raise ImportError(
            "plotly is needed for these charts: pip install plotly (or use the SVG "
            "renderer: start_monitor(renderer='svg'))"
        ) from exc
    return go


def _round(values: Sequence[float | None], factor: float) -> list[float | None]:
    """Values in axis units, 4 significant digits: a third of the bytes of raw floats."""
    return [None if v is None else float(f"{v / factor:.4g}") for v in values]


# ----------------------------------------------------------------- timeline

TIMELINE_TRACES: tuple[str, ...] = (*BYTE_SERIES, *RATIO_SERIES)
"""Trace order of :func:`timeline_figure` (per device): the update helpers rely on it."""

_TRACE_STYLE: dict[str, dict[str, Any]] = {
    "reserved": {"line": {"color": COLORS["reserved"], "width": 2}, "fill": "tozeroy",
                 "fillcolor": "rgba(31,119,180,0.08)"},
    "allocated": {"line": {"color": COLORS["allocated"], "width": 2}},
    # active usually equals allocated: a wide translucent band around allocated's line, so
    # both stay visible (a thin line would hide under allocated)
    "active": {"line": {"color": COLORS["active"], "width": 7}, "opacity": 0.3},
    "non_pytorch": {"line": {"color": COLORS["non_pytorch"], "width": 1, "dash": "dash"}},
    "cached_share": {"line": {"color": COLORS["cached_share"], "width": 1, "dash": "dash"},
                     "yaxis": "y2"},
    "fragmentation": {"line": {"color": COLORS["fragmentation"], "width": 1},
                      "mode": "lines+markers", "marker": {"size": 4}, "yaxis": "y2",
                      "connectgaps": True},
}


def _unit(payloads: Sequence[RenderPayload]) -> tuple[int, str]:
    peak = max([p.peaks.get(n) or 0.0 for p in payloads for n in BYTE_SERIES] + [1.0])
    return byte_unit(peak)


def _trace_values(payload: RenderPayload, name: str, factor: int) -> list[float | None]:
    ys = payload.series.get(name) or [None] * len(payload.x)
    if name in RATIO_SERIES:
        return [None if v is None else round(v * 100, 2) for v in ys]
    return _round(ys, factor)


def _timeline_traces(go: Any, payload: RenderPayload, unit: tuple[int, str], visible: bool,
                     suffix: str) -> list[Any]:
    factor, unit_name = unit
    traces = []
    for name in TIMELINE_TRACES:
        ratio = name in RATIO_SERIES
        template = "%{y:.1f}%" if ratio else f"%{{y:.3f}} {unit_name}"
        style = dict(_TRACE_STYLE[name])
        traces.append(go.Scatter(
            x=list(payload.x),
            y=_trace_values(payload, name, factor),
            name=LABELS[name] + suffix,
            mode=style.pop("mode", "lines"),
            hovertemplate=f"{LABELS[name]}: {template}<extra></extra>",
            visible=visible,
            **style,
        ))
    return traces


def _marker_shapes(markers: Sequence[Marker]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    shapes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    for m in markers:
        if m.kind == "cell" and m.x_end is not None:
            shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": m.x, "x1": m.x_end,
                           "y0": 0, "y1": 1, "fillcolor": COLORS["cell"], "line": {"width": 0},
                           "layer": "below"})
        elif m.kind == "idle":
            shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": m.x,
                           "x1": m.x_end if m.x_end is not None else m.x, "y0": 0, "y1": 1,
                           "fillcolor": COLORS["idle"], "line": {"width": 0}, "layer": "below"})
            notes.append({"x": m.x, "y": 0.98, "xref": "x", "yref": "paper", "text": m.label,
                          "hovertext": f"{m.label}: no memory counter changed; the chart keeps "
                          "half a second of it", "showarrow": False, "xanchor": "left",
                          "yanchor": "top", "font": {"color": COLORS["note"], "size": 10}})
        elif m.kind == "oom":
            shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": m.x, "x1": m.x,
                           "y0": 0, "y1": 1, "line": {"color": COLORS["oom"], "width": 2}})
            notes.append({"x": m.x, "y": 1, "xref": "x", "yref": "paper", "text": "OOM",
                          "hovertext": m.label, "showarrow": False, "xanchor": "left",
                          "font": {"color": COLORS["oom"]}})
        else:
            shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": m.x, "x1": m.x,
                           "y0": 0, "y1": 1, "line": {"color": COLORS["note"], "width": 1,
                                                      "dash": "dot"}})
    return shapes, notes


def timeline_layout(payload: RenderPayload, unit: tuple[int, str], title: str | None) -> dict[str, Any]:
    """Layout (axes, markers) of the timeline; also what a live update re-sends."""
    shapes, notes = _marker_shapes(payload.markers)
    return {
        "title": {"text": title or "", "font": {"size": 13}},
        "xaxis": {"title": {"text": payload.x_label}},
        "yaxis": {"title": {"text": unit[1]}, "rangemode": "tozero"},
        # a little room above the full share, and quarter gridlines drawn, so a share near the
        # top does not sit on the plot's edge above the left axis' highest gridline
        "yaxis2": {"title": {"text": "%"}, "overlaying": "y", "side": "right", "range": [0, 105],
                   "tickmode": "linear", "tick0": 0, "dtick": 25, "showgrid": True,
                   "gridcolor": "rgba(148,103,189,0.25)", "griddash": "dot"},
        "shapes": shapes,
        "annotations": notes,
    }


def timeline_figure(
    payloads: RenderPayload | Mapping[Any, RenderPayload],
    *,
    title: str | None = None,
    height: int = 330,
    device: Any = None,
) -> Any:
    """The memory timeline: reserved / allocated / active / non-PyTorch, ratios on a right axis.

    Args:
        payloads: one device's payload, or ``{device: payload}``; with several,
            a drop-down on the figure picks the device (``device`` is shown first).
        title: figure title (e.g. ``"Recording: …"`` for a replay).

    Cell runs are shaded, OOMs are red lines; ``uirevision`` keeps the user's zoom
    across live updates.
    """
    go = _go()
    by_device = {payloads.device: payloads} if isinstance(payloads, RenderPayload) else dict(payloads)
    keys = list(by_device)
    shown = device if device in by_device else (keys[0] if keys else None)
    unit = _unit(list(by_device.values()))
    fig = go.Figure()
    for key in keys:
        suffix = f" (GPU {key})" if len(keys) > 1 else ""
        for trace in _timeline_traces(go, by_device[key], unit, key == shown, suffix):
            fig.add_trace(trace)
    first = by_device.get(shown)
    layout = timeline_layout(first, unit, title) if first is not None else {}
    fig.update_layout(
        height=height, margin={"l": 55, "r": 50, "t": 40 if title else 20, "b": 40},
        legend={"orientation": "h", "y": -0.22}, hovermode="x unified", uirevision="allocconf",
        template="plotly_white", **layout,
    )
    if len(keys) > 1:
        fig.update_layout(updatemenus=[_device_menu(keys, by_device, title)])
    return fig


def _device_menu(keys: list[Any], by_device: Mapping[Any, RenderPayload],
                 title: str | None) -> dict[str, Any]:
    n = len(TIMELINE_TRACES)
    buttons = []
    for i, key in enumerate(keys):
        visible = [j // n == i for j in range(n * len(keys))]
        shapes, notes = _marker_shapes(by_device[key].markers)
        buttons.append({"label": f"GPU {key}", "method": "update",
                        "args": [{"visible": visible}, {"shapes": shapes, "annotations": notes,
                                                        "title.text": title or ""}]})
    return {"buttons": buttons, "x": 0, "y": 1.15, "xanchor": "left", "showactive": True}


def update_timeline_figure(fig: Any, payload: RenderPayload, *, title: str | None = None) -> None:
    """Redraw a one-device :func:`timeline_figure` (e.g. a ``FigureWidget``) in one message.

    Only x/y and the markers change, inside ``batch_update`` so plotly sends a
    single update; the payload's size bounds the message size.
    """
    unit = _unit([payload])
    factor = unit[0]
    layout = timeline_layout(payload, unit, title)
    with fig.batch_update():
        for trace, name in zip(fig.data, TIMELINE_TRACES, strict=False):
            trace.x = list(payload.x)
            trace.y = _trace_values(payload, name, factor)
            if name not in RATIO_SERIES:
                trace.hovertemplate = f"{LABELS[name]}: %{{y:.3f}} {unit[1]}<extra></extra>"
        fig.layout.yaxis.title.text = layout["yaxis"]["title"]["text"]
        fig.layout.xaxis.title.text = payload.x_label
        fig.layout.shapes = layout["shapes"]
        fig.layout.annotations = layout["annotations"]
        if title is not None:
            fig.layout.title.text = title


# ----------------------------------------------------------------- what-if helpers


class ConfigRun(NamedTuple):
    """One configuration's result for the what-if charts (plain data; a tuple works too)."""

    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    peak: float
    #: what the setting does to the step, in a few words ('' where it fits:
    #: ``views/text/forecast.outcome_tag``); "OOM" where it runs out
    tag: str = ""
    low: float | None = None  # the peak's range by GPU timing (record_stream frees); None: a point
    high: float | None = None

    @property
    def top(self) -> float:
        """The highest the peak can be: the range's top where it is a range."""
        return max(self.peak, self.high or 0.0)

    def peak_text(self) -> str:
        """The peak as every view says it, with its range where GPU timing moves it."""
        from allocconf_widget.views.text.forecast import peak_text

        if self.low is not None and self.high is not None and self.low != self.high:
            return peak_text(int(self.peak), int(self.low), int(self.high))
        return peak_text(int(self.peak))

    @property
    def runs_out(self) -> bool:
        return self.tag == "OOM"

    @property
    def color(self) -> str:
        """Red where the step runs out, amber where the replay cannot say, else reserved's."""
        if not self.tag:
            return COLORS["reserved"]
        return COLORS["oom"] if self.runs_out else COLORS["unsure"]

    def bar_text(self) -> str:
        """The bar's words: the outcome where it is not "fits", then the peak."""
        return (f"{self.tag}: " if self.tag else "") + self.peak_text()


def peak_bar_chart(runs: Sequence[ConfigRun | tuple[Any, ...]], *, title: str | None = None,
                   device_total: float | None = None) -> Any:
    """Bars of peak reserved memory per configuration; OOM runs in red, device size as a line."""
    go = _go()
    items = [ConfigRun(*r) for r in runs]
    factor, unit = byte_unit(max([r.top for r in items] + [device_total or 0, 1]))
    fig = go.Figure(go.Bar(
        x=[r.label for r in items],
        y=[round(r.peak / factor, 3) for r in items],
        marker={"color": [r.color for r in items]},
        # the range by GPU timing as a whisker, where a peak is a range
        error_y={"type": "data", "symmetric": False, "color": "#333",
                 "array": [round((r.top - r.peak) / factor, 3) for r in items],
                 "arrayminus": [round((r.peak - (r.low if r.low is not None else r.peak)) / factor, 3)
                                for r in items]},
        text=[r.bar_text() for r in items],
        textposition="outside",
        hovertemplate="%{x}: %{y:.2f} " + unit + "<extra></extra>",
    ))
    if device_total:
        fig.add_hline(y=device_total / factor, line={"color": COLORS["oom"], "dash": "dash"},
                      annotation_text=f"device {format_bytes(device_total)}")
    fig.update_layout(title={"text": title or "peak reserved memory per configuration"},
                      yaxis={"title": {"text": unit}}, template="plotly_white", height=320,
                      margin={"l": 55, "r": 20, "t": 45, "b": 60})
    return fig


def reserved_overlay_chart(runs: Sequence[ConfigRun | tuple[Any, ...]], *, title: str | None = None,
                           x_title: str = "allocator event") -> Any:
    """Reserved memory over time, one line per configuration; an ✕ where a run ran out of memory."""
    go = _go()
    items = [ConfigRun(*r) for r in runs]
    factor, unit = byte_unit(max([r.top for r in items] + [max(r.ys, default=0) for r in items] + [1]))
    fig = go.Figure()
    for run in items:
        fig.add_trace(go.Scatter(x=list(run.xs), y=_round(list(run.ys), factor), mode="lines",
                                 name=run.label,
                                 hovertemplate=f"{run.label}: %{{y:.3f}} {unit}<extra></extra>"))
        if run.runs_out and run.xs:
            fig.add_trace(go.Scatter(x=[run.xs[-1]], y=_round([run.ys[-1]], factor),
                                     mode="markers", showlegend=False, name=f"{run.label} OOM",
                                     marker={"symbol": "x", "size": 12, "color": COLORS["oom"]},
                                     hovertemplate=f"{run.label}: out of memory<extra></extra>"))
    fig.update_layout(title={"text": title or "reserved memory per configuration"},
                      xaxis={"title": {"text": x_title}}, yaxis={"title": {"text": unit}},
                      template="plotly_white", height=330, hovermode="x unified",
                      margin={"l": 55, "r": 20, "t": 45, "b": 40})
    return fig
