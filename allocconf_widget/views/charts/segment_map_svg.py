"""The segment map as inline SVG: one row per segment, bars coloured by block state.

Works in every front end (no plotly, no script): the OOM view uses it, the monitor's
Segments button too (with ``label_share``: each row says how much of it is allocated,
and the legend is printed above by :mod:`allocconf_widget.views.charts.segment_svg`),
and it is what stands in for PyTorch's own viewer when that page cannot load its script.
Hover text is each piece's ``<title>``; everything is escaped.
"""

from __future__ import annotations

from html import escape, unescape

from allocconf_widget.views.charts.segment_map import SegmentMap

_ROW_H, _GAP, _LABEL_W = 11, 2, 170


def _strip_tags(text: str) -> str:
    """The piece's hover (escaped HTML with <br>/<b>) as plain text, escaped again on output."""
    return unescape(text.replace("<br>", "\n").replace("<b>", "").replace("</b>", ""))


def _share_label(row: str, allocated: int, size: int) -> str:
    """``#<n> <pool> <size> · <share> allocated``, the default pool's name left out."""
    name = row.replace(" smaller segments", " smaller, summed") if row.startswith("+") else row
    share = f"{allocated / size:.0%} allocated" if size else "empty"
    return f"{name.replace('default/', '')} · {share}"


def segment_map_svg(smap: SegmentMap, width: int = 720, *, legend: bool = True,
                    label_share: bool = False) -> str:
    """Rows scaled to the largest segment; a legend with the byte total per state.

    ``legend=False`` leaves the legend to the caller; ``label_share`` labels each row
    with its allocated share (and gives the labels more room).
    """
    label_w = 230 if label_share else _LABEL_W
    sizes: dict[str, int] = {}
    allocated: dict[str, int] = {}
    for piece in smap.pieces:
        sizes[piece.row] = max(sizes.get(piece.row, 0), piece.offset + piece.size)
        if piece.state == "active_allocated":
            allocated[piece.row] = allocated.get(piece.row, 0) + piece.size
    # a summary row ("+N smaller segments") is drawn to its own scale: it is a sum, not a segment
    summary = {row for row in sizes if row.startswith("+")}
    largest = max((v for row, v in sizes.items() if row not in summary), default=1) or 1
    scale = {row: (sizes[row] if row in summary else largest) or 1 for row in sizes}
    plot_w = width - label_w - 10
    height = len(smap.rows) * (_ROW_H + _GAP) + (34 if legend else 8)
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' class='allocconf-segment-map' "
             f"viewBox='0 0 {width} {height}' width='100%' "
             f"style='font:10px sans-serif;max-width:{width}px'>"]
    index = {row: i for i, row in enumerate(smap.rows)}
    for row, i in index.items():
        y = 4 + i * (_ROW_H + _GAP)
        text = (_share_label(row, allocated.get(row, 0), sizes.get(row, 0)) if label_share
                else row[:34])
        parts.append(f"<text x='{label_w - 6}' y='{y + 9}' text-anchor='end'>"
                     f"{escape(text)}</text>")
        width_of_row = plot_w * sizes.get(row, 0) / scale.get(row, largest)
        parts.append(f"<rect x='{label_w}' y='{y}' width='{width_of_row:.1f}' "
                     f"height='{_ROW_H}' fill='none' stroke='#ccc'/>")
    for piece in smap.pieces:
        y = 4 + index[piece.row] * (_ROW_H + _GAP)
        row_scale = scale.get(piece.row, largest)
        x = label_w + plot_w * piece.offset / row_scale
        w = max(0.5, plot_w * piece.size / row_scale)
        parts.append(f"<rect x='{x:.1f}' y='{y}' width='{w:.1f}' height='{_ROW_H}' "
                     f"fill='{smap.state_color(piece.state)}'><title>"
                     f"{escape(_strip_tags(piece.hover), quote=False)}</title></rect>")
    y = height - 8
    x = 4
    for state, total in smap.totals.items():
        if not total or not legend:
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
