"""Where a recorded cell starts in a trace that holds history from before it.

The recorder takes ``memory_snapshot()`` when a ``%%allocconf record`` cell starts and marks
that moment (:data:`CELL_START_KEY`); the flight recorder's ring buffer and a live monitor's
own ``snapshot`` entries share the trace, so the cell's first entry is found by the mark.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from allocconf_widget.core.numbers import int_or_zero

#: what the recorder noted about its start snapshot: ``started_us`` / ``ended_us`` (epoch µs,
#: ``time.time()``, the clock torch stamps entries with, just before and after the call) and
#: ``token`` (the ``user_metadata`` torch 2.11+ stamps on that entry, when it could be set)
CELL_START_KEY = "allocconf_cell_start"


#: how far torch's approximate clock may stand before ``time.time()`` (it is TSC based)
CLOCK_SLACK_US = 50_000


#: and after: kept short, so a monitor's snapshot just after the cell began is not taken
CLOCK_SLACK_AFTER_US = 1_000


@dataclass(frozen=True)
class CellStart:
    """When and how the recorder marked a cell's start (see :data:`CELL_START_KEY`)."""

    started_us: float
    ended_us: float
    token: str | None = None


def recorded_cell_start(snapshot: Mapping[str, Any]) -> CellStart | None:
    """The recorder's cell-start mark, if the snapshot has a well-formed one."""
    raw = snapshot.get(CELL_START_KEY)
    if not isinstance(raw, Mapping):
        return None
    started, ended, token = raw.get("started_us"), raw.get("ended_us"), raw.get("token")
    if not (_finite(started) and _finite(ended)):
        return None
    return CellStart(float(started), max(float(started), float(ended)),
                     token if isinstance(token, str) and token else None)


def _finite(value: Any) -> TypeGuard[int | float]:
    """A real number a float can hold (an int of 400 digits is not: ``float()`` overflows)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def cell_start_index(entries: Sequence[Any], *, start: CellStart | None,
                     active_bytes: int | None) -> int:
    """Index of the recorded cell's first entry: events before it are in the start state.

    The recorder takes ``memory_snapshot()`` at the cell's start, which leaves a
    ``snapshot`` entry whose size is the active bytes at that moment. Whatever came
    before it (the flight recorder keeps history since CUDA started in the same ring
    buffer; a live monitor leaves ``snapshot`` entries of its own, same size included)
    is not the cell's. In order of trust:

    * the ``snapshot`` entry stamped with the recorder's ``token`` (torch 2.11+);
    * the last ``snapshot`` entry of size ``active_bytes`` stamped between the times the
      recorder noted around its call (with :data:`CLOCK_SLACK_US` before and
      :data:`CLOCK_SLACK_AFTER_US` after); else the first entry after that call;
    * without a mark (a recording saved by an older release): the first ``snapshot``
      entry anywhere whose size is ``active_bytes``; else 0 (replay everything).

    One pass over the entries, however long the history before the cell.
    """
    def is_snapshot(e: Any) -> bool:
        return isinstance(e, Mapping) and e.get("action") == "snapshot" and (
            active_bytes is None or int_or_zero(e.get("size")) == active_bytes)

    if start is not None and start.token is not None:
        for idx, e in enumerate(entries):
            if isinstance(e, Mapping) and e.get("user_metadata") == start.token and (
                    e.get("action") == "snapshot"):
                return idx
    timed = bool(entries) and isinstance(entries[0], Mapping) and _finite(entries[0].get("time_us"))
    if start is not None and timed:
        low, high = start.started_us - CLOCK_SLACK_US, start.ended_us + CLOCK_SLACK_AFTER_US
        chosen = None
        after = None
        for idx, e in enumerate(entries):
            t = e.get("time_us") if isinstance(e, Mapping) else None
            if not _finite(t):
                continue
            if low <= t <= high and is_snapshot(e):
                chosen = idx
            if after is None and t > start.ended_us:
                after = idx
            if t > high:
                break
        if chosen is not None:
            return chosen
        return after if after is not None else len(entries)
    if active_bytes is None:
        return 0
    return next((idx for idx, e in enumerate(entries) if is_snapshot(e)), 0)


def cell_traces(traces: Sequence[Any], initial_segments: Sequence[Any] | None,
                start: CellStart) -> list[Any]:
    """Each device's trace from the recorded cell's first entry on (:func:`cell_start_index`).

    ``initial_segments``: the recorder's start snapshot (None when CUDA was not up, so no
    ``snapshot`` entry was left). The recorder keeps only this, so a recording holds the
    cell and nothing of the history before it, and its event count is the cell's.
    """
    out: list[Any] = []
    for device, entries in enumerate(traces):
        if not isinstance(entries, list):
            out.append(entries)
            continue
        active = None
        if initial_segments is not None:
            active = sum(int_or_zero(seg.get("active_size")) for seg in initial_segments
                         if isinstance(seg, Mapping) and int_or_zero(seg.get("device")) == device)
        out.append(entries[cell_start_index(entries, start=start, active_bytes=active):])
    return out
