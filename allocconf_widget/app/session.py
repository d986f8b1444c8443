"""The one owner of a shell's allocator configuration: requested, staged, applied and effective.

Every view of the configuration (the panel's rows, its top string and
"changes" line, the What-if tab's "current" row, ``%allocconf show``) renders
one :class:`ConfigView`, built fresh from this session and the runtime at the
moment it is asked for, and is told to re-render after every change. No view
keeps its own copy, so an Apply made anywhere (a panel button, a What-if row,
the magic in another cell) cannot leave another view showing the state before it.

Three configurations matter, and they differ on purpose:

* **effective** -- what torch reads (or will read) from the environment now;
* **applied** -- the last *complete* configuration the user applied. It can
  hold more than the environment: a ``backend`` change waits for a restart and
  is kept out of this process's environment (torch would assert on it), but it
  is still what the user asked for, what is saved and what the restart gets.
  If the environment is changed behind our back, the environment wins.
* **staged** -- what is being composed; the applied one until something is staged.

A re-entrant lock guards the fields: with ipykernel 7, widget callbacks run on
a subshell thread while a cell is busy, so the panel and the magic can race.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from allocconf_widget.adapters import persist
from allocconf_widget.adapters.apply import ApplyResult, apply, current_conf, preview
from allocconf_widget.adapters.runtime_state import Phase as Phase  # noqa: PLC0414  (views read it here)
from allocconf_widget.adapters.runtime_state import RuntimeState, detect_state
from allocconf_widget.core.config.conf import AllocConf
from allocconf_widget.core.config.plan import OptionPlan

if TYPE_CHECKING:
    from allocconf_widget.adapters.recorder import CellRecording
    from allocconf_widget.app.dryrun import DryRunCell, DryRunResult
    from allocconf_widget.core.config.readback import ReadBack

Listener = Callable[[], None]

#: where an apply saves the settings for restarts (this project's file, or the global default)
SaveScope = persist.Scope

#: which step the views predict from: the newest of the two, or the one the user pinned
StepChoice = Literal["latest", "recording", "dryrun"]


@dataclass(frozen=True)
class Step:
    """The user's step every view predicts from: the session's last ``%%allocconf record`` or
    last dry run, whichever is newer unless the user pinned one (``%allocconf step``); the
    bundled recording (``"demo"``) while there is neither."""

    kind: Literal["recording", "dryrun", "demo"]
    token: int  # never reused: a new recording or dry run gets a new one
    events: int  # trace entries (what a replay walks)
    other: Literal["recording", "dryrun"] | None = None  # the session's other step, if any
    pinned: bool = False

    @property
    def other_hint(self) -> str | None:
        """How to use the other step instead, or None when there is none."""
        if self.other is None:
            return None
        name = "the last %%allocconf record" if self.other == "recording" else "the last dry run"
        if self.pinned:
            return f"%allocconf step latest uses the newer step again; {name} is kept"
        return f"%allocconf step {self.other} uses {name} instead"


class AppliedCandidate(Protocol):
    """A replayed candidate an Apply came from (:class:`~allocconf_widget.app.candidates.CandidatePlan`)."""

    @property
    def shown_conf(self) -> str: ...

    def done(self) -> str: ...


@dataclass(frozen=True)
class ConfigView:
    """Everything a view shows about the configuration, as of one moment."""

    state: RuntimeState
    effective: AllocConf
    applied: AllocConf
    staged: AllocConf
    plans: tuple[OptionPlan, ...]

    @property
    def has_changes(self) -> bool:
        """True when Apply would change something the user asked for."""
        return self.staged != self.applied

    @property
    def draft(self) -> str | None:
        """The staged configuration while it is not applied (a ranking gives it a row)."""
        return self.staged.to_string() if self.has_changes else None


@dataclass(frozen=True)
class SaveOutcome:
    """Whether a configuration reached the settings file, and why not."""

    path: str
    error: str | None = None
    scope: str = "project"
    forgotten: bool = False  # removed since (``%allocconf forget``): new kernels do not re-apply it
    #: a global default saved in a project with a file of its own: new kernels here re-apply that
    #: file instead (the global apply was lost at the next restart without a word)
    project_file: str | None = None

    @property
    def saved(self) -> bool:
        return self.error is None and not self.forgotten

    def message(self) -> str:
        if self.forgotten:
            what = "the global default" if self.scope == "global" else "this project's saved settings"
            return (f"Not saved any more: {what} ({self.path}) was removed by %allocconf forget, so "
                    "new kernels do not re-apply it.")
        if self.saved:
            if self.scope == "global" and self.project_file is not None:
                return (f"Saved as the global default to {self.path}, but this project has "
                        f"settings of its own ({self.project_file}), which its new kernels re-apply "
                        "instead: %allocconf forget removes them, %allocconf apply saves these there.")
            if self.scope == "global":
                return (f"Saved as the global default to {self.path} (re-applied by %load_ext "
                        "allocconf_widget in projects without settings of their own; "
                        "%allocconf forget --global removes it).")
            return (f"Saved for this project to {self.path} (re-applied by %load_ext "
                    "allocconf_widget in this project's new kernels; %allocconf forget removes it).")
        return (f"Applied, but NOT saved for kernel restarts: {self.error}. Fix that path (or set "
                "XDG_CONFIG_HOME to a writable folder) and apply again.")


@dataclass(frozen=True)
class ApplyOutcome:
    """What one Apply did, wherever it was clicked or typed: the one result every view renders.

    ``%allocconf apply``, the Settings tab's Apply, a What-if row's Apply and the OOM card's
    Apply all return this, and :meth:`lines` is the one place its sentences are made.
    """

    result: ApplyResult
    save: SaveOutcome | None  # None: not saved (``--no-save``)
    readback: ReadBack | None  # torch's own settings compared with the request, once readable
    global_save: SaveOutcome | None = None
    candidate: AppliedCandidate | None = None  # set when a replayed candidate was applied

    @property
    def restart_needed(self) -> bool:
        return self.result.restart_needed

    def headline(self) -> str:
        if self.candidate is not None:
            return f"Applied {self.candidate.shown_conf}."
        return "Applied."

    def lines(self) -> list[str]:
        """Every sentence of the outcome, in the order each front end shows them."""
        out: list[str] = []
        if self.candidate is not None:
            out.append(self.candidate.done() + ".")
        out += [f"warning: {w}" for w in self.result.requested.warnings]
        out += self.result.summary().splitlines()
        for save in (self.save, self.global_save):
            if save is not None:
                out.append(save.message())
        if self.readback is not None:
            out.append(self.readback.summary())
        if self.restart_needed:
            out.append("A restart is needed for part of it: %allocconf restart (or the panel's "
                       "Restart); the settings are saved and re-applied by %load_ext allocconf_widget.")
        return out

    def forgotten(self, scope: str) -> ApplyOutcome:
        """This outcome after ``%allocconf forget`` removed what it saved for ``scope``."""
        def mark(save: SaveOutcome | None) -> SaveOutcome | None:
            if save is None or save.scope != scope or save.error is not None:
                return save
            return dataclasses.replace(save, forgotten=True)

        return dataclasses.replace(self, save=mark(self.save), global_save=mark(self.global_save))


@dataclass(frozen=True)
class ForgetOutcome:
    """What ``%allocconf forget`` removed."""

    scope: persist.Scope
    path: str
    removed: bool

    def message(self) -> str:
        what = "the global default" if self.scope == "global" else "this project's saved settings"
        return (f"Removed {what} ({self.path})." if self.removed
                else f"Nothing was saved as {what} ({self.path}).")


def save_settings(conf: AllocConf, scope: persist.Scope = "project") -> SaveOutcome:
    """Save ``conf`` for restarts (this project's file, or the global default); never raises."""
    try:
        path = persist.settings_path(scope)
    except persist.NoConfigDirError as exc:
        return SaveOutcome("(no settings folder)", str(exc))
    try:
        persist.save(conf, scope)
    except OSError as exc:
        return SaveOutcome(str(path), f"{path} cannot be written ({exc.strerror or exc})")
    return SaveOutcome(str(path), scope=scope,
                       project_file=_project_file() if scope == "global" else None)


def _project_file() -> str | None:
    """This project's own settings file, where there is one (it wins over the global default)."""
    try:
        path = persist.settings_path("project")
    except (persist.NoConfigDirError, persist.NoProjectDirError):
        return None
    return str(path) if path.exists() or path.is_symlink() else None


class Session:
    """Requested, staged and applied configuration and change listeners for one shell."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._staged: AllocConf | None = None
        self._applied: AllocConf | None = None
        self._applied_env: AllocConf | None = None  # the environment right after that apply
        self.last_apply: ApplyResult | None = None
        self.last_save: SaveOutcome | None = None
        self.last_outcome: ApplyOutcome | None = None  # the last Apply, whoever made it
        self._listeners: list[Listener] = []
        self._recording: CellRecording | None = None
        self._tokens = 0  # bumped by every new recording or dry run: keys never repeat
        self._recording_token = 0  # the recording's token (newer steps have larger ones)
        self._dry_run_token = 0
        self._step_choice: StepChoice = "latest"
        self._dry_run: DryRunResult | None = None
        self.dry_run_cell: DryRunCell | None = None  # what ``%allocconf plan`` re-runs
        from allocconf_widget.app.trace_cache import TraceCache

        self.trace_cache = TraceCache()  # the What-if's decoded trace, shared by its tabs
        from allocconf_widget.app.monitor import Monitors

        self.monitors = Monitors()  # at most one memory monitor runs per shell

    # -- the last %%allocconf record ---------------------------------------------
    @property
    def recording(self) -> CellRecording | None:
        """The last ``%%allocconf record`` of this shell (what the What-if replays)."""
        with self.lock:
            return self._recording

    def set_recording(self, recording: CellRecording) -> None:
        """Keep ``recording`` as the one the What-if replays; views re-render."""
        with self.lock:
            self._recording = recording
            self._tokens += 1
            self._recording_token = self._tokens
        self._notify()

    @property
    def dry_run(self) -> DryRunResult | None:
        """The last ``%%allocconf dryrun`` (replayed when there is no recording; an estimate)."""
        with self.lock:
            return self._dry_run

    def set_dry_run(self, result: DryRunResult, cell: DryRunCell | None = None) -> None:
        """Keep ``result`` (and the cell that made it, for the batch planner); views re-render."""
        with self.lock:
            self._dry_run = result
            self.dry_run_cell = cell if cell is not None else self.dry_run_cell
            self._tokens += 1
            self._dry_run_token = self._tokens
        self._notify()

    def step(self) -> Step:
        """The step every view predicts from (one rule for all of them: :class:`Step`)."""
        with self.lock:
            held: dict[Literal["recording", "dryrun"], int] = {}
            rec, dry = self._recording, self._dry_run
            if rec is not None and rec.snapshot is not None:
                held["recording"] = self._recording_token
            if dry is not None:
                held["dryrun"] = self._dry_run_token
            if not held:
                return Step("demo", 0, 0)
            pinned = self._step_choice != "latest" and self._step_choice in held
            kind = (self._step_choice if pinned else max(held.items(), key=lambda kv: kv[1])[0])
            assert kind != "latest"
            events = rec.events if kind == "recording" and rec is not None else (
                len(dry.trace.entries) if dry is not None else 0)
            other = next((k for k in held if k != kind), None)
            return Step(kind, held[kind], events, other, pinned)

    def choose_step(self, choice: StepChoice) -> Step:
        """Pin the step views predict from (``"latest"``: the newer of the two, the default).

        Raises:
            RuntimeStateError: the session holds no step of that kind.
        """
        from allocconf_widget._errors import RuntimeStateError

        with self.lock:
            recorded = self._recording is not None and self._recording.snapshot is not None
            if (choice == "recording" and not recorded) or (choice == "dryrun" and self._dry_run is None):
                what = "%%allocconf record" if choice == "recording" else "%%allocconf dryrun"
                raise RuntimeStateError(f"this session has no {choice.replace('dryrun', 'dry run')} yet: "
                                        f"run a cell with {what} first")
            self._step_choice = choice
        self._notify()
        return self.step()

    def recording_key(self) -> tuple[str, int]:
        """An identity for the step's trace that is never reused (unlike ``id()``)."""
        step = self.step()
        return (step.kind, step.token)

    # -- observation -----------------------------------------------------------
    def state(self) -> RuntimeState:
        """The runtime state right now (cheap, side-effect free)."""
        return detect_state()

    def current(self, state: RuntimeState | None = None) -> AllocConf:
        """What torch reads (or will read) from the environment now."""
        return current_conf(state or self.state())

    def applied(self, state: RuntimeState | None = None) -> AllocConf:
        """The last complete configuration applied here, unless the environment changed since."""
        return self._applied_given(self.current(state))

    def _applied_given(self, effective: AllocConf) -> AllocConf:
        with self.lock:
            if self._applied is not None and self._applied_env == effective:
                return self._applied
            return effective

    def staged(self, state: RuntimeState | None = None) -> AllocConf:
        """The configuration being composed (the applied one until something is staged)."""
        with self.lock:
            return self._staged if self._staged is not None else self.applied(state)

    def view(self) -> ConfigView:
        """One consistent picture for every view to render."""
        state = self.state()
        effective = current_conf(state)
        with self.lock:
            applied = self._applied_given(effective)
            staged = self._staged if self._staged is not None else applied
        plans = preview(staged, state) if staged != applied else ()
        return ConfigView(state, effective, applied, staged, plans)

    @property
    def has_staged_changes(self) -> bool:
        return self.view().has_changes

    def preview(self) -> tuple[OptionPlan, ...]:
        """What applying the staged configuration would do."""
        return self.view().plans

    # -- changes -----------------------------------------------------------------
    def stage(self, conf: AllocConf, *, eager: bool = True) -> AllocConf:
        """Stage ``conf`` (already validated; replaces what was staged).

        With ``eager`` (the magic's ``set``), before torch is imported the
        environment *is* the configuration, so staging there also writes it:
        ``%allocconf set …`` then ``import torch`` just works. The panel stages
        with ``eager=False`` and writes only on its explicit Apply.
        """
        state = self.state()
        with self.lock:
            self._staged = conf
            if eager and state.phase is Phase.NOT_IMPORTED:
                self._apply_locked(conf, state, save=False)
        self._notify()
        return conf

    def update(self, options: dict[str, str | None], base: AllocConf | None = None, *,
               typed_with: dict[str, str] | None = None) -> AllocConf:
        """Stage ``base`` (default: the staged configuration) with options set (text) or unset (None).

        Each value is validated on its own (:meth:`AllocConf.with_changes`), so a
        value holding a comma cannot smuggle in another option, and a misspelled
        name is an error with a suggestion even when unsetting. ``typed_with``: the
        separator typed after each name (``=`` or ``:``), for messages.
        """
        with self.lock:
            conf = (self.staged() if base is None else base).with_changes(options, typed_with=typed_with)
        return self.stage(conf)

    def discard(self) -> None:
        """Forget staged changes (back to what is applied)."""
        with self.lock:
            self._staged = None
        self._notify()

    def apply(self, conf: AllocConf | None = None, *, save: persist.Scope | None = "project",
              candidate: AppliedCandidate | None = None) -> ApplyOutcome:
        """Apply ``conf`` (default: the staged configuration) now, save it, read it back.

        The one apply of every front end. ``save`` is where it is saved for restarts
        (``None``: not saved); a settings file that cannot be written does not undo the
        apply: the outcome says "applied, not saved". ``candidate`` is the replayed row
        it came from, for the outcome's sentence.
        """
        from allocconf_widget.adapters.effective_settings import read_back

        state = self.state()
        with self.lock:
            target = self.staged(state) if conf is None else conf
            result = self._apply_locked(target, state, save=save == "project")
            global_save = save_settings(target, "global") if save == "global" else None
            readback = read_back(target, applied_by_setter=result.setter_called is not None)
            outcome = ApplyOutcome(result, self.last_save, readback, global_save, candidate)
            self.last_outcome = outcome
        self._notify()
        return outcome

    def forget(self, scope: persist.Scope = "project") -> ForgetOutcome:
        """Delete the saved settings of ``scope``; views stop saying they are saved.

        Raises:
            OSError: the file exists but cannot be removed.
        """
        path = persist.settings_path(scope)
        removed = persist.forget(scope)
        with self.lock:
            if self.last_outcome is not None:
                self.last_outcome = self.last_outcome.forgotten(scope)
            if self.last_save is not None and self.last_save.scope == scope:
                self.last_save = dataclasses.replace(self.last_save, forgotten=True)
        self._notify()
        return ForgetOutcome(scope, str(path), removed)

    def _apply_locked(self, conf: AllocConf, state: RuntimeState, *, save: bool) -> ApplyResult:
        result = apply(conf, state=state)
        self._remember(conf, result)
        self._staged = None
        self.last_save = save_settings(conf) if save else None
        return result

    def _remember(self, conf: AllocConf, result: ApplyResult) -> None:
        self.last_apply = result
        self._applied = conf
        self._applied_env = self.current()

    def settings_for_restart(self) -> AllocConf:
        """What a restart must carry over: the last complete applied configuration, never staged edits."""
        return self.applied()

    # -- listeners --------------------------------------------------------------
    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener()`` after every change; returns an unsubscribe function."""
        with self.lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self.lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def _notify(self) -> None:
        with self.lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener()


_SESSIONS: dict[int, Session] = {}
_SESSIONS_LOCK = threading.Lock()


def get_session(shell: object = None) -> Session:
    """The session of ``shell`` (one per shell object; a default one without a shell)."""
    key = id(shell)
    with _SESSIONS_LOCK:
        if key not in _SESSIONS:
            _SESSIONS[key] = Session()
        return _SESSIONS[key]


def drop_session(shell: object = None) -> None:
    """Forget the session of ``shell`` (on ``%unload_ext``)."""
    with _SESSIONS_LOCK:
        _SESSIONS.pop(id(shell), None)
