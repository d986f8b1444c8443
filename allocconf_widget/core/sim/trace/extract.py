"""From a snapshot to a :class:`~.model.Trace`: which device, which start state, which pools.

A trace recorded mid-run (a notebook cell after the model was built, a ring buffer that
wrapped) does not start from an empty allocator. :func:`extract_trace` then attaches the
allocator state at the trace's start (:mod:`..state`): the one the recorder saved
(``allocconf_initial_segments``), else one reconstructed backwards from the snapshot's final
segments. Its live blocks are known addresses to the decoder, so their later frees replay;
the engine starts from its segments.
"""

from __future__ import annotations

import dataclasses
from array import _array_reconstructor, array  # type: ignore[attr-defined]
from collections.abc import Mapping, Sequence
from typing import Any

from allocconf_widget._errors import SnapshotError
from allocconf_widget.core.memory.gcpause import paused_gc
from allocconf_widget.core.numbers import int_or_zero
from allocconf_widget.core.sim.state import (
    INITIAL_SEGMENTS_KEY,
    RECORDED,
    AllocatorState,
    ReconstructionError,
    StateBlock,
    StateSegment,
    pool_id_of_entry,
    reconstruct_initial_state,
    start_state_evidence,
)
from allocconf_widget.core.sim.trace.cells import cell_start_index, recorded_cell_start
from allocconf_widget.core.sim.trace.codes import SEG_NAMES
from allocconf_widget.core.sim.trace.decode import decode_entries, decode_keeping_live
from allocconf_widget.core.sim.trace.model import RecordedOom, Trace
from allocconf_widget.core.versions import TorchVersion, parse_version

NO_HISTORY_HELP = (
    "this snapshot was recorded without allocation history, so there is nothing to replay. "
    "Record one with torch.cuda.memory._record_memory_history(max_entries=1_000_000) "
    "before the workload runs, then torch.cuda.memory._dump_snapshot('trace.pickle')"
)


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
        trace, _ = decode_keeping_live(trace_entries(snapshot, trace.device), trace.device, None, 0,
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
    trace, live = decode_keeping_live(entries, device, None, 0, gc)
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


def _recorded_settings(snapshot: Mapping[str, Any]) -> Any:
    """The snapshot's own settings (their rounding sizes blocks during reconstruction)."""
    from allocconf_widget.core.sim.settings import SimSettings

    readback = snapshot.get("allocator_settings")
    version, _ = guess_torch_version(snapshot)
    return SimSettings.from_allocator_settings(readback if isinstance(readback, Mapping) else None, version)


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
