"""Record a cell's allocation trace with torch's own memory history, for the what-if simulator.

``torch.cuda.memory._record_memory_history`` keeps a ring buffer of every
alloc/free/segment event; ``_snapshot()`` returns it with the allocator
settings in force. We record without stack frames (``context=None``): frames
cost seconds to symbolise and the simulator needs only sizes, addresses and
streams. Recording initialises CUDA, which is fine here: the user is about to
run GPU code in that very cell.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from allocconf_widget._errors import RuntimeStateError
from allocconf_widget.adapters import torch_private
from allocconf_widget.adapters.fraction_calls import noting_fraction_calls
from allocconf_widget.core.sim.limits import FRACTION_CHANGES_KEY
from allocconf_widget.core.sim.trace.cells import CELL_START_KEY, CellStart, cell_traces

DEFAULT_MAX_ENTRIES = 1_000_000
#: the ring buffer a recorded cell may ask for: torch takes any int (and fails with a raw
#: TypeError on a negative one, after the cell was meant to run); 10 M entries is a few GiB
#: of host memory, the flight recorder's bound too
MIN_ENTRIES, MAX_ENTRIES = 1_000, 10_000_000


def check_max_entries(value: object) -> int:
    """``value`` if it is a ring-buffer size a recording may use; ValueError naming the range."""
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_ENTRIES <= value <= MAX_ENTRIES:
        raise ValueError(f"{value!r} entries is out of range: use {MIN_ENTRIES:,} to "
                         f"{MAX_ENTRIES:,} (default {DEFAULT_MAX_ENTRIES:,})")
    return value


#: Extra snapshot key holding the segments that existed when recording started.
INITIAL_SEGMENTS_KEY = "allocconf_initial_segments"


@dataclass
class CellRecording:
    """The outcome of a recorded block: the snapshot (with its trace) and context."""

    snapshot: Any = None  # torch's snapshot dict (core.memory.snapshot.Snapshot shape)
    torch_version: str = ""
    device_total: int | None = None
    free_at_start: int | None = None
    seconds: float = 0.0
    peak_reserved: int | None = None
    #: ``set_per_process_memory_fraction`` in force when the cell started (None: no limit);
    #: changes inside the cell are in the snapshot, where they happened
    fraction: float | None = None
    error: BaseException | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def events(self) -> int:
        traces = (self.snapshot or {}).get("device_traces") or [[]]
        return sum(len(t) for t in traces)


def _torch() -> Any:
    torch = torch_private.imported_torch()
    if torch is None:
        import importlib

        torch = importlib.import_module("torch")  # recording is an explicit request to use CUDA
    if not torch_private.cuda_built(torch) or not torch.cuda.is_available():
        raise RuntimeStateError(
            "recording an allocation trace needs a CUDA GPU; here, try the what-if tab on the "
            "bundled H200 recording (%allocconf simulate --demo)")
    return torch


@contextmanager
def record(max_entries: int = DEFAULT_MAX_ENTRIES, device: int = 0) -> Iterator[CellRecording]:
    """Record allocation history inside the ``with`` block; ``CellRecording.snapshot`` is set on exit.

    Errors from the block (an out-of-memory error included) still produce a
    snapshot, which is exactly when a what-if is wanted most; the error is
    kept in ``CellRecording.error`` and re-raised.
    """
    check_max_entries(max_entries)  # before anything starts: bad input changes nothing
    torch = _torch()
    recording = CellRecording(torch_version=str(torch.__version__))
    torch_private.record_history(torch, max_entries=max_entries)
    # What the allocator already holds: blocks allocated in earlier cells and cached free
    # segments. The trace only has what happens from now on; the simulator starts from this.
    # The time noted first tells the cell's entries from history already in the ring buffer
    # (the flight recorder's, since CUDA started; a live monitor's snapshot entries).
    taken = torch_private.cuda_initialized(torch)
    token = f"allocconf-cell-{secrets.token_hex(8)}"
    previous = torch_private.set_memory_metadata(torch, token) if taken else None
    started_us = time.time() * 1e6
    try:
        initial = torch_private.trace_free_snapshot(torch) if taken else []
    finally:
        ended_us = time.time() * 1e6
        if previous is not None:
            torch_private.set_memory_metadata(torch, previous)
    mark = CellStart(started_us, ended_us, token if previous is not None else None)
    torch.cuda.reset_peak_memory_stats(device)
    free, total = torch.cuda.mem_get_info(device)
    recording.free_at_start, recording.device_total = int(free), int(total)
    in_force = torch_private.memory_fraction(torch, device)  # set in an earlier cell
    recording.fraction = in_force if in_force is not None and in_force < 1.0 else None
    started = time.perf_counter()
    fraction_calls: list[dict[str, Any]] = []
    try:
        with noting_fraction_calls(torch) as fraction_calls:
            yield recording
    except BaseException as exc:
        recording.error = exc
        raise
    finally:
        recording.seconds = time.perf_counter() - started
        try:
            recording.snapshot = torch_private.snapshot_with_history(torch)
            recording.snapshot["device_traces"] = cell_traces(
                recording.snapshot.get("device_traces") or [], initial if taken else None, mark)
            recording.snapshot[CELL_START_KEY] = {"started_us": mark.started_us,
                                                  "ended_us": mark.ended_us, "token": mark.token}
            recording.snapshot[INITIAL_SEGMENTS_KEY] = initial
            if fraction_calls:  # the replay applies them where they happened (core/sim/limits.py)
                recording.snapshot[FRACTION_CHANGES_KEY] = fraction_calls
            recording.peak_reserved = int(torch.cuda.memory_stats(device).get(
                "reserved_bytes.all.peak", 0))
        finally:
            # the flight recorder shares torch's ring buffer: it resumes, or history stops
            from allocconf_widget.adapters.flight_history import flight_history

            flight_history().after_recording(torch)
        if recording.events >= max_entries:
            recording.notes.append(
                f"the trace filled its {max_entries:,}-event buffer: older events were dropped, "
                "so the replay starts mid-run (record a shorter cell or raise --max-entries)")
