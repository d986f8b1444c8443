"""The allocator state a replay starts from: recorded, or rebuilt backwards from the end.

A trace recorded from process start begins with an empty allocator. A trace recorded
mid-run does not: a notebook cell recorded after earlier cells built a model starts
with segments holding live parameters and cached free blocks that the trace never saw
being allocated, and a ring buffer that wrapped has lost its oldest events. Replaying
such a trace from an empty allocator predicts the wrong thing.

:class:`AllocatorState` is that starting point: segments (classic ones, and each
contiguous mapped run of an expandable segment, as ``memory_snapshot()`` lists them)
with their blocks in address order. It comes from

* the recorder's ``allocconf_initial_segments`` key (``memory_snapshot()`` taken as
  recording started): :meth:`AllocatorState.from_snapshot_segments`, ``source="recorded"``;
* or, when no such key exists, the snapshot's *final* ``segments`` walked backwards
  through the trace (what PyTorch's MemoryViz "Allocator State History" does):
  :func:`reconstruct_initial_state`, ``source="reconstructed"``.

Walking backwards is exact except for one thing the trace does not say: how large a
block was that was allocated *before* the trace began and freed *during* it (a free
merges the block into its free neighbours; the entry carries only the requested
size). Its size is derived from the request with the allocator's own rules (rounding,
and whether the rest would have been split off), and corrected if an earlier event
lands inside it. See docs/simulator.md, "Traces that start mid-run".

Standard library only; no engine imports (the engine imports this module).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from allocconf_widget.core.numbers import int_or_zero
from allocconf_widget.core.sim.settings import SMALL_BUFFER, SMALL_SIZE, EngineRules, SimSettings, round_size
from allocconf_widget.core.units import format_bytes

#: Snapshot key written by ``adapters/recorder.py``: ``memory_snapshot()`` at recording start.
INITIAL_SEGMENTS_KEY = "allocconf_initial_segments"

ALLOCATED = "active_allocated"
PENDING = "active_pending_free"
FREE = "inactive"

RECORDED = "recorded"
RECONSTRUCTED = "reconstructed"



class ReconstructionError(ValueError):
    """The trace and the final segments contradict each other; no start state follows."""


@dataclass(frozen=True)
class StateBlock:
    """One block of a segment: allocated, pending free (record_stream) or free (cached)."""

    address: int
    size: int
    state: str = FREE
    requested_size: int = 0

    @property
    def active(self) -> bool:
        """Allocated or waiting for its free to complete (counts in ``active_bytes``)."""
        return self.state != FREE


@dataclass(frozen=True)
class StateSegment:
    """A classic segment, or one contiguous mapped run of an expandable segment."""

    address: int
    total_size: int
    stream: int
    small: bool
    expandable: bool
    blocks: tuple[StateBlock, ...]
    pool_id: tuple[int, int] = (0, 0)

    @property
    def end(self) -> int:
        """First address after the segment."""
        return self.address + self.total_size


@dataclass(frozen=True)
class AllocatorState:
    """Segments and blocks of one device's caching allocator at one moment.

    ``source`` says where it came from (``"recorded"``, ``"reconstructed"``, or any
    label a caller chooses); ``note`` says why a start state was needed at all.
    Equality (:meth:`signature`) ignores both, and the stale ``requested_size`` of
    free blocks.
    """

    segments: tuple[StateSegment, ...]
    source: str = RECORDED
    note: str = field(default="", compare=False)
    derived_sizes: int = field(default=0, compare=False)  # live blocks sized by rule (reconstruction)

    # ------------------------------------------------------------ totals
    @property
    def reserved_bytes(self) -> int:
        """Sum of segment sizes (mapped bytes for expandable runs)."""
        return sum(seg.total_size for seg in self.segments)

    @property
    def allocated_bytes(self) -> int:
        """Bytes of allocated blocks (pending frees excluded, as torch counts them)."""
        return sum(b.size for _, b in self.live_blocks() if b.state == ALLOCATED)

    @property
    def active_bytes(self) -> int:
        """Bytes of allocated and pending-free blocks."""
        return sum(b.size for _, b in self.live_blocks())

    @property
    def requested_bytes(self) -> int:
        """Requested bytes of active blocks."""
        return sum(b.requested_size for _, b in self.live_blocks())

    def live_blocks(self) -> Iterable[tuple[StateSegment, StateBlock]]:
        """Active blocks in segment order, then address order (the trace decoder's id order)."""
        for seg in self.segments:
            for b in seg.blocks:
                if b.state != FREE:
                    yield seg, b

    def describe(self) -> str:
        """Short description for people: '41 segments, 1.43 GiB reserved, 212.00 MiB allocated'."""
        return (
            f"{len(self.segments)} segment{'s' if len(self.segments) != 1 else ''}, "
            f"{_fmt(self.reserved_bytes)} reserved, {_fmt(self.allocated_bytes)} allocated"
        )

    def provenance(self) -> str:
        """Where the state comes from, in words."""
        if self.source == RECORDED:
            return "the allocator state recorded when the trace began"
        if self.source == RECONSTRUCTED:
            return "the allocator state at the trace's start, reconstructed backwards from the final segments"
        return f"the allocator state '{self.source}'"

    # ---------------------------------------------------------- comparison
    def signature(self) -> tuple[Any, ...]:
        """Everything that matters to a replay, as plain tuples."""
        return tuple(
            (seg.address, seg.total_size, seg.stream, seg.small, seg.expandable, seg.pool_id,
             tuple((b.address, b.size, b.state, b.requested_size if b.active else 0)
                   for b in seg.blocks))
            for seg in self.segments
        )

    def same_as(self, other: AllocatorState) -> bool:
        """Equal segments and blocks (sources and notes aside)."""
        return self.signature() == other.signature()

    def differences(self, other: AllocatorState, limit: int = 5) -> list[str]:
        """Human-readable differences (at most ``limit``), for tests and verification."""
        out: list[str] = []
        mine = {seg.address: seg for seg in self.segments}
        theirs = {seg.address: seg for seg in other.segments}
        for addr in sorted(set(mine) | set(theirs)):
            a, b = mine.get(addr), theirs.get(addr)
            if a is None or b is None:
                which = "second" if a is None else "first"
                seg = b if a is None else a
                assert seg is not None
                out.append(f"segment {addr:#x} ({seg.total_size} B) only in the {which} state")
            else:
                sa = self._seg_sig(a)
                sb = self._seg_sig(b)
                if sa != sb:
                    out.append(f"segment {addr:#x} differs: {_first_diff(sa, sb)}")
            if len(out) >= limit:
                break
        return out

    @staticmethod
    def _seg_sig(seg: StateSegment) -> tuple[Any, ...]:
        return (seg.total_size, seg.stream, seg.small, seg.expandable, seg.pool_id,
                tuple((b.address, b.size, b.state, b.requested_size if b.active else 0)
                      for b in seg.blocks))

    # -------------------------------------------------------- conversion
    @classmethod
    def from_snapshot_segments(
        cls, segments: Sequence[Any], *, device: int | None = None, source: str = RECORDED,
        note: str = "",
    ) -> AllocatorState:
        """Read ``memory_snapshot()`` / ``_snapshot()["segments"]`` (one device's, when given).

        Raises:
            ValueError: a segment whose blocks do not tile it, or fields of the wrong type.
        """
        from allocconf_widget.core.memory.snapshot import pool_id_of, requested_size_of, segment_type_of

        out = []
        for index, raw in enumerate(segments):
            if not isinstance(raw, Mapping):
                raise ValueError(f"segment {index} is a {type(raw).__name__}, not a dict")
            if device is not None and int_or_zero(raw.get("device", 0)) != device:
                continue
            addr = int_or_zero(raw.get("address"))
            total = int_or_zero(raw.get("total_size"))
            blocks = []
            offset = addr
            for b in raw.get("blocks") or ():
                if not isinstance(b, Mapping):
                    raise ValueError(f"segment {addr:#x}: a block is not a dict")
                size = int_or_zero(b.get("size"))
                baddr = int_or_zero(b.get("address", b.get("addr", offset)))
                if baddr != offset or size <= 0:
                    raise ValueError(f"segment {addr:#x}: blocks do not tile the segment at {offset:#x}")
                state = str(b.get("state", FREE))
                if state not in (ALLOCATED, PENDING, FREE):
                    state = PENDING if "pending" in state else (ALLOCATED if "alloc" in state else FREE)
                req = requested_size_of(b) if state != FREE else 0  # type: ignore[arg-type]
                blocks.append(StateBlock(baddr, size, state, int(req)))
                offset += size
            if not blocks:
                blocks.append(StateBlock(addr, total, FREE, 0))
                offset = addr + total
            if offset != addr + total:
                raise ValueError(f"segment {addr:#x}: blocks cover {offset - addr} of {total} bytes")
            out.append(StateSegment(
                address=addr,
                total_size=total,
                stream=int_or_zero(raw.get("stream")),
                small=segment_type_of(raw) == "small",  # type: ignore[arg-type]
                expandable=bool(raw.get("is_expandable", False)),
                blocks=tuple(blocks),
                pool_id=pool_id_of(raw),  # type: ignore[arg-type]
            ))
        out.sort(key=lambda s: s.address)
        return cls(tuple(out), source=source, note=note)


# ======================================================================
# Does a trace start from an empty allocator?
# ======================================================================
def start_state_evidence(
    segment_events: Iterable[tuple[str, int, int]],
    final: AllocatorState,
    unknown_frees: int,
    live_at_end: Iterable[int],
) -> str | None:
    """Why the trace cannot have started from an empty allocator, or ``None`` if it may have.

    ``segment_events`` are the trace's ``(action, addr, size)`` segment entries in
    order. Evidence: frees of addresses the trace never allocated (``unknown_frees``,
    from the decoder), segments released or unmapped that the trace never created,
    final segments or live blocks the trace does not explain. A final state that holds
    *less* than the trace implies is no evidence (synthetic snapshots without
    segments): the empty start is kept.
    """
    reasons: list[str] = []
    if unknown_frees:
        reasons.append(f"{unknown_frees:,} frees of blocks allocated before the trace began")
    created: dict[int, int] = {}
    released_unknown = 0
    mapped = 0
    unmapped_unknown = False
    for act, addr, size in segment_events:
        if act == "segment_alloc":
            created[addr] = size
        elif act == "segment_free":
            if created.pop(addr, None) is None:
                released_unknown += 1
        elif act == "segment_map":
            mapped += size
        elif act == "segment_unmap":
            mapped -= size
            unmapped_unknown = unmapped_unknown or mapped < 0
    if released_unknown:
        reasons.append(f"{released_unknown:,} segments released that the trace never allocated")
    if unmapped_unknown:
        reasons.append("expandable memory unmapped that the trace never mapped")
    extra = [s for s in final.segments if not s.expandable and created.get(s.address) != s.total_size]
    if extra:
        size = sum(s.total_size for s in extra)
        reasons.append(f"{len(extra):,} final segments ({_fmt(size)}) that the trace never allocated")
    final_mapped = sum(s.total_size for s in final.segments if s.expandable)
    if final_mapped > mapped:
        reasons.append(f"{_fmt(final_mapped - mapped)} of expandable memory mapped before the trace")
    live = set(live_at_end)
    old = [b for _, b in final.live_blocks() if b.address not in live]
    if old and not extra:
        reasons.append(f"{len(old):,} live blocks allocated before the trace began")
    return "; ".join(reasons) or None


# ======================================================================
# Backward reconstruction
# ======================================================================
_FREE, _ALLOC, _PENDING = 0, 1, 2
_STATE_NAMES = (FREE, ALLOCATED, PENDING)
_STATE_CODES = {FREE: _FREE, ALLOCATED: _ALLOC, PENDING: _PENDING}


class _Blk:
    __slots__ = ("addr", "req", "size", "soft", "state")

    def __init__(self, addr: int, size: int, state: int, req: int = 0, soft: int = 0) -> None:
        self.addr = addr
        self.size = size
        self.state = state
        self.req = req
        self.soft = soft  # rounded request when the size was derived, not seen: may shrink


class _Run:
    """A classic segment or an expandable mapped run, with its blocks by address."""

    __slots__ = ("addr", "blocks", "end", "expandable", "pool", "small", "starts", "stream")

    def __init__(self, addr: int, end: int, stream: int, pool: tuple[int, int], small: bool,
                 expandable: bool) -> None:
        self.addr = addr
        self.end = end
        self.stream = stream
        self.pool = pool
        self.small = small
        self.expandable = expandable
        self.starts: list[int] = []
        self.blocks: dict[int, _Blk] = {}

    def add(self, b: _Blk) -> None:
        insort(self.starts, b.addr)
        self.blocks[b.addr] = b

    def drop(self, b: _Blk) -> None:
        del self.starts[bisect_left(self.starts, b.addr)]
        del self.blocks[b.addr]

    def at(self, x: int) -> _Blk:
        """The block containing address ``x`` (``x`` inside the run)."""
        return self.blocks[self.starts[bisect_right(self.starts, x) - 1]]

    def neighbour(self, b: _Blk, step: int) -> _Blk | None:
        i = bisect_left(self.starts, b.addr) + step
        return self.blocks[self.starts[i]] if 0 <= i < len(self.starts) else None


class _SizeRule:
    """How large the block was that served a request (docs/internals/allocator_facts.md §6.6 split rules)."""

    def __init__(self, settings: SimSettings) -> None:
        rules = EngineRules.derive(settings, None)
        self.slots, self.div2 = rules.slots, rules.division_needs_two
        self.max_split, self.slack = rules.max_split, rules.oversize_slack
        self.expandable = rules.expandable
        self.cache: dict[int, int] = {}

    def rounded(self, req: int) -> int:
        r = self.cache.get(req)
        if r is None:
            r = self.cache[req] = round_size(req, self.slots, self.div2)
        return r

    def size(self, r: int, avail: int, run: _Run) -> int:
        """Block size for a rounded request ``r`` when ``avail`` bytes are free from its start.

        The allocator splits off the rest when it may (small pool / expandable: ≥ 512 B
        left; large pool: request below max_split_size and more than 1 MiB left),
        otherwise hands out the whole free block; an oversize block (≥ max_split_size)
        is reused only within the slack, never split.
        """
        if avail <= r:
            return avail
        if run.small or run.expandable or self.expandable:
            return r
        if r >= self.max_split:
            return avail if avail < r + self.slack else r
        return avail if avail - r <= SMALL_SIZE else r


class _Backward:
    """The allocator state, edited one trace event at a time from the end to the start."""

    def __init__(self, final: AllocatorState, rule: _SizeRule) -> None:
        self.rule = rule
        self.run_starts: list[int] = []
        self.runs: dict[int, _Run] = {}
        self.known_exp: list[tuple[int, int, bool]] = []  # (address, stream, small) ever seen
        for seg in final.segments:
            run = _Run(seg.address, seg.end, seg.stream, seg.pool_id, seg.small, seg.expandable)
            for b in seg.blocks:
                run.add(_Blk(b.address, b.size, _STATE_CODES[b.state], b.requested_size))
            self._add_run(run)

    # ------------------------------------------------------------ runs
    def _add_run(self, run: _Run) -> None:
        pos = bisect_left(self.run_starts, run.addr)
        if (pos < len(self.run_starts) and self.run_starts[pos] < run.end) or (
            pos > 0 and self.runs[self.run_starts[pos - 1]].end > run.addr
        ):
            raise ReconstructionError(f"segment {run.addr:#x} overlaps another one")
        self.run_starts.insert(pos, run.addr)
        self.runs[run.addr] = run
        if run.expandable:
            self.known_exp.append((run.addr, run.stream, run.small))

    def _drop_run(self, run: _Run) -> None:
        del self.run_starts[bisect_left(self.run_starts, run.addr)]
        del self.runs[run.addr]

    def _run_at(self, x: int, what: str) -> _Run:
        pos = bisect_right(self.run_starts, x) - 1
        if pos >= 0:
            run = self.runs[self.run_starts[pos]]
            if x < run.end:
                return run
        raise ReconstructionError(f"{what} at {x:#x} lies in no segment")

    # ---------------------------------------------------------- blocks
    def _free_and_merge(self, run: _Run, b: _Blk) -> None:
        b.state, b.req, b.soft = _FREE, 0, 0
        self._merge_around(run, b)

    def _shrink(self, run: _Run, b: _Blk, bound: int) -> None:
        """A derived block must end by ``bound``: re-derive it, free what it gives back."""
        new = self.rule.size(b.soft, bound - b.addr, run)
        if new >= b.size:
            return
        tail = _Blk(b.addr + new, b.size - new, _FREE)
        b.size = new
        run.add(tail)
        n = run.neighbour(tail, 1)
        if n is not None and n.state == _FREE:
            run.drop(n)
            tail.size += n.size

    def _free_block_at(self, run: _Run, x: int, what: str) -> _Blk:
        """The free block containing ``x``, shrinking a derived block that covers it."""
        b = run.at(x)
        if b.state != _FREE and b.soft and b.addr < x:
            self._shrink(run, b, x)
            b = run.at(x)
        if b.state != _FREE:
            raise ReconstructionError(f"{what} at {x:#x}, inside a block that was in use")
        return b

    # ----------------------------------------------------------- events
    def undo(self, e: Mapping[str, Any]) -> None:
        act = e.get("action")
        if act == "alloc":
            addr = int_or_zero(e.get("addr"))
            run = self._run_at(addr, "allocation")
            b = run.blocks.get(addr)
            if b is None or b.state != _ALLOC:
                raise ReconstructionError(f"allocation at {addr:#x} has no allocated block after it")
            self._front_of_free_block(run, b)
            self._free_and_merge(run, b)
        elif act == "free_completed":
            self._undo_free(int_or_zero(e.get("addr")), int_or_zero(e.get("size")))
        elif act == "free_requested":
            addr = int_or_zero(e.get("addr"))
            run = self._run_at(addr, "free")
            b = run.blocks.get(addr)
            if b is None or b.state == _FREE:
                raise ReconstructionError(f"free request at {addr:#x} for no live block")
            b.state = _ALLOC
        elif act == "segment_alloc":
            self._undo_segment_alloc(int_or_zero(e.get("addr")), int_or_zero(e.get("size")))
        elif act == "segment_free":
            addr, size = int_or_zero(e.get("addr")), int_or_zero(e.get("size"))
            stream, pool = int_or_zero(e.get("stream")), pool_id_of_entry(e)
            run = _Run(addr, addr + size, stream, pool, size == SMALL_BUFFER, False)
            run.add(_Blk(addr, size, _FREE))
            self._add_run(run)
        elif act == "segment_map":
            self._undo_map(int_or_zero(e.get("addr")), int_or_zero(e.get("size")))
        elif act == "segment_unmap":
            self._undo_unmap(int_or_zero(e.get("addr")), int_or_zero(e.get("size")),
                             int_or_zero(e.get("stream")), pool_id_of_entry(e))
        # oom, snapshot, annotate: no state change

    def _undo_free(self, addr: int, req: int) -> None:
        """Before ``free_completed`` the block was live (pending, until its request is undone)."""
        run = self._run_at(addr, "free")
        f = self._free_block_at(run, addr, "free")
        end = f.addr + f.size
        r = self.rule.rounded(req)
        size = self.rule.size(r, end - addr, run)
        if f.addr < addr:
            f.size = addr - f.addr
        else:
            run.drop(f)
        b = _Blk(addr, size, _PENDING, req, r)
        run.add(b)
        if addr + size < end:
            run.add(_Blk(addr + size, end - addr - size, _FREE))
        self._refit_left(run, b)

    def _front_of_free_block(self, run: _Run, b: _Blk) -> None:
        """An allocation takes the front of a maximal free block, so right after it the block
        before it is in use. A free gap there can only be the tail of a derived block that
        in fact took its whole free block: give the gap to that block."""
        gap = run.neighbour(b, -1)
        if gap is None or gap.state != _FREE:
            return
        d = run.neighbour(gap, -1)
        if d is None or d.state == _FREE or not d.soft:
            return
        run.drop(gap)
        d.size = b.addr - d.addr

    def _refit_left(self, run: _Run, b: _Blk) -> None:
        """A block now sits right after a free gap that follows a derived block: that
        block must fit its size rule against this new bound too. In a large-pool
        classic segment every free block is larger than 1 MiB (only such pieces are
        split off, and freed blocks are larger), so a smaller gap was never free: it
        belongs to the derived block, which took its whole free block unsplit."""
        gap = run.neighbour(b, -1)
        if gap is None or gap.state != _FREE:
            return
        d = run.neighbour(gap, -1)
        if d is None or d.state == _FREE or not d.soft:
            return
        new = self.rule.size(d.soft, b.addr - d.addr, run)
        if new == d.size:
            return
        if new > d.size:
            gap_end = gap.addr + gap.size
            run.drop(gap)
            d.size = new
            if d.addr + new < gap_end:
                run.add(_Blk(d.addr + new, gap_end - d.addr - new, _FREE))
        else:
            self._shrink(run, d, b.addr)

    def _undo_segment_alloc(self, addr: int, size: int) -> None:
        run = self.runs.get(addr)
        if run is None or run.expandable or run.end != addr + size:
            raise ReconstructionError(f"segment_alloc {addr:#x} ({size} B) matches no segment")
        if len(run.starts) != 1 or run.blocks[addr].state != _FREE:
            raise ReconstructionError(f"segment {addr:#x} holds live blocks before its cudaMalloc")
        self._drop_run(run)

    def _undo_map(self, addr: int, size: int) -> None:
        """Before ``segment_map`` the pages were not mapped: cut them out of their run."""
        run = self._run_at(addr, "segment_map")
        f = self._free_block_at(run, addr, "segment_map")
        end = addr + size
        if f.addr + f.size < end or not run.expandable:
            raise ReconstructionError(f"segment_map {addr:#x} ({size} B) is not one free range")
        f_end = f.addr + f.size
        pos = bisect_left(run.starts, f.addr)
        before = [run.blocks[a] for a in run.starts[:pos]]
        after = [run.blocks[a] for a in run.starts[pos + 1:]]
        if f.addr < addr:
            before.append(_Blk(f.addr, addr - f.addr, _FREE))
        if end < f_end:
            after.insert(0, _Blk(end, f_end - end, _FREE))
        self._drop_run(run)
        for blocks, lo, hi in ((before, run.addr, addr), (after, end, run.end)):
            if blocks:
                piece = _Run(lo, hi, run.stream, run.pool, run.small, True)
                for b in blocks:
                    piece.add(b)
                self._add_run(piece)

    def _undo_unmap(self, addr: int, size: int, stream: int, pool: tuple[int, int]) -> None:
        """Before ``segment_unmap`` the pages were mapped and free: join them to their neighbours."""
        end = addr + size
        left = right = None
        pos = bisect_right(self.run_starts, addr) - 1
        if pos >= 0:
            cand = self.runs[self.run_starts[pos]]
            if cand.end > addr:
                raise ReconstructionError(f"segment_unmap {addr:#x} overlaps a mapped segment")
            if cand.end == addr and cand.expandable and cand.stream == stream:
                left = cand
        cand2 = self.runs.get(end)
        if cand2 is not None and cand2.expandable and cand2.stream == stream:
            right = cand2
        near = left or right
        if near is not None:
            small, pool = near.small, near.pool
        else:
            small = self._guess_small(addr, stream)
        run = _Run(addr, end, stream, pool, small, True)
        piece = _Blk(addr, size, _FREE)
        run.add(piece)
        if left is not None:
            self._drop_run(left)
            for a in left.starts:
                run.add(left.blocks[a])
            run.addr = left.addr
        if right is not None:
            self._drop_run(right)
            for a in right.starts:
                run.add(right.blocks[a])
            run.end = right.end
        if right is not None or left is not None:
            self._merge_around(run, piece)
        self._add_run(run)

    def _merge_around(self, run: _Run, b: _Blk) -> None:
        p = run.neighbour(b, -1)
        if p is not None and p.state == _FREE:
            run.drop(b)
            p.size += b.size
            b = p
        n = run.neighbour(b, 1)
        if n is not None and n.state == _FREE:
            run.drop(n)
            b.size += n.size

    def _guess_small(self, addr: int, stream: int) -> bool:
        """Pool of an unmapped range no run touches: that of the nearest range seen on its stream."""
        same = [(abs(a - addr), small) for a, s, small in self.known_exp if s == stream]
        return min(same)[1] if same else False

    # ----------------------------------------------------------- result
    def state(self, note: str) -> AllocatorState:
        segments = []
        derived = sum(1 for run in self.runs.values() for b in run.blocks.values()
                      if b.soft and b.state != _FREE)
        for addr in self.run_starts:
            run = self.runs[addr]
            blocks = tuple(
                StateBlock(b.addr, b.size, _STATE_NAMES[b.state], b.req if b.state != _FREE else 0)
                for b in (run.blocks[a] for a in run.starts)
            )
            segments.append(StateSegment(run.addr, run.end - run.addr, run.stream, run.small,
                                         run.expandable, blocks, run.pool))
        return AllocatorState(tuple(segments), source=RECONSTRUCTED, note=note, derived_sizes=derived)


def reconstruct_initial_state(
    entries: Sequence[Any],
    final: AllocatorState,
    settings: SimSettings | None = None,
    *,
    note: str = "",
) -> AllocatorState:
    """The allocator state before ``entries``, given the state after them.

    Undoes each event from the last to the first: ``alloc`` → the block was free
    (merged with its free neighbours); ``free_completed`` → it was live (its size
    derived from the request under ``settings``, see the module docstring);
    ``free_requested`` → it was allocated, not pending; ``segment_alloc`` → the
    segment did not exist; ``segment_free`` → it existed, free; ``segment_map`` →
    those pages were unmapped; ``segment_unmap`` → they were mapped and free.

    Raises:
        ReconstructionError: the events contradict the final state (e.g. the
            snapshot's segments were taken at another time than its trace).
    """
    back = _Backward(final, _SizeRule(settings or SimSettings()))
    for e in reversed(entries):
        if isinstance(e, Mapping):
            back.undo(e)
    return back.state(note)


# ---------------------------------------------------------------- helpers
def pool_id_of_entry(entry: Mapping[str, Any]) -> tuple[int, int]:
    """The private-pool id a trace entry or segment carries ((0, 0) = default pool)."""
    # the first of the three names present wins (its value even if malformed), as torch writes
    # one of them; membership tests, not nested get()s: most entries hold none of them
    if "pool_id" in entry:
        raw = entry["pool_id"]
    elif "segment_pool_id" in entry:
        raw = entry["segment_pool_id"]
    elif "mempool_id" in entry:
        raw = entry["mempool_id"]
    else:
        return (0, 0)
    if isinstance(raw, list | tuple) and len(raw) == 2:
        return int_or_zero(raw[0]), int_or_zero(raw[1])
    return (0, 0)


def _fmt(n: int) -> str:
    return format_bytes(n)


def _first_diff(a: tuple[Any, ...], b: tuple[Any, ...]) -> str:
    names = ("size", "stream", "small", "expandable", "pool")
    for name, x, y in zip(names, a, b, strict=False):
        if x != y:
            return f"{name} {x} vs {y}"
    blocks_a, blocks_b = a[-1], b[-1]
    for x, y in zip(blocks_a, blocks_b, strict=False):
        if x != y:
            return f"block {x} vs {y}"
    return f"{len(blocks_a)} vs {len(blocks_b)} blocks"
