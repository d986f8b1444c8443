"""Re-apply saved settings when a new kernel loads the extension: the one apply, at load.

``%load_ext allocconf_widget`` re-applies this project's saved settings (else the global
default, which never overrides a variable exported before the kernel started) through
``Session.apply``, so the new kernel's panel, ``show`` and every prediction see them, and
returns a :class:`RestoreOutcome` its one line is worded from.
"""

from __future__ import annotations

import enum
import os
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from allocconf_widget._errors import AllocConfError, AllocConfWarning, printable

if TYPE_CHECKING:
    from allocconf_widget.adapters.runtime_state import Phase
    from allocconf_widget.app.session import ApplyOutcome, Session
    from allocconf_widget.core.config.conf import AllocConf


class Restored(enum.Enum):
    """What the load did with saved settings."""

    NOTHING_SAVED = "nothing saved"
    KEPT_EXPORTED = "kept the exported variable"  # a global default beside a valid exported one
    APPLIED = "applied"
    FAILED = "failed"  # saved settings this kernel cannot apply


@dataclass(frozen=True)
class RestoreOutcome:
    """What ``%load_ext`` did with saved settings, and the facts its one line gives."""

    kind: Restored
    phase: Phase
    exported: dict[str, str] = field(default_factory=dict)  # variables set before the load
    problems: tuple[str, ...] = ()  # why a settings file could not be read
    env_problem: str | None = None  # an exported variable torch would refuse or misread
    source: str | None = None  # which saved file (project or global), as a person reads it
    conf: AllocConf | None = None
    applied: ApplyOutcome | None = None
    replaced: dict[str, str] = field(default_factory=dict)  # exported variables the apply changed
    error: str | None = None
    looked_in: str = ""


def restore_saved(session: Session) -> RestoreOutcome:
    """Apply this project's saved settings (else the global default) through the session.

    Raises only what a broken environment raises while it is being read; a file that cannot
    be read is a :attr:`RestoreOutcome.problems` entry, an apply torch refuses a
    :attr:`Restored.FAILED` outcome.
    """
    from allocconf_widget.adapters import persist
    from allocconf_widget.adapters.runtime_state import detect_state

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AllocConfWarning)
        saved = persist.load()
    problems = tuple(printable(str(w.message), 400) for w in caught)
    state = detect_state()
    before = dict(state.env.set_vars)
    if saved is None:
        invalid = [p for p in state.env.problems if p.code == "invalid"]
        unread = [p for p in state.env.problems if p.misread]
        problem = (f"it is not valid: {printable(invalid[0].message, 300)}" if invalid
                   else printable(unread[0].message, 300) if unread else None)
        return RestoreOutcome(Restored.NOTHING_SAVED, state.phase, before, problems, problem,
                              looked_in=looked_in())
    if saved.scope == "global" and before and not state.env.problems:
        return RestoreOutcome(Restored.KEPT_EXPORTED, state.phase, before, problems,
                              source=str(saved.path), conf=saved.conf)
    try:
        outcome = session.apply(saved.conf, save=None)
    except (AllocConfError, RuntimeError) as exc:
        return RestoreOutcome(Restored.FAILED, state.phase, before, problems,
                              source=saved.describe_source(), conf=saved.conf, error=str(exc))
    replaced = {name: value for name, value in before.items() if os.environ.get(name) != value}
    return RestoreOutcome(Restored.APPLIED, state.phase, before, problems, source=saved.describe_source(),
                          conf=saved.conf, applied=outcome, replaced=replaced)


def looked_in() -> str:
    """Where saved settings were looked for, for the line that says none were found."""
    from allocconf_widget.adapters import persist

    try:
        return (f"project {persist.project_dir()}: looked in {persist.project_settings_path()} "
                f"and the global {persist.global_settings_path()}")
    except persist.NoProjectDirError:
        return "the working directory no longer exists, so no project is known"
    except persist.NoConfigDirError:
        return f"project {persist.project_dir()}: no settings folder is known"
