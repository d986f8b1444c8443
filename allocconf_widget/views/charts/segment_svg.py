"""The monitor's segment map: the figures and the legend printed, then the bars.

The figures a reader needs are printed, not hidden in tooltips: a line with
segments / reserved / allocated / free in segments / largest free block /
external fragmentation (docs/metrics.md), a legend with every block state's
colour and byte total (zero totals too, so the reader knows the state exists),
and the bars of :func:`allocconf_widget.views.charts.segment_map_svg.segment_map_svg`
(one per segment, one byte scale, each labelled with its pool, size and allocated
share; beyond ``max_rows`` the smallest summed into one row at its own scale).
Pure string building; bounded by ``max_rows`` and the map's ``max_pieces``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from allocconf_widget.core.memory.metrics import segment_metrics
from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.charts.segment_map import STATES, build_segment_map
from allocconf_widget.views.charts.segment_map_svg import segment_map_svg
from allocconf_widget.views.charts.style import STATE_COLORS, STATE_LABELS

_FONT = "font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:11px"


def _legend(totals: Mapping[str, int]) -> str:
    items = []
    for state in STATES:
        items.append(
            f'<span class="allocconf-segmap-legend-item" style="margin-right:14px;white-space:nowrap">'
            f'<span style="display:inline-block;width:12px;height:10px;background:{STATE_COLORS[state]};'
            f'vertical-align:middle;margin-right:4px;border:1px solid rgba(0,0,0,0.15)"></span>'
            f"{escape(STATE_LABELS[state])} <b>{escape(format_bytes(totals.get(state, 0)))}</b></span>")
    return f'<div class="allocconf-segmap-legend" style="line-height:1.8">{"".join(items)}</div>'


def _figures(segments: Sequence[Mapping[str, Any]], moment: str) -> str:
    metrics = segment_metrics(segments)  # type: ignore[arg-type]
    reserved = metrics.reserved_bytes
    share = metrics.allocated_bytes / reserved if reserved else 0.0
    parts = [
        f"{moment}: {metrics.segment_count} segments",
        f"{format_bytes(reserved)} reserved",
        f"{format_bytes(metrics.allocated_bytes)} allocated ({share:.0%})",
        f"{format_bytes(metrics.inactive_bytes)} free in segments",
        f"largest free block {format_bytes(metrics.largest_free_block_bytes)}",
        f"external fragmentation {metrics.external_fragmentation:.0%}",
    ]
    return f'<div class="allocconf-segmap-figures">{escape(" · ".join(parts))}</div>'


def segment_panel_html(
    snapshot: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    device: int | None = 0,
    title: str | None = None,
    width: int = 760,
    max_rows: int = 16,
    moment: str = "in this snapshot",
) -> str:
    """The segments of ``device``: headline figures, legend, labelled bars, caption.

    ``moment`` opens the figures ("in the end-of-run snapshot"): the numbers belong to the
    snapshot, not to the monitor's last sample shown above them.
    """
    smap = build_segment_map(snapshot, device=device, max_rows=max_rows, max_pieces=600)
    raw = snapshot.get("segments", []) if isinstance(snapshot, Mapping) else snapshot
    segments = [s for s in raw if device is None or s.get("device", 0) == device]
    style = f"color:var(--jp-ui-font-color1,#333);{_FONT}"
    head = f'<div style="font-weight:600">{escape(title)}</div>' if title else ""
    if not smap.rows:
        return f'<div class="allocconf-segmap" style="{style}">{head}no segments</div>'
    bars = segment_map_svg(smap, width, legend=False, label_share=True)
    summed = any(row.startswith("+") for row in smap.rows)
    note = (f'<div style="opacity:0.75">{escape(smap.caption)}; bars share one byte scale '
            "(a segment's length is its size)"
            + ("; the summed row of smaller segments is drawn to its own scale" if summed else "")
            + "</div>")
    return (f'<div class="allocconf-segmap" style="{style}">{head}{_figures(segments, moment)}'
            f"{_legend(smap.totals)}{bars}{note}</div>")
