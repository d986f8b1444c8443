"""The replay engine: a pure-Python model of PyTorch's native CUDA caching allocator.

It follows docs/internals/allocator_facts.md §6 (derived from ``CUDACachingAllocator.cpp``):
rounding, small/large pools, best fit per (pool, stream) with the release's
tie-break, splitting, merging on ``free_completed``, the OOM path, GC and
expandable segments. Blocks and free lists live in :mod:`.blocks`, the
OOM path and GC in :mod:`.reclaim`, expandable segments in
:mod:`.expandable`.

Speed is a design goal (≥ 500k trace events/s per configuration in CPython):

* the free list of one (pool, stream) keeps sorted int keys
  ``size << 64 | tiebreak`` (:class:`~.sorted_keys.SortedKeys`: one sorted ``list``, which
  this loop searches with :func:`bisect.bisect_left` itself, or sorted chunks when long), so
  a best-fit lookup compares ints only, plus a dict from key to block;
* blocks are ``__slots__`` objects; addresses in the trace were interned to
  dense ids, so "which block lives at this address" is a list index;
* :meth:`Engine.run_ops` is one flat loop with everything bound to locals;
  everything that happens rarely (new segments, the OOM path, GC, recorded
  OOMs, ``empty_cache``) is a method call outside it.
"""

from __future__ import annotations

import gc
import itertools
from bisect import bisect_left, insort
from time import perf_counter
from typing import TYPE_CHECKING

from allocconf_widget.core.memory.gcpause import paused_gc
from allocconf_widget.core.sim import expandable as xp
from allocconf_widget.core.sim import reclaim, sorted_keys
from allocconf_widget.core.sim.blocks import (
    KEY_SHIFT,
    Block,
    ExpSegment,
    FreeList,
    Pool,
    drain,
    insert_free,
    remove_free,
)
from allocconf_widget.core.sim.limits import FRACTION_SCALE
from allocconf_widget.core.sim.ranges import FreeRanges
from allocconf_widget.core.sim.result import PredictedOom, SegmentEvent, SimResult, SimSeries
from allocconf_widget.core.sim.settings import (
    ROUND_LARGE,
    SMALL_SIZE,
    EngineRules,
    SimSettings,
    round_size,
)
from allocconf_widget.core.sim.state import (
    ALLOCATED,
    FREE,
    PENDING,
    AllocatorState,
    StateBlock,
    StateSegment,
)
from allocconf_widget.core.sim.trace.codes import SEG_ALLOC, SEG_MAP
from allocconf_widget.core.units import MIB

if TYPE_CHECKING:
    from allocconf_widget.core.sim.trace.model import Trace

_BUMP_BASE = 1 << 60  # simulated addresses live far above real (≤ 2^48) ones
_SPACE_TOP = 1 << 59  # synthetic driver layout: below the bump, above real addresses
VA_ALIGN = 32 * MIB  # the driver starts fresh and top-down placements on 32 MiB boundaries
VA_TOP_DOWN_FROM = 80 * MIB  # smaller segments go bottom-up into free ranges, larger top-down
_SEED_LOW_MIN = 1 << 40  # a start state's segments set the layout's top only above 1 TiB
#: drain ``Engine.fresh`` once it holds this many blocks. Each block is drained once whatever
#: the threshold (the result is the same); most of them were merged away since, and a short
#: list lets them go sooner
FRESH_DRAIN_AT = 2048


class AddressSpace:
    """Where the CUDA driver puts new segments, when the recorded addresses are unknown.

    Addresses matter only for the equal-size tie-break of torch ≤ 2.11, through the
    *order* of segments within a free list. The rules below are what the recorded runs
    show (``benchmarks/address_model_study.py``; docs/simulator.md):

    * memory the process never had is taken top-down: a segment goes below the lowest
      one so far, starting on a 32 MiB boundary; the rest of that 32 MiB unit stays
      free (this is where 2 MiB small-pool segments end up);
    * a segment below 80 MiB takes the lowest-address free range that holds it, at
      the range's start (bottom-up first fit);
    * a segment of 80 MiB or more takes the highest 32 MiB-aligned start that fits in
      a free range (top-down first fit);
    * ``cudaFree`` gives the range back, merged with free neighbours.

    Free ranges live in a :class:`~.ranges.FreeRanges` treap, so each placement and
    release costs time logarithmic in the free ranges: a trace that creates and frees
    many segments replays in linear time (scanning a list of free ranges per new segment
    made it quadratic, docs/simulator.md "Speed").
    """

    __slots__ = ("free", "low")

    def __init__(self, top: int = _SPACE_TOP) -> None:
        self.low = top  # lowest address handed out so far
        self.free = FreeRanges(VA_ALIGN)

    @property
    def lengths(self) -> dict[int, int]:
        """Free ranges: start -> length."""
        return self.free.lengths

    @property
    def starts(self) -> list[int]:
        """Starts of the free ranges, by address."""
        return sorted(self.free.lengths)

    def allocate(self, size: int) -> int:
        """Address of a new ``size``-byte segment (a multiple of 2 MiB)."""
        free = self.free
        if size < VA_TOP_DOWN_FROM:
            start = free.lowest_fit(size)
            if start is not None:
                free.take(start, start, size)
                return start
        else:
            start = free.highest_aligned_fit(size)
            if start is not None:  # the highest range that fits holds the highest start
                addr = (start + free.lengths[start] - size) // VA_ALIGN * VA_ALIGN
                free.take(start, addr, size)
                return addr
        addr = (self.low - size) // VA_ALIGN * VA_ALIGN
        if addr + size < self.low:
            self.release(addr + size, self.low - addr - size)
        self.low = addr
        return addr

    def release(self, addr: int, size: int) -> None:
        """Return ``[addr, addr + size)`` to the free ranges."""
        self.free.release(addr, size)


class Engine:
    """One replay of one trace under one configuration. Use :func:`simulator.simulate`."""

    def __init__(
        self,
        trace: Trace,
        settings: SimSettings,
        *,
        device_total: int | None = None,
        non_pytorch_bytes: int = 0,
        stop_at_oom: bool = True,
        record_segments: bool = False,
        address_hints: bool = False,
    ) -> None:
        self.trace = trace
        self.settings = settings
        self.rules = rules = EngineRules.derive(settings, device_total, non_pytorch_bytes)
        self.stop_at_oom = stop_at_oom
        self.record_segments = record_segments
        self.cols = trace.replay_columns()
        self.live: list[Block | None] = [None] * trace.num_addresses
        self.pending: dict[int, Block] = {}
        self.fresh: list[Block] = []  # blocks the hot loop cached since the last drain (blocks.drain)
        self.rcache: dict[int, int] = {}
        self.counter = itertools.count()
        with paused_gc():  # a free list per (pool, stream): with many pools, ~1M objects
            self._build_pools(trace, rules)
        # statistics
        self.reserved = self.allocated = self.active = self.requested = 0
        self.peak_reserved = self.peak_active = self.peak_allocated = 0
        self.chunk_max_reserved = self.chunk_max_alloc = 0
        self.num_device_alloc = self.num_device_free = self.num_alloc_retries = 0
        self.num_ooms = self.num_oom_rejections = self.num_sync_all_streams = 0
        self.recorded_ooms = self.recorded_ooms_avoided = 0
        self.largest_segment = 0  # bytes of the largest segment held at any time (start state too)
        self.first_avoided: int | None = None  # event index of the first recorded OOM that fits now
        self.rejected = False
        self.oom: PredictedOom | None = None
        self.seg_events: list[SegmentEvent] = []
        self.stop_op: int | None = None
        # simulated address space: the driver model, or the recorded addresses (+ bump)
        self.space = AddressSpace()
        self.bump = _BUMP_BASE
        self.hints: list[tuple[int, int]] | None = None
        self.hint_pos = 0
        self.va_starts: list[int] = []
        self.va_ends: dict[int, int] = {}
        self.map_hints: list[int] | None = None  # recorded segment_map addresses (check=True)
        self.map_pos = 0
        self.reservations: list[ExpSegment] = []
        if address_hints:
            self.hints = [
                (size, addr)
                for kind, size, addr in zip(trace.seg_kinds, trace.seg_sizes, trace.seg_addrs, strict=True)
                if kind == SEG_ALLOC
            ]
            self.map_hints = [
                addr for kind, addr in zip(trace.seg_kinds, trace.seg_addrs, strict=True) if kind == SEG_MAP
            ]
        self.release_limit = _recorded_limit(trace, rules)
        # expandable blocks of a start state under settings without expandable segments
        # are skipped by best fit, as torch does when the option is turned off at runtime
        self.skip_expandable = False
        if trace.initial_state is not None:
            self._seed(trace.initial_state)

    def _build_pools(self, trace: Trace, rules: EngineRules) -> None:
        pools: dict[tuple[tuple[int, int], bool], Pool] = {}

        def pool_for(pool_id: tuple[int, int], small: bool) -> Pool:
            key = (pool_id, small)
            if key not in pools:
                default = pool_id == (0, 0)
                exp = rules.expandable and (default or rules.expandable_private_pools)
                pools[key] = Pool(small, default, exp, pool_id)
            return pools[key]

        self.default_large = pool_for((0, 0), False)
        self.default_small = pool_for((0, 0), True)
        self.small_lists: list[FreeList] = []
        self.large_lists: list[FreeList] = []
        for pool_id, stream in zip(trace.lane_pools, trace.lane_streams, strict=True):
            for small, out in ((True, self.small_lists), (False, self.large_lists)):
                pool = pool_for(pool_id, small)
                fl = FreeList(pool, stream)
                pool.lists.append(fl)
                out.append(fl)
        for pool in pools.values():
            pool.lists.sort(key=lambda fl: fl.stream)

    # ------------------------------------------------------------------ driver
    def run(self, series_points: int = 1000) -> SimResult:
        """Replay every operation; returns the prediction.

        Python's cyclic garbage collector is paused meanwhile: the replay makes and drops
        blocks by the million, none of them in a reference cycle that outlives it, and each
        full collection walks every live block (on a trace with many pools or segments that
        was half the replay's time, growing with the trace).
        """
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run(series_points)
        finally:
            if was_enabled:
                gc.enable()

    def _run(self, series_points: int) -> SimResult:
        trace = self.trace
        n = len(self.cols[0])
        chunk = max(1, -(-n // max(series_points, 1)))
        index, times = trace.op_index, trace.op_time_us
        s_idx: list[int] = []
        s_time: list[int] = []
        s_res: list[int] = []
        s_alloc: list[int] = []
        s_frag: list[float] = []
        start = perf_counter()
        for a in range(0, n, chunk):
            self.chunk_max_reserved = self.reserved
            self.chunk_max_alloc = self.allocated
            done = self.run_ops(a, min(a + chunk, n))
            if len(self.fresh) > FRESH_DRAIN_AT:
                drain(self.fresh)
            last = self.stop_op if self.stop_op is not None else min(a + chunk, n) - 1
            s_idx.append(index[last])
            s_time.append(times[last])
            s_res.append(self.chunk_max_reserved)
            s_alloc.append(self.chunk_max_alloc)
            s_frag.append(1.0 - self.allocated / self.reserved if self.reserved else 0.0)
            self.peak_allocated = max(self.peak_allocated, self.chunk_max_alloc)
            if not done:
                break
        seconds = perf_counter() - start
        series = SimSeries(tuple(s_idx), tuple(s_time), tuple(s_res), tuple(s_alloc), tuple(s_frag))
        return self._result(series, seconds)

    def _result(self, series: SimSeries, seconds: float) -> SimResult:
        trace = self.trace
        events = trace.num_events if self.stop_op is None else trace.op_index[self.stop_op] + 1
        return SimResult(
            settings=self.settings,
            events=events,
            ops=len(self.cols[0]) if self.stop_op is None else self.stop_op + 1,
            peak_reserved_bytes=self.peak_reserved,
            peak_allocated_bytes=self.peak_allocated,
            peak_active_bytes=self.peak_active,
            final_reserved_bytes=self.reserved,
            final_allocated_bytes=self.allocated,
            num_device_alloc=self.num_device_alloc,
            num_device_free=self.num_device_free,
            num_alloc_retries=self.num_alloc_retries,
            num_ooms=self.num_ooms,
            num_oom_rejections=self.num_oom_rejections,
            num_sync_all_streams=self.num_sync_all_streams,
            oom=self.oom,
            recorded_ooms=self.recorded_ooms,
            recorded_ooms_avoided=self.recorded_ooms_avoided,
            stopped_early=self.stop_op is not None,
            series=series,
            seconds=seconds,
            device_total=self.rules.device_total,
            partial_trace=trace.partial,
            segment_events=tuple(self.seg_events) if self.record_segments else (),
            initial_state_source=trace.initial_state.source if trace.initial_state is not None else None,
            initial_reserved_bytes=trace.initial_reserved_bytes,
            initial_allocated_bytes=(
                trace.initial_state.allocated_bytes if trace.initial_state is not None else 0),
            program_catches_ooms=trace.program_catches_ooms(),
            oom_fatal=self.oom is not None and not trace.program_catches_ooms(),
            path_changes_at=self.first_avoided if trace.program_catches_ooms() else None,
            outlives_recording=(self.oom is None and self.recorded_ooms_avoided > 0
                                and trace.ends_at_its_oom()),
            largest_segment_bytes=self.largest_segment,
        )

    # ---------------------------------------------------------------- hot loop
    def run_ops(self, a: int, b: int) -> bool:
        """Replay operations ``[a, b)``; False when stopped at an OOM.

        Deliberately long: a helper call per event would cost more than the
        event itself. Anything rare leaves through a method call, with the
        running totals written back to ``self`` around it.
        """
        ops, aids, sizes, lanes = self.cols
        live = self.live
        smalls, larges = self.small_lists, self.large_lists
        rcache = self.rcache
        rules = self.rules
        slots, div2 = rules.slots, rules.division_needs_two
        max_split, slack = rules.max_split, rules.oversize_slack
        exp_on, gc_on, by_addr = rules.expandable, rules.gc_enabled, rules.tie_by_address
        exp_lookup = exp_on or self.skip_expandable
        # a temporary (OP_ALLOC_FREED_NEXT) leaves no trace in the cache unless a split takes a
        # new tie-break counter or GC ages the blocks it touches
        skip_temporaries = by_addr and not gc_on
        take_exp = xp.take_free_expandable if exp_on else xp.take_free_skipping_expandable
        next_ctr = self.counter.__next__
        fresh_append = self.fresh.append
        new_block = Block
        one_max = 2 * sorted_keys.LOAD  # insort into SortedKeys.one while it is shorter
        allocated, active, requested = self.allocated, self.active, self.requested
        cmax, amax = self.chunk_max_alloc, self.peak_active
        stopped = False
        rows = zip(range(a, b), ops[a:b], aids[a:b], sizes[a:b], lanes[a:b], strict=True)
        for i, op, aid, n, lane in rows:
            if op == 0 or op == 7:  # noqa: PLR1714 - alloc (0 first: the commonest row)
                r = rcache.get(n)
                if r is None:
                    r = rcache[n] = round_size(n, slots, div2)
                small = r <= 1048576
                fl = smalls[lane] if small else larges[lane]
                if gc_on:
                    fl.pool.clock += 1
                if exp_lookup:
                    blk = take_exp(self, fl, r)
                else:
                    # the free list's keys are one sorted list unless it is long (SortedKeys.one)
                    one = fl.keys.one
                    if one is not None:
                        j = bisect_left(one, r << 64)
                        k = one[j] if j < len(one) else -1
                    else:
                        found = fl.keys.ceiling(r << 64)
                        k = -1 if found is None else found
                    if k < 0:
                        blk = None
                    else:
                        blk = fl.blocks[k]
                        bs = blk.size
                        if bs >= max_split and (r < max_split or bs >= r + slack):
                            blk = None
                        elif op == 7 and skip_temporaries and i + 1 < b and live[aid] is None:
                            # freed by the next row and served by the cache: the split and
                            # the merge undo each other, leaving the free list as it was
                            # (the same block, key and tie-break), so only the peaks move
                            rest = bs - r
                            if rest >= 512 and (small or (rest > 1048576 and r < max_split)):
                                bs = r
                            if allocated + bs > cmax:  # noqa: PLR1730
                                cmax = allocated + bs
                            if active + bs > amax:  # noqa: PLR1730
                                amax = active + bs
                            next(rows)  # its free
                            continue
                        else:
                            if one is not None:
                                del one[j]
                            else:
                                fl.keys.remove(k)
                            del fl.blocks[k]
                if blk is None:
                    self.allocated, self.active, self.requested = allocated, active, requested
                    blk = self.malloc_miss(fl, r, n, i, False)
                    allocated, active, requested = self.allocated, self.active, self.requested
                    if blk is None:
                        if self.stop_at_oom:
                            self.stop_op = i
                            stopped = True
                            break
                        continue
                bs = blk.size
                rest = bs - r
                if rest >= 512 and (small or exp_on or (rest > 1048576 and r < max_split)):
                    ptr = blk.ptr
                    nb = new_block(ptr, r, fl, blk.seg, ptr if by_addr else next_ctr())
                    p = blk.prev
                    nb.prev = p
                    if p is not None:
                        p.next = nb
                    nb.next = blk
                    blk.prev = nb
                    ptr += r
                    blk.ptr = ptr
                    blk.size = rest
                    if by_addr:
                        blk.tb = ptr
                    k = (rest << 64) | blk.tb
                    one = fl.keys.one  # read again: malloc_miss may have changed it
                    if one is not None and len(one) < one_max:
                        insort(one, k)
                    else:
                        fl.keys.add(k)
                    fl.blocks[k] = blk
                    blk.key = k
                    if gc_on:
                        blk.gcb = fl.pool.clock
                    blk = nb
                    bs = r
                blk.busy = True
                blk.req = n
                live[aid] = blk
                allocated += bs
                active += bs
                requested += n
                # not max(): a builtin call per allocation is measurable in the hot loop
                if allocated > cmax:  # noqa: PLR1730
                    cmax = allocated
                if active > amax:  # noqa: PLR1730
                    amax = active
            elif op == 1:  # ------------------------------------- free (+completed)
                blk = live[aid]
                # pending: the free is of a later allocation at this address that failed in the
                # replay (continue-after-oom); the pending block is its request's to complete
                if blk is None or blk.pending:
                    continue
                live[aid] = None
                bs = blk.size
                allocated -= bs
                active -= bs
                requested -= blk.req
                blk.busy = False
                fl = blk.fl
                keys = fl.keys
                one = keys.one  # only a method call below turns it to None or back
                fb = fl.blocks
                p = blk.prev
                if p is not None and not p.busy and p.mapped:
                    k = p.key
                    if one is not None:
                        del one[bisect_left(one, k)]
                    else:
                        keys.remove(k)
                    del fb[k]
                    blk.ptr = p.ptr
                    blk.size += p.size
                    pp = p.prev
                    blk.prev = pp
                    if pp is not None:
                        pp.next = blk
                    p.prev = p.next = None  # a stale candidate must not keep a chain alive
                    if by_addr:
                        blk.tb = blk.ptr
                q = blk.next
                if q is not None and not q.busy and q.mapped:
                    k = q.key
                    if one is not None:
                        del one[bisect_left(one, k)]
                    else:
                        keys.remove(k)
                    del fb[k]
                    blk.size += q.size
                    qn = q.next
                    blk.next = qn
                    if qn is not None:
                        qn.prev = blk
                    q.prev = q.next = None
                k = (blk.size << 64) | blk.tb
                if one is not None and len(one) < one_max:
                    insort(one, k)
                else:
                    keys.add(k)
                fb[k] = blk
                blk.key = k
                if gc_on:
                    blk.gcb = fl.pool.clock
                if exp_lookup:
                    fresh_append(blk)  # a release may unmap its pages (blocks.candidates)
                    fl.dirty = min(fl.dirty, blk.ptr)  # an idle run grew: the room search looks again
                elif blk.prev is None and blk.next is None:
                    fresh_append(blk)  # a whole segment now: a release or GC may free it
            elif op == 2:  # ---------------------------- free requested, events pending
                blk = live[aid]
                if blk is None or blk.pending:
                    continue
                blk.pending = True
                allocated -= blk.size
                self.pending[aid] = blk
            elif op == 3:  # -------------------------------------- pending free done
                # the pending block, not whatever holds the address now: a completion held
                # past malloc's sync (decode._Decoder._hold_sync_completions) can follow a new
                # allocation at the same address, once its segment was released and made
                # again. None: a sync in the replay completed it already (a completion
                # without a request decodes as a whole free, op 1)
                blk = self.pending.pop(aid, None)
                if blk is None:
                    continue
                if live[aid] is blk:
                    live[aid] = None
                active -= blk.size
                requested -= blk.req
                self.to_cache(blk)
            else:  # ---------------------------------- recorded OOM / empty_cache
                self.allocated, self.active, self.requested = allocated, active, requested
                if op == 4:
                    self.replay_recorded_oom(i, n, lane)
                elif op == 6:  # the program changed its memory fraction here
                    self.change_fraction(n)
                    rules = self.rules
                    gc_on = rules.gc_enabled
                    skip_temporaries = by_addr and not gc_on
                elif not larges[lane].pool.default:
                    reclaim.release_pool(self, lane, i)  # a private pool let go of its memory
                elif n == 0 or self.release_limit is None or n <= self.release_limit:
                    reclaim.free_all_cached(self, i)  # the user's empty_cache()
                allocated, active, requested = self.allocated, self.active, self.requested
        self.allocated, self.active, self.requested = allocated, active, requested
        self.chunk_max_alloc, self.peak_active = max(cmax, allocated), amax
        return not stopped

    def change_fraction(self, encoded: int) -> None:
        """``set_per_process_memory_fraction`` mid-run (a ``limit`` row, the fraction in
        billionths): the new limit holds from here on, and tells ``empty_cache()`` from
        malloc's own release path as the first limit did."""
        self.rules = self.rules.with_fraction(encoded / FRACTION_SCALE)
        self.release_limit = _replay_limit(self.rules)

    # ------------------------------------------------------------- free lists
    def new_tb(self, ptr: int) -> int:
        """Tie-break value for a newly created Block object."""
        return ptr if self.rules.tie_by_address else next(self.counter)

    def to_cache(self, blk: Block) -> None:
        """``free_block``: merge with idle neighbours of the same segment and cache it."""
        blk.busy = False
        blk.pending = False
        by_addr = self.rules.tie_by_address
        for nb in (blk.prev, blk.next):
            if nb is None or nb.busy or not nb.mapped:
                continue
            remove_free(nb)
            if nb is blk.prev:
                blk.ptr = nb.ptr
                blk.prev = nb.prev
                if nb.prev is not None:
                    nb.prev.next = blk
                if by_addr:
                    blk.tb = blk.ptr
            else:
                blk.next = nb.next
                if nb.next is not None:
                    nb.next.prev = blk
            blk.size += nb.size
            nb.prev = nb.next = None  # merged away (see run_ops)
        insert_free(blk)
        fl = blk.fl
        fl.dirty = min(fl.dirty, blk.ptr)  # an idle run grew: the expandable room search looks again

    def take_free(self, fl: FreeList, r: int) -> Block | None:
        """``get_free_block`` outside the hot loop (recorded OOM replay)."""
        rules = self.rules
        if rules.gc_enabled:
            fl.pool.clock += 1
        if rules.expandable:
            return xp.take_free_expandable(self, fl, r)
        if self.skip_expandable:
            return xp.take_free_skipping_expandable(self, fl, r)
        k = fl.keys.ceiling(r << KEY_SHIFT)
        if k is None:
            return None
        b = fl.blocks[k]
        if b.size >= rules.max_split and (r < rules.max_split or b.size >= r + rules.oversize_slack):
            return None
        remove_free(b)
        return b

    # --------------------------------------------------------------- slow path
    def malloc_miss(self, fl: FreeList, r: int, n: int, i: int, recorded: bool) -> Block | None:
        """No cached block fits: GC, new segment, then the OOM path (§6.4, §6.8)."""
        rules = self.rules
        seg = rules.segment_bytes(r)
        if rules.gc_enabled:
            reclaim.collect_garbage(self, i)
        self.rejected = False
        blk = self.new_segment(fl, r, seg, False, i)
        if blk is None and not self.rejected:
            if reclaim.release_oversize(self, fl, r, i):
                blk = self.new_segment(fl, r, seg, False, i)
            if blk is None and fl.pool.default:
                # a request into a private pool comes while a graph capture or use_mem_pool is
                # under way, and torch then skips release_cached_blocks: no retry
                reclaim.free_all_cached(self, i)
                blk = self.new_segment(fl, r, seg, True, i)
        if blk is None:
            if not self.rejected:
                self.num_ooms += 1
            # the first OOM, but one the recording did not have outranks a recorded one before
            # it: that is where the run ends, or where the program's handler takes over
            if self.oom is None or (self.oom.recorded and not recorded):
                self.oom = PredictedOom(
                    event_index=self.trace.op_index[i],
                    requested_bytes=n,
                    rounded_bytes=r,
                    segment_bytes=seg,
                    reserved_bytes=self.reserved,
                    allocated_bytes=self.allocated,
                    recorded=recorded,
                    rejected=self.rejected,
                )
        return blk

    def new_segment(self, fl: FreeList, r: int, seg: int, retry: bool, i: int) -> Block | None:
        """``alloc_block``: fraction limit, rejection, expandable growth or cudaMalloc."""
        rules = self.rules
        if retry:
            self.num_alloc_retries += 1
        if rules.allowed_max is not None and self.reserved + seg > rules.allowed_max:
            return None
        if rules.reject_limit is not None and self.reserved + seg > rules.reject_limit:
            self.num_oom_rejections += 1
            self.rejected = True
            return None
        if fl.pool.expandable:
            return xp.grow(self, fl, r, i)
        if rules.usable is not None and self.reserved + seg > rules.usable:
            return None  # cudaMalloc fails
        addr = self.segment_address(seg)
        self.largest_segment = max(self.largest_segment, seg)
        blk = Block(addr, seg, fl, None, self.new_tb(addr))
        self.grow_reserved(seg)
        self.num_device_alloc += 1
        self.segment_event(i, SEG_ALLOC, addr, seg)
        return blk

    def grow_reserved(self, nbytes: int) -> None:
        """Account a new segment or mapping; keeps the peaks."""
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.chunk_max_reserved = max(self.chunk_max_reserved, self.reserved)

    def segment_event(self, i: int, kind: int, addr: int, size: int) -> None:
        """Remember a segment event for the fidelity comparison."""
        if self.record_segments:
            self.seg_events.append((self.trace.op_index[i], kind, addr, size))

    def replay_recorded_oom(self, i: int, r: int, lane: int) -> None:
        """A request the real allocator failed: retry it; if it now fits, cache it again."""
        self.recorded_ooms += 1
        fl = self.small_lists[lane] if r <= SMALL_SIZE else self.large_lists[lane]
        blk = self.take_free(fl, r)
        if blk is None:
            blk = self.malloc_miss(fl, r, r, i, True)
        if blk is not None:
            self.recorded_ooms_avoided += 1
            if self.first_avoided is None:
                self.first_avoided = self.trace.op_index[i]
            self.to_cache(blk)

    # --------------------------------------------------------- address space
    def segment_address(self, size: int) -> int:
        """Address for a new classic segment: the recorded one when replaying a trace
        under its own settings (``check=True``), else the driver model's."""
        hints = self.hints
        if hints is None:
            return self.space.allocate(size)
        addr = self.reserve_va(size)  # where a segment goes when its hint does not apply
        if self.hint_pos < len(hints):
            hsize, haddr = hints[self.hint_pos]
            self.hint_pos += 1
            if hsize == size and self._range_free(haddr, size):
                pos = bisect_left(self.va_starts, haddr)
                self.va_starts.insert(pos, haddr)
                self.va_ends[haddr] = haddr + size
                return haddr
        return addr

    def release_address(self, addr: int, size: int) -> None:
        """A classic segment was freed (``cudaFree``): its range can be reused."""
        if self.hints is None:
            self.space.release(addr, size)
        elif self.va_ends.pop(addr, None) is not None:
            del self.va_starts[bisect_left(self.va_starts, addr)]

    def expandable_base(self, size: int) -> int:
        """Base of a new expandable reservation: under ``check=True`` the address of the
        next recorded ``segment_map`` (a new range is mapped from its start), else fresh."""
        hints = self.map_hints
        if hints is not None and self.map_pos < len(hints):
            addr = hints[self.map_pos]
            if all(not (r.base < addr + size and addr < r.base + r.size) for r in self.reservations):
                return addr
        return self.reserve_va(size)

    def reserve_va(self, size: int) -> int:
        """A fresh range below all earlier ones (never reused, so always distinct).

        Used for expandable-segment reservations, and for segments whose recorded
        address does not apply under ``check=True``.
        """
        self.bump -= -(-size // ROUND_LARGE) * ROUND_LARGE
        return self.bump

    def _range_free(self, start: int, size: int) -> bool:
        starts = self.va_starts
        pos = bisect_left(starts, start)
        if pos < len(starts) and starts[pos] < start + size:
            return False
        return not (pos > 0 and self.va_ends[starts[pos - 1]] > start)

    # ---------------------------------------------------------- start state
    def _seed(self, state: AllocatorState) -> None:
        """Start from ``state`` instead of an empty allocator (docs/simulator.md,
        "Traces that start mid-run").

        Its segments keep their recorded addresses; free blocks go into the free
        list of their pool (small/large by segment type) and stream, live blocks
        become the trace's first address ids (the decoder numbered them the same
        way), pending frees wait for their ``free_completed``. Reserved, allocated,
        active and requested start at the state's totals, and so do the peaks (as
        after ``reset_peak_memory_stats()``); the counters start at 0. Expandable
        runs are re-assembled into reservations (see :func:`.expandable.seed_reservations`).
        """
        trace = self.trace
        self.largest_segment = max((seg.total_size for seg in state.segments), default=0)
        keys = zip(trace.lane_pools, trace.lane_streams, strict=True)
        lane_of = {key: lane for lane, key in enumerate(keys)}
        lists = {(lane, small): (self.small_lists if small else self.large_lists)[lane]
                 for lane in range(len(lane_of)) for small in (True, False)}
        exp_of = xp.seed_reservations(self, state)
        ends: dict[int, tuple[Block, Block]] = {}
        live = self.live
        aid = 0
        for seg in state.segments:
            fl = lists[(lane_of[(seg.pool_id, seg.stream)], seg.small)]
            exp = exp_of.get(seg.address) if seg.expandable else None
            prev: Block | None = None
            first: Block | None = None
            for sb in seg.blocks:
                b = Block(sb.address, sb.size, fl, exp, self.new_tb(sb.address))
                if prev is None:
                    first = b
                else:
                    prev.next = b
                    b.prev = prev
                prev = b
                if sb.state == FREE:
                    insert_free(b)
                    continue
                b.busy = True
                b.req = sb.requested_size
                live[aid] = b
                aid += 1
                self.active += sb.size
                self.requested += sb.requested_size
                if sb.state == PENDING:
                    b.pending = True
                    self.pending[aid - 1] = b
                else:
                    self.allocated += sb.size
            assert first is not None and prev is not None
            ends[seg.address] = (first, prev)
            self.reserved += seg.total_size
        xp.link_reservations(self, state, exp_of, ends)
        self.skip_expandable = not self.rules.expandable and bool(exp_of)
        self.peak_reserved = self.chunk_max_reserved = self.reserved
        self.peak_allocated = self.chunk_max_alloc = self.allocated
        self.peak_active = self.active
        classic = [(seg.address, seg.total_size) for seg in state.segments if not seg.expandable]
        if self.hints is None:
            # new memory goes below the old segments; gaps between them count as taken. (Not
            # for addresses so low that new segments could run out of room below them.)
            lowest = min((addr for addr, _ in classic), default=self.space.low)
            if _SEED_LOW_MIN <= lowest < self.space.low:
                self.space.low = lowest
        else:
            for addr, size in classic:
                self.va_starts.insert(bisect_left(self.va_starts, addr), addr)
                self.va_ends[addr] = addr + size

    def export_state(self, source: str = "replayed") -> AllocatorState:
        """The simulated allocator's segments and blocks now, as a snapshot would list them."""
        seen: set[int] = set()
        segments: list[StateSegment] = []
        candidates: list[Block] = [b for b in self.live if b is not None]
        for fl in self.small_lists + self.large_lists:
            candidates.extend(fl.blocks.values())
            candidates.extend(fl.unmapped)
        for blk in candidates:
            if id(blk) in seen:
                continue
            head = blk
            while head.prev is not None:
                head = head.prev
            run: list[Block] = []
            cur: Block | None = head
            while cur is not None:
                seen.add(id(cur))
                if cur.mapped:
                    run.append(cur)
                elif run:
                    segments.append(_state_segment(run))
                    run = []
                cur = cur.next
            if run:
                segments.append(_state_segment(run))
        segments.sort(key=lambda seg: seg.address)
        return AllocatorState(tuple(segments), source=source)


def _recorded_limit(trace: Trace, rules: EngineRules) -> int | None:
    """The memory limit the trace was recorded under, as far as this replay knows it.

    It tells a user's ``empty_cache()`` from malloc's OOM path when both look the same
    in the trace (releases right before a new segment): the OOM path runs only when
    the new segment did not fit under the limit. The replay's own limit (fraction,
    else the usable device) is taken as the recorded one unless the recorded run
    reserved more than it allows: then the run was not recorded under it (a what-if
    of a smaller fraction), and the usable device is the limit, if the run fits in it.
    Where the caller knows the recording's own limit (:attr:`Trace.recorded_limit_bytes`: a
    sidecar's fraction, the device) that one decides, in every row: a row under another
    fraction asks what that limit would do, not what the recording did.
    """
    peak = trace.recorded_reserved_peak()
    known = trace.recorded_limit_bytes
    if known is not None and peak <= known:
        return known  # the caller knows the recording's limit: a row's own is a what-if
    limit = _replay_limit(rules)
    if limit is None:
        return None
    if peak <= limit:
        return limit
    return rules.usable if rules.usable is not None and peak <= rules.usable else None


def _replay_limit(rules: EngineRules) -> int | None:
    """The tighter of the fraction limit and the usable device, if either is known."""
    limits = [x for x in (rules.allowed_max, rules.usable) if x is not None]
    return min(limits) if limits else None


def _state_segment(run: list[Block]) -> StateSegment:
    fl = run[0].fl
    blocks = tuple(
        StateBlock(b.ptr, b.size, (PENDING if b.pending else ALLOCATED) if b.busy else FREE,
                   b.req if b.busy else 0)
        for b in run
    )
    return StateSegment(run[0].ptr, sum(b.size for b in run), fl.stream, fl.pool.small,
                        run[0].seg is not None, blocks, fl.pool.pool_id)
