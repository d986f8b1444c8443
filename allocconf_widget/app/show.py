"""``%allocconf show``: the runtime state, the requested, staged, effective and saved settings."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from allocconf_widget._errors import AllocConfWarning

if TYPE_CHECKING:
    from allocconf_widget.adapters.persist import SavedSettings
    from allocconf_widget.adapters.runtime_state import RuntimeState
    from allocconf_widget.app.session import Session
    from allocconf_widget.core.config.conf import AllocConf
    from allocconf_widget.core.config.readback import ReadBack


@dataclass(frozen=True)
class SettingsReport:
    """Everything ``show`` says, read at one moment."""

    state: RuntimeState
    requested: AllocConf  # what torch reads (or will read) from the environment
    staged: AllocConf | None  # what is being composed, where it differs from what is applied
    readback: ReadBack | None  # torch's own settings against the request, once readable
    saved: SavedSettings | None  # what a new kernel re-applies
    saved_problems: tuple[str, ...] = ()  # why a settings file could not be read


def settings_report(session: Session) -> SettingsReport:
    """Read the state, the environment, torch's own settings (only once CUDA runs: reading
    earlier would freeze them) and the saved settings."""
    from allocconf_widget.adapters import persist
    from allocconf_widget.adapters.effective_settings import read_back

    state = session.state()
    requested = session.current(state)
    staged = session.staged() if session.has_staged_changes else None
    readback = read_back(requested, state=state)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AllocConfWarning)
        saved = persist.load(state.version)
    problems: list[str] = []
    for item in caught:
        if not issubclass(item.category, AllocConfWarning):  # not ours: as it would have gone
            warnings.warn_explicit(item.message, item.category, item.filename, item.lineno)
        elif str(item.message) not in problems:
            problems.append(str(item.message))
    return SettingsReport(state, requested, staged, readback, saved, tuple(problems))
