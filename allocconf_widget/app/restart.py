"""Save, then restart: the one way every front end restarts the kernel.

The settings a restart carries over are the last applied complete configuration
(``Session.settings_for_restart``), never staged edits. They are saved first; where they cannot
be saved, nothing restarts, because the new kernel would lose them. ``%load_ext
allocconf_widget`` in the new kernel re-applies them (:mod:`.restore`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from allocconf_widget._errors import AllocConfError

if TYPE_CHECKING:
    from allocconf_widget.adapters.frontend import RestartOutcome
    from allocconf_widget.app.session import SaveOutcome, Session
    from allocconf_widget.core.config.conf import AllocConf


@dataclass(frozen=True)
class RestartRequest:
    """What a restart carried over and what the front end did."""

    conf: AllocConf  # the settings saved for the new kernel
    saved: SaveOutcome
    dropped_edits: bool  # staged edits that were never applied (not carried over)
    restart: RestartOutcome


def save_and_restart(session: Session, *, notify: Callable[[str], None] | None = None,
                     before: Callable[[AllocConf, SaveOutcome, bool], None] | None = None,
                     ) -> RestartRequest:
    """Save the settings a restart carries over, then ask the front end to restart.

    ``before(conf, saved, dropped_edits)`` is called once they are saved and before the
    restart is asked for (the kernel may be gone soon after); ``notify`` gets the front end's
    line before its wait.

    Raises:
        AllocConfError: the settings could not be saved; nothing was restarted.
    """
    from allocconf_widget.adapters.frontend import restart
    from allocconf_widget.app.session import save_settings

    conf = session.settings_for_restart()
    saved = save_settings(conf)
    if not saved.saved:
        raise AllocConfError(f"not restarting: the settings could not be saved, so the new kernel "
                             f"would lose them ({saved.error})",
                             fix="set XDG_CONFIG_HOME to a writable folder, then restart again")
    dropped = session.view().has_changes
    if before is not None:
        before(conf, saved, dropped)
    return RestartRequest(conf, saved, dropped, restart(notify=notify))
