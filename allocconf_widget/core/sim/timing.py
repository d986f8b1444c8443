"""The two extremes of GPU timing a recording allows, for frees that wait on other streams.

A block freed after ``record_stream`` (a ``free_requested`` whose ``free_completed`` comes
later) returns to the cache only once the other streams' work recorded on it is done, and
torch notices that at its next ``malloc``. When that happens depends on how far the GPU
lags the CPU, which differs from run to run: identical runs on an idle H200 peaked 1.45–1.85×
apart (issue 23). One replay in recorded order gives one of those runs. This module builds
two more orders of the same trace:

* **early**: every such free completes as soon as it is requested (the GPU had caught up:
  the consumer's last use is already done). Nothing can return a block sooner;
* **late**: every such free completes no earlier than the recording shows, and as late as
  the *largest* delay the recording shows for any of them (``L`` = the longest time from a
  request to its completion): the GPU is taken to lag by that much throughout. A completion
  never moves past the next allocation of the same address (which proves it had completed).

The replay of the three orders gives ``[low, high]`` around the point prediction
(:attr:`.result.SimResult.peak_reserved_range`). The late bound rests on the recording: a
run whose GPU lagged further behind than any moment of the recorded one can peak higher.

Standard library only.
"""

from __future__ import annotations

import dataclasses
from array import array
from bisect import bisect_left
from itertools import accumulate
from typing import TYPE_CHECKING

from allocconf_widget.core.sim.trace import OP_ALLOC, OP_FREE, OP_FREE_COMPLETED, OP_FREE_REQUESTED

if TYPE_CHECKING:
    from allocconf_widget.core.sim.trace import Trace


@dataclasses.dataclass(frozen=True)
class TimingVariants:
    """The trace with every deferred free completed early, and late (see the module docstring)."""

    early: Trace
    late: Trace


def timing_variants(trace: Trace) -> TimingVariants | None:
    """The early and late orders of ``trace``; None when no free waits on another stream.

    Built once per trace (and per process: not pickled with it).
    """
    if not trace.deferred_frees:
        return None
    cached: TimingVariants | None = trace.__dict__.get("_timing")
    if cached is None:
        cached = _build(trace)
        object.__setattr__(trace, "_timing", cached)
    return cached


def _build(trace: Trace) -> TimingVariants:
    ops, aids, times = trace.ops, trace.addr_ids, trace.op_time_us
    n = len(ops)
    requested: dict[int, int] = {}  # aid -> row of its free_requested
    pair: dict[int, int] = {}  # completion row -> request row
    for row in _rows_with(ops, (OP_FREE_REQUESTED, OP_FREE_COMPLETED)):
        if ops[row] == OP_FREE_REQUESTED:
            requested[aids[row]] = row
        else:
            start = requested.pop(aids[row], None)
            if start is not None:
                pair[row] = start
    if not pair:
        return TimingVariants(trace, trace)
    completions = sorted(pair)
    early = _rebuild(trace, [(j, None) for j in completions], early=True)
    timed = any(times[j] != times[i] for j, i in pair.items())
    lag = (max(times[j] - times[i] for j, i in pair.items()) if timed
           else max(j - i for j, i in pair.items()))
    running = list(accumulate(times, max)) if timed else []
    watched = {aids[j] for j in completions}
    allocs: dict[int, list[int]] = {}
    for row in _rows_with(ops, (OP_ALLOC,)):
        aid = aids[row]
        if aid in watched:
            allocs.setdefault(aid, []).append(row)
    moves: list[tuple[int, int | None]] = []
    for j in completions:
        i = pair[j]
        want = bisect_left(running, times[i] + lag) if timed else min(i + lag, n)
        later = allocs.get(aids[j], ())
        k = bisect_left(later, j)
        cap = later[k] if k < len(later) else n
        moves.append((j, min(max(j, want), cap)))
    late = _rebuild(trace, moves, early=False)
    return TimingVariants(early, late)


def _rows_with(ops: array[int], codes: tuple[int, ...]) -> list[int]:
    """Rows whose operation is one of ``codes``, found at C speed (``bytes.find``)."""
    raw = ops.tobytes()
    rows: list[int] = []
    for code in codes:
        needle = bytes((code,))
        pos = raw.find(needle)
        while pos >= 0:
            rows.append(pos)
            pos = raw.find(needle, pos + 1)
    rows.sort()
    return rows


def _rebuild(trace: Trace, moves: list[tuple[int, int | None]], *, early: bool) -> Trace:
    """``trace`` with each row ``j`` of ``moves`` taken out and put back before row ``p``
    (dropped where ``p`` is None); ``early`` also turns the remaining requests into frees.
    Built from slices of the columns, so the cost is in the moved rows, not the trace."""
    columns = (trace.ops, trace.addr_ids, trace.sizes, trace.lanes, trace.op_index, trace.op_time_us)
    out = [array(c.typecode) for c in columns]
    removed = {j for j, _ in moves}
    inserts: dict[int, list[int]] = {}
    for j, p in moves:
        if p is not None:
            inserts.setdefault(p, []).append(j)
    cuts = sorted(removed | set(inserts))
    pos = 0
    for cut in cuts:
        for col, src in zip(out, columns, strict=True):
            col.extend(src[pos:cut])
        for j in inserts.get(cut, ()):
            for col, src in zip(out, columns, strict=True):
                col.append(src[j])
        pos = cut + 1 if cut in removed else cut
    for col, src in zip(out, columns, strict=True):
        col.extend(src[pos:])
    for j in inserts.get(len(trace.ops), ()):
        for col, src in zip(out, columns, strict=True):
            col.append(src[j])
    ops = out[0]
    if early:
        ops = array("b", ops.tobytes().translate(_REQUEST_TO_FREE))
    return dataclasses.replace(trace, ops=ops, addr_ids=out[1], sizes=out[2], lanes=out[3],
                               op_index=out[4], op_time_us=out[5])


_REQUEST_TO_FREE = bytes(OP_FREE if b == OP_FREE_REQUESTED else b for b in range(256))
