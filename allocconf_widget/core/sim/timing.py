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
from typing import TYPE_CHECKING

from allocconf_widget.core.sim.trace import OP_ALLOC, OP_FREE, OP_FREE_COMPLETED, OP_FREE_REQUESTED

if TYPE_CHECKING:
    from allocconf_widget.core.sim.trace import Trace


@dataclasses.dataclass(frozen=True)
class TimingVariants:
    """The trace with every deferred free completed early, and late (see the module docstring)."""

    early: Trace
    late: Trace
    lag_us: int  # the largest request-to-completion delay in the recording (0: no times)


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
    for row in range(n):
        op = ops[row]
        if op == OP_FREE_REQUESTED:
            requested[aids[row]] = row
        elif op == OP_FREE_COMPLETED:
            start = requested.pop(aids[row], None)
            if start is not None:
                pair[row] = start
    if not pair:
        return TimingVariants(trace, trace, 0)
    early = _reordered(trace, _early_rows(ops, pair), early=True)
    timed = any(times[j] != times[i] for j, i in pair.items())
    if timed:
        lag = max(times[j] - times[i] for j, i in pair.items())
        running: list[int] = []
        top = times[0]
        for t in times:
            top = max(top, t)
            running.append(top)

        def target(j: int, i: int) -> int:
            return max(j, bisect_left(running, times[i] + lag))
    else:  # no times: the longest delay in rows
        lag = max(j - i for j, i in pair.items())

        def target(j: int, i: int) -> int:
            return max(j, min(i + lag, n))

    next_alloc: dict[int, int] = {}  # completion row -> next alloc row of its address
    seen: dict[int, int] = {}
    for row in range(n - 1, -1, -1):
        op = ops[row]
        if op == OP_ALLOC:
            seen[aids[row]] = row
        elif row in pair:
            next_alloc[row] = seen.get(aids[row], n)
    moved: dict[int, list[int]] = {}
    for j, i in pair.items():
        moved.setdefault(min(target(j, i), next_alloc[j]), []).append(j)
    order: list[int] = []
    for row in range(n):
        for j in moved.get(row, ()):
            order.append(j)
        if row not in pair:
            order.append(row)
    order.extend(moved.get(n, ()))
    late = _reordered(trace, order, early=False)
    return TimingVariants(early, late, int(lag) if timed else 0)


def _early_rows(ops: array[int], pair: dict[int, int]) -> list[int]:
    """Rows of the early order: completions dropped (their requests become whole frees)."""
    return [row for row in range(len(ops)) if row not in pair]


def _reordered(trace: Trace, order: list[int], *, early: bool) -> Trace:
    """``trace`` with its operation rows in ``order``; ``early`` turns requests into frees."""
    ops = array("b", (trace.ops[r] for r in order))
    if early:
        for k, op in enumerate(ops):
            if op == OP_FREE_REQUESTED:
                ops[k] = OP_FREE
    return dataclasses.replace(
        trace,
        ops=ops,
        addr_ids=array("q", (trace.addr_ids[r] for r in order)),
        sizes=array("q", (trace.sizes[r] for r in order)),
        lanes=array("q", (trace.lanes[r] for r in order)),
        op_index=array("q", (trace.op_index[r] for r in order)),
        op_time_us=array("q", (trace.op_time_us[r] for r in order)),
    )
