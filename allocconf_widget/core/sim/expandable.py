"""Expandable segments (``expandable_segments:True``) for the replay engine (§6.12).

An expandable segment is a large reserved virtual range per (pool, stream)
whose pages are mapped on demand: 2 MiB pages in the small pool, 20 MiB
(``large_segment_size`` from 2.11) in the large pool. A request maps just
enough pages after the lowest-address free space that can hold it, so
reserved memory tracks live memory closely. Free mapped blocks and unmapped
ranges are both :class:`~.blocks.Block` objects linked in address order;
``mapped`` tells them apart.

These functions take the engine as their first argument rather than being
methods so the engine module stays readable; they run only when a setting
turns expandable segments on.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING

from allocconf_widget.core.sim.blocks import KEY_SHIFT, NO_CHANGE, Block, ExpSegment, insert_free, remove_free
from allocconf_widget.core.sim.settings import SMALL_BUFFER
from allocconf_widget.core.sim.trace.codes import SEG_MAP, SEG_UNMAP

if TYPE_CHECKING:
    from allocconf_widget.core.sim.blocks import FreeList
    from allocconf_widget.core.sim.ports import EngineCore
    from allocconf_widget.core.sim.state import AllocatorState, StateSegment


def growable(b: Block) -> int:
    """Size a block could reach by mapping the unmapped range right after it."""
    nxt = b.next
    return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


def take_free_expandable(eng: EngineCore, fl: FreeList, r: int) -> Block | None:
    """``get_free_block`` when expandable segments are on: the first cached block of ≥ r
    bytes, or None.

    Among expandable candidates torch prefers the one with the smallest
    *growable* size, so it walks forward while the next block would grow less.
    """
    blocks = fl.blocks
    x = r << KEY_SHIFT
    one = fl.keys.one
    if one is None:  # a long free list: its keys in chunks
        walk = fl.keys.iter_from(x)
        k = next(walk, None)
        if k is None:
            return None
        b = blocks[k]
        if b.seg is not None:
            for k in walk:
                nb = blocks[k]
                if growable(nb) >= growable(b):
                    break
                b = nb
                if b.seg is None:
                    break
        return _claim(eng, fl, b, r)
    # the usual case, the same walk by index over the one sorted list (SortedKeys.one): an
    # iterator per allocation would cost more than the walk
    j = bisect_left(one, x)
    if j == len(one):
        return None
    b = blocks[one[j]]
    if b.seg is not None:
        last = len(one) - 1
        while j < last:
            nb = blocks[one[j + 1]]
            if growable(nb) >= growable(b):
                break
            j += 1
            b = nb
            if b.seg is None:
                break
    if _refused(eng, b, r):
        return None
    del one[j]
    del blocks[b.key]
    return b


def _refused(eng: EngineCore, b: Block, r: int) -> bool:
    """Whether the oversize rules refuse the chosen free block ``b`` for ``r`` bytes."""
    rules = eng.rules
    return b.size >= rules.max_split and (r < rules.max_split or b.size >= r + rules.oversize_slack)


def _claim(eng: EngineCore, fl: FreeList, b: Block, r: int) -> Block | None:
    """Take the chosen free block ``b`` unless the oversize rules refuse it."""
    if _refused(eng, b, r):
        return None
    fl.keys.remove(b.key)
    del fl.blocks[b.key]
    return b


def take_free_skipping_expandable(eng: EngineCore, fl: FreeList, r: int) -> Block | None:
    """``get_free_block`` with expandable segments turned off while expandable blocks are
    cached (a start state recorded with them on): torch skips those blocks."""
    blocks = fl.blocks
    for k in fl.keys.iter_from(r << KEY_SHIFT):
        b = blocks[k]
        if b.seg is None:
            return _claim(eng, fl, b, r)
    return None


def _unmapped_insert(fl: FreeList, b: Block) -> None:
    pos = bisect_left(fl.unmapped_ptrs, b.ptr)
    fl.unmapped_ptrs.insert(pos, b.ptr)
    fl.unmapped.insert(pos, b)
    fl.dirty = min(fl.dirty, b.ptr)  # a new candidate for the room search (see _find_room)


def _unmapped_remove(fl: FreeList, b: Block) -> None:
    pos = bisect_left(fl.unmapped_ptrs, b.ptr)
    del fl.unmapped_ptrs[pos]
    del fl.unmapped[pos]


def _try_merge(eng: EngineCore, dst: Block, src: Block | None) -> None:
    """``try_merge_blocks`` for map/unmap: only idle neighbours in the same mapped state."""
    if src is None or src.busy or src.mapped != dst.mapped:
        return
    if src.mapped:
        remove_free(src)
    else:
        _unmapped_remove(src.fl, src)
    if dst.prev is src:
        dst.ptr = src.ptr
        dst.prev = src.prev
        if src.prev is not None:
            src.prev.next = dst
        if eng.rules.tie_by_address:
            dst.tb = dst.ptr
    else:
        dst.next = src.next
        if src.next is not None:
            src.next.prev = dst
    dst.size += src.size


#: set by tests: check every room search against torch's plain walk
CHECK_ROOM_SEARCH = False


def _find_room(eng: EngineCore, fl: FreeList, r: int) -> Block:
    """``find_expandable_block``: lowest-address idle run (free + unmapped) of ≥ r bytes.

    torch walks every unmapped range from the lowest; doing the same would make a trace with
    many released holes quadratic. The walk from an unmapped range
    sums the idle run it starts (the free block before it included); the answer is the first
    range whose sum reaches ``r``. The free list keeps the walk's *records* (each range whose
    sum beat every earlier one: ``room_ptrs``/``room_totals``, up to ``room_end``): the first
    range that can reach ``r`` is at or after the first record that reached ``r``, or after
    ``room_end`` if none did. Sums only shrink by allocation; they grow only when a block is
    freed or pages are unmapped, which lower ``fl.dirty`` to their address, and the records
    from the first range of the idle run holding that address on are dropped
    (:func:`_forget_from`). So the search resumes where the records say, with the answer of
    the full walk.
    """
    if fl.dirty != NO_CHANGE:
        _forget_from(fl, fl.dirty)
        fl.dirty = NO_CHANGE
    ptrs, totals = fl.room_ptrs, fl.room_totals
    k = bisect_left(totals, r)
    if k < len(totals):
        start = ptrs[k]
        del ptrs[k:], totals[k:]
    else:
        start = fl.room_end
    best = totals[-1] if totals else 0
    unmapped = fl.unmapped
    found: Block | None = None
    for pos in range(bisect_left(fl.unmapped_ptrs, start), len(unmapped)):
        u = unmapped[pos]
        c = u
        if u.prev is not None and not u.prev.busy:
            c = u.prev
        total = 0
        x: Block | None = c
        while total < r and x is not None and not x.busy:
            total += x.size
            x = x.next
        if total >= r:  # the walk stopped at r: its sum is a lower bound, so no record may skip it
            ptrs.append(u.ptr)
            totals.append(NO_CHANGE)
            fl.room_end = u.ptr + 1
            found = c
            break
        if total > best:
            best = total
            ptrs.append(u.ptr)
            totals.append(total)
    else:
        fl.room_end = unmapped[-1].ptr + 1 if unmapped else 0
    if CHECK_ROOM_SEARCH:
        assert found is _plain_walk(fl, r), "the room search left torch's walk"
    if found is not None:
        return found
    page = SMALL_BUFFER if fl.pool.small else eng.rules.large_segment
    size = -(-eng.rules.expandable_reserve() // page) * page
    base = eng.expandable_base(size)
    exp = ExpSegment(base, page, size)
    eng.reservations.append(exp)
    c = Block(base, size, fl, exp, eng.new_tb(base))
    c.mapped = False
    _unmapped_insert(fl, c)
    return c


def _forget_from(fl: FreeList, dirty: int) -> None:
    """Drop the search records a free or unmap at ``dirty`` may have made stale: those from
    the first unmapped range of the idle run around the last range at or below ``dirty``."""
    low = dirty
    k = bisect_right(fl.unmapped_ptrs, dirty) - 1
    if k >= 0:
        b: Block | None = fl.unmapped[k]
        while b is not None and not b.busy:
            if not b.mapped:
                low = min(low, b.ptr)
            b = b.prev
    cut = bisect_left(fl.room_ptrs, low)
    del fl.room_ptrs[cut:], fl.room_totals[cut:]
    fl.room_end = min(fl.room_end, low)


def _plain_walk(fl: FreeList, r: int) -> Block | None:
    """torch's walk, every unmapped range from the lowest (for CHECK_ROOM_SEARCH)."""
    for u in fl.unmapped:
        c = u
        if u.prev is not None and not u.prev.busy:
            c = u.prev
        total = 0
        x: Block | None = c
        while total < r and x is not None and not x.busy:
            total += x.size
            x = x.next
        if total >= r:
            return c
    return None


def _map_block(eng: EngineCore, b: Block, n: int, i: int) -> bool:
    """``map_block``: back whole pages from ``b``'s start; all or nothing."""
    seg = b.seg
    assert seg is not None and not b.mapped
    m = -(-n // seg.page) * seg.page
    usable = eng.rules.usable
    if usable is not None and eng.reserved + m > usable:
        return False
    fl = b.fl
    _unmapped_remove(fl, b)
    eng.map_pos += 1
    b.mapped = True
    if m < b.size:
        rest = Block(b.ptr + m, b.size - m, fl, seg, eng.new_tb(b.ptr + m))
        rest.mapped = False
        rest.prev, rest.next = b, b.next
        if b.next is not None:
            b.next.prev = rest
        b.next = rest
        _unmapped_insert(fl, rest)
        b.size = m
    start = b.ptr
    _try_merge(eng, b, b.prev)
    _try_merge(eng, b, b.next)
    insert_free(b)
    eng.grow_reserved(m)
    eng.num_device_alloc += 1
    eng.segment_event(i, SEG_MAP, start, m)
    return True


def grow(eng: EngineCore, fl: FreeList, r: int, i: int) -> Block | None:
    """``try_allocate_expandable_block``: map pages until one free block holds ``r``.

    Pages mapped before a later mapping fails stay mapped (and cached), as in torch.
    """
    c = _find_room(eng, fl, r)
    if not c.mapped and not _map_block(eng, c, min(c.size, r), i):
        return None
    while c.size < r:
        nxt = c.next
        if nxt is None or nxt.mapped:  # cannot happen: the run was checked in _find_room
            return None
        if not _map_block(eng, nxt, min(r - c.size, nxt.size), i):
            return None
        c = nxt
    remove_free(c)
    return c


def unmap_block(eng: EngineCore, b: Block, i: int) -> None:
    """``unmap_block``: give back the whole pages inside a cached expandable block."""
    seg = b.seg
    assert seg is not None
    page, base = seg.page, seg.base
    off = b.ptr - base
    begin = -(-off // page) * page
    end = (off + b.size) // page * page
    if begin >= end:
        return
    fl = b.fl
    remove_free(b)
    before = base + begin - b.ptr
    if before > 0:
        head = Block(b.ptr, before, fl, seg, eng.new_tb(b.ptr))
        head.prev, head.next = b.prev, b
        if b.prev is not None:
            b.prev.next = head
        b.prev = head
        insert_free(head)
    after = b.size - before - (end - begin)
    if after > 0:
        tail = Block(base + end, after, fl, seg, eng.new_tb(base + end))
        tail.prev, tail.next = b, b.next
        if b.next is not None:
            b.next.prev = tail
        b.next = tail
        insert_free(tail)
    b.ptr = base + begin
    b.size = end - begin
    b.mapped = False
    if eng.rules.tie_by_address:
        b.tb = b.ptr
    _try_merge(eng, b, b.prev)
    _try_merge(eng, b, b.next)
    _unmapped_insert(fl, b)
    eng.reserved -= end - begin
    eng.num_device_free += 1
    eng.segment_event(i, SEG_UNMAP, base + begin, end - begin)


def release_segment(b: Block) -> None:
    """``release_expandable_segment``: drop a fully unmapped reservation (no trace entry)."""
    _unmapped_remove(b.fl, b)


def seed_reservations(eng: EngineCore, state: AllocatorState) -> dict[int, ExpSegment]:
    """Reservations for a start state's expandable runs: run address -> its :class:`ExpSegment`.

    A snapshot lists each contiguous mapped run of an expandable segment as its own
    segment and says nothing of the reservation around it. Runs of one (pool, stream,
    small/large) are taken to share a reservation of ``9/8 × device`` (the engine's
    reserve size; more if the runs span more) that starts at the lowest run, or lower
    where the trace maps or unmaps pages below it (pages in front of the lowest run
    that were unmapped before the trace began and are mapped again in it: a whole
    number of pages below, within one reservation's reach). A run beyond that reach
    starts a new reservation. Pages are the replayed settings' page size (2 MiB
    small; ``large_segment_size`` large).
    """
    groups: dict[tuple[tuple[int, int], int, bool], list[StateSegment]] = {}
    for seg in state.segments:
        if seg.expandable:
            groups.setdefault((seg.pool_id, seg.stream, seg.small), []).append(seg)
    reserve = eng.rules.expandable_reserve()
    found: list[tuple[ExpSegment, list[StateSegment]]] = []
    for (_, _, small), runs in groups.items():
        page = SMALL_BUFFER if small else eng.rules.large_segment
        full = -(-reserve // page) * page
        cur: tuple[ExpSegment, list[StateSegment]] | None = None
        for seg in sorted(runs, key=lambda s: s.address):
            if cur is None or seg.address >= cur[0].base + full:
                cur = (ExpSegment(seg.address, page, full), [])
                found.append(cur)
            cur[1].append(seg)
    trace = eng.trace
    touched = sorted(addr for kind, addr in zip(trace.seg_kinds, trace.seg_addrs, strict=True)
                     if kind in (SEG_MAP, SEG_UNMAP))
    for addr in touched:
        best: ExpSegment | None = None
        for exp, runs in found:
            runs_end = runs[-1].address + runs[-1].total_size
            if exp.base <= addr < exp.base + exp.size:
                best = None
                break
            if (addr < exp.base and (exp.base - addr) % exp.page == 0 and runs_end - addr <= exp.size
                    and (best is None or exp.base < best.base)):
                best = exp
        if best is not None:
            best.base = addr
    out: dict[int, ExpSegment] = {}
    for exp, runs in found:
        runs_end = runs[-1].address + runs[-1].total_size
        exp.size = max(exp.size, -(-(runs_end - exp.base) // exp.page) * exp.page)
        eng.reservations.append(exp)
        for seg in runs:
            out[seg.address] = exp
    return out


def link_reservations(
    eng: EngineCore, state: AllocatorState, exp_of: dict[int, ExpSegment],
    ends: dict[int, tuple[Block, Block]],
) -> None:
    """Chain each seeded reservation's runs in address order, unmapped gaps between them
    and an unmapped tail to the reservation's end (``ends``: first and last block per run)."""
    runs: dict[int, list[StateSegment]] = {}
    for seg in state.segments:
        if seg.expandable:
            runs.setdefault(id(exp_of[seg.address]), []).append(seg)
    for segs in runs.values():
        segs.sort(key=lambda s: s.address)
        exp = exp_of[segs[0].address]
        fl = ends[segs[0].address][0].fl
        pos = exp.base
        last: Block | None = None
        for seg in segs:
            first, end_blk = ends[seg.address]
            if seg.address > pos:
                last = _seed_unmapped(eng, fl, exp, last, pos, seg.address - pos)
            if last is not None:
                last.next = first
                first.prev = last
            last = end_blk
            pos = seg.address + seg.total_size
        if pos < exp.base + exp.size:
            _seed_unmapped(eng, fl, exp, last, pos, exp.base + exp.size - pos)


def _seed_unmapped(eng: EngineCore, fl: FreeList, exp: ExpSegment, prev: Block | None, ptr: int,
                   size: int) -> Block:
    b = Block(ptr, size, fl, exp, eng.new_tb(ptr))
    b.mapped = False
    if prev is not None:
        prev.next = b
        b.prev = prev
    _unmapped_insert(fl, b)
    return b
