"""Decode a list of trace-entry dicts into a :class:`~.model.Trace`, in one pass.

Replaying many configurations over a million entries would spend most of its time on dict
lookups, so the entries are decoded once into parallel ``array`` columns. Decoding also does
the bookkeeping the engine should not pay for per event:

* addresses are interned to dense ids so the engine can index a list;
* a ``free_requested`` immediately followed by its ``free_completed`` (the
  usual case, no ``record_stream``) becomes one ``FREE`` operation;
* frees of addresses never allocated in the trace (a ring buffer that dropped
  its oldest entries) are counted and dropped: the trace is *partial*;
* bursts of ``segment_free``/``segment_unmap`` are ``torch.cuda.empty_cache()`` calls
  (replayed as ``EMPTY_CACHE`` under every setting) unless malloc's own release paths
  can explain them: see :meth:`_Decoder._segment`;
* the recorded segment events are kept aside as the fidelity reference.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from allocconf_widget._errors import SnapshotError, one_line
from allocconf_widget.core.numbers import int_or_zero
from allocconf_widget.core.sim.state import PENDING, AllocatorState, pool_id_of_entry
from allocconf_widget.core.sim.trace.codes import (
    OP_ALLOC,
    OP_EMPTY_CACHE,
    OP_FREE,
    OP_FREE_COMPLETED,
    OP_FREE_REQUESTED,
    OP_OOM,
    SEG_NAMES,
)
from allocconf_widget.core.sim.trace.model import RecordedOom, Trace

#: (memory pool, stream) pairs a trace may allocate on: each costs every replay two free lists
#: (about 14 KiB). Valid traces may hold thousands (a private pool per CUDA graph or MemPool);
#: a crafted file with a new stream per entry would need gigabytes per setting.
MAX_LANES = 65_536
_SEG_CODES = {name: code for code, name in enumerate(SEG_NAMES)}


def _compiled() -> Any:
    """The compiled module where replays use it (``core/sim/native.compiled``): its loop over the
    common entries gives the rows and dicts this module's loop gives."""
    from allocconf_widget.core.sim.native import compiled

    return compiled()
_RELEASES = frozenset(("segment_free", "segment_unmap"))
_BURST_FILLER = frozenset(("segment_free", "segment_unmap", "free_completed"))
_EXPLAINS_RELEASE = frozenset(("segment_alloc", "segment_map", "oom"))


def decode_entries(
    entries: Sequence[Any],
    device: int = 0,
    *,
    initial_state: AllocatorState | None = None,
    start: int = 0,
    recorded_gc: bool = False,
) -> Trace:
    """Decode a chronological list of trace-entry dicts (see docs/internals/allocator_facts.md §7.4).

    With ``initial_state``, its live blocks are known to the decoder (their frees
    replay) and the replay starts from its segments. ``start`` skips entries
    already reflected in that state (event indices stay those of ``entries``).
    ``recorded_gc``: the run had ``garbage_collection_threshold`` set, so malloc may
    have released whole large segments before a new one (not ``empty_cache()``).
    """
    return decode_keeping_live(entries, device, initial_state, start, recorded_gc)[0]


def decode_keeping_live(
    entries: Sequence[Any], device: int, initial_state: AllocatorState | None, start: int,
    recorded_gc: bool = False, pools: Any = None,
) -> tuple[Trace, list[int]]:
    b = _Decoder(entries, initial_state, recorded_gc, pools)
    b.run(start)
    trace = Trace(
        device=device,
        num_events=len(entries),
        ops=b.ops,
        addr_ids=b.aids,
        sizes=b.sizes,
        lanes=b.lanes,
        op_index=b.index,
        op_time_us=b.times,
        num_addresses=len(b.addr_ids),
        lane_streams=tuple(stream for _, stream in b.lane_keys),
        lane_pools=tuple(pool for pool, _ in b.lane_keys),
        seg_kinds=b.seg_kinds,
        seg_sizes=b.seg_sizes,
        seg_addrs=b.seg_addrs,
        seg_index=b.seg_index,
        ooms=tuple(b.ooms),
        # an action is the file's own string: escaped once here for every view (a crafted one
        # carried escape sequences into the header of `allocconf simulate`)
        action_counts=tuple(sorted(((one_line(a, 60), c) for a, c in b.counts.items()),
                                   key=lambda kv: -kv[1])),
        unknown_frees=b.unknown_frees,
        first_unknown_free=b.first_unknown,
        empty_cache_calls=b.empty_calls,
        initial_state=initial_state,
        ambiguous_releases=b.ambiguous,
        deferred_frees=b.deferred,
        unknown_actions=tuple(sorted((one_line(a, 60), c) for a, c in b.counts.items()
                                     if a not in _KNOWN_ACTIONS)),
    )
    return trace, list(b.live)


class _Decoder:
    """Single pass over the entries; see the module docstring for what it folds."""

    def __init__(self, entries: Sequence[Any], initial: AllocatorState | None = None,
                 recorded_gc: bool = False, pools: Any = None) -> None:
        self.entries = entries
        self.alloc_pools: dict[int, tuple[int, int]] = pools.alloc_pools if pools is not None else {}
        self.release_pools: dict[int, tuple[int, int]] = pools.release_pools if pools is not None else {}
        self.attributed = bool(self.alloc_pools or self.release_pools)  # private pools read off the run
        self.default_lanes: dict[int, int] = {}  # stream -> its default-pool lane (see _emit)
        self.initial = initial
        self.recorded_gc = recorded_gc
        self._explained_from: list[int] | None = None
        self.reserved = initial.reserved_bytes if initial is not None else 0
        self.ambiguous = 0
        self.deferred = 0
        self.ops: array[int] = array("b")
        self.aids: array[int] = array("q")
        self.sizes: array[int] = array("q")
        self.lanes: array[int] = array("q")
        self.index: array[int] = array("q")
        self.times: array[int] = array("q")
        self.seg_kinds: array[int] = array("b")
        self.seg_sizes: array[int] = array("q")
        self.seg_addrs: array[int] = array("q")
        self.seg_index: array[int] = array("q")
        self.addr_ids: dict[int, int] = {}
        self.lane_ids: dict[tuple[tuple[int, int], int], int] = {}
        self.lane_keys: list[tuple[tuple[int, int], int]] = []
        self.ooms: list[RecordedOom] = []
        self.counts: dict[str, int] = {}
        self.unknown_frees = 0
        self.first_unknown: int | None = None
        self.empty_calls = 0
        self.live: dict[int, bool] = {}  # addr -> free already requested
        self.held: list[tuple[int, int, int, int, int, int]] = []  # completions moved past an alloc
        self._emit = self._emitter()  # writes one row: op, address id, size, lane, index, time

    def _lane(self, entry: Mapping[str, Any], idx: int = -1) -> int:
        pool = None
        if self.attributed:  # private pools read off the run (rare)
            pool = self.alloc_pools.get(idx) or self.release_pools.get(idx)
        if pool is None:
            pool = pool_id_of_entry(entry)
        stream = entry.get("stream")
        if type(stream) is not int:  # ints (nearly every entry) pass as they are
            stream = int_or_zero(stream)
        key = (pool, stream)
        lane = self.lane_ids.get(key)
        if lane is None:
            if len(self.lane_keys) >= MAX_LANES:
                raise SnapshotError(
                    f"the trace allocates on more than {MAX_LANES:,} (memory pool, stream) pairs: "
                    "every replay builds free lists for each (about 14 KiB), so this many would take "
                    "gigabytes; programs use a few dozen streams and, with CUDA graphs or memory "
                    "pools, thousands of pools at most: refused")
            lane = self.lane_ids[key] = len(self.lane_keys)
            self.lane_keys.append(key)
        return lane

    def _unknown(self, idx: int) -> None:
        self.unknown_frees += 1
        if self.first_unknown is None:
            self.first_unknown = idx

    def _seed(self) -> None:
        """Blocks live in the start state get the first address ids, in state order (the
        engine enumerates them the same way); pending frees wait for their completion."""
        if self.initial is None:
            return
        for _, blk in self.initial.live_blocks():
            self.addr_ids.setdefault(blk.address, len(self.addr_ids))
            self.live[blk.address] = blk.state == PENDING

    def _seed_lanes(self) -> None:
        """Lanes for the start state's segments (after the trace's own, so theirs keep their ids)."""
        if self.initial is None:
            return
        for seg in self.initial.segments:
            key = (seg.pool_id, seg.stream)
            if key not in self.lane_ids:
                self.lane_ids[key] = len(self.lane_keys)
                self.lane_keys.append(key)

    def _emitter(self) -> Callable[[int, int, int, Mapping[str, Any], int], None]:
        """The function that writes one row (``_emit``), with the columns' ``append`` and the
        dicts bound once: attribute lookups were a tenth of the decode."""
        addr_ids, default_lanes, attributed = self.addr_ids, self.default_lanes, self.attributed
        add_op, add_aid, add_size, add_lane, add_index, add_time = (
            self.ops.append, self.aids.append, self.sizes.append, self.lanes.append,
            self.index.append, self.times.append)
        lane_of = self._lane

        def emit(op: int, addr: int, size: int, entry: Mapping[str, Any], idx: int) -> None:
            aid = addr_ids.get(addr)
            if aid is None:
                aid = addr_ids[addr] = len(addr_ids)
            # nearly every entry: an int stream, no pool field, no attributed private pool; its
            # lane is the default pool's for that stream, looked up once (what _lane would give)
            stream = entry.get("stream")
            if (type(stream) is int and not attributed and "pool_id" not in entry
                    and "segment_pool_id" not in entry and "mempool_id" not in entry):
                lane = default_lanes.get(stream)
                if lane is None:
                    lane = default_lanes[stream] = lane_of(entry, idx)
            else:
                lane = lane_of(entry, idx)
            add_op(op)
            add_aid(aid)
            add_size(size)
            add_lane(lane)
            add_index(idx)
            stamp = entry.get("time_us")
            add_time(stamp if type(stamp) is int else int_or_zero(stamp))

        return emit

    def _common_rows(self, idx: int) -> int:
        """Decode the run of common entries from ``idx`` in the compiled module (an alloc or a free
        of an int address on a stream with its lane already, no pool field: nearly every entry),
        with the effects the loop in :meth:`run` has; returns the index of the first entry it left
        to that loop. Only while no completion is held and no private pool was read off the run."""
        compiled = _compiled()
        if compiled is None or self.held or self.attributed or type(self.entries) is not list:
            return idx
        nxt, deferred, *cols = compiled.decode_common(self.entries, idx, self.addr_ids, self.live,
                                                      self.counts, self.default_lanes)
        self.deferred += deferred
        for column, raw in zip((self.ops, self.aids, self.sizes, self.lanes, self.index, self.times), cols,
                               strict=True):
            column.frombytes(raw)
        return int(nxt)

    def run(self, start: int = 0) -> None:
        self._seed()
        entries = self.entries
        n = len(entries)
        live = self.live
        counts = self.counts
        emit = self._emit
        skip_next = False
        idx = start - 1
        while idx + 1 < n:
            idx += 1
            if skip_next:
                skip_next = False
                continue
            idx = self._common_rows(idx)
            if idx >= n:
                break
            e = entries[idx]
            if type(e) is not dict and not isinstance(e, Mapping):
                raise SnapshotError(
                    f"trace entry {idx} is a {type(e).__name__}, not a dict; "
                    "this does not look like a torch memory snapshot"
                )
            act = e.get("action")
            if type(act) is not str:  # never hashed as it is: a deep tuple's hash crashes
                act = str(act)
            counts[act] = counts.get(act, 0) + 1
            # the exact-int checks below skip int_or_zero for what nearly every entry holds
            addr = e.get("addr")
            if type(addr) is not int:
                addr = int_or_zero(addr)
            if act == "alloc":
                live[addr] = False
                size = e.get("size")
                emit(OP_ALLOC, addr, size if type(size) is int else int_or_zero(size), e, idx)
                if self.held:
                    self._release_held()
            elif act == "free_requested":
                nxt = entries[idx + 1] if idx + 1 < n else None
                fused = False
                if (type(nxt) is dict or isinstance(nxt, Mapping)) and nxt.get("action") == "free_completed":
                    other = nxt.get("addr")
                    fused = (other if type(other) is int else int_or_zero(other)) == addr
                if fused:
                    counts["free_completed"] = counts.get("free_completed", 0) + 1
                    skip_next = True
                if addr not in live:
                    self._unknown(idx)
                elif fused:  # a second request of a pending free completes the first one
                    emit(OP_FREE_COMPLETED if live.pop(addr) else OP_FREE, addr, 0, e, idx)
                elif not live[addr]:
                    live[addr] = True
                    self.deferred += 1
                    emit(OP_FREE_REQUESTED, addr, 0, e, idx)
            elif act == "free_completed":
                requested = live.pop(addr, None)
                if requested is None:
                    self._unknown(idx)
                else:
                    # Without a prior free_requested (skip_actions dropped it) it is a whole free.
                    emit(OP_FREE_COMPLETED if requested else OP_FREE, addr, 0, e, idx)
            elif act in _SEG_CODES:
                self._segment(idx, e, act)
            elif act == "oom":
                size = int_or_zero(e.get("size"))
                self.ooms.append(
                    RecordedOom(idx, size, int_or_zero(e.get("device_free")), int_or_zero(e.get("stream")))
                )
                emit(OP_OOM, -1, size, e, idx)
            # "snapshot", "annotate" and unknown actions change no allocator state.
        if self.held:
            self._release_held()
        self._seed_lanes()

    def _segment(self, idx: int, e: Mapping[str, Any], act: str) -> None:
        size = int_or_zero(e.get("size"))
        if size == 0 and act in _RELEASES:
            # torch never releases a segment of no bytes: this is a dry run's record of the
            # program's own ``empty_cache()`` (adapters/dryrun/log.py), certain, not inferred
            self.empty_calls += 1
            self._emit(OP_EMPTY_CACHE, -1, 0, e, idx)
            return
        self.seg_kinds.append(_SEG_CODES[act])
        self.seg_sizes.append(size)
        self.seg_addrs.append(int_or_zero(e.get("addr")))
        self.seg_index.append(idx)
        reserved_before = self.reserved
        self.reserved += -size if act in _RELEASES else size
        if act not in _RELEASES:
            return
        prev = self.entries[idx - 1] if idx else None
        prev_act = prev.get("action") if isinstance(prev, Mapping) else None
        if type(prev_act) is str and prev_act in _RELEASES:  # a string only is hashed
            return  # not the first release of its burst
        if idx in self.release_pools:
            # a private pool released (a MemPool destroyed or emptied, a graph pool freed):
            # the replay releases that pool's cached segments, under every setting
            self._emit(OP_EMPTY_CACHE, -1, 0, e, idx)
            return
        need = self._burst_need(idx, reserved_before)
        if need != 0:
            self._hold_sync_completions(idx)
        if need is None:
            return
        self.empty_calls += 1
        if need:
            self.ambiguous += 1
        self._emit(OP_EMPTY_CACHE, -1, need, e, idx)

    def _hold_sync_completions(self, idx: int) -> None:
        """Move the ``free_completed`` rows right before a release burst that malloc may have
        made to just after the next ``alloc``.

        On malloc's OOM path torch synchronises and completes every pending free *after* the
        cache lookup failed, then releases; the trace writes those completions before the
        releases and the ``alloc`` after them. Replayed in trace order, the completed blocks
        would serve the very request that failed. (If the replay decides the burst was
        ``empty_cache()``, it completes pending frees there itself.)
        """
        n = len(self.ops)
        k = 0
        while (k < n and self.ops[n - 1 - k] == OP_FREE_COMPLETED
               and self.index[n - 1 - k] == idx - 1 - k):
            k += 1
        rows = [(self.ops.pop(), self.aids.pop(), self.sizes.pop(), self.lanes.pop(), self.index.pop(),
                 self.times.pop()) for _ in range(k)]
        self.held.extend(reversed(rows))

    def _release_held(self) -> None:
        for op, aid, size, lane, index, time in self.held:
            self.ops.append(op)
            self.aids.append(aid)
            self.sizes.append(size)
            self.lanes.append(lane)
            self.index.append(index)
            self.times.append(time)
        self.held.clear()

    def _burst_need(self, idx: int, reserved_before: int) -> int | None:
        """Is the release burst starting at ``idx`` a user's ``empty_cache()``?

        ``empty_cache()`` leaves no entry of its own, only the releases. Inside malloc,
        releases come right before a new segment (or an ``oom``): GC (only with
        ``garbage_collection_threshold``; it frees whole large segments) or the OOM path
        (only when the new segment did not fit under the memory limit). Returns None
        when malloc explains the burst (an ``oom`` follows, or recorded GC could have
        freed exactly these segments), 0 when nothing follows that malloc would have
        released memory for (certainly ``empty_cache()``), else the reserved bytes the
        next segment needed: the replay compares it with the recorded limit.
        """
        if self._explained_from is None:
            self._explained_from = _explained_from(self.entries)
        nxt = self._explained_from[idx + 1]
        if nxt < 0:
            return 0
        follower = self.entries[nxt]
        if follower.get("action") == "oom":
            return None
        if self.recorded_gc and self._large_classic_burst(idx, nxt):
            return None
        size = int_or_zero(follower.get("size"))
        if follower.get("action") == "segment_map":
            # the limit check is on the request's whole segment size, not on the pages mapped
            size = max(size, segment_size_of(self._next_alloc_size(nxt)))
        return reserved_before + size

    def _next_alloc_size(self, start: int) -> int:
        """Size of the first ``alloc`` entry after ``start`` (0 if none within a few entries)."""
        for j in range(start + 1, min(start + 64, len(self.entries))):
            e = self.entries[j]
            if isinstance(e, Mapping) and e.get("action") == "alloc":
                return int_or_zero(e.get("size"))
        return 0

    def _large_classic_burst(self, start: int, end: int) -> bool:
        """Every release in ``entries[start:end]`` frees a large-pool classic segment (GC's kind)."""
        for j in range(start, end):
            e = self.entries[j]
            act = e.get("action")
            small = act == "segment_free" and int_or_zero(e.get("size")) <= _SMALL_SEGMENT
            if act == "segment_unmap" or small:
                return False
        return True


_SMALL_SEGMENT = 2 << 20  # small-pool segments are 2 MiB; large-pool ones never are


def segment_size_of(n: int) -> int:
    """The segment a request of ``n`` bytes asks for under default rules (2 MiB small, 20 MiB
    below 10 MiB, else rounded to 2 MiB): malloc's limit check is on this, not on the pages mapped."""
    if n <= 1 << 20:
        return _SMALL_SEGMENT
    if n < 10 << 20:
        return 20 << 20
    return -(-n // _SMALL_SEGMENT) * _SMALL_SEGMENT


_KNOWN_ACTIONS = frozenset((
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
    "segment_unmap", "oom", "snapshot", "annotate",
))


def _explained_from(entries: Sequence[Any]) -> list[int]:
    """``result[j]``: index of the first non-filler entry at or after ``j`` if it is one that
    ends a malloc release burst (a new segment or an ``oom``), else -1."""
    result = [-1] * (len(entries) + 1)
    for j in range(len(entries) - 1, -1, -1):
        entry = entries[j]
        act = entry.get("action") if isinstance(entry, Mapping) else None
        if type(act) is not str:  # hashed below: only a string (a deep tuple's hash crashes)
            act = None
        result[j] = result[j + 1] if act in _BURST_FILLER else (j if act in _EXPLAINS_RELEASE else -1)
    return result
