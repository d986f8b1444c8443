"""Turn a snapshot's allocator trace into compact, replay-ready integer arrays.

A snapshot's ``device_traces[d]`` is a list of dicts, one per allocator event.
Replaying many configurations over a million of them would spend most of its
time on dict lookups, so :func:`extract_trace` decodes the list once into
parallel ``array`` columns (operation code, address id, size, lane, original
index, time). Arrays pickle as raw bytes, which makes shipping a trace to
worker processes cheap.

Decoding also does the bookkeeping the engine should not pay for per event:

* addresses are interned to dense ids so the engine can index a list;
* a ``free_requested`` immediately followed by its ``free_completed`` (the
  usual case, no ``record_stream``) becomes one ``FREE`` operation;
* frees of addresses never allocated in the trace (a ring buffer that dropped
  its oldest entries) are counted and dropped: the trace is *partial*;
* bursts of ``segment_free``/``segment_unmap`` are ``torch.cuda.empty_cache()`` calls
  (replayed as ``EMPTY_CACHE`` under every setting) unless malloc's own release paths
  can explain them: see :meth:`_Decoder._segment`;
* the recorded segment events are kept aside as the fidelity reference.

A trace recorded mid-run (a notebook cell after the model was built, a ring buffer
that wrapped) does not start from an empty allocator. :func:`extract_trace` then
attaches the allocator state at the trace's start (:mod:`.state`): the one the
recorder saved (``allocconf_initial_segments``), else one reconstructed backwards
from the snapshot's final segments. Its live blocks are known addresses to the
decoder, so their later frees replay; the engine starts from its segments.
"""

from __future__ import annotations

import dataclasses
import math
from array import _array_reconstructor, array  # type: ignore[attr-defined]
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any, TypeGuard

from allocconf_widget._errors import SnapshotError, one_line
from allocconf_widget.core.gcpause import paused_gc
from allocconf_widget.core.numbers import int_or_zero
from allocconf_widget.core.sim.state import (
    FREE,
    INITIAL_SEGMENTS_KEY,
    PENDING,
    RECORDED,
    AllocatorState,
    ReconstructionError,
    StateBlock,
    StateSegment,
    pool_id_of_entry,
    reconstruct_initial_state,
    start_state_evidence,
)
from allocconf_widget.core.versions import TorchVersion, parse_version

#: (memory pool, stream) pairs a trace may allocate on: each costs every replay two free lists,
#: about 14 KiB (an attack pass: a new stream per entry made a 32 MiB file need gigabytes per
#: setting). Valid traces may hold thousands: a private pool per CUDA graph or MemPool, and
#: the hardening tests' 20,000 pools in 100,000 entries, which replay in linear time
MAX_LANES = 65_536

OP_ALLOC = 0
OP_FREE = 1  # free_requested + free_completed at once
OP_FREE_REQUESTED = 2  # allocated drops; block stays unusable (record_stream)
OP_FREE_COMPLETED = 3  # pending block returns to the cache
OP_OOM = 4  # a recorded OOM: retry the request (size is already rounded)
OP_EMPTY_CACHE = 5  # torch.cuda.empty_cache() inferred from a release burst (size: see below)
# 6 is ``limits.OP_SET_LIMIT``: the program changed its memory fraction (size: the fraction
# in billionths); :mod:`.limits` inserts those rows after decoding.
#: Only in :meth:`Trace.replay_columns`: an ``OP_ALLOC`` whose own ``OP_FREE`` is the next row
#: (a temporary). Where the cache serves it, the replay skips both rows (``engine.run_ops``).
OP_ALLOC_FREED_NEXT = 7
#: An ``OP_EMPTY_CACHE`` row's size is 0 when the burst is certainly ``empty_cache()``; otherwise
#: the reserved bytes the next recorded segment needed (reserved before the burst + its size):
#: the burst was malloc's OOM path if and only if that did not fit under the recorded limit.

SEG_ALLOC = 0
SEG_FREE = 1
SEG_MAP = 2
SEG_UNMAP = 3
SEG_NAMES = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")
_SEG_CODES = {name: code for code, name in enumerate(SEG_NAMES)}
_RELEASES = frozenset(("segment_free", "segment_unmap"))
_BURST_FILLER = frozenset(("segment_free", "segment_unmap", "free_completed"))
_EXPLAINS_RELEASE = frozenset(("segment_alloc", "segment_map", "oom"))

NO_HISTORY_HELP = (
    "this snapshot was recorded without allocation history, so there is nothing to replay. "
    "Record one with torch.cuda.memory._record_memory_history(max_entries=1_000_000) "
    "before the workload runs, then torch.cuda.memory._dump_snapshot('trace.pickle')"
)


@dataclass(frozen=True)
class RecordedOom:
    """An ``oom`` entry: the real allocator failed this (rounded) request."""

    event_index: int
    size: int
    device_free: int
    stream: int


@dataclass(frozen=True, eq=False)
class Trace:
    """One device's trace, decoded once for fast replay.

    The ``ops``/``addr_ids``/``sizes``/``lanes``/``op_index``/``op_time_us``
    columns run in parallel, one row per replayed operation. A lane is one
    (private pool id, stream) pair; blocks are never shared between lanes.
    """

    device: int
    num_events: int
    ops: array[int]
    addr_ids: array[int]
    sizes: array[int]
    lanes: array[int]
    op_index: array[int]
    op_time_us: array[int]
    num_addresses: int
    lane_streams: tuple[int, ...]
    lane_pools: tuple[tuple[int, int], ...]
    seg_kinds: array[int]
    seg_sizes: array[int]
    seg_addrs: array[int]
    seg_index: array[int]
    ooms: tuple[RecordedOom, ...]
    action_counts: tuple[tuple[str, int], ...]
    unknown_frees: int
    first_unknown_free: int | None
    empty_cache_calls: int
    initial_state: AllocatorState | None = None
    initial_note: str | None = None
    #: ``empty_cache()`` calls that only the recorded memory limit tells apart from malloc's OOM
    #: path (a release right before a new segment); the replay decides them (docs/simulator.md)
    ambiguous_releases: int = 0
    #: trace actions the replay does not model (counted; they change no simulated state)
    unknown_actions: tuple[tuple[str, int], ...] = ()
    #: frees that waited on other streams' events (``record_stream``): requested, completed later
    deferred_frees: int = 0
    #: private pools (CUDA graphs, ``torch.cuda.MemPool``) the snapshot shows whose allocations the
    #: trace entries do not attribute (torch ≤ 2.11 writes no ``pool_id`` in trace entries)
    unattributed_pools: tuple[tuple[int, int], ...] = ()
    #: allocations attributed to a private pool from the recorded run (:mod:`.pools`)
    inferred_private_allocs: int = 0
    #: ``set_per_process_memory_fraction`` calls placed as ``limit`` rows (:mod:`.limits`)
    limit_changes: int = 0
    #: recorded calls with no row to place them by (a trace without times, or after its end)
    unplaced_limit_changes: int = 0
    #: the memory limit the recording ran under (its fraction's, else the usable device), where
    #: the caller knows it: it tells malloc's out-of-memory path from ``empty_cache()`` in every
    #: row, whatever limit the row itself applies (``engine._recorded_limit``); None: unknown
    recorded_limit_bytes: int | None = None

    def caveats(self) -> tuple[str, ...]:
        """What the replay cannot model faithfully in this trace, for people.

        Each one lowers the confidence of every prediction made from the trace
        (:attr:`.result.Fidelity.confident`): a "no OOM" then comes with a caveat.
        """
        out: list[str] = []
        if self.unknown_actions:
            names = ", ".join(f"{name} ×{count:,}" for name, count in self.unknown_actions)
            out.append(f"trace entries the replay does not model ({names})")
        private = sorted({pool for pool in self.lane_pools if pool != (0, 0)})
        if private:
            how = (f"{self.inferred_private_allocs:,} allocations attributed to it from the recorded "
                   "addresses (the trace entries carry no pool id), " if self.inferred_private_allocs else "")
            out.append(f"allocations in {len(private)} private memory pool(s): {how}kept apart from the "
                       "default pool, but when CUDA graphs release or reuse them is not modelled")
        if self.unattributed_pools:
            out.append(
                f"{len(self.unattributed_pools)} private memory pool(s) (CUDA graphs / torch.cuda.MemPool) "
                "whose allocations the trace does not attribute, replayed in the default pool")
        if self.unplaced_limit_changes:
            out.append(f"{self.unplaced_limit_changes} memory-fraction change(s) the program made could "
                       "not be placed in the trace (it has no times), so the replay keeps one limit")
        if self.deferred_frees:
            out.append(
                f"{self.deferred_frees:,} frees waited on other streams (record_stream) and complete "
                "where the recording saw them; under other settings the GPU may finish them earlier or later "
                "(a result's peak range covers the GPU finishing them at once, and lagging twice as far "
                "as the recording ever shows; a single peak means neither changes it)")
        return tuple(out)

    def replay_columns(self) -> tuple[list[int], list[int], list[int], list[int]]:
        """(ops, address ids, sizes, lanes) as lists, built once per process and cached.

        Each allocation freed by the very next row is marked ``OP_ALLOC_FREED_NEXT``.
        Equal values share one int object (a size that occurs 10,000 times is one
        object, not 10,000), which keeps the lists small and cache-friendly: the
        replay is memory-bound, and two replays on two cores slow each other down
        far less this way. Lists are faster to iterate than ``array`` (no int
        boxing per element).
        """
        cached: tuple[list[int], list[int], list[int], list[int]] | None
        cached = self.__dict__.get("_columns")
        if cached is None:
            ids = list(range(self.num_addresses))
            shared: dict[int, int] = {}
            cached = (
                _ops_marking_temporaries(self.ops, self.addr_ids),
                list(map(ids.__getitem__, self.addr_ids)),
                [shared.setdefault(v, v) for v in self.sizes],
                list(self.lanes),
            )
            object.__setattr__(self, "_columns", cached)
        return cached

    def with_recorded_limit(self, limit: int | None) -> Trace:
        """This trace, knowing the limit its recording ran under (:attr:`recorded_limit_bytes`).
        Kept per limit on this trace: the panel asks again on every Compare, and a copy would
        build its replay columns and timing orders again."""
        if limit == self.recorded_limit_bytes:
            return self
        copies: dict[int | None, Trace] = self.__dict__.setdefault("_limited", {})
        if limit not in copies:
            copies[limit] = dataclasses.replace(self, recorded_limit_bytes=limit)
        return copies[limit]

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the cached lists (workers rebuild them from the arrays)."""
        state = dict(self.__dict__)
        state.pop("_columns", None)
        state.pop("_timing", None)
        state.pop("_limited", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def num_ops(self) -> int:
        """Rows the engine replays (fewer than events: fused frees, segments aside)."""
        return len(self.ops)

    @property
    def partial(self) -> bool:
        """True when the trace starts after allocations it later frees (ring buffer wrapped)."""
        return self.unknown_frees > 0

    def program_catches_ooms(self) -> bool:
        """The program survived an out-of-memory error: the trace allocates after an ``oom``
        entry (a batch-size finder, a ``try/except OutOfMemoryError`` loop, a library that
        retries with a smaller workspace). An OOM is then not the end of the run."""
        cached: bool | None = self.__dict__.get("_catches_ooms")
        if cached is None:
            ops = self.ops
            try:
                first = ops.index(OP_OOM)
            except ValueError:
                cached = False
            else:
                cached = any(op == OP_ALLOC for op in ops[first + 1:])
            object.__setattr__(self, "_catches_ooms", cached)
        return cached

    def ends_at_its_oom(self) -> bool:
        """The program died of an out-of-memory error the trace records: an ``oom`` entry with
        nothing allocated after it (the run, or its recording, ended there). A setting that
        serves that request is replayed only up to it: what the program would have allocated
        next was never recorded."""
        return bool(self.ooms) and not self.program_catches_ooms()

    @property
    def initial_reserved_bytes(self) -> int:
        """Reserved bytes when the trace begins (0 unless it starts from a known state)."""
        return self.initial_state.reserved_bytes if self.initial_state is not None else 0

    def idle_start_segments(self) -> int:
        """Whole cached segments of the default large pool the replay starts with.

        ``garbage_collection_threshold`` releases the blocks that were idle longest first, and
        how long these had been idle before the recording is not in the snapshot: the replay
        takes them as idle equally long, which decides among two or more of them (cut at 38
        points, our two GC recordings replayed from such a start within 2.5 %).
        """
        state = self.initial_state
        if state is None:
            return 0
        return sum(1 for seg in state.segments
                   if not seg.small and not seg.expandable and seg.pool_id == (0, 0)
                   and all(block.state == FREE for block in seg.blocks))

    def recorded_reserved_peak(self) -> int:
        """Peak of reserved memory implied by the recorded segment events (from the start state)."""
        reserved = peak = self.initial_reserved_bytes
        for kind, size in zip(self.seg_kinds, self.seg_sizes, strict=True):
            reserved += size if kind in (SEG_ALLOC, SEG_MAP) else -size
            peak = max(peak, reserved)
        return peak

    def releases_a_limit_decides(self, up_to: int | None = None) -> int:
        """Release bursts right before a new segment that only the run's memory limit tells
        from ``empty_cache()``: the new segment would have taken reserved memory past the
        recorded peak (and not past ``up_to``, a limit taken as the run's, which calls those
        beyond it malloc's). One that stayed within the peak fitted under any limit the run
        had, so malloc's out-of-memory path did not release: it was ``empty_cache()``."""
        if not self.ambiguous_releases:
            return 0
        peak = self.recorded_reserved_peak()
        top = math.inf if up_to is None else up_to
        return sum(1 for op, need in zip(self.ops, self.sizes, strict=True)
                   if op == OP_EMPTY_CACHE and peak < need <= top)

    def recorded_reserved_at(self, event_index: int) -> int:
        """Reserved bytes implied by recorded segment events before ``event_index``."""
        return self.recorded_reserved_before([event_index])[0]

    def recorded_reserved_before(self, event_indices: Sequence[int]) -> list[int]:
        """:meth:`recorded_reserved_at` of each of ``event_indices`` (ascending), in one walk
        over the segment events: a trace with 100,000 OOMs asked one at a time walked them
        100,000 times."""
        out: list[int] = []
        reserved, j = self.initial_reserved_bytes, 0
        kinds, sizes, where = self.seg_kinds, self.seg_sizes, self.seg_index
        for event_index in event_indices:
            while j < len(where) and where[j] < event_index:
                reserved += sizes[j] if kinds[j] in (SEG_ALLOC, SEG_MAP) else -sizes[j]
                j += 1
            out.append(reserved)
        return out

    def inferred_usable_bytes(self) -> int | None:
        """Device bytes PyTorch could use, inferred from the first recorded OOM.

        At an ``oom`` entry every cache has been released and the driver
        reported ``device_free``; with the no-fragmentation driver model the
        usable capacity is reserved-at-that-moment + ``device_free``. ``None``
        when the trace has no OOM or is partial (reserved is then unknown).
        """
        if not self.ooms or self.partial:
            return None
        first = self.ooms[0]
        return self.recorded_reserved_at(first.event_index) + first.device_free

    def describe(self) -> str:
        """One line for CLI output."""
        counts = ", ".join(f"{name} {count:,}" for name, count in self.action_counts)
        text = f"device {self.device}: {self.num_events:,} events ({counts})"
        if self.initial_state is not None:
            kind = "recorded" if self.initial_state.source == RECORDED else "reconstructed"
            text += f"; starts from a {kind} allocator state: {self.initial_state.describe()}"
        if self.partial:
            text += f"; PARTIAL: {self.unknown_frees:,} frees of addresses allocated before the trace"
        return text


def extract_trace(
    snapshot: Mapping[str, Any],
    device: int | None = None,
    *,
    initial_state: AllocatorState | str = "auto",
) -> Trace:
    """Decode ``snapshot["device_traces"][device]``; see :func:`_extract` (this adds the
    private pools the snapshot shows but the trace entries do not attribute)."""
    with paused_gc():
        return _extract_all(snapshot, device, initial_state)


def _extract_all(snapshot: Mapping[str, Any], device: int | None,
                 initial_state: AllocatorState | str) -> Trace:
    trace = _extract(snapshot, device, initial_state)
    attribution = _pool_attribution(snapshot, trace)
    if attribution is not None:
        trace, _ = _decode(trace_entries(snapshot, trace.device), trace.device, None, 0,
                           _recorded_gc(snapshot), attribution)
        trace = dataclasses.replace(trace, inferred_private_allocs=len(attribution.alloc_pools))
    pools = _unattributed_pools(snapshot, trace)
    if pools:
        trace = dataclasses.replace(trace, unattributed_pools=pools)
    from allocconf_widget.core.sim.limits import read_fraction_changes, with_fraction_changes

    return with_fraction_changes(trace, read_fraction_changes(snapshot))


def read_pickled_trace(payload: bytes) -> Trace:
    """A :class:`Trace` pickled by the decoding child of ``load_snapshot_deriving``.

    It is our own process's output, yet it was made from bytes nobody vouched for, so it is
    read as the snapshot is: by an unpickler that builds only the classes a decoded trace is
    made of (and ``array``'s own reconstructor) and refuses any other global.

    Raises:
        pickle.UnpicklingError: another global, or not a trace.
    """
    import io
    import pickle

    allowed: dict[tuple[str, str], object] = {
        ("array", "_array_reconstructor"): _array_reconstructor,
        ("array", "array"): array,
        **{(cls.__module__, cls.__qualname__): cls
           for cls in (Trace, RecordedOom, AllocatorState, StateSegment, StateBlock)},
    }

    class _TraceUnpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            found = allowed.get((module, name))
            if found is None:
                raise pickle.UnpicklingError(f"{module}.{name} is not part of a decoded trace")
            return found

    trace = _TraceUnpickler(io.BytesIO(payload)).load()
    if not isinstance(trace, Trace):
        raise pickle.UnpicklingError(f"a {type(trace).__name__}, not a decoded trace")
    return trace


def trace_entries(snapshot: Mapping[str, Any], device: int) -> Sequence[Any]:
    """The raw entries of one device's trace (already validated by :func:`extract_trace`)."""
    entries: Sequence[Any] = snapshot["device_traces"][device]
    return entries


#: Pool attribution reads the whole trace once more (about 3 µs an entry): it runs on traces
#: up to this size, and on any trace whose snapshot shows a private pool.
POOL_ATTRIBUTION_MAX_ENTRIES = 200_000


def _pool_attribution(snapshot: Mapping[str, Any], trace: Trace) -> Any:
    """Private pools read off the recorded run (:mod:`.pools`) when the entries carry no pool id."""
    if trace.initial_state is not None or any(pool != (0, 0) for pool in trace.lane_pools):
        return None
    entries = trace_entries(snapshot, trace.device)
    segments = snapshot.get("segments")
    final = segments if isinstance(segments, list) else []
    shows_private = any(isinstance(seg, Mapping) and pool_id_of_entry(seg) != (0, 0) for seg in final)
    if not shows_private and len(entries) > POOL_ATTRIBUTION_MAX_ENTRIES:
        return None
    from allocconf_widget.core.sim.pools import attribute_pools
    from allocconf_widget.core.sim.settings import round_size

    settings = _recorded_settings(snapshot)
    # from 2.11 private pools are expandable too (measured, docs/simulator.md): a classic
    # segment then proves nothing
    expandable = settings.expandable_segments
    if expandable and settings.torch_version >= (2, 11):
        from allocconf_widget.core.sim.pools import attribute_expandable_pools

        return attribute_expandable_pools(entries, final)
    slots, div2 = settings.roundup_slots, settings.torch_version >= (2, 4)
    return attribute_pools(entries, final, lambda n: round_size(n, slots, div2),
                           max_split=settings.max_split_bytes, expandable=expandable)


def _unattributed_pools(snapshot: Mapping[str, Any], trace: Trace) -> tuple[tuple[int, int], ...]:
    """Private pools in the snapshot's segments (or the start state) that no trace lane carries."""
    seen: set[tuple[int, int]] = set()
    segments = snapshot.get("segments")
    for seg in segments if isinstance(segments, list) else ():
        if isinstance(seg, Mapping) and int_or_zero(seg.get("device")) == trace.device:
            seen.add(pool_id_of_entry(seg))
    seen.discard((0, 0))
    seen.difference_update(trace.lane_pools)
    return tuple(sorted(seen))


def _extract(
    snapshot: Mapping[str, Any],
    device: int | None,
    initial_state: AllocatorState | str,
) -> Trace:
    """Decode ``snapshot["device_traces"][device]`` (default: the busiest device).

    ``initial_state`` is the allocator state the replay starts from:

    * ``"auto"`` (default): the recorder's ``allocconf_initial_segments`` when the
      snapshot has them; else, when the trace cannot have started from an empty
      allocator (frees of blocks it never allocated, final segments it never
      created), the state reconstructed backwards from the snapshot's final
      ``segments`` (:func:`.state.reconstruct_initial_state`); else empty;
    * ``"empty"``: always start from an empty allocator (the behaviour before
      start states existed);
    * an :class:`.state.AllocatorState`: start from that.

    Raises:
        SnapshotError: the snapshot has no trace (recorded without history),
            the requested device has none, or the entries are not trace dicts.
    """
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list) or not any(isinstance(t, list) and t for t in traces):
        raise SnapshotError(NO_HISTORY_HELP)
    if device is None:
        device = max(range(len(traces)), key=lambda d: len(traces[d]) if isinstance(traces[d], list) else 0)
    if not 0 <= device < len(traces) or not isinstance(traces[device], list) or not traces[device]:
        have = [d for d, t in enumerate(traces) if isinstance(t, list) and t]
        shown = ", ".join(map(str, have[:8])) + (f" and {len(have) - 8:,} more" if len(have) > 8 else "")
        raise SnapshotError(f"device {device} has no trace entries; devices with a trace: {shown} "
                            "(pick one with --device)")
    entries = traces[device]
    gc = _recorded_gc(snapshot)
    if isinstance(initial_state, AllocatorState):
        return decode_entries(entries, device=device, initial_state=initial_state, recorded_gc=gc)
    if initial_state not in ("auto", "empty"):
        raise ValueError(f"initial_state must be 'auto', 'empty' or an AllocatorState, not {initial_state!r}")
    if initial_state == "empty":
        return decode_entries(entries, device=device, recorded_gc=gc)
    state, note = _recorded_state(snapshot, device)
    mark = recorded_cell_start(snapshot)
    if state is not None:
        start = cell_start_index(entries, start=mark, active_bytes=state.active_bytes)
        return decode_entries(entries, device=device, initial_state=state, start=start,
                              recorded_gc=gc)
    if mark is not None and note is None and isinstance(snapshot.get(INITIAL_SEGMENTS_KEY), list):
        # the recorder saw an empty allocator at the cell's start: replay the cell from empty,
        # whatever history (the flight recorder's ring buffer) came before it
        start = cell_start_index(entries, start=mark, active_bytes=0)
        return decode_entries(entries, device=device, start=start, recorded_gc=gc)
    trace, live = _decode(entries, device, None, 0, gc)
    segments = snapshot.get("segments")
    if not isinstance(segments, list):
        return trace
    try:
        final = AllocatorState.from_snapshot_segments(segments, device=device, source="final")
    except ValueError:
        return trace
    events = ((SEG_NAMES[k], a, n) for k, a, n in zip(trace.seg_kinds, trace.seg_addrs, trace.seg_sizes,
                                                     strict=True))
    reason = start_state_evidence(events, final, trace.unknown_frees, live)
    if reason is None:
        return trace if note is None else dataclasses.replace(trace, initial_note=note)
    settings = _recorded_settings(snapshot)
    try:
        state = reconstruct_initial_state(entries, final, settings, note=reason)
    except ReconstructionError as exc:
        return dataclasses.replace(trace, initial_note=(
            f"the trace starts mid-run ({reason}), but its start state could not be reconstructed "
            f"from the final segments ({exc}); replaying from an empty allocator"))
    if not state.segments:
        return trace
    return decode_entries(entries, device=device, initial_state=state, recorded_gc=gc)


def _recorded_gc(snapshot: Mapping[str, Any]) -> bool:
    """Whether the run had ``garbage_collection_threshold`` set (its GC releases segments in malloc)."""
    readback = snapshot.get("allocator_settings")
    if not isinstance(readback, Mapping):
        return False
    value = readback.get("garbage_collection_threshold")
    try:
        return float(value) > 0.0 if value is not None else False
    except (TypeError, ValueError):
        return False


def _recorded_state(snapshot: Mapping[str, Any], device: int) -> tuple[AllocatorState | None, str | None]:
    """The recorder's start state (``allocconf_initial_segments``), if any, and a note if unreadable."""
    raw = snapshot.get(INITIAL_SEGMENTS_KEY)
    if not isinstance(raw, list):
        return None, None
    try:
        state = AllocatorState.from_snapshot_segments(
            raw, device=device, source=RECORDED, note="memory_snapshot() taken when recording started")
    except ValueError as exc:
        return None, f"the recorded start state ({INITIAL_SEGMENTS_KEY}) is unreadable: {exc}"
    return (state if state.segments else None), None


#: what the recorder noted about its start snapshot: ``started_us`` / ``ended_us`` (epoch µs,
#: ``time.time()``, the clock torch stamps entries with, just before and after the call) and
#: ``token`` (the ``user_metadata`` torch 2.11+ stamps on that entry, when it could be set)
CELL_START_KEY = "allocconf_cell_start"
#: how far torch's approximate clock may stand before ``time.time()`` (it is TSC based)
CLOCK_SLACK_US = 50_000
#: and after: kept short, so a monitor's snapshot just after the cell began is not taken
CLOCK_SLACK_AFTER_US = 1_000


@dataclass(frozen=True)
class CellStart:
    """When and how the recorder marked a cell's start (see :data:`CELL_START_KEY`)."""

    started_us: float
    ended_us: float
    token: str | None = None


def recorded_cell_start(snapshot: Mapping[str, Any]) -> CellStart | None:
    """The recorder's cell-start mark, if the snapshot has a well-formed one."""
    raw = snapshot.get(CELL_START_KEY)
    if not isinstance(raw, Mapping):
        return None
    started, ended, token = raw.get("started_us"), raw.get("ended_us"), raw.get("token")
    if not (_finite(started) and _finite(ended)):
        return None
    return CellStart(float(started), max(float(started), float(ended)),
                     token if isinstance(token, str) and token else None)


def _finite(value: Any) -> TypeGuard[int | float]:
    """A real number a float can hold (an int of 400 digits is not: ``float()`` overflows)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def cell_start_index(entries: Sequence[Any], *, start: CellStart | None,
                     active_bytes: int | None) -> int:
    """Index of the recorded cell's first entry: events before it are in the start state.

    The recorder takes ``memory_snapshot()`` at the cell's start, which leaves a
    ``snapshot`` entry whose size is the active bytes at that moment. Whatever came
    before it (the flight recorder keeps history since CUDA started in the same ring
    buffer; a live monitor leaves ``snapshot`` entries of its own, same size included)
    is not the cell's. In order of trust:

    * the ``snapshot`` entry stamped with the recorder's ``token`` (torch 2.11+);
    * the last ``snapshot`` entry of size ``active_bytes`` stamped between the times the
      recorder noted around its call (with :data:`CLOCK_SLACK_US` before and
      :data:`CLOCK_SLACK_AFTER_US` after); else the first entry after that call;
    * without a mark (a recording saved by an older release): the first ``snapshot``
      entry anywhere whose size is ``active_bytes``; else 0 (replay everything).

    One pass over the entries, however long the history before the cell.
    """
    def is_snapshot(e: Any) -> bool:
        return isinstance(e, Mapping) and e.get("action") == "snapshot" and (
            active_bytes is None or int_or_zero(e.get("size")) == active_bytes)

    if start is not None and start.token is not None:
        for idx, e in enumerate(entries):
            if isinstance(e, Mapping) and e.get("user_metadata") == start.token and (
                    e.get("action") == "snapshot"):
                return idx
    timed = bool(entries) and isinstance(entries[0], Mapping) and _finite(entries[0].get("time_us"))
    if start is not None and timed:
        low, high = start.started_us - CLOCK_SLACK_US, start.ended_us + CLOCK_SLACK_AFTER_US
        chosen = None
        after = None
        for idx, e in enumerate(entries):
            t = e.get("time_us") if isinstance(e, Mapping) else None
            if not _finite(t):
                continue
            if low <= t <= high and is_snapshot(e):
                chosen = idx
            if after is None and t > start.ended_us:
                after = idx
            if t > high:
                break
        if chosen is not None:
            return chosen
        return after if after is not None else len(entries)
    if active_bytes is None:
        return 0
    return next((idx for idx, e in enumerate(entries) if is_snapshot(e)), 0)


def cell_traces(traces: Sequence[Any], initial_segments: Sequence[Any] | None,
                start: CellStart) -> list[Any]:
    """Each device's trace from the recorded cell's first entry on (:func:`cell_start_index`).

    ``initial_segments``: the recorder's start snapshot (None when CUDA was not up, so no
    ``snapshot`` entry was left). The recorder keeps only this, so a recording holds the
    cell and nothing of the history before it, and its event count is the cell's.
    """
    out: list[Any] = []
    for device, entries in enumerate(traces):
        if not isinstance(entries, list):
            out.append(entries)
            continue
        active = None
        if initial_segments is not None:
            active = sum(int_or_zero(seg.get("active_size")) for seg in initial_segments
                         if isinstance(seg, Mapping) and int_or_zero(seg.get("device")) == device)
        out.append(entries[cell_start_index(entries, start=start, active_bytes=active):])
    return out


def _recorded_settings(snapshot: Mapping[str, Any]) -> Any:
    """The snapshot's own settings (their rounding sizes blocks during reconstruction)."""
    from allocconf_widget.core.sim.settings import SimSettings

    readback = snapshot.get("allocator_settings")
    version, _ = guess_torch_version(snapshot)
    return SimSettings.from_allocator_settings(readback if isinstance(readback, Mapping) else None, version)


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
    return _decode(entries, device, initial_state, start, recorded_gc)[0]


def _decode(
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

    def run(self, start: int = 0) -> None:
        self._seed()
        entries = self.entries
        n = len(entries)
        live = self.live
        counts = self.counts
        emit = self._emit
        skip_next = False
        for idx in range(start, n):
            if skip_next:
                skip_next = False
                continue
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


def guess_torch_version(snapshot: Mapping[str, Any]) -> tuple[TorchVersion, str]:
    """Lower bound on the torch release that wrote ``snapshot``, from which keys it has.

    Snapshots do not record the torch version, so this is only a floor; the
    caller should prefer an explicit version.
    """
    settings = snapshot.get("allocator_settings")
    version, why = (2, 0), "no allocator_settings (torch < 2.3)"
    if isinstance(settings, Mapping):
        version, why = (2, 3), "allocator_settings present (2.3+)"
        if "max_round_threshold" in settings or "max_cached_size" in settings:
            version, why = (2, 13), "pinned max_round_threshold in allocator_settings (2.13+)"
    if "host_segments" in snapshot or "host_traces" in snapshot:
        version, why = max(version, (2, 14)), "host_segments present (2.14+)"
    first = _first_entry(snapshot)
    if first is not None:
        if "user_metadata" in first and version < (2, 11):
            version, why = (2, 11), "trace entries carry user_metadata (2.11+)"
        elif "compile_context" in first and version < (2, 8):
            version, why = (2, 8), "trace entries carry compile_context (2.8+)"
    return parse_version(version), why


def _first_entry(snapshot: Mapping[str, Any]) -> Mapping[str, Any] | None:
    traces = snapshot.get("device_traces")
    if isinstance(traces, list):
        for t in traces:
            if isinstance(t, list) and t and isinstance(t[0], Mapping):
                return t[0]
    return None



def code_mask(ops: array[int], codes: tuple[int, ...]) -> bytes:
    """One byte per row of ``ops``: 1 where its operation is one of ``codes``, else 0
    (a ``bytes.translate``, at C speed)."""
    table = bytes(1 if code in codes else 0 for code in range(256))
    return (ops.tobytes() if ops.itemsize == 1 else bytes(ops)).translate(table)


def rows_with(ops: array[int], codes: tuple[int, ...], *also: bytes) -> list[int]:
    """Rows whose operation is one of ``codes`` and whose byte is 1 in every ``also`` mask
    (one byte per row), in order, found at C speed: :func:`code_mask`, ANDed with the masks
    as integers, and ``itertools.compress``. The replay's passes over a million rows use it
    where a Python loop over every row would cost a large share of a replay."""
    mask = code_mask(ops, codes)
    if also:
        joined = int.from_bytes(mask, "little")
        for other in also:
            joined &= int.from_bytes(other, "little")
        mask = joined.to_bytes(len(mask), "little")
    return list(compress(range(len(mask)), mask))


def _ops_marking_temporaries(ops: array[int], addr_ids: array[int]) -> list[int]:
    """``ops`` as a list, each ``OP_ALLOC`` whose ``OP_FREE`` of the same address is the next
    row turned into ``OP_ALLOC_FREED_NEXT``."""
    out = list(ops)
    if len(out) < 2:
        return out
    same_address_next = bytes(map(int.__eq__, addr_ids, addr_ids[1:]))
    for row in rows_with(ops[:-1], (OP_ALLOC,), code_mask(ops[1:], (OP_FREE,)), same_address_next):
        out[row] = OP_ALLOC_FREED_NEXT
    return out
