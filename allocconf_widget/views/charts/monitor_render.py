"""The monitor's chart back ends (inline SVG or plotly ``FigureWidget``) and its status text.

Which renderer works where (docs/internals/notebook_facts.md §4, §6):

==================  ==================  =============================================
front end           ``renderer="auto"``  why
==================  ==================  =============================================
JupyterLab / NB 7   ``figurewidget``     measured live from a thread; 5 MB bundle once
Colab               ``svg``              FigureWidget and plotly-in-Output fail there
VS Code             ``svg``              anywidget model loading is intermittent there
nbclient/papermill  ``svg``              nobody watches; no 5 MB widget state saved
terminal / plain    ``svg``              nothing renders widgets; the magic prints text
==================  ==================  =============================================

``figurewidget`` falls back to ``svg`` (with the reason in the status line)
when plotly/anywidget cannot build one. Both back ends take the same bounded
:class:`~allocconf_widget.core.memory.timeline.RenderPayload`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from allocconf_widget.adapters.frontend import Frontend
from allocconf_widget.app.monitor import MonitorRun
from allocconf_widget.core.memory.timeline import RenderPayload
from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.charts.style import format_value, format_x

RENDERERS = ("auto", "figurewidget", "svg")
SVG_POINTS = 400
FIGURE_POINTS = 400


def choose_renderer(requested: str, frontend: Frontend) -> str:
    """``figurewidget`` or ``svg`` for this front end (before trying to build it)."""
    if requested not in RENDERERS:
        raise ValueError(f"renderer={requested!r}: use one of {', '.join(RENDERERS)}")
    if requested != "auto":
        return requested
    return "figurewidget" if frontend is Frontend.JUPYTER else "svg"


class SvgChart:
    """A core ``ipywidgets.HTML`` whose value is the inline-SVG timeline (works everywhere)."""

    name = "svg"

    def __init__(self, title: str | None = None) -> None:
        import ipywidgets as widgets

        self.title = title
        self.widget = widgets.HTML(value="")
        self.widget.add_class("allocconf-monitor-chart")
        self.widget.add_class("allocconf-monitor-svg")

    def update(self, payload: RenderPayload, empty_text: str) -> None:
        from allocconf_widget.views.charts.svg import timeline_svg

        self.widget.value = timeline_svg(payload, title=self.title, empty_text=empty_text)


class FigureChart:
    """A plotly ``FigureWidget`` updated with one batched message per redraw."""

    name = "figurewidget"

    def __init__(self, payload: RenderPayload, title: str | None = None) -> None:
        import plotly.graph_objects as go

        from allocconf_widget.views.charts.figures import timeline_figure

        self.title = title
        self.widget = go.FigureWidget(timeline_figure(payload, title=title))
        self.widget.add_class("allocconf-monitor-chart")
        self.widget.add_class("allocconf-monitor-figure")

    def update(self, payload: RenderPayload, empty_text: str) -> None:
        from allocconf_widget.views.charts.figures import update_timeline_figure

        update_timeline_figure(self.widget, payload, title=self.title or (
            empty_text if not payload.x else None))


def build_chart(renderer: str, payload: RenderPayload, title: str | None) -> tuple[Any, str | None]:
    """The chart back end, and why ``figurewidget`` fell back to ``svg`` (or None)."""
    if renderer == "figurewidget":
        try:
            return FigureChart(payload, title), None
        except Exception as exc:  # ImportError (no anywidget/plotly), widget manager errors
            return SvgChart(title), f"plotly FigureWidget unavailable ({exc}); using the SVG chart"
    return SvgChart(title), None


# ----------------------------------------------------------------- status line


def _part(label: str, name: str, latest: Mapping[str, float | None]) -> str | None:
    value = latest.get(name)
    return None if value is None else f"{label} <b>{format_value(name, value)}</b>"


def status_html(
    *,
    payload: RenderPayload,
    state: str,
    overhead: Mapping[str, Any],
    sample: Any = None,
    note: str | None = None,
    link: tuple[str, str] | None = None,
) -> str:
    """One line: what is shown now, how it was measured, and what it cost (and a download link)."""
    from html import escape

    latest = payload.latest
    parts = [f"<b>{escape(state)}</b>"]
    # the moment these numbers belong to, said first: a segment map below is another moment
    # (a snapshot), and its "allocated" differs from the last sample's
    moment = ("last sample" if payload.latest_x is None
              else f"last sample, at {escape(format_x(payload.latest_x, payload.x_label))}")
    numbers = []
    for label, name in (("reserved", "reserved"), ("allocated", "allocated"),
                        ("non-PyTorch", "non_pytorch"), ("cached", "cached_share"),
                        ("fragmentation", "fragmentation")):
        text = _part(label, name, latest)
        if text:
            # torch's own high-water mark where the sample carries it: the samples' maximum
            # misses what rose and fell between two samples, so it would disagree with the
            # peak the What if? tab and the report give
            counter = getattr(sample, f"{name}_peak", None) if name in ("reserved", "allocated") else None
            if isinstance(counter, int) and counter > 0:
                text += f" (peak {format_bytes(counter)}, torch's counter)"
            elif name == "reserved" and payload.peaks.get("reserved"):
                text += f" (sampled peak {format_bytes(payload.peaks['reserved'] or 0)})"
            if name == "non_pytorch" and sample is not None and sample.non_pytorch_source == "device":
                text += " (device-wide)"
            numbers.append(text)
    if numbers:
        numbers[0] = f"{moment}: {numbers[0]}"
    parts += numbers
    parts.append(f"{payload.samples:,} samples")
    if overhead.get("steps"):
        parts.append(f"step {overhead['steps']:,}")
    if overhead.get("steps_note"):
        parts.append(f"<i>{escape(str(overhead['steps_note']))}</i>")
    interval = overhead.get("snapshot_interval_s")
    if interval:
        parts.append(f"snapshot every {interval:.1f} s ({overhead.get('last_snapshot_ms') or 0:.1f} ms)")
    mean = overhead.get("mean_sample_ms")
    if mean:
        parts.append(f"{mean:.2f} ms/sample")
    if sample is not None and getattr(sample, "degraded", None):
        parts.append(f"<i>{escape(sample.degraded)}</i>")
    if note:
        text = f"<i>{escape(note)}</i>"
        if link is not None:
            url, label = link
            text += (f' <a class="allocconf-download" href="{escape(url, quote=True)}" download '
                     f'target="_blank" style="text-decoration:underline">{escape(label)}</a>')
        parts.append(text)
    return " · ".join(parts)


def status_text(run: MonitorRun, device: int | None = None, note: str | None = None) -> str:
    """The status line of a monitor run as plain text (terminal IPython, logs): no widgets."""
    import re

    timeline = run.source.timeline
    devices = timeline.devices
    shown = device if device in devices else (devices[0] if devices else 0)
    html = status_html(payload=timeline.render(shown, max_points=SVG_POINTS), state=run.state_text(),
                       overhead=run.source.overhead(), sample=run.source.latest.get(device), note=note)
    return re.sub(r"<[^>]+>", "", html)
