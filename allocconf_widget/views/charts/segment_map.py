"""The segment map as plain data: rows of pieces (block runs) with hover text, bounded in size.

A snapshot can hold 2,000 segments and 20,000 blocks (docs/internals/allocator_facts.md §8); one bar
per block would make a figure of megabytes. So: adjacent blocks of one state
become one piece; beyond ``max_rows`` segments the smallest are summed into a
single row; a row with more pieces than its share of ``max_pieces`` is cut into
equal byte ranges, each drawn as its per-state byte totals. Byte totals per
state and per row are exact at every level of aggregation.

Pure Python (no plotly): :mod:`allocconf_widget.views.charts.segment_map_svg` draws it as SVG bars.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from allocconf_widget.core.memory.metrics import pool_label
from allocconf_widget.core.memory.sites import frame_site
from allocconf_widget.core.memory.snapshot import ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE, INACTIVE
from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.charts.style import STATE_COLORS, STATE_LABELS

STATES = (ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE, INACTIVE)


@dataclass(frozen=True, slots=True)
class Piece:
    """One bar: ``size`` bytes of ``state`` at ``offset`` in the row's segment."""

    row: str
    state: str
    offset: int
    size: int
    hover: str


@dataclass(frozen=True)
class SegmentMap:
    """Rows (one per shown segment, plus maybe a summary row) and their pieces."""

    rows: list[str]
    pieces: list[Piece]
    segments: int
    blocks: int
    caption: str
    totals: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def state_label(state: str) -> str:
        return STATE_LABELS.get(state, state)

    @staticmethod
    def state_color(state: str) -> str:
        return STATE_COLORS.get(state, "#999999")


# ----------------------------------------------------------------- frames


def _frames_of(block: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    frames = block.get("frames")
    if frames:
        return list(frames)
    history = block.get("history")  # torch 2.0 snapshots
    if history:
        return list(history[0].get("frames") or [])
    return []


#: The site of an allocation: the first frame outside torch (one rule for the map and the OOM view).
allocation_site = frame_site


# ----------------------------------------------------------------- runs and bins


@dataclass
class _Run:
    state: str
    offset: int
    size: int = 0
    count: int = 0
    requested: int = 0
    site: str | None = None
    biggest: int = 0


def _state(block: Mapping[str, Any]) -> str:
    state = str(block.get("state", INACTIVE))
    return state if state in STATES else ACTIVE_PENDING_FREE


def _runs(blocks: Iterable[Mapping[str, Any]]) -> list[_Run]:
    runs: list[_Run] = []
    offset = 0
    for block in blocks:
        state, size = _state(block), int(block.get("size", 0))
        if not runs or runs[-1].state != state:
            runs.append(_Run(state, offset))
        run = runs[-1]
        run.size += size
        run.count += 1
        if state != INACTIVE:
            run.requested += int(block.get("requested_size", size) or 0)
            if size > run.biggest:
                run.biggest = size
                run.site = allocation_site(_frames_of(block)) or run.site
        offset += size
    return runs


def _run_hover(run: _Run, seg_text: str) -> str:
    what = STATE_LABELS[run.state]
    lines = [f"<b>{escape(what)}</b> {format_bytes(run.size)}"
             + (f" in {run.count} blocks" if run.count > 1 else "")]
    if run.state != INACTIVE and run.requested:
        lines.append(f"requested {format_bytes(run.requested)}")
    lines.append(f"offset {format_bytes(run.offset)}")
    if run.site:
        lines.append(f"allocated at {escape(run.site)}")
    lines.append(seg_text)
    return "<br>".join(lines)


def _binned(runs: list[_Run], bins: int, row: str, seg_text: str) -> list[Piece]:
    """Cut a long row into ``bins`` equal byte ranges; draw each as its per-state totals."""
    total = sum(r.size for r in runs) or 1
    width = -(-total // bins)
    sums: list[dict[str, int]] = [dict.fromkeys(STATES, 0) for _ in range(bins)]
    counts = [0] * bins
    for run in runs:
        start, end = run.offset, run.offset + run.size
        counts[min(bins - 1, start // width)] += run.count
        while start < end:
            index = min(bins - 1, start // width)
            stop = min(end, (index + 1) * width)
            sums[index][run.state] += stop - start
            start = stop
    pieces = []
    for index, per_state in enumerate(sums):
        offset = index * width
        detail = ", ".join(f"{STATE_LABELS[s]} {format_bytes(v)}" for s, v in per_state.items() if v)
        hover = (f"bytes {format_bytes(index * width)}–{format_bytes(min(total, (index + 1) * width))}"
                 f" ({counts[index]} block runs start here)<br>{detail}<br>{seg_text}")
        for state in STATES:
            if per_state[state]:
                pieces.append(Piece(row, state, offset, per_state[state], hover))
                offset += per_state[state]
    return pieces


# ----------------------------------------------------------------- segments to rows


def _segments(snapshot: Mapping[str, Any] | Sequence[Mapping[str, Any]],
              device: int | None) -> list[Mapping[str, Any]]:
    segments = snapshot.get("segments", []) if isinstance(snapshot, Mapping) else snapshot
    return [s for s in segments if device is None or s.get("device", 0) == device]


def _summary_row(rest: Sequence[Mapping[str, Any]], row: str) -> list[Piece]:
    per_state = dict.fromkeys(STATES, 0)
    for segment in rest:
        for block in segment.get("blocks", []):
            per_state[_state(block)] += int(block.get("size", 0))
    total = sum(int(s.get("total_size", 0)) for s in rest)
    detail = ", ".join(f"{STATE_LABELS[s]} {format_bytes(v)}" for s, v in per_state.items() if v)
    hover = f"{len(rest)} smaller segments, {format_bytes(total)} in all<br>{detail}"
    pieces, offset = [], 0
    for state in STATES:
        if per_state[state]:
            pieces.append(Piece(row, state, offset, per_state[state], hover))
            offset += per_state[state]
    return pieces


def build_segment_map(
    snapshot: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    device: int | None = 0,
    max_rows: int = 60,
    max_pieces: int = 1500,
) -> SegmentMap:
    """Aggregate a snapshot's segments (of ``device``; None = all) into at most ~``max_pieces`` bars."""
    segments = _segments(snapshot, device)
    order = sorted(segments, key=lambda s: (pool_label(s), s.get("address", 0)))  # type: ignore[arg-type]
    shown, rest = order, []
    if len(order) > max_rows:
        keep = {id(s) for s in sorted(order, key=lambda s: -int(s.get("total_size", 0)))[: max_rows - 1]}
        shown = [s for s in order if id(s) in keep]
        rest = [s for s in order if id(s) not in keep]
    share = max(3, max_pieces // max(1, len(shown) + (1 if rest else 0)))
    rows: list[str] = []
    pieces: list[Piece] = []
    for index, segment in enumerate(shown):
        size = int(segment.get("total_size", 0))
        pool = pool_label(segment)  # type: ignore[arg-type]
        row = f"#{index} {pool} {format_bytes(size)}"
        rows.append(row)
        seg_text = (f"segment #{index}: {pool}, {format_bytes(size)}, stream "
                    f"{segment.get('stream', 0):#x}{', expandable' if segment.get('is_expandable') else ''}")
        runs = _runs(segment.get("blocks", []))
        if len(runs) <= share:
            pieces += [Piece(row, r.state, r.offset, r.size, _run_hover(r, seg_text)) for r in runs]
        else:
            pieces += _binned(runs, max(1, share // 3), row, seg_text)
    if rest:
        row = f"+{len(rest)} smaller segments"
        rows.append(row)
        pieces += _summary_row(rest, row)
    totals = dict.fromkeys(STATES, 0)
    for piece in pieces:
        totals[piece.state] += piece.size
    blocks = sum(len(s.get("blocks", [])) for s in segments)
    reserved = sum(int(s.get("total_size", 0)) for s in segments)
    caption = (f"{len(segments)} segments, {blocks:,} blocks, {format_bytes(reserved)} reserved"
               + (f" (largest {len(shown)} shown)" if rest else ""))
    return SegmentMap(rows, pieces, len(segments), blocks, caption, totals)
