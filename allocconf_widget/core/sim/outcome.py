"""What a replayed setting does to the step: one outcome, read from one place.

Every view answers the same question ("what would this setting do to my step?") from a
:class:`~allocconf_widget.core.sim.result.SimResult`. :func:`outcome_of` is the only reader of
the result's out-of-memory facts; views word the :class:`Outcome` it returns
(``views/text/forecast.py``) and never look at the facts themselves, so a setting gets one
verdict wherever it is shown.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from allocconf_widget.core.sim.result import SimResult


class Outcome(enum.Enum):
    """What a setting does to the replayed step, in order of precedence (:func:`outcome_of`)."""

    #: an out-of-memory error the program does not survive: the run ends there
    RUNS_OUT = "runs out"
    #: an out-of-memory error where the recording had none, in a program that catches its OOMs:
    #: its own handler decides what follows (a smaller batch, a skipped step), which the replay
    #: cannot follow, so it stops there
    HANDLER_DECIDES = "handler decides"
    #: a request that failed in the recording fits here, in a program that catches its OOMs: its
    #: handler does not run and what the program does instead was never recorded
    PATH_CHANGES = "path changes"
    #: the OOMs the program caught in the recording are met and caught again; the run goes on
    #: as recorded
    CAUGHT_AS_RECORDED = "caught as recorded"
    #: no OOM in the recorded order of the GPU's work, but the latest GPU timing the recording
    #: allows runs out: whether it fits depends on when other streams finish
    MAY_RUN_OUT = "may run out by GPU timing"
    #: the request that ended the recorded run (its fatal OOM) is served: the step gets past
    #: the crash into a part of the run nobody recorded
    OUTLIVES_RECORDING = "outlives the recording"
    #: the step runs to its end without an OOM, in every GPU timing the recording allows
    FITS = "fits"

    @property
    def fits(self) -> bool | None:
        """The one meaning of "fits": True where the step runs to the end of what was
        recorded without an OOM that stops it (caught OOMs the recording had included), False
        where it runs out, None where the replay cannot say (the program's handler, a path
        nobody recorded, or GPU timing decides)."""
        if self in (Outcome.FITS, Outcome.OUTLIVES_RECORDING, Outcome.CAUGHT_AS_RECORDED):
            return True
        if self is Outcome.RUNS_OUT:
            return False
        return None

    @property
    def avoids_oom(self) -> bool:
        """No out-of-memory error in the recorded window at all, in any GPU timing: the OOM card
        offers only such settings as ones that would have avoided its OOM."""
        return self in (Outcome.FITS, Outcome.OUTLIVES_RECORDING)

    @property
    def stops(self) -> bool:
        """The replay ends before the recording does: the run dies, or the program's handler
        takes over. Such settings rank after every setting that gets further."""
        return self in (Outcome.RUNS_OUT, Outcome.HANDLER_DECIDES)

    @property
    def partial_peak(self) -> bool:
        """The peak covers only part of what the program does under this setting (a path
        nobody recorded follows): such a row ranks after the rows predicted to the end."""
        return self is Outcome.PATH_CHANGES


def outcome_of(result: SimResult) -> Outcome:
    """The outcome of one replay; the only function that reads a result's OOM facts."""
    oom = result.oom
    if oom is not None and result.oom_fatal:
        return Outcome.RUNS_OUT
    if oom is not None and not oom.recorded:
        return Outcome.HANDLER_DECIDES
    if result.path_changes_at is not None:
        return Outcome.PATH_CHANGES
    if oom is not None:
        return Outcome.CAUGHT_AS_RECORDED
    if result.timing_oom:
        return Outcome.MAY_RUN_OUT
    if result.outlives_recording:
        return Outcome.OUTLIVES_RECORDING
    return Outcome.FITS
