"""The decoded trace: one device's allocator events as parallel integer columns.

:class:`Trace` is what every replay reads. Its columns (operation code, address id, size,
lane, original index, time) run in parallel, one row per replayed operation; arrays pickle as
raw bytes, which makes shipping a trace to worker processes cheap. The recorded segment
events ride beside them as the self-check's reference.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from allocconf_widget.core.sim.state import FREE, RECORDED, AllocatorState
from allocconf_widget.core.sim.trace.codes import OP_ALLOC, OP_EMPTY_CACHE, OP_OOM, SEG_ALLOC, SEG_MAP
from allocconf_widget.core.sim.trace.rows import ops_marking_temporaries


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
                ops_marking_temporaries(self.ops, self.addr_ids),
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
        state.pop("_native", None)
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
        takes them as idle equally long, which decides among two or more of them
        (docs/simulator.md, "Traces that start mid-run", says how far that moves a peak).
        """
        state = self.initial_state
        if state is None:
            return 0
        return sum(1 for seg in state.segments
                   if not seg.small and not seg.expandable and seg.pool_id == (0, 0)
                   and all(block.state == FREE for block in seg.blocks))

    def recorded_reserved_peak(self) -> int:
        """Peak of reserved memory implied by the recorded segment events (from the start state);
        worked out once per trace (every replay asks)."""
        cached: int | None = self.__dict__.get("_recorded_peak")
        if cached is None:
            reserved = cached = self.initial_reserved_bytes
            for kind, size in zip(self.seg_kinds, self.seg_sizes, strict=True):
                reserved += size if kind in (SEG_ALLOC, SEG_MAP) else -size
                cached = max(cached, reserved)
            object.__setattr__(self, "_recorded_peak", cached)
        return cached

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
