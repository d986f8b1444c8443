"""Giving cached memory back: segment release, the OOM path, GC and ``empty_cache``.

These are torch's ``release_block``, ``release_available_cached_blocks``,
``release_cached_blocks`` and ``garbage_collect_cached_blocks``
(docs/internals/allocator_facts.md §6.8–6.9), as functions of the engine.
They run only when a request misses the cache (or the trace shows an
``empty_cache()``), never in the hot loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from allocconf_widget.core.sim.blocks import KEY_SHIFT, Block, FreeList, candidates, drain, remove_free
from allocconf_widget.core.sim.expandable import release_segment, unmap_block
from allocconf_widget.core.sim.settings import UNLIMITED
from allocconf_widget.core.sim.trace.codes import SEG_FREE

if TYPE_CHECKING:
    from allocconf_widget.core.sim.ports import EngineCore


def release_block(eng: EngineCore, b: Block, i: int) -> None:
    """``release_block``: cudaFree a whole cached classic segment."""
    remove_free(b)
    eng.reserved -= b.size
    eng.num_device_free += 1
    eng.segment_event(i, SEG_FREE, b.ptr, b.size)
    eng.release_address(b.ptr, b.size)


def release_oversize(eng: EngineCore, fl: FreeList, r: int, i: int) -> bool:
    """``release_available_cached_blocks``: free oversize cached segments (§6.8)."""
    max_split = eng.rules.max_split
    if max_split == UNLIMITED:
        return False
    need = max(r, max_split)
    keys, blocks = fl.keys, fl.blocks
    k = keys.ceiling(need << KEY_SHIFT)
    if k is not None and blocks[k].seg is None:
        release_block(eng, blocks[k], i)
        return True
    released = 0
    # down from the largest key below need; a released block leaves the keys, so each step
    # asks again for the next key below the last one seen
    k = keys.lower(need << KEY_SHIFT)
    while released < need and k is not None:
        b = blocks[k]
        if b.size < max_split:
            break
        if b.seg is None and b.prev is None and b.next is None:
            released += b.size
            release_block(eng, b, i)
        k = keys.lower(k)
    return released >= need


def free_all_cached(eng: EngineCore, i: int) -> None:
    """``release_cached_blocks`` (OOM path and ``empty_cache``): sync, then release."""
    eng.num_sync_all_streams += 1
    for aid, blk in list(eng.pending.items()):
        if eng.live[aid] is blk:  # (the address may hold a newer block: see run_ops)
            eng.live[aid] = None
        eng.active -= blk.size
        eng.requested -= blk.req
        eng.to_cache(blk)
    eng.pending.clear()
    for pool in (eng.default_large, eng.default_small):
        _release_blocks(eng, pool, i)


def _release_blocks(eng: EngineCore, pool: Any, i: int) -> None:
    """torch's ``release_blocks``: free every whole classic segment of ``pool`` and unmap
    its free expandable pages (a wholly unmapped expandable segment is let go)."""
    to_unmap: list[Block] = []
    drain(eng.fresh)
    for b in candidates(pool):
        if b.seg is not None:
            to_unmap.append(b)
        elif b.prev is None and b.next is None:
            release_block(eng, b, i)
    for b in to_unmap:
        unmap_block(eng, b, i)
        if not b.mapped and b.prev is None and b.next is None:
            release_segment(b)


def release_pool(eng: EngineCore, lane: int, i: int) -> None:
    """Release the cached memory of the private pool of ``lane`` (small and large), classic
    segments and expandable pages alike: a ``MemPool`` destroyed or emptied, a CUDA graph
    pool that became free."""
    eng.num_sync_all_streams += 1  # torch synchronises the pool's events first
    for fl in (eng.small_lists[lane], eng.large_lists[lane]):
        _release_blocks(eng, fl.pool, i)


def collect_garbage(eng: EngineCore, i: int) -> None:
    """``garbage_collect_cached_blocks``: release old whole large segments (§6.9)."""
    rules = eng.rules
    assert rules.allowed_max is not None
    budget = int(rules.gc_threshold * rules.allowed_max)
    if eng.reserved <= budget:
        return
    target = eng.reserved - budget
    pool = eng.default_large
    clock = pool.clock
    drain(eng.fresh)
    whole = [b for b in candidates(pool) if b.prev is None and b.next is None]
    total_age = sum(clock - b.gcb for b in whole)
    count = len(whole)
    reclaimed = 0
    freed = True
    while reclaimed < target and freed and count > 0:
        threshold = total_age / count
        freed = False
        for b in candidates(pool):
            if b.prev is None and b.next is None and b.seg is None and clock - b.gcb >= threshold:
                freed = True
                reclaimed += b.size
                total_age -= clock - b.gcb
                count -= 1
                release_block(eng, b, i)
