"""What the staged settings would do to the user's own step, asked again at every slider move.

Once the session holds a ``%%allocconf record`` or a ``%%allocconf dryrun``, every change to
the staged draft (a Settings-tab slider, ``%allocconf set``) can be answered with its
predicted peak reserved and whether it runs out of memory on that GPU, beside what the
applied settings give. The answer comes from the one replay of every front end
(:func:`allocconf_widget.app.simulate.simulate`, the same rows the What if? tab ranks), on
the session's decoded trace (:class:`~allocconf_widget.app.simulate.TraceCache`), and is
kept per (trace, draft, applied): moving a slider back to a position replays nothing.

Before anything was recorded or dry-run there is nothing of *the user's* to predict from:
:func:`predict_staged` says so (the bundled demo recording is not their model).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from allocconf_widget._errors import AllocConfError, SnapshotError
from allocconf_widget.core.sim.native import engine_name

if TYPE_CHECKING:
    from allocconf_widget.app.session import Session
    from allocconf_widget.app.simulate import SimulationRow
    from allocconf_widget.app.sources import TraceSource
    from allocconf_widget.core.config.conf import AllocConf
    from allocconf_widget.core.sim.trace.model import Trace

#: trace entries above which the Python replay engine does not replay a draft at every slider
#: move (three of its replays of a million entries take seconds: ``%allocconf simulate`` ranks
#: such a recording once instead). The compiled engine replays any recording the loader accepts,
#: a draft of a million entries in less time than unpickling the file (docs/panel.md)
LIMIT_EVENTS = 200_000

#: what the panel and ``%allocconf set`` say while there is nothing to predict from
NOTHING_YET = ("Record a step (%%allocconf record) or dry-run it before CUDA starts "
               "(%%allocconf dryrun) to see what each draft would do to its memory; until then "
               "the What if? tab ranks your draft on the bundled recording of another run.")


@dataclass(frozen=True)
class DraftPrediction:
    """The staged draft replayed on the session's step, beside the applied settings: two rows
    of the one replay. Views word them with ``views/text/forecast.py``.

    ``problem`` is set (and the rows are None) when the draft cannot be replayed: a setting
    the trace's torch rejects, or a trace that cannot be read.
    """

    source_label: str
    estimate: bool  # from a dry run: an estimate with known gaps (docs/dryrun.md)
    draft_conf: str
    applied_conf: str
    draft: SimulationRow | None = None
    applied: SimulationRow | None = None  # None: the draft is what is applied
    problem: str | None = None
    #: how to use the session's other step (a recording beside a newer dry run, or the reverse)
    other_step: str | None = None

    @property
    def fits(self) -> bool | None:
        """The draft's :attr:`~allocconf_widget.core.sim.outcome.Outcome.fits` (None: not
        predicted, or the replay cannot say)."""
        return None if self.draft is None else self.draft.outcome.fits


def predict_staged(session: Session) -> DraftPrediction | None:
    """The staged draft (and the applied settings) replayed on the session's step (its last
    recording or dry run, whichever is newer: ``Session.step``); None when it has neither.

    Never raises for a draft or a trace it cannot replay: the answer carries the problem,
    because a slider must not throw in a widget callback.
    """
    step = session.step()
    if step.kind == "demo":
        return None  # the What-if's fallback, the bundled recording, is not the user's step
    view = session.view()
    draft, applied = view.staged, view.applied
    from allocconf_widget.app.sources import source_label

    label = source_label(session)  # the one name every view gives this trace
    estimate = step.kind == "dryrun"
    blank = DraftPrediction(label, estimate, draft.to_string(), applied.to_string(),
                            other_step=step.other_hint)
    if step.events > LIMIT_EVENTS and engine_name() == "python":
        return dataclasses.replace(blank, problem=(
            f"{label} has {step.events:,} trace entries, too many to replay at every change on the "
            "Python replay engine (this install has no compiled one: see `allocconf check --env`); "
            "%allocconf simulate ranks settings on it once"))
    try:
        return session.trace_cache.memo(
            session, ("draft", draft, applied),
            lambda source, trace: _replay(source, trace, blank, draft, applied))
    except (AllocConfError, SnapshotError) as exc:
        return dataclasses.replace(blank, problem=str(exc))


def _replay(source: TraceSource, trace: Trace, blank: DraftPrediction, draft: AllocConf,
            applied: AllocConf) -> DraftPrediction:
    from allocconf_widget.app.simulate import SimulationRequest, simulate

    same = draft == applied
    report = simulate(source, SimulationRequest(configs=(draft,) if same else (draft, applied)),
                      trace=trace)
    rows = report.rows
    return dataclasses.replace(blank, draft=rows[0], applied=None if same else rows[-1])
