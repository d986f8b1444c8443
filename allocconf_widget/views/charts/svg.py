"""The timeline as inline SVG inside an HTML string.

This is the renderer for front ends where plotly's ``FigureWidget`` is
unreliable or absent (Colab, VS Code; docs/internals/notebook_facts.md §4, §6): a core
``ipywidgets.HTML`` widget whose ``value`` is this string updates live, even
from a background thread, with no plotly.js and no custom widget manager.
Pure string building: no plotly, no ipywidgets here.

Size is bounded by the payload (≤ N points per series, ≤ M markers), with
coordinates rounded to 0.1 px, so one update stays a few tens of KB however
long the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape

from allocconf_widget.core.memory.timeline import Marker, RenderPayload
from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.charts.style import (
    BYTE_SERIES,
    COLORS,
    HELP,
    LABELS,
    RATIO_SERIES,
    byte_unit,
    format_tick,
    format_value,
    format_x,
    nice_ticks,
)

_FONT = "font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:11px"
_DASH = {"active": "4 2", "cached_share": "5 3", "non_pytorch": "2 2"}
_DRAW_ORDER = ("non_pytorch", "active", "reserved", "allocated")  # allocated on top of active
_SPARSE = frozenset({"fragmentation"})
"""Series measured only on some samples (a snapshot's): drawn through their points, gaps joined."""


@dataclass(frozen=True)
class _Frame:
    """Maps data coordinates to pixels for one plot."""

    width: int
    height: int
    left: int
    right: int
    top: int
    bottom: int
    x0: float
    x1: float
    y_max: float

    @property
    def plot_w(self) -> float:
        return self.width - self.left - self.right

    @property
    def plot_h(self) -> float:
        return self.height - self.top - self.bottom

    def px(self, x: float) -> float:
        span = self.x1 - self.x0 or 1.0
        return self.left + (x - self.x0) / span * self.plot_w

    def py(self, y: float, y_max: float | None = None) -> float:
        top = (y_max if y_max is not None else self.y_max) or 1.0
        return self.top + self.plot_h * (1.0 - min(max(y / top, 0.0), 1.05))


def _num(value: float) -> str:
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _path(frame: _Frame, xs: Sequence[float], ys: Sequence[float | None], y_max: float,
          join_gaps: bool = False) -> str:
    """An SVG path through the points; gaps (None) start a new subpath unless ``join_gaps``."""
    parts: list[str] = []
    pen_down = False
    for x, y in zip(xs, ys, strict=True):
        if y is None:
            pen_down = pen_down and join_gaps
            continue
        parts.append(("L" if pen_down else "M") + f"{_num(frame.px(x))} {_num(frame.py(y, y_max))}")
        pen_down = True
    return "".join(parts)


def _series_paths(frame: _Frame, payload: RenderPayload, names: Iterable[str], y_max: float,
                  scale: float = 1.0) -> list[str]:
    out = []
    for name in names:
        ys = payload.series.get(name)
        if not ys or all(v is None for v in ys):
            continue
        scaled = [None if v is None else v * scale for v in ys]
        sparse = name in _SPARSE
        d = _path(frame, payload.x, scaled, y_max, join_gaps=sparse)
        dash = f' stroke-dasharray="{_DASH[name]}"' if name in _DASH else ""
        width = "2" if name in ("reserved", "allocated") else "1.3"
        dots = ""
        if sparse and sum(v is not None for v in scaled) <= 60:  # few measurements: show each one
            dots = "".join(f'<circle cx="{_num(frame.px(x))}" cy="{_num(frame.py(y, y_max))}" r="2"/>'
                           for x, y in zip(payload.x, scaled, strict=True) if y is not None)
            dots = f'<g fill="{COLORS[name]}">{dots}</g>'
        out.append(
            f'<path class="allocconf-series-{name}" d="{d}" fill="none" stroke="{COLORS[name]}" '
            f'stroke-width="{width}"{dash}>'
            f"<title>{escape(LABELS[name])}: {escape(HELP.get(name, ''))}</title></path>{dots}"
        )
    return out


def _markers(frame: _Frame, markers: Sequence[Marker]) -> list[str]:
    """Cell spans, idle gaps and OOMs. Their labels sit at the bottom of the plot, clear of the
    "peak reserved …" label at the top."""
    out = []
    top, bottom = frame.top, frame.height - frame.bottom
    for m in markers:
        x = frame.px(m.x)
        title = f"<title>{escape(m.label)}</title>"
        if m.kind == "cell" and m.x_end is not None:
            w = max(1.0, frame.px(m.x_end) - x)
            out.append(f'<rect x="{_num(x)}" y="{top}" width="{_num(w)}" height="{bottom - top}" '
                       f'fill="{COLORS["cell"]}">{title}</rect>')
        elif m.kind == "idle":
            w = max(2.0, frame.px(m.x_end if m.x_end is not None else m.x) - x)
            out.append(f'<g class="allocconf-idle"><rect x="{_num(x)}" y="{top}" width="{_num(w)}" '
                       f'height="{bottom - top}" fill="{COLORS["idle"]}"/>'
                       f'<text x="{_num(x + 3)}" y="{bottom - 4}" fill="{COLORS["note"]}">'
                       f"{escape(m.label)}</text>{title}</g>")
        elif m.kind == "oom":
            out.append(f'<g><line x1="{_num(x)}" x2="{_num(x)}" y1="{top}" y2="{bottom}" '
                       f'stroke="{COLORS["oom"]}" stroke-width="2"/>'
                       f'<text x="{_num(x + 3)}" y="{bottom - 4}" fill="{COLORS["oom"]}" '
                       f'font-weight="bold">OOM</text>{title}</g>')
        else:
            out.append(f'<line x1="{_num(x)}" x2="{_num(x)}" y1="{top}" y2="{bottom}" '
                       f'stroke="{COLORS["note"]}" stroke-dasharray="3 3">{title}</line>')
    return out


def _axes(frame: _Frame, payload: RenderPayload, unit: tuple[int, str], ratio_max: float) -> list[str]:
    factor, unit_name = unit
    out = []
    bottom = frame.height - frame.bottom
    right = frame.width - frame.right
    for tick in nice_ticks(0.0, frame.y_max / factor, 4):
        y = frame.py(tick * factor)
        out.append(f'<line x1="{frame.left}" x2="{right}" y1="{_num(y)}" y2="{_num(y)}" '
                   'stroke="currentColor" stroke-opacity="0.12"/>')
        out.append(f'<text x="{frame.left - 4}" y="{_num(y + 3.5)}" text-anchor="end">'
                   f"{format_tick(tick)}</text>")
    out.append(f'<text x="4" y="{frame.top + 8}">{unit_name}</text>')
    for tick in nice_ticks(0.0, ratio_max * 100, 2):
        y = frame.py(tick / 100, ratio_max)
        out.append(f'<text x="{right + 4}" y="{_num(y + 3.5)}" fill="{COLORS["cached_share"]}">'
                   f"{format_tick(tick)}%</text>")
    for tick in nice_ticks(frame.x0, frame.x1, 6):
        x = frame.px(tick)
        out.append(f'<line x1="{_num(x)}" x2="{_num(x)}" y1="{bottom}" y2="{bottom + 4}" '
                   'stroke="currentColor"/>')
        out.append(f'<text x="{_num(x)}" y="{bottom + 15}" text-anchor="middle">'
                   f"{escape(format_x(tick, payload.x_label))}</text>")
    out.append(f'<line x1="{frame.left}" x2="{right}" y1="{bottom}" y2="{bottom}" '
               'stroke="currentColor" stroke-opacity="0.5"/>')
    for x, _step in payload.steps:
        px = _num(frame.px(x))
        out.append(f'<line x1="{px}" x2="{px}" y1="{bottom - 3}" y2="{bottom}" '
                   'stroke="currentColor" stroke-opacity="0.35"/>')
    return out


def _peak_line(frame: _Frame, payload: RenderPayload) -> list[str]:
    peak = payload.peaks.get("reserved")
    if not peak:
        return []
    y = _num(frame.py(peak))
    return [f'<line x1="{frame.left}" x2="{frame.width - frame.right}" y1="{y}" y2="{y}" '
            f'stroke="{COLORS["reserved"]}" stroke-dasharray="1 3"/>',
            f'<text x="{frame.left + 4}" y="{_num(float(y) - 3)}" fill="{COLORS["reserved"]}">'
            f"peak reserved {escape(format_bytes(peak))}</text>"]


def _legend(payload: RenderPayload, names: Iterable[str]) -> str:
    items = []
    for name in names:
        if name not in payload.series or all(v is None for v in payload.series[name]):
            continue
        latest = payload.latest.get(name)
        items.append(
            f'<span title="{escape(HELP.get(name, ""))}" style="margin-right:12px;white-space:nowrap">'
            f'<span style="display:inline-block;width:14px;height:3px;background:{COLORS[name]};'
            f'vertical-align:middle;margin-right:4px"></span>{escape(LABELS[name])} '
            f"<b>{escape(format_value(name, latest))}</b></span>"
        )
    return f'<div style="line-height:1.8">{"".join(items)}</div>'


def timeline_svg(
    payload: RenderPayload,
    *,
    width: int = 760,
    height: int = 260,
    title: str | None = None,
    empty_text: str = "no samples yet",
) -> str:
    """The memory timeline of one device as an HTML fragment with an inline ``<svg>``.

    Left axis: reserved / allocated / active / non-PyTorch bytes; right axis:
    cached share and external fragmentation (%); shaded cell runs, red OOM
    lines, a dotted peak-reserved line and optimizer-step ticks on the x axis.
    """
    head = f'<div style="font-weight:600">{escape(title)}</div>' if title else ""
    style = f"color:var(--jp-ui-font-color1,#333);{_FONT}"
    if not payload.x:
        return (f'<div class="allocconf-svgchart" style="{style}">{head}'
                f'<div style="padding:24px;opacity:0.7">{escape(empty_text)}</div></div>')
    peak = max([payload.peaks.get(n) or 0.0 for n in BYTE_SERIES] + [1.0])
    top = nice_ticks(0.0, peak * 1.08, 4)
    unit = byte_unit(peak)
    y_max = max(peak * 1.08, (top[-1] if top else 0.0))
    span = payload.span or (payload.x[0], payload.x[-1])
    x0, x1 = span if span[1] > span[0] else (span[0] - 0.5, span[0] + 0.5)
    frame = _Frame(width, height, 46, 40, 8, 22, x0, x1, y_max)
    ratio_max = 1.0
    body = [
        *_markers(frame, payload.markers),
        *_axes(frame, payload, unit, ratio_max),
        *_series_paths(frame, payload, _DRAW_ORDER, y_max),
        *_series_paths(frame, payload, RATIO_SERIES, ratio_max),
        *_peak_line(frame, payload),
    ]
    svg = (f'<svg viewBox="0 0 {width} {height}" width="100%" style="max-width:{width}px" '
           f'fill="currentColor" xmlns="http://www.w3.org/2000/svg">{"".join(body)}</svg>')
    return (f'<div class="allocconf-svgchart" style="{style}">{head}{svg}'
            f"{_legend(payload, (*BYTE_SERIES, *RATIO_SERIES))}</div>")
