"""The two extremes of GPU timing a recording allows, for frees that wait on other streams.

A block freed after ``record_stream`` (a ``free_requested`` whose ``free_completed`` comes
later) returns to the cache only once the other streams' work recorded on it is done, and
torch notices that at its next ``malloc``. When that happens depends on how far the GPU
lags the CPU, which differs from run to run: identical runs can peak far apart
(docs/fidelity.md). One replay in recorded order gives one of those runs. This module builds
two more orders of the same trace:

* **early**: every such free completes as soon as it is requested (the GPU had caught up:
  the consumer's last use is already done). Nothing can return a block sooner;
* **late**: every such free completes no earlier than the recording shows, and ``L`` rows
  after its request, ``L`` twice the *most* rows (allocator calls) the recording shows between
  a request and its completion for any of them: the GPU is taken to lag that far behind the
  CPU throughout (:data:`LATE_LAG_FACTOR` says why twice). Where the recording hands the same
  address out again before that, the address was free *in the recorded run* only; in a run
  lagging by ``L`` the allocator gives that request other memory, so the late order gives
  each later allocation of such an address its own id instead of holding the completion
  back. (Held back, the late bound was hardly later than the recording: from the first
  default run of a data loader's side-stream copies, 14 of 20 real re-runs' peaks fell
  inside the range; then 19, now 20.)

The replay of the three orders gives ``[low, high]`` around the point prediction
(:attr:`.result.SimResult.peak_reserved_range`). The late bound rests on the recording: a
run whose GPU lagged further behind than twice the recorded one's worst moment can peak higher.

Standard library only.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from allocconf_widget.core.sim.trace.codes import OP_ALLOC, OP_FREE, OP_FREE_COMPLETED, OP_FREE_REQUESTED
from allocconf_widget.core.sim.trace.rows import rows_with

if TYPE_CHECKING:
    from allocconf_widget.core.sim.trace.model import Trace


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


@dataclasses.dataclass(frozen=True)
class _Waits:
    """The frees that waited on another stream, paired as the recording shows them."""

    #: each completion's row -> its request's row, in the order of the completions
    pair: dict[int, int]
    #: the first request no completion answered (the free was still waiting when the snapshot
    #: was taken), or None
    first_pending: int | None


def _waits(trace: Trace) -> _Waits:
    ops, aids = trace.ops, trace.addr_ids
    requested: dict[int, int] = {}  # aid -> row of its free_requested
    pair: dict[int, int] = {}  # completion row -> request row
    first_pending: int | None = None
    for row in rows_with(ops, (OP_FREE_REQUESTED, OP_FREE_COMPLETED)):
        if ops[row] == OP_FREE_REQUESTED:
            # a request replaced by another of the same address is never answered either
            replaced = requested.get(aids[row])
            if replaced is not None and (first_pending is None or replaced < first_pending):
                first_pending = replaced
            requested[aids[row]] = row
        else:
            start = requested.pop(aids[row], None)
            if start is not None:
                pair[row] = start
    left = min(requested.values(), default=None)
    if left is not None and (first_pending is None or left < first_pending):
        first_pending = left
    return _Waits(pair, first_pending)


def _build(trace: Trace) -> TimingVariants:
    aids = trace.addr_ids
    pair = _waits(trace).pair
    if not pair:
        return TimingVariants(trace, trace)
    completions = sorted(pair)
    early = _rebuild(trace, [(j, None) for j in completions], early=True)
    moves = list(zip(completions, _late_rows(trace, pair, completions), strict=True))
    late = _rebuild(_own_ids_after_reuse(trace, {aids[j] for j in completions}), moves, early=False)
    return TimingVariants(early, late)


def host_ran_ahead(trace: Trace) -> bool | None:
    """Whether any free that waited on another stream completed only after a later allocation:
    the CPU had run ahead of the GPU there. None where no free waits on another stream.

    Where none did, every such free completed before the next allocation, the late order is the
    recorded one and the range has no width: the recorded run's CPU kept pace with its GPU (a
    slow host, a debugger, a cell that waits on the GPU) and says nothing of a run whose CPU
    does get ahead, which can peak several times higher (docs/fidelity.md).
    """
    if not trace.deferred_frees:
        return None
    ops = trace.ops
    codes = ops.tobytes() if ops.itemsize == 1 else bytes(ops)
    alloc = bytes([OP_ALLOC])
    # the last allocation before each completion, each row searched once (at C speed): a
    # search of the rows between each request and its completion went quadratic
    last_alloc, searched = -1, 0
    waits = _waits(trace)
    for completed, start in waits.pair.items():
        found = codes.rfind(alloc, searched, completed)
        if found >= 0:
            last_alloc = found
        searched = completed
        if last_alloc > start:
            return True
    # a free still waiting when the snapshot was taken, with allocations after its request:
    # the CPU was ahead there too (the commonest case: a snapshot taken mid-step)
    pending = waits.first_pending
    return pending is not None and codes.rfind(alloc, pending) > pending


#: The late order's lag: this many times the recording's longest wait, in rows. One run's
#: longest wait predicts another's poorly, so no factor bounds it; twice the recorded one is
#: the factor that held the most real peaks in their range while keeping ranges narrow
#: (docs/fidelity.md has the counts).
LATE_LAG_FACTOR = 2


def _late_rows(trace: Trace, pair: dict[int, int], completions: list[int]) -> list[int]:
    """Where each completion goes in the late order: ``L`` rows after its request (never
    earlier than recorded, at most the end), ``L`` :data:`LATE_LAG_FACTOR` times the most rows
    between a request and its completion anywhere in the recording.

    Rows count the program's allocator calls, which every run of the program makes in the
    same order, so a lag in rows says "how far ahead the CPU got". A lag in microseconds
    mixes in the CPU's speed and single stalls (one stall sets the lag of every free); rows
    held more real peaks in their range (docs/fidelity.md).
    """
    n = len(trace.ops)
    lag = LATE_LAG_FACTOR * max(j - i for j, i in pair.items())
    return [min(max(j, pair[j] + lag), n) for j in completions]


def _own_ids_after_reuse(trace: Trace, watched: set[int]) -> Trace:
    """``trace`` where every allocation of a ``watched`` address gets a new address id, and
    the rows after it (in recorded order) that name the address use that id.

    A completion moved later then still frees the block it belongs to, even past a recorded
    re-allocation of its address (which now names another block). Ids of other addresses,
    and rows before an address's first allocation (a block of the start state), stay.
    """
    ops, aids = trace.ops, trace.addr_ids
    compiled = _compiled()
    if compiled is not None and ops.typecode == "b" and aids.typecode == "q":
        flags = bytearray(trace.num_addresses)
        for aid in watched:
            flags[aid] = 1
        raw, ids = compiled.own_ids(ops.tobytes(), aids.tobytes(), bytes(flags), trace.num_addresses)
        if ids == trace.num_addresses:
            return trace
        out = array("q")
        out.frombytes(raw)
        return dataclasses.replace(trace, addr_ids=out, num_addresses=ids)
    new_ids = array(aids.typecode, aids)
    current: dict[int, int] = {}
    requested: dict[int, int] = {}  # address id -> the id its pending request used
    fresh = trace.num_addresses
    is_watched = bytearray(trace.num_addresses)
    for aid in watched:
        is_watched[aid] = 1
    # only the rows that name a watched address: the loop below is Python, the search is not
    for row in rows_with(ops, (OP_ALLOC, OP_FREE, OP_FREE_REQUESTED, OP_FREE_COMPLETED),
                         bytes(map(is_watched.__getitem__, aids))):
        aid = aids[row]
        op = ops[row]
        if op == OP_ALLOC:
            current[aid] = fresh
            fresh += 1
        if op == OP_FREE_COMPLETED:  # it frees the block its request named, even when a new
            new_ids[row] = requested.pop(aid, current.get(aid, aid))  # one holds the address
            continue
        new_ids[row] = current.get(aid, aid)
        if op == OP_FREE_REQUESTED:
            requested[aid] = new_ids[row]
    if fresh == trace.num_addresses:
        return trace
    return dataclasses.replace(trace, addr_ids=new_ids, num_addresses=fresh)


def _rebuild(trace: Trace, moves: Sequence[tuple[int, int | None]], *, early: bool) -> Trace:
    """``trace`` with each row ``j`` of ``moves`` taken out and put back before row ``p``
    (dropped where ``p`` is None); ``early`` also turns the remaining requests into frees.
    Built from slices of the columns, so the cost is in the moved rows, not the trace."""
    columns = (trace.ops, trace.addr_ids, trace.sizes, trace.lanes, trace.op_index, trace.op_time_us)
    out = [array(c.typecode) for c in columns]
    compiled = _compiled()
    if compiled is not None and tuple(c.typecode for c in columns) == _RAW:
        raw = compiled.reorder(tuple(c.tobytes() for c in columns), tuple(c.itemsize for c in columns),
                               [(j, -1 if p is None else p) for j, p in moves], early)
        for col, data in zip(out, raw, strict=True):
            col.frombytes(data)
        return dataclasses.replace(trace, ops=out[0], addr_ids=out[1], sizes=out[2], lanes=out[3],
                                   op_index=out[4], op_time_us=out[5])
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
        col.extend(src[pos:])  # rows moved to the end went in with the last cut, len(trace.ops)
    ops = out[0]
    if early:
        ops = array("b", ops.tobytes().translate(_REQUEST_TO_FREE))
    return dataclasses.replace(trace, ops=ops, addr_ids=out[1], sizes=out[2], lanes=out[3],
                               op_index=out[4], op_time_us=out[5])


_REQUEST_TO_FREE = bytes(OP_FREE if b == OP_FREE_REQUESTED else b for b in range(256))
#: the columns' types the compiled module reorders (the decoder's)
_RAW = ("b", "q", "q", "q", "q", "q")


def _compiled() -> Any:
    """The compiled module, where replays use it: it builds the orders from the raw columns, the
    same arrays as the Python code here (``tests/unit/test_native_engine.py``)."""
    from allocconf_widget.core.sim.native import compiled

    return compiled()
