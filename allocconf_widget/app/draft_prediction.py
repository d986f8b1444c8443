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

from dataclasses import dataclass
from typing import TYPE_CHECKING

from allocconf_widget._errors import AllocConfError, SnapshotError
from allocconf_widget.core.units import format_bytes

if TYPE_CHECKING:
    from allocconf_widget.app.session import Session
    from allocconf_widget.app.simulate import SimulationRow, TraceSource
    from allocconf_widget.core.sim.result import SimResult
    from allocconf_widget.core.sim.trace.model import Trace

#: trace entries above which a draft is not replayed at every slider move (three replays of a
#: million entries take seconds: ``%allocconf simulate`` ranks such a recording once instead)
LIMIT_EVENTS = 200_000

#: what the panel and ``%allocconf set`` say while there is nothing to predict from
NOTHING_YET = ("Record a step (%%allocconf record) or dry-run it before CUDA starts "
               "(%%allocconf dryrun) to see what each draft would do to its memory; until then "
               "the What if? tab ranks your draft on the bundled recording of another run.")


@dataclass(frozen=True)
class DraftPrediction:
    """The staged draft replayed on the session's step, beside the applied settings.

    ``problem`` is set (and the rows are None) when the draft cannot be replayed: a setting
    the trace's torch rejects, or a trace that cannot be read.
    """

    source_label: str
    estimate: bool  # from a dry run: an estimate with known gaps (docs/dryrun.md)
    usable_bytes: int | None  # device memory the step may use; None: unknown (no OOM verdict)
    draft_conf: str
    applied_conf: str
    draft: SimulationRow | None = None
    applied: SimulationRow | None = None  # None: the draft is what is applied
    problem: str | None = None
    limit_bytes: int | None = None  # a memory fraction's cap, tighter than usable_bytes

    @property
    def fits(self) -> bool | None:
        """Whether the draft runs the step as recorded, without an OOM that ends it or one the
        program's handler would meet where the recording had none (None: not predicted, or the
        handler decides)."""
        if self.draft is None or _handler_decides(self.draft):
            return None
        if self.draft.result.path_changes_at is not None:  # a path nobody recorded follows
            return None
        return not _fatal(self.draft)

    def lines(self) -> list[str]:
        """The sentences every front end shows, first the draft's verdict."""
        head = f"Prediction from {self.source_label}"
        if self.problem is not None or self.draft is None:
            return [f"{head}: not available for this draft: {self.problem}"]
        of = _of(self.usable_bytes, self.limit_bytes)
        out = [f"{head}, with {_setting(self.draft_conf)}: {_said(self.draft, of)}"]
        if self.applied is not None:
            out.append(f"Applied now, with {_setting(self.applied_conf)}: "
                       f"{_said(self.applied, of)}")
            out.append(_compared(self.draft, self.applied))
        if self.estimate:
            out.append("A dry run misses some library workspaces: treat a margin under ~10 % "
                       "as a maybe (docs/dryrun.md).")
        return out


def _setting(conf: str) -> str:
    return conf or "torch's defaults"


def _fatal(row: SimulationRow) -> bool:
    return row.result.oom_fatal  # set only with an OOM, and never for one the program catches


def _handler_decides(row: SimulationRow) -> bool:
    return row.result.handler_decides  # an OOM the recording did not have, in a program that catches them


def _of(usable: int | None, limit: int | None) -> str:
    """What the peak is measured against: the memory fraction's cap where it binds (the OOM
    card says "of a 4.00 GiB limit"), else the device memory left to PyTorch."""
    if limit:
        return f" of a {format_bytes(limit)} limit (the memory fraction)"
    return f" of {format_bytes(usable)} usable" if usable else ""


def _said(row: SimulationRow, of: str) -> str:
    result = row.result
    peak = result.peak_reserved_text()
    if result.oom is not None:
        failed = format_bytes(result.oom.requested_bytes)
        if _fatal(row):
            return f"runs out of memory: a {failed} request fails at {peak} reserved{of}."
        if _handler_decides(row):
            return (f"a {failed} request fails where the recording did not; the program catches "
                    f"its OOMs, so its own handler decides what follows (peak reserved {peak}{of} "
                    "until then).")
        return (f"the OOM the program caught in the recording, caught again; peak reserved {peak}{of}"
                + _path_change(result))
    if result.path_changes_at is not None:
        return f"peak reserved {peak}{of}" + _path_change(result)
    return f"peak reserved {peak}{of}; fits."


def _path_change(result: SimResult) -> str:
    """'.' or, where a request the recording failed fits, that the program's path changes."""
    return f"; {result.path_change_words()}." if result.path_changes_at is not None else "."


def _compared(draft: SimulationRow, applied: SimulationRow) -> str:
    """The draft against the applied settings: fit against OOM first, else the peaks."""
    if _handler_decides(draft) or _handler_decides(applied):
        return ("Not comparable past the first OOM the recording did not have: the program's "
                "handler decides what follows.")
    if _fatal(applied) and not _fatal(draft):
        return "The draft fits where the applied settings run out of memory."
    if _fatal(draft) and not _fatal(applied):
        return "The draft runs out of memory where the applied settings fit."
    if _fatal(draft):
        return "Both run out of memory."
    delta = draft.result.peak_reserved_bytes - applied.result.peak_reserved_bytes
    if delta == 0:
        return "The draft: the same peak."
    return f"The draft: {format_bytes(abs(delta))} {'less' if delta < 0 else 'more'} reserved at the peak."


def predict_staged(session: Session) -> DraftPrediction | None:
    """The staged draft (and the applied settings) replayed on the session's recording or dry
    run; None when the session has neither.

    Never raises for a draft or a trace it cannot replay: the answer carries the problem,
    because a slider must not throw in a widget callback.
    """
    recording = session.recording
    recorded = recording is not None and recording.snapshot is not None
    if not recorded and session.dry_run is None:
        return None  # the What-if's fallback, the bundled recording, is not the user's step
    estimate = not recorded  # the session replays a recording before a dry run
    view = session.view()
    draft_conf, applied_conf = view.staged.to_string(), view.applied.to_string()
    from allocconf_widget.app.simulate import source_label

    label = source_label(session)  # the one name every view gives this trace
    events = recording.events if recording is not None and recorded else _dry_run_events(session)
    if events > LIMIT_EVENTS:
        return DraftPrediction(label, estimate, None, draft_conf, applied_conf,
                               problem=f"{label} has {events:,} trace entries, too many to replay at "
                               "every change; %allocconf simulate ranks settings on it once")
    try:
        return session.trace_cache.memo(
            session, ("draft", draft_conf, applied_conf),
            lambda source, trace: _replay(source, trace, draft_conf, applied_conf, estimate))
    except (AllocConfError, SnapshotError) as exc:
        return DraftPrediction(label, estimate, None, draft_conf, applied_conf, problem=str(exc))


def _dry_run_events(session: Session) -> int:
    dry = session.dry_run
    return len(dry.trace.entries) if dry is not None else 0


def _replay(source: TraceSource, trace: Trace, draft_conf: str, applied_conf: str,
            estimate: bool) -> DraftPrediction:
    from allocconf_widget.app.simulate import SimulationRequest, simulate

    same = draft_conf == applied_conf
    confs = (draft_conf,) if same else (draft_conf, applied_conf)
    report = simulate(source, SimulationRequest(confs=confs), trace=trace)
    return DraftPrediction(source.label, estimate, report.usable_bytes, draft_conf, applied_conf,
                           draft=report.rows[0], applied=None if same else report.rows[1],
                           limit_bytes=report.limit_bytes)
