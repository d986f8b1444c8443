"""Which replay engine runs a replay: the compiled one, or the Python reference.

:mod:`.engine` is the replay engine and its reference. ``_replay`` (``_replay.c``) is the same
model compiled: the same steps in the same order on C structures, so a replay returns the same
:class:`~.result.SimResult` field for field, ten times and more faster
(docs/simulator.md, "Two engines"). It is chosen at import when the installed package has it;
``ALLOCCONF_REPLAY_ENGINE=python`` in the environment forces the Python engine.

The compiled engine takes the trace as raw column bytes and the rules as plain numbers. It
replays only what fits its 64-bit arithmetic with room to spare (:func:`_bounds_ok`); anything
else, a start state's or a replay's address leaving that range included, replays in Python
with no difference to the caller. A trace that starts mid-run is seeded by the Python engine's
own start-state code and handed over block by block (:func:`_seed_payload`), so the two
engines start from the same state.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from time import perf_counter
from types import ModuleType
from typing import TYPE_CHECKING, Any

from allocconf_widget.core.sim import expandable as xp
from allocconf_widget.core.sim import sorted_keys
from allocconf_widget.core.sim.engine import Engine, _recorded_limit, _replay_limit
from allocconf_widget.core.sim.limits import FRACTION_SCALE, OP_SET_LIMIT
from allocconf_widget.core.sim.result import PredictedOom, SegmentEvent, SimResult, SimSeries
from allocconf_widget.core.sim.settings import UNLIMITED, EngineRules, SimSettings
from allocconf_widget.core.sim.trace.codes import SEG_ALLOC, SEG_MAP
from allocconf_widget.core.sim.trace.rows import rows_with

if TYPE_CHECKING:
    from allocconf_widget.core.sim.trace.model import Trace

#: the environment variable that forces the Python engine (``python``)
ENGINE_VARIABLE = "ALLOCCONF_REPLAY_ENGINE"

#: every number the compiled engine holds stays below this (a sum of two stays below 2^63)
_CEILING = 1 << 62
#: settings' sizes (a segment, a page) stay below this
_SIZE_CEILING = 1 << 46
#: the trace's sizes added up, with a segment's worth of rounding per row, stay below this:
#: reserved memory, the peaks and the driver model's addresses are sums of them
_SUM_CEILING = 1 << 61
#: the most a new segment or a mapping adds to a row's size: rounding to 2 MiB, a 32 MiB
#: alignment of its address
_ROW_SLACK = 34 << 20


def _load() -> tuple[ModuleType | None, str]:
    choice = os.environ.get(ENGINE_VARIABLE, "").strip().lower()
    if choice == "python":
        return None, f"python ({ENGINE_VARIABLE}=python)"
    try:
        from allocconf_widget.core.sim import _replay  # type: ignore[attr-defined]
    except ImportError:
        return None, "python (this install has no compiled engine: see README, \"Installing\")"
    return _replay, "native (compiled)"


_NATIVE, _DESCRIPTION = _load()
_forced_python = 0


def engine_name() -> str:
    """``native`` when replays run on the compiled engine, else ``python``."""
    return "native" if _NATIVE is not None and not _forced_python else "python"


def compiled() -> ModuleType | None:
    """The compiled module where replays use it (None: the Python engine serves); :mod:`.timing`
    builds a trace's GPU-timing orders with it."""
    return _NATIVE if engine_name() == "native" else None


def describe_engine() -> str:
    """The engine in use and why, for ``allocconf check --env``."""
    if _forced_python and _NATIVE is not None:
        return "python (forced for this call)"
    return _DESCRIPTION


@contextmanager
def python_engine() -> Iterator[None]:
    """Replay on the Python engine inside the block (tests that look into its internals)."""
    global _forced_python  # noqa: PLW0603 - a counter, so nested blocks restore it
    _forced_python += 1
    try:
        yield
    finally:
        _forced_python -= 1


def new_engine(
    trace: Trace,
    settings: SimSettings,
    *,
    device_total: int | None = None,
    non_pytorch_bytes: int = 0,
    stop_at_oom: bool = True,
    record_segments: bool = False,
    address_hints: bool = False,
) -> Engine | NativeEngine:
    """An engine for one replay: the compiled one where it is installed and not turned off."""
    kwargs: dict[str, Any] = {"device_total": device_total, "non_pytorch_bytes": non_pytorch_bytes,
                              "stop_at_oom": stop_at_oom, "record_segments": record_segments,
                              "address_hints": address_hints}
    if _NATIVE is None or _forced_python or xp.CHECK_ROOM_SEARCH:
        return Engine(trace, settings, **kwargs)
    return NativeEngine(trace, settings, **kwargs)


@dataclass(frozen=True)
class _Columns:
    """What the compiled engine reads of a trace, built once per trace and process."""

    columns: tuple[Any, ...]
    fl_pool: tuple[int, ...]
    fl_rank: tuple[int, ...]
    pools: tuple[tuple[tuple[int, int], bool], ...]  # (pool id, small), default large/small first
    fits: bool  # the trace's shape is within the compiled engine's bounds
    size_sum: int  # its rows' sizes added up (see _bounds_ok)
    fractions: tuple[int, ...]  # the distinct fractions of the trace's ``limit`` rows


def _raw(col: array[int]) -> bytes:
    return (col if col.typecode == "q" else array("q", col)).tobytes()


def _columns(trace: Trace) -> _Columns:
    cached: _Columns | None = trace.__dict__.get("_native")
    if cached is not None:
        return cached
    ops = trace.ops
    n = len(ops)
    pools: dict[tuple[tuple[int, int], bool], int] = {((0, 0), False): 0, ((0, 0), True): 1}
    fl_pool: list[int] = []
    for pool_id in trace.lane_pools:
        for small in (True, False):
            fl_pool.append(pools.setdefault((pool_id, small), len(pools)))
    rank = {stream: pos for pos, stream in enumerate(sorted(set(trace.lane_streams)))}
    fl_rank = [rank[stream] for stream in trace.lane_streams for _ in (0, 1)]
    fits = (min(trace.sizes, default=0) >= 0 and trace.num_addresses < (1 << 31)
            and 2 * len(trace.lane_pools) < (1 << 31))
    fractions = tuple(sorted({trace.sizes[row] for row in rows_with(ops, (OP_SET_LIMIT,))})) \
        if trace.limit_changes else ()
    columns = (n, ops.tobytes() if ops.typecode == "b" else array("b", ops).tobytes(),
               _raw(trace.addr_ids), _raw(trace.sizes), _raw(trace.lanes), _raw(trace.op_index),
               _raw(trace.op_time_us), trace.num_addresses)
    cached = _Columns(columns, tuple(fl_pool), tuple(fl_rank), tuple(sorted(pools, key=pools.__getitem__)),
                      fits, sum(trace.sizes) + trace.initial_reserved_bytes, fractions)
    object.__setattr__(trace, "_native", cached)
    return cached


def _opt(value: int | None) -> int:
    return -1 if value is None else min(value, _CEILING)


def _limits(rules: EngineRules, release: int | None) -> tuple[int, int, int, int, int]:
    """(allowed, reject, release limit, GC budget, GC on) as the compiled engine reads them."""
    budget = int(rules.gc_threshold * rules.allowed_max) if rules.gc_enabled and rules.allowed_max else 0
    return (_opt(rules.allowed_max), _opt(rules.reject_limit), _opt(release), min(budget, _CEILING),
            int(rules.gc_enabled))


def _bounds_ok(rules: EngineRules, cols: _Columns) -> bool:
    """Whether every number of this replay stays below 2^61: each segment is a row's size rounded
    (or the large-segment size, or a page), so reserved memory, the peaks and the addresses are
    at most the rows' sizes added up plus that much per row."""
    values = [rules.large_segment, rules.expandable_reserve(), rules.device_total or 0, rules.usable or 0]
    rows = cols.columns[0] + 1
    return (all(0 <= v < _SIZE_CEILING << 6 for v in values)
            and cols.size_sum + rows * (rules.large_segment + _ROW_SLACK) < _SUM_CEILING)


class NativeEngine:
    """One replay on the compiled engine, with :class:`.engine.Engine`'s ``run`` and
    ``seg_events``; replays in Python where the compiled engine declines."""

    def __init__(self, trace: Trace, settings: SimSettings, *, device_total: int | None = None,
                 non_pytorch_bytes: int = 0, stop_at_oom: bool = True, record_segments: bool = False,
                 address_hints: bool = False) -> None:
        self.trace = trace
        self.settings = settings
        self.rules = EngineRules.derive(settings, device_total, non_pytorch_bytes)
        self.kwargs: dict[str, Any] = {"device_total": device_total, "non_pytorch_bytes": non_pytorch_bytes,
                                       "stop_at_oom": stop_at_oom, "record_segments": record_segments,
                                       "address_hints": address_hints}
        self.seg_events: list[SegmentEvent] = []
        self.used_native = False

    def run(self, series_points: int = 1000) -> SimResult:
        """Replay every operation; returns the prediction (:meth:`.engine.Engine.run`)."""
        start = perf_counter()
        out = self._replay(series_points)
        if out is None or out[0] != 0:
            engine = Engine(self.trace, self.settings, **self.kwargs)
            result = engine.run(series_points)
            self.seg_events = engine.seg_events
            return result
        self.used_native = True
        return self._result(out, perf_counter() - start)

    def _replay(self, series_points: int) -> tuple[Any, ...] | None:
        assert _NATIVE is not None
        trace, rules, kw = self.trace, self.rules, self.kwargs
        cols = _columns(trace)
        if not cols.fits or not _bounds_ok(rules, cols):
            return None
        pools = tuple((int(small), int(pool_id == (0, 0)),
                       int(rules.expandable and (pool_id == (0, 0) or rules.expandable_private_pools)))
                      for pool_id, small in cols.pools)
        release = _recorded_limit(trace, rules)
        allowed, reject, release_limit, budget, gc_on = _limits(rules, release)
        rule_args = (tuple(min(s, _CEILING) for s in rules.slots), int(rules.division_needs_two),
                     -1 if rules.max_split >= UNLIMITED else min(rules.max_split, _CEILING),
                     min(rules.oversize_slack, _CEILING), rules.large_segment, int(rules.tie_by_address),
                     int(rules.expandable), allowed, reject, _opt(rules.usable), release_limit, budget, gc_on,
                     rules.expandable_reserve(), int(kw["stop_at_oom"]), int(kw["record_segments"]))
        limit_rows = []
        for encoded in cols.fractions:
            changed = rules.with_fraction(encoded / FRACTION_SCALE)
            limit_rows.append((encoded, *_limits(changed, _replay_limit(changed))))
        hints = None
        if kw["address_hints"]:
            segs = list(zip(trace.seg_kinds, trace.seg_sizes, trace.seg_addrs, strict=True))
            pairs = [(size, addr) for kind, size, addr in segs if kind == SEG_ALLOC]
            maps = [addr for kind, _, addr in segs if kind == SEG_MAP]
            if not all(0 <= v < _SUM_CEILING for pair in pairs for v in pair) or \
                    not all(0 <= v < _SUM_CEILING for v in maps):
                return None
            hints = ([s for s, _ in pairs], [a for _, a in pairs], maps)
        seed = None
        if trace.initial_state is not None:
            seed = _seed_payload(Engine(trace, self.settings, **kw))
            if seed is None:
                return None
        out: tuple[Any, ...] = _NATIVE.replay(cols.columns, (cols.fl_pool, cols.fl_rank, pools), rule_args,
                                              tuple(limit_rows), hints, seed, series_points,
                                              sorted_keys.LOAD)
        return out

    def _result(self, out: tuple[Any, ...], seconds: float) -> SimResult:
        trace = self.trace
        _, counters, oom, events, s_idx, s_time, s_res, s_alloc, s_frag, alloc_end, res_end = out
        (peak_reserved, peak_allocated, peak_active, reserved, allocated, num_device_alloc, num_device_free,
         num_alloc_retries, num_ooms, num_oom_rejections, num_sync_all_streams, recorded_ooms,
         recorded_ooms_avoided, largest_segment, stop_op, first_avoided, _, _) = counters
        if self.kwargs["record_segments"]:
            self.seg_events = [tuple(ev) for ev in events]
        if s_frag is None:  # a number the compiled engine cannot divide as Python does
            s_frag = tuple(1.0 - a / r if r else 0.0 for a, r in zip(alloc_end, res_end, strict=True))
        series = SimSeries(s_idx, s_time, s_res, s_alloc, s_frag)
        predicted = None
        if oom is not None:
            event_index, requested, rounded, segment, reserved_then, allocated_then, recorded, rejected = oom
            predicted = PredictedOom(event_index, requested, rounded, segment, reserved_then, allocated_then,
                                     recorded=bool(recorded), rejected=bool(rejected))
        stopped = stop_op >= 0
        catches = trace.program_catches_ooms()
        return SimResult(
            settings=self.settings,
            events=trace.num_events if not stopped else trace.op_index[stop_op] + 1,
            ops=len(trace.ops) if not stopped else stop_op + 1,
            peak_reserved_bytes=peak_reserved,
            peak_allocated_bytes=peak_allocated,
            peak_active_bytes=peak_active,
            final_reserved_bytes=reserved,
            final_allocated_bytes=allocated,
            num_device_alloc=num_device_alloc,
            num_device_free=num_device_free,
            num_alloc_retries=num_alloc_retries,
            num_ooms=num_ooms,
            num_oom_rejections=num_oom_rejections,
            num_sync_all_streams=num_sync_all_streams,
            oom=predicted,
            recorded_ooms=recorded_ooms,
            recorded_ooms_avoided=recorded_ooms_avoided,
            stopped_early=stopped,
            series=series,
            seconds=seconds,
            device_total=self.rules.device_total,
            partial_trace=trace.partial,
            segment_events=tuple(self.seg_events) if self.kwargs["record_segments"] else (),
            initial_state_source=trace.initial_state.source if trace.initial_state is not None else None,
            initial_reserved_bytes=trace.initial_reserved_bytes,
            initial_allocated_bytes=(
                trace.initial_state.allocated_bytes if trace.initial_state is not None else 0),
            program_catches_ooms=catches,
            oom_fatal=predicted is not None and not catches,
            path_changes_at=(first_avoided if first_avoided >= 0 else None) if catches else None,
            outlives_recording=(predicted is None and recorded_ooms_avoided > 0 and trace.ends_at_its_oom()),
            largest_segment_bytes=largest_segment,
        )


def _seed_payload(eng: Engine) -> tuple[Any, ...] | None:
    """The Python engine's start state, laid out for the compiled engine: every block with its
    links, free list, reservation and flags; live and pending blocks by address id (pending in
    the order the engine completes them); the reservations; the counters. None where a number
    is outside the compiled engine's bounds."""
    fl_index = {id(fl): lane * 2 + (0 if small else 1)
                for lane, (sl, ll) in enumerate(zip(eng.small_lists, eng.large_lists, strict=True))
                for small, fl in ((True, sl), (False, ll))}
    seg_index = {id(seg): pos for pos, seg in enumerate(eng.reservations)}
    order: dict[int, int] = {}
    blocks: list[Any] = []

    def visit(b: Any) -> None:
        head = b
        while head.prev is not None:
            head = head.prev
        cur = head
        while cur is not None:
            if id(cur) not in order:
                order[id(cur)] = len(blocks)
                blocks.append(cur)
            cur = cur.next

    for b in eng.live:
        if b is not None:
            visit(b)
    for b in eng.pending.values():
        visit(b)
    for fl in eng.small_lists + eng.large_lists:
        for b in fl.blocks.values():
            visit(b)
        for b in fl.unmapped:
            visit(b)
    rows = []
    for b in blocks:
        cached = b.fl.blocks.get(b.key) is b
        ks, kt = (b.key >> 64, b.key & ((1 << 64) - 1)) if cached else (0, 0)
        row = (b.ptr, b.size, b.tb, b.req, b.gcb, ks, kt,
               -1 if b.prev is None else order[id(b.prev)], -1 if b.next is None else order[id(b.next)],
               fl_index[id(b.fl)], -1 if b.seg is None else seg_index[id(b.seg)],
               int(b.busy), int(b.pending), int(b.mapped), int(cached), int(id(b) in b.fl.pool.cands))
        if not all(0 <= v < _SUM_CEILING for v in row[:7]):
            return None
        rows.append(row)
    live = [(aid, order[id(b)]) for aid, b in enumerate(eng.live) if b is not None]
    pending = [(aid, order[id(b)]) for aid, b in eng.pending.items()]
    reservations = [(seg.base, seg.page, seg.size) for seg in eng.reservations]
    counter = next(eng.counter)  # the Python engine is done with: the next tie-break the replay hands out
    counts = (eng.reserved, eng.allocated, eng.active, eng.requested, eng.peak_reserved,
              eng.chunk_max_reserved, eng.peak_allocated, eng.chunk_max_alloc, eng.peak_active,
              eng.largest_segment, int(eng.skip_expandable), eng.space.low, counter)
    va = [(start, eng.va_ends[start]) for start in eng.va_starts]
    if not all(0 <= v < _SUM_CEILING for v in counts) or \
            not all(0 <= v < _SUM_CEILING for seg in reservations for v in seg) or \
            not all(0 <= v < _SUM_CEILING for pair in va for v in pair) or len(set(eng.va_starts)) != len(va):
        return None
    return tuple(rows), live, pending, reservations, counts, va
