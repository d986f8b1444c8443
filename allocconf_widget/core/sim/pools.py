"""Which allocations went to a private pool, when the trace entries do not say.

torch ≤ 2.11 writes no pool id into trace entries, so the allocations of CUDA graphs
(``torch.compile(mode="reduce-overhead")``) and of ``torch.cuda.use_mem_pool`` look like
default-pool ones, and a replay that mixes them reuses blocks the real allocator never
could. Which pool each request went to is the program's choice, the same under every
setting, so it can be read off the recorded run once:

* the final snapshot lists each surviving segment with its ``segment_pool_id``;
* a new segment made while a live segment of the same stream and size class had a free
  gap that would have served the request cannot be in that segment's pool (the
  allocator always reuses a fitting cached block of its own pool first);
* likewise, a request placed in a free block while another segment of the same stream and
  size class had a smaller free block that fits was not in that segment's pool (the
  allocator takes the smallest fitting block of its pool: best fit);
* segments released together with private ones, when no default segment is released in
  that burst, went with their pool (a ``MemPool`` being destroyed or emptied).

Segments form a graph of "not in the same pool" edges; with one private pool beside the
default one it is two-coloured from the anchors. Allocations inside a private segment get
that pool. Anything contradictory (an odd cycle, two private pools) gives up: the caller
keeps the default attribution and its caveat.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from allocconf_widget.core.numbers import int_or_zero
from allocconf_widget.core.sim.state import pool_id_of_entry
from allocconf_widget.core.units import MIB

SMALL_SEGMENT = 2 * MIB
DEFAULT_POOL = (0, 0)
#: the id given to an inferred private pool that the snapshot does not name
INFERRED_POOL = (-1, 1)


@dataclass
class _Segment:
    start: int
    end: int
    stream: int
    small: bool
    blocks: dict[int, int] = field(default_factory=dict)  # live block start -> end
    starts: list[int] = field(default_factory=list)  # live block starts, sorted
    gap_at: dict[int, int] = field(default_factory=dict)  # free gap start -> size


class _FreeGaps:
    """The free gaps of every live segment, sorted by size per (stream, size class), kept
    up to date block by block (a trace has hundreds of thousands of entries).

    Gaps are computed from the live blocks at their rounded sizes; a real block can be up
    to one slack larger (the allocator does not split off a remainder that small), so a
    gap is at most ``slack`` larger than the real free block, never smaller.
    """

    #: more free gaps than this at once is no notebook's trace (a hostile file could make
    #: every insertion move them all): the evidence is then no longer gathered (the other
    #: rules still apply)
    LIMIT = 8192

    def __init__(self) -> None:
        self.by_kind: dict[tuple[int, bool], list[tuple[int, int, int]]] = {}
        self.count = 0
        self.on = True

    def _add(self, seg: _Segment, sid: int, pos: int, size: int) -> None:
        if size > 0:
            seg.gap_at[pos] = size
            insort(self.by_kind.setdefault((seg.stream, seg.small), []), (size, pos, sid))
            self.count += 1
            if self.count > self.LIMIT:
                self.on = False
                self.by_kind.clear()

    def _drop(self, seg: _Segment, sid: int, pos: int) -> None:
        size = seg.gap_at.pop(pos, None)
        if size is not None:
            self.count -= 1
            items = self.by_kind.get((seg.stream, seg.small), [])
            i = bisect_left(items, (size, pos, sid))
            if i < len(items) and items[i] == (size, pos, sid):
                del items[i]

    def _neighbours(self, seg: _Segment, addr: int) -> tuple[int, int]:
        """End of the live block before ``addr`` and start of the one after (segment edges)."""
        p = bisect_left(seg.starts, addr)
        before = seg.blocks[seg.starts[p - 1]] if p > 0 else seg.start
        after = seg.starts[p] if p < len(seg.starts) else seg.end
        return max(before, seg.start), after

    def created(self, seg: _Segment, sid: int) -> None:
        self._add(seg, sid, seg.start, seg.end - seg.start)

    def released(self, seg: _Segment, sid: int) -> None:
        for pos in list(seg.gap_at):
            self._drop(seg, sid, pos)

    def allocated(self, seg: _Segment, sid: int, addr: int, end: int) -> int:
        """Block ``[addr, end)`` taken; returns the free block it was placed in (its size)."""
        before, after = self._neighbours(seg, addr)
        self._drop(seg, sid, before)
        self._add(seg, sid, before, addr - before)
        self._add(seg, sid, end, after - end)
        insort(seg.starts, addr)
        if len(seg.starts) > self.LIMIT:  # as many live blocks in one segment: the same
            self.on = False
            self.by_kind.clear()
        return after - addr

    def freed(self, seg: _Segment, sid: int, addr: int, end: int) -> None:
        i = bisect_left(seg.starts, addr)
        if i < len(seg.starts) and seg.starts[i] == addr:
            del seg.starts[i]
        before, after = self._neighbours(seg, addr)
        self._drop(seg, sid, before)
        self._drop(seg, sid, end)
        self._add(seg, sid, before, after - before)

    def smaller_fits(self, kind: tuple[int, bool], r: int, slack: int, hi: int, skip: int,
                     segs: Sequence[_Segment], limit: int = 8) -> list[int]:
        """Segments other than ``skip`` with a free block that surely holds ``r`` bytes and is
        smaller than ``hi`` (at most ``limit``). A gap at the start of its segment is exact (no
        block before it can be larger than recorded); any other needs ``r + slack``."""
        items = self.by_kind.get(kind)
        out: list[int] = []
        if not items:
            return out
        i = bisect_left(items, (r, -1, -1))
        for size, pos, sid in items[i:i + 8 * limit]:  # a bounded look: evidence is optional
            if size >= hi or len(out) >= limit:
                break
            if (sid != skip and sid not in out
                    and (size >= r + slack or pos == segs[sid].start)):
                out.append(sid)
        return out


@dataclass(frozen=True)
class PoolAttribution:
    """Private pools read off a recorded run (entry index -> pool id, for private ones only)."""

    alloc_pools: dict[int, tuple[int, int]]
    release_pools: dict[int, tuple[int, int]]  # segment_free entry index -> private pool
    private_segments: int


def attribute_pools(
    entries: Sequence[Any],
    final_segments: Sequence[Any] | None,
    rounding: Callable[[int], int],
    *,
    max_split: int | None = None,
    expandable: bool = False,
) -> PoolAttribution | None:
    """Pool of every allocation of a trace whose entries carry no pool id, or None.

    None when nothing points at a private pool, or when the evidence contradicts itself.
    ``rounding`` is the recorded settings' request rounding; with ``max_split`` set,
    oversize gaps prove nothing (the allocator may not split them) and are skipped. With
    ``expandable`` (the run had expandable segments; torch ≤ 2.10 maps them in the default
    pool only) every classic ``segment_alloc`` is a private pool's.
    """
    segs: list[_Segment] = []
    live_starts: list[int] = []
    live_id: dict[int, int] = {}
    block_seg: dict[int, int] = {}
    edges: dict[int, set[int]] = {}
    bursts: list[list[int]] = []
    gaps = _FreeGaps()
    released_at: dict[int, int] = {}
    last_release = -2
    n = len(entries)
    empty: set[int] = set()  # live segments holding no block
    last_alloc_seg: int | None = None
    released_since_alloc = False
    ooms: list[tuple[int, int, tuple[int, ...]]] = []  # (entry, last alloc's segment, empty ones)
    for idx, e in enumerate(entries):
        if not isinstance(e, Mapping):
            return None
        act = e.get("action")
        if act == "oom":
            if last_alloc_seg is not None and not released_since_alloc and len(ooms) < 10_000:
                ooms.append((idx, last_alloc_seg, tuple(sorted(empty))[:64]))
        elif act == "alloc":
            addr = int_or_zero(e.get("addr"))
            pos = bisect_right(live_starts, addr) - 1
            if pos < 0:
                continue
            sid = live_id[live_starts[pos]]
            seg = segs[sid]
            if addr >= seg.end:
                continue
            r = rounding(int_or_zero(e.get("size")))
            if addr in seg.blocks:  # an alloc without a free before it: keep the first
                continue
            end = min(addr + r, seg.end)
            if gaps.on:
                chosen = gaps.allocated(seg, sid, addr, end)
                _best_fit_edges(seg, sid, r, chosen, gaps, segs, edges, max_split)
            seg.blocks[addr] = end
            block_seg[addr] = sid
            empty.discard(sid)
            last_alloc_seg, released_since_alloc = sid, False
        elif act == "free_completed":
            addr = int_or_zero(e.get("addr"))
            sid_or_none = block_seg.pop(addr, None)
            if sid_or_none is not None:
                seg = segs[sid_or_none]
                end = seg.blocks.pop(addr, seg.end)
                if gaps.on:
                    gaps.freed(seg, sid_or_none, addr, end)
                if not seg.blocks:
                    empty.add(sid_or_none)
        elif act == "segment_alloc":
            addr, size = int_or_zero(e.get("addr")), int_or_zero(e.get("size"))
            pos = bisect_right(live_starts, addr) - 1
            if pos >= 0 and addr < segs[live_id[live_starts[pos]]].end:
                return None  # a segment made inside a live one: the trace contradicts itself
            sid = len(segs)
            seg = _Segment(addr, addr + size, int_or_zero(e.get("stream")), size == SMALL_SEGMENT)
            segs.append(seg)
            edges[sid] = set()
            request = _next_alloc(entries, idx, n)
            if request is not None and gaps.on:
                # a cached block that fits would have been reused: those segments are another
                # pool's (with max_split_size, an oversize block serves no smaller request)
                r = rounding(request)
                small = r <= MIB
                hi = max_split if max_split is not None and not small else 1 << 62
                for oid in gaps.smaller_fits((seg.stream, small), r, 512 if small else MIB,
                                             hi, sid, segs):
                    edges[sid].add(oid)
                    edges[oid].add(sid)
            insort(live_starts, addr)
            live_id[addr] = sid
            empty.add(sid)
            if gaps.on:
                gaps.created(seg, sid)
        elif act in ("segment_unmap", "segment_map"):
            if not expandable:
                return None
        elif act == "segment_free":
            addr = int_or_zero(e.get("addr"))
            sid_or_none = live_id.pop(addr, None)
            if sid_or_none is None:
                continue
            del live_starts[bisect_left(live_starts, addr)]
            empty.discard(sid_or_none)
            released_since_alloc = True
            if gaps.on:
                gaps.released(segs[sid_or_none], sid_or_none)
            released_at[sid_or_none] = idx
            if last_release == idx - 1 and bursts:
                bursts[-1].append(sid_or_none)
            else:
                bursts.append([sid_or_none])
            last_release = idx
    anchors: dict[int, tuple[int, int]] = {}
    for raw in final_segments or ():
        if isinstance(raw, Mapping):
            sid_or_none = live_id.get(int_or_zero(raw.get("address")))
            if sid_or_none is not None:
                anchors[sid_or_none] = pool_id_of_entry(raw)
    private_ids = {p for p in anchors.values() if p != DEFAULT_POOL}
    if len(private_ids) > 1:
        return None
    private = private_ids.pop() if private_ids else INFERRED_POOL
    color = (dict.fromkeys(range(len(segs)), 1) if expandable
             else _two_colour(len(segs), edges, anchors))
    if color is None:
        return None
    # a burst that released a private segment and no default one released its whole pool
    for burst in bursts:
        if any(color.get(s) == 1 for s in burst) and not any(color.get(s) == 0 for s in burst):
            for s in burst:
                color.setdefault(s, 1)
    if not any(c == 1 for c in color.values()):
        return None
    alloc_pools: dict[int, tuple[int, int]] = {}
    release_pools: dict[int, tuple[int, int]] = {}
    _assign(entries, segs, color, private, alloc_pools)
    # An OOM with no release before it while a default segment sat wholly free: torch skips
    # release_cached_blocks only while a capture (a CUDA graph, use_mem_pool) is under way, and
    # then the failed request was going to the private pool, as the allocations before it did.
    for idx, seg_id, empties in ooms:
        if color.get(seg_id) == 1 and any(color.get(s, 0) == 0 for s in empties):
            alloc_pools[idx] = private
    for sid, idx in released_at.items():
        if color.get(sid) == 1:
            release_pools[idx] = private
    return PoolAttribution(alloc_pools, release_pools, sum(1 for c in color.values() if c == 1))


def _best_fit_edges(seg: _Segment, sid: int, r: int, chosen: int, gaps: _FreeGaps,
                    segs: Sequence[_Segment], edges: dict[int, set[int]],
                    max_split: int | None) -> None:
    """A request of rounded size ``r`` was placed in a free block of ``chosen`` bytes of
    ``seg``: best fit took it, so any other segment of its stream and size class holding a
    smaller block that surely fits (``r <= gap < chosen``) is in another pool."""
    small = r <= MIB
    if seg.small != small:
        return
    slack = 512 if small else MIB
    if chosen <= r:
        return  # an exact fit: no smaller block could have been preferred
    hi = chosen if max_split is None or small else min(chosen, max_split)
    for other in gaps.smaller_fits((seg.stream, small), r, slack, hi, sid, segs):
        edges[sid].add(other)
        edges[other].add(sid)


def _next_alloc(entries: Sequence[Any], idx: int, n: int) -> int | None:
    for j in range(idx + 1, min(idx + 8, n)):
        e = entries[j]
        if isinstance(e, Mapping) and e.get("action") == "alloc":
            return int_or_zero(e.get("size"))
    return None


def _two_colour(count: int, edges: dict[int, set[int]],
                anchors: dict[int, tuple[int, int]]) -> dict[int, int] | None:
    """0 = default pool, 1 = private; components with neither anchor nor edge stay out."""
    color: dict[int, int] = {}
    for root in range(count):
        if root in color or (not edges.get(root) and root not in anchors):
            continue
        comp: list[int] = []
        trial: dict[int, int] = {root: 0}
        stack = [root]
        while stack:
            x = stack.pop()
            comp.append(x)
            for y in edges.get(x, ()):
                if y not in trial:
                    trial[y] = 1 - trial[x]
                    stack.append(y)
                elif trial[y] == trial[x]:
                    return None
        anchored = [(trial[s], anchors[s] != DEFAULT_POOL) for s in comp if s in anchors]
        if anchored:
            flips = {t ^ int(priv) for t, priv in anchored}
            if len(flips) > 1:
                return None
            flip = flips.pop()
        elif len(comp) > 1:
            # no anchor: the segment that appears first is the default pool's
            flip = trial[min(comp)]
        else:
            continue
        for s in comp:
            color[s] = trial[s] ^ flip
    return color


def _assign(entries: Sequence[Any], segs: list[_Segment], color: dict[int, int],
            private: tuple[int, int], out: dict[int, tuple[int, int]]) -> None:
    """Second pass: each allocation inside a private segment's lifetime gets its pool."""
    live_starts: list[int] = []
    live_id: dict[int, int] = {}
    next_sid = 0
    for idx, e in enumerate(entries):
        act = e.get("action")
        if act == "segment_alloc":
            addr = int_or_zero(e.get("addr"))
            insort(live_starts, addr)
            live_id[addr] = next_sid
            next_sid += 1
        elif act == "segment_free":
            addr = int_or_zero(e.get("addr"))
            if live_id.pop(addr, None) is not None:
                del live_starts[bisect_left(live_starts, addr)]
        elif act == "alloc":
            addr = int_or_zero(e.get("addr"))
            pos = bisect_right(live_starts, addr) - 1
            if pos >= 0:
                sid = live_id[live_starts[pos]]
                if color.get(sid) == 1 and addr < segs[sid].end:
                    out[idx] = private


#: Separate expandable-segment reservations lie far apart (each reserves about 9/8 of the
#: device's memory in virtual addresses); addresses closer than this are one reservation.
RESERVATION_GAP = 8 << 30


def attribute_expandable_pools(
    entries: Sequence[Any], final_segments: Sequence[Any] | None,
) -> PoolAttribution | None:
    """Pools of a run recorded under expandable segments (torch 2.11+: private pools map
    expandable segments too), from where the memory lies.

    Each (pool, stream, size class) maps its pages inside a virtual-address reservation of
    its own, far from the others, and keeps it until it is wholly unmapped (a reservation
    covers 9/8 of the device: it never runs out). Addresses of mapped segments and
    allocations are grouped into reservations by those gaps. A reservation holding a
    surviving segment of the final snapshot is that segment's pool's. One that does not, but
    lived while the default pool's reservation of its stream and size class did, cannot be
    the default pool's: it is a private pool's (a ``MemPool`` destroyed before the end).
    Every allocation inside a private reservation gets that pool, and its unmapping releases
    the pool. None when no reservation is a private pool's, or one holds two pools.
    """
    owners: list[tuple[int, tuple[int, int], bool]] = []
    for seg in final_segments or ():
        if isinstance(seg, Mapping) and seg.get("is_expandable"):
            owners.append((int_or_zero(seg.get("address")), pool_id_of_entry(seg),
                           seg.get("segment_type") == "small"))
    if not owners:
        return None
    kinds = ("segment_map", "segment_unmap", "alloc")
    points = sorted({a for a, _, _ in owners} | {
        int_or_zero(e.get("addr")) for e in entries
        if isinstance(e, Mapping) and e.get("action") in kinds})
    starts: list[int] = []  # first address of each reservation-sized group
    ends: list[int] = []
    for addr in points:
        if starts and addr - ends[-1] <= RESERVATION_GAP:
            ends[-1] = addr
        else:
            starts.append(addr)
            ends.append(addr)

    def group_of(addr: int) -> int:
        return bisect_right(starts, addr) - 1

    group_pool: dict[int, tuple[int, int]] = {}
    small: dict[int, bool] = {}
    for addr, pool, is_small in owners:
        group = group_of(addr)
        if group_pool.setdefault(group, pool) != pool:
            return None  # two pools in one reservation: the grouping is wrong, do not guess
        small[group] = is_small
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    streams: dict[int, set[int]] = {}
    unused: dict[int, int] = {}  # mapped bytes not allocated, per group
    live: dict[int, tuple[int, int]] = {}  # allocated address -> (group, size)
    last_alloc: int | None = None
    released_since_alloc = False
    ooms: list[tuple[int, int, dict[int, int]]] = []
    for idx, e in enumerate(entries):
        if not isinstance(e, Mapping):
            continue
        act = e.get("action")
        if act == "oom":
            if last_alloc is not None and not released_since_alloc and len(ooms) < 10_000:
                ooms.append((idx, last_alloc, {g: b for g, b in unused.items() if b > 0}))
            continue
        if act == "free_completed":
            gone = live.pop(int_or_zero(e.get("addr")), None)
            if gone is not None:
                unused[gone[0]] = unused.get(gone[0], 0) + gone[1]
            continue
        if act not in kinds:
            continue
        group = group_of(int_or_zero(e.get("addr")))
        first.setdefault(group, idx)
        last[group] = idx
        streams.setdefault(group, set()).add(int_or_zero(e.get("stream")))
        size = int_or_zero(e.get("size"))
        if act == "alloc":
            small[group] = small.get(group, True) and size <= MIB
            live[int_or_zero(e.get("addr"))] = (group, size)
            unused[group] = unused.get(group, 0) - size
            last_alloc, released_since_alloc = group, False
        else:
            unused[group] = unused.get(group, 0) + (size if act == "segment_map" else -size)
            released_since_alloc = released_since_alloc or act == "segment_unmap"
    for group in group_pool:  # a surviving reservation lives to the end
        last[group] = len(entries)
    named = {p for p in group_pool.values() if p != DEFAULT_POOL}
    if len(named) <= 1:  # with two private pools, which one a lost reservation was is unknown
        private = named.pop() if named else INFERRED_POOL
        defaults = [g for g, p in group_pool.items() if p == DEFAULT_POOL and len(streams.get(g, ())) <= 1]
        for group in range(len(starts)):
            if group in group_pool or group not in first or len(streams[group]) != 1:
                continue
            if any(streams.get(d, streams[group]) == streams[group] and small.get(d) == small.get(group)
                   and first.get(d, 0) <= last[group] and first[group] <= last[d] for d in defaults):
                group_pool[group] = private
    alloc_pools: dict[int, tuple[int, int]] = {}
    release_pools: dict[int, tuple[int, int]] = {}
    for idx, e in enumerate(entries):
        if not isinstance(e, Mapping) or e.get("action") not in ("alloc", "segment_unmap"):
            continue
        pool = group_pool.get(group_of(int_or_zero(e.get("addr"))), DEFAULT_POOL)
        if pool != DEFAULT_POOL:
            (alloc_pools if e.get("action") == "alloc" else release_pools)[idx] = pool
    # An OOM with nothing unmapped before it while the default pool had two pages' worth
    # mapped and unused: torch skips release_cached_blocks only while a capture (a CUDA graph,
    # use_mem_pool) is under way, and the failed request went where the ones before it did.
    for idx, group, spare in ooms:
        pool = group_pool.get(group, DEFAULT_POOL)
        if pool != DEFAULT_POOL and any(
                group_pool.get(g, DEFAULT_POOL) == DEFAULT_POOL
                and b >= 2 * (SMALL_SEGMENT if small.get(g) else 20 * MIB) for g, b in spare.items()):
            alloc_pools[idx] = pool
    if not alloc_pools:
        return None
    private_groups = sum(1 for p in group_pool.values() if p != DEFAULT_POOL)
    return PoolAttribution(alloc_pools, release_pools, private_groups)
