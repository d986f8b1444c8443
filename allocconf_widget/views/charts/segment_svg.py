"""The monitor's segment map as inline SVG: one bar per segment, blocks coloured by state.

The figures a reader needs are printed, not hidden in tooltips: a legend with
each block state's colour and byte total, a line with reserved / allocated /
free-in-segments / largest free block / external fragmentation (docs/metrics.md),
and, beside every bar, the segment's pool, size and how much of it is allocated.
Bars share one byte scale, so a 2 MiB small-pool segment looks small next to a
1 GiB one. Beyond ``max_rows`` segments the smallest are summed into one row
(drawn at its own scale and labelled so). Pure string building, like
:mod:`allocconf_widget.views.charts.svg`; bounded by ``max_rows`` and the
segment map's ``max_pieces``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from allocconf_widget.core.memory.metrics import segment_metrics
from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.charts.segment_map import STATES, build_segment_map
from allocconf_widget.views.charts.style import STATE_COLORS, STATE_LABELS

_FONT = "font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:11px"
_LABEL_W = 250
_ROW_H = 16


def _num(value: float) -> str:
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _legend(totals: Mapping[str, int]) -> str:
    items = []
    for state in STATES:
        items.append(
            f'<span class="allocconf-segmap-legend-item" style="margin-right:14px;white-space:nowrap">'
            f'<span style="display:inline-block;width:12px;height:10px;background:{STATE_COLORS[state]};'
            f'vertical-align:middle;margin-right:4px;border:1px solid rgba(0,0,0,0.15)"></span>'
            f"{escape(STATE_LABELS[state])} <b>{escape(format_bytes(totals.get(state, 0)))}</b></span>")
    return f'<div class="allocconf-segmap-legend" style="line-height:1.8">{"".join(items)}</div>'


def _figures(segments: Sequence[Mapping[str, Any]]) -> str:
    metrics = segment_metrics(segments)  # type: ignore[arg-type]
    reserved = metrics.reserved_bytes
    share = metrics.allocated_bytes / reserved if reserved else 0.0
    parts = [
        f"{metrics.segment_count} segments",
        f"{format_bytes(reserved)} reserved",
        f"{format_bytes(metrics.allocated_bytes)} allocated ({share:.0%})",
        f"{format_bytes(metrics.inactive_bytes)} free in segments",
        f"largest free block {format_bytes(metrics.largest_free_block_bytes)}",
        f"external fragmentation {metrics.external_fragmentation:.0%}",
    ]
    return (f'<div class="allocconf-segmap-figures">{escape(" · ".join(parts))}</div>')


def _row_label(row: str, used: int, total: int) -> str:
    summed = row.startswith("+")
    share = f"{used / total:.0%} allocated" if total else "empty"
    name = row.replace(" smaller segments", " smaller, summed") if summed else row
    return f"{name.replace('default/', '')} · {share}"


def segment_map_svg(
    snapshot: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    device: int | None = 0,
    title: str | None = None,
    width: int = 760,
    max_rows: int = 16,
) -> str:
    """The segments of ``device`` as labelled bars with a legend and the headline figures."""
    smap = build_segment_map(snapshot, device=device, max_rows=max_rows, max_pieces=600)
    raw = snapshot.get("segments", []) if isinstance(snapshot, Mapping) else snapshot
    segments = [s for s in raw if device is None or s.get("device", 0) == device]
    style = f"color:var(--jp-ui-font-color1,#333);{_FONT}"
    head = f'<div style="font-weight:600">{escape(title)}</div>' if title else ""
    if not smap.rows:
        return f'<div class="allocconf-segmap" style="{style}">{head}no segments</div>'
    per_row: dict[str, dict[str, int]] = {row: dict.fromkeys(STATES, 0) for row in smap.rows}
    for piece in smap.pieces:
        per_row[piece.row][piece.state] = per_row[piece.row].get(piece.state, 0) + piece.size
    sizes = {row: sum(states.values()) for row, states in per_row.items()}
    scale_bytes = max([size for row, size in sizes.items() if not row.startswith("+")] or [1]) or 1
    bar_w = width - _LABEL_W - 6
    body: list[str] = []
    for index, row in enumerate(smap.rows):
        y = 2 + index * _ROW_H
        total = sizes[row] or 1
        own_scale = row.startswith("+") and total > scale_bytes
        px_per_byte = bar_w / (total if own_scale else scale_bytes)
        used = per_row[row].get(STATES[0], 0)
        body.append(f'<text x="{_LABEL_W - 4}" y="{y + 11}" text-anchor="end">'
                    f"{escape(_row_label(row, used, sizes[row]))}</text>")
        body.append(f'<rect x="{_LABEL_W}" y="{y + 1}" width="{_num(max(1.0, sizes[row] * px_per_byte))}" '
                    f'height="{_ROW_H - 3}" fill="none" stroke="currentColor" stroke-opacity="0.25"/>')
        for piece in (p for p in smap.pieces if p.row == row):
            x = _LABEL_W + piece.offset * px_per_byte
            w = max(0.3, piece.size * px_per_byte)
            hover = piece.hover.replace("<br>", "\n").replace("<b>", "").replace("</b>", "")
            body.append(f'<rect x="{_num(x)}" y="{y + 1}" width="{_num(w)}" height="{_ROW_H - 3}" '
                        f'fill="{STATE_COLORS[piece.state]}"><title>{escape(hover)}</title></rect>')
    height = 4 + len(smap.rows) * _ROW_H
    svg = (f'<svg viewBox="0 0 {width} {height}" width="100%" style="max-width:{width}px" '
           f'fill="currentColor" xmlns="http://www.w3.org/2000/svg">{"".join(body)}</svg>')
    note = (f'<div style="opacity:0.75">{escape(smap.caption)}; bars share one byte scale '
            "(a segment's length is its size)</div>")
    return (f'<div class="allocconf-segmap" style="{style}">{head}{_figures(segments)}'
            f"{_legend(smap.totals)}{svg}{note}</div>")
