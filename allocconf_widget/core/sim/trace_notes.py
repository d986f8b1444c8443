"""What a trace's shape means for every prediction made from it, as typed notes.

A trace that starts mid-run, lost its oldest entries, ends at the OOM that ended its program,
holds inferred ``empty_cache()`` calls or frees that waited on another stream limits what any
row of a replay can say. These notes are the same for every row, so the replay use case adds
them once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from allocconf_widget.core.sim.notes import Note, NoteKind
from allocconf_widget.core.sim.timing import host_ran_ahead

if TYPE_CHECKING:
    from allocconf_widget.core.sim.settings import SimSettings
    from allocconf_widget.core.sim.trace.model import Trace

#: where every free that waited on another stream completed before the next allocation: the
#: range cannot reach above the recorded order
HOST_KEPT_PACE = (
    "every free that waited on another stream (record_stream) completed before the next "
    "allocation: the recorded run's CPU never got ahead of its GPU (a slow host, a debugger, "
    "code that waits on the GPU), so the peaks (and any range shown) hold only for a run paced "
    "like it. A run whose CPU does get ahead can peak several times higher (docs/fidelity.md). "
    "Record a run at full speed to see how far its peak can move")


def recorded_window(num_events: int) -> Note:
    """Said wherever a replay covers a run only up to the request that failed and ended it:
    a setting that serves that request gets past the crash, into what nobody recorded."""
    return Note(NoteKind.WINDOW, f"peaks cover the recorded window ({num_events:,} events, up to the "
                "request that failed); what the run needs after it was never seen")


def trace_notes(trace: Trace, *, has_settings: bool) -> tuple[Note, ...]:
    """The notes every row of a replay of ``trace`` shares. ``has_settings``: the snapshot
    carries the allocator settings the run had (torch 2.3+)."""
    notes: list[Note] = []
    if not has_settings:
        notes.append(Note(NoteKind.SETTINGS, "the snapshot has no allocator_settings (torch < 2.3): "
                          "assuming the trace ran with torch's defaults"))
    if trace.initial_state is None and trace.initial_note:
        notes.append(Note(NoteKind.START, trace.initial_note))
    if trace.ends_at_its_oom():
        window = recorded_window(trace.num_events)
        notes.append(Note(NoteKind.WINDOW, "the recording ends at the OOM that ended the program: "
                          + window.text))
    if trace.partial:
        notes.append(Note(NoteKind.PARTIAL, (
            f"the trace is partial: {trace.unknown_frees:,} frees of memory allocated before it "
            "began (ring buffer full); predictions cover only the recorded window")))
    if trace.empty_cache_calls:
        notes.append(Note(NoteKind.EMPTY_CACHE, (
            f"{trace.empty_cache_calls:,} torch.cuda.empty_cache() call(s) inferred from the "
            "segments the run released; every row releases its cache at the same points")))
    if host_ran_ahead(trace) is False:
        notes.append(Note(NoteKind.TIMING, HOST_KEPT_PACE))
    return tuple(notes)


def start_state_line(trace: Trace) -> str | None:
    """Where the replay starts, when not from an empty allocator."""
    state = trace.initial_state
    if state is None:
        return None
    return (f"the replay starts from {state.provenance()} ({state.describe()}); other settings are "
            "replayed as if switched now, keeping these segments")


def gc_start_note(trace: Trace, settings: list[SimSettings]) -> Note | None:
    """Where garbage-collection rows rest on a guess: the replay starts with cached segments the
    collector may release, in an order set by how long each had been idle before the recording,
    which no snapshot carries."""
    idle = trace.idle_start_segments()
    collects = any(s.gc_threshold > 0.0 and (s.per_process_memory_fraction is not None or trace.limit_changes)
                   for s in settings)
    if idle < 2 or not collects:
        return None
    return Note(NoteKind.START, (
        f"the recording starts with {idle} cached segments that garbage_collection_threshold may "
        "release, oldest first; how long each had been idle before the recording is not in the "
        "snapshot, so the replay takes them as idle equally long: rows with garbage collection "
        "may be a few percent off (docs/simulator.md, \"Traces that start mid-run\")"))
