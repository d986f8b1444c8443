"""``%%allocconf record``: run a cell with allocation history on, and keep its trace.

The recording becomes the session's step (:meth:`Session.set_recording`), which every
prediction then uses when it is the newest (``Session.step``). Where no GPU can record, the
cell still runs: the user's work is never skipped, and the outcome says why nothing was kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from allocconf_widget._errors import RuntimeStateError
from allocconf_widget.adapters.recorder import CellRecording as CellRecording  # noqa: PLC0414

if TYPE_CHECKING:
    from allocconf_widget.app.session import Session


def check_max_entries(value: object) -> int:
    """``value`` if it is a ring-buffer size a recording may use; ValueError naming the range."""
    from allocconf_widget.adapters.recorder import check_max_entries as check

    return check(value)


@dataclass(frozen=True)
class RecordedCell:
    """What recording a cell gave: the recording (None where none could be made) and the
    cell's own result."""

    recording: CellRecording | None
    result: Any  # what running the cell returned (IPython's ExecutionResult)
    not_recorded: str | None = None  # why nothing was recorded
    saved_to: str | None = None  # where the snapshot was written (``--save``)


def record_cell(session: Session, run: Callable[[], Any], *, max_entries: int,
                save: str | None = None) -> RecordedCell:
    """Run ``run()`` with allocation history on; the recording becomes the session's step.

    An error from the cell (an out-of-memory error included) still gives a recording, which
    is when a what-if is wanted most; it is re-raised after the recording is kept.
    """
    from allocconf_widget.adapters.recorder import record

    recorder = record(max_entries=max_entries)
    try:
        rec = recorder.__enter__()
    except RuntimeStateError as exc:
        return RecordedCell(None, run(), not_recorded=str(exc))
    try:
        result = run()
    except BaseException as exc:
        recorder.__exit__(type(exc), exc, exc.__traceback__)
        raise
    recorder.__exit__(None, None, None)
    session.set_recording(rec)
    saved_to = None
    if save is not None and rec.snapshot is not None:
        from allocconf_widget.app.exports import viewer_torch
        from allocconf_widget.core.memory.snapshot import save_snapshot

        save_snapshot(rec.snapshot, save, for_torch=viewer_torch())
        saved_to = save
    return RecordedCell(rec, result, saved_to=saved_to)
