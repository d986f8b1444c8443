"""The segment map as inline SVG: one row per segment, bars coloured by block state.

Works in every front end (no plotly, no script): the OOM view uses it, and it is
what stands in for PyTorch's own viewer when that page cannot load its script.
Hover text is each piece's ``<title>``; everything is escaped.
"""

from __future__ import annotations

from html import escape, unescape

from allocconf_widget.views.charts.segment_map import SegmentMap

_ROW_H, _GAP, _LABEL_W = 14, 3, 170


def _strip_tags(text: str) -> str:
    """The piece's hover (escaped HTML with <br>/<b>) as plain text, escaped again on output."""
    return unescape(text.replace("<br>", "\n").replace("<b>", "").replace("</b>", ""))


def segment_map_svg(smap: SegmentMap, width: int = 720) -> str:
    """Rows scaled to the largest segment; a legend with the byte total per state."""
    sizes: dict[str, int] = {}
    for piece in smap.pieces:
        sizes[piece.row] = max(sizes.get(piece.row, 0), piece.offset + piece.size)
    largest = max(sizes.values(), default=1) or 1
    plot_w = width - _LABEL_W - 10
    height = len(smap.rows) * (_ROW_H + _GAP) + 34
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' class='allocconf-segment-map' "
             f"width='{width}' height='{height}' style='font:10px sans-serif'>"]
    index = {row: i for i, row in enumerate(smap.rows)}
    for row, i in index.items():
        y = 4 + i * (_ROW_H + _GAP)
        parts.append(f"<text x='{_LABEL_W - 6}' y='{y + 11}' text-anchor='end'>"
                     f"{escape(row[:34])}</text>")
        parts.append(f"<rect x='{_LABEL_W}' y='{y}' width='{plot_w * sizes.get(row, 0) / largest:.1f}' "
                     f"height='{_ROW_H}' fill='none' stroke='#ccc'/>")
    for piece in smap.pieces:
        y = 4 + index[piece.row] * (_ROW_H + _GAP)
        x = _LABEL_W + plot_w * piece.offset / largest
        w = max(0.5, plot_w * piece.size / largest)
        parts.append(f"<rect x='{x:.1f}' y='{y}' width='{w:.1f}' height='{_ROW_H}' "
                     f"fill='{smap.state_color(piece.state)}'><title>"
                     f"{escape(_strip_tags(piece.hover), quote=False)}</title></rect>")
    y = height - 8
    x = 4
    for state, total in smap.totals.items():
        if not total:
            continue
        label = f"{smap.state_label(state)} {_fmt(total)}"
        parts.append(f"<rect x='{x}' y='{y - 8}' width='9' height='9' "
                     f"fill='{smap.state_color(state)}'/>")
        parts.append(f"<text x='{x + 12}' y='{y}'>{escape(label)}</text>")
        x += 20 + 6 * len(label)
    parts.append("</svg>")
    return "".join(parts)


def _fmt(size: int) -> str:
    from allocconf_widget.core.units import format_bytes

    return format_bytes(size)
