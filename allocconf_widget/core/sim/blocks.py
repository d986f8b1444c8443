"""Blocks and free lists of the replay engine.

A :class:`Block` is a piece of a segment; a :class:`FreeList` holds the cached
blocks of one pool on one stream as sorted int keys ``size << 64 | tiebreak``
(:class:`~.sorted_keys.SortedKeys`) plus a dict from key to block, so best fit is a
search over ints (:meth:`~.sorted_keys.SortedKeys.ceiling`). :class:`Pool` is torch's
``BlockPool``: one per (private pool id, small/large) across streams, owning the GC clock.
"""

from __future__ import annotations

from allocconf_widget.core.sim.sorted_keys import SortedKeys

KEY_SHIFT = 64
NO_CHANGE = 1 << 62  # FreeList.dirty when nothing was freed or unmapped since the last search


class ExpSegment:
    """One reserved virtual range of expandable segments: its base, page size and length."""

    __slots__ = ("base", "page", "size")

    def __init__(self, base: int, page: int, size: int) -> None:
        self.base = base
        self.page = page
        self.size = size


class Block:
    """A piece of a segment: allocated, cached (in a free list), pending, or unmapped."""

    __slots__ = ("busy", "fl", "gcb", "key", "mapped", "next", "pending", "prev", "ptr", "req",
                 "seg", "size", "tb")

    ptr: int
    size: int
    fl: FreeList
    seg: ExpSegment | None
    tb: int  # tie-break: address (≤2.11) or registration counter (2.12+)
    prev: Block | None
    next: Block | None
    busy: bool  # allocated or waiting on record_stream events
    pending: bool  # free requested, events outstanding
    mapped: bool
    req: int
    key: int
    gcb: int  # GC clock value when the block entered the free list

    def __init__(self, ptr: int, size: int, fl: FreeList, seg: ExpSegment | None, tb: int) -> None:
        self.ptr = ptr
        self.size = size
        self.fl = fl
        self.seg = seg
        self.tb = tb
        self.prev = None
        self.next = None
        self.busy = False
        self.pending = False
        self.mapped = True
        self.req = 0
        self.key = 0
        self.gcb = 0


class Pool:
    """torch's ``BlockPool``: one per (private pool id, small/large), across streams."""

    __slots__ = ("cands", "clock", "default", "expandable", "lists", "pool_id", "small")

    def __init__(self, small: bool, default: bool, expandable: bool,
                 pool_id: tuple[int, int] = (0, 0)) -> None:
        self.small = small
        self.default = default
        self.expandable = expandable
        self.pool_id = pool_id
        self.clock = 0  # get_free_blocks_call_count
        self.lists: list[FreeList] = []  # sorted by raw stream, like torch's set order
        #: cached blocks a release or GC may act on (see reclaim.candidates), by id()
        self.cands: dict[int, Block] = {}


class FreeList:
    """The cached blocks of one pool on one stream, plus its unmapped expandable ranges."""

    __slots__ = ("blocks", "dirty", "keys", "pool", "room_end", "room_ptrs", "room_totals", "stream",
                 "unmapped", "unmapped_ptrs")

    def __init__(self, pool: Pool, stream: int) -> None:
        self.pool = pool
        self.stream = stream
        self.keys = SortedKeys()
        self.blocks: dict[int, Block] = {}
        self.unmapped: list[Block] = []  # address order
        self.unmapped_ptrs: list[int] = []
        # the expandable room search's memory (expandable._find_room): the ranges whose idle
        # run beat every earlier one, how far the search got, the lowest address freed or
        # unmapped since
        self.room_ptrs: list[int] = []
        self.room_totals: list[int] = []
        self.room_end = 0
        self.dirty = NO_CHANGE


def insert_free(b: Block) -> None:
    """Put a free mapped block into its (pool, stream) list, resetting its GC age."""
    fl = b.fl
    k = (b.size << KEY_SHIFT) | b.tb
    fl.keys.add(k)
    fl.blocks[k] = b
    b.key = k
    b.gcb = fl.pool.clock
    if releasable(b):
        fl.pool.cands[id(b)] = b


def releasable(b: Block) -> bool:
    """Whether a cached block is one a release or GC acts on: a whole segment (classic, or an
    expandable reservation mapped end to end), or expandable memory holding a whole page.
    A cached block only stops being one by being split or taken; it becomes one only by
    being freed or merged, which puts it into its free list again."""
    if b.prev is None and b.next is None:
        return True
    seg = b.seg
    if seg is None:
        return False
    page = seg.page
    off = b.ptr - seg.base
    return -(-off // page) * page < (off + b.size) // page * page


def remove_free(b: Block) -> None:
    """Take a block out of its free list."""
    fl = b.fl
    fl.keys.remove(b.key)
    del fl.blocks[b.key]


def drain(fresh: list[Block]) -> None:
    """Note the blocks the replay's hot loop cached (``fresh``) in their pools' candidates."""
    for b in fresh:
        if not b.busy and b.fl.blocks.get(b.key) is b and releasable(b):
            b.fl.pool.cands[id(b)] = b
    fresh.clear()


def candidates(pool: Pool) -> list[Block]:
    """The pool's cached blocks a release or GC may act on, in torch's set order.

    torch walks every cached block of the pool; the blocks this skips are ones the walk
    leaves alone (parts of a segment, expandable pieces without a whole page). Walking all
    of them per ``empty_cache()`` made a trace with many cached pieces, streams or pools
    replay in quadratic time; this costs the candidates only.
    """
    cands = pool.cands
    out = []
    for key, b in list(cands.items()):
        if not b.busy and b.mapped and b.fl.blocks.get(b.key) is b and releasable(b):
            out.append(b)
        else:
            del cands[key]
    out.sort(key=_set_order)
    return out


def _set_order(b: Block) -> tuple[int, int]:
    return b.fl.stream, b.key
