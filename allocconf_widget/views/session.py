"""Per-shell state shared by the ``%allocconf`` magic and the panel.

One :class:`Session` per IPython shell holds the *staged* configuration (what
the user is composing, not yet applied) behind a re-entrant lock: with
ipykernel 7 widget callbacks run on a subshell thread while a cell is busy,
so the panel and the magic may touch it concurrently. Listeners (the panel)
are told whenever the staged or applied configuration changes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from allocconf_widget.adapters import persist
from allocconf_widget.adapters.apply import ApplyResult, apply, current_conf, preview
from allocconf_widget.adapters.runtime_state import Phase, RuntimeState, detect_state
from allocconf_widget.core.conf import AllocConf, parse_conf
from allocconf_widget.core.plan import OptionPlan

Listener = Callable[[], None]


class Session:
    """Staged configuration, last results and change listeners for one shell."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._staged: AllocConf | None = None
        self.last_apply: ApplyResult | None = None
        self._listeners: list[Listener] = []
        self.extras: dict[str, Any] = {}

    # -- observation -----------------------------------------------------------
    def state(self) -> RuntimeState:
        """The runtime state right now (cheap, side-effect free)."""
        return detect_state()

    def current(self, state: RuntimeState | None = None) -> AllocConf:
        """What torch reads (or will read) from the environment now."""
        return current_conf(state or self.state())

    def staged(self, state: RuntimeState | None = None) -> AllocConf:
        """The configuration being composed (the current one until something is staged)."""
        with self.lock:
            return self._staged if self._staged is not None else self.current(state)

    @property
    def has_staged_changes(self) -> bool:
        with self.lock:
            return self._staged is not None and self._staged != self.current()

    def preview(self) -> tuple[OptionPlan, ...]:
        """What applying the staged configuration would do."""
        return preview(self.staged())

    # -- changes -----------------------------------------------------------------
    def stage(self, conf: AllocConf | str, *, eager: bool = True) -> AllocConf:
        """Validate and stage ``conf`` (replacing what was staged). Bad input raises, stages nothing.

        With ``eager`` (the magic's ``set``), before torch is imported the
        environment *is* the configuration, so staging there also writes it:
        ``%allocconf set …`` then ``import torch`` just works. The panel stages
        with ``eager=False`` and writes only on its explicit Apply.
        """
        state = self.state()
        text = conf.to_string() if isinstance(conf, AllocConf) else conf
        validated = parse_conf(text, state.version, warn=False)
        with self.lock:
            self._staged = validated
            if eager and state.phase is Phase.NOT_IMPORTED:
                self.last_apply = apply(validated, state=state)
                self._staged = None
        self._notify()
        return validated

    def update(self, options: dict[str, str | None]) -> AllocConf:
        """Stage the current staged configuration with some options set (text) or unset (None)."""
        with self.lock:
            base = self.staged()
        unset = [name for name, value in options.items() if value is None]
        merged = base.without(*unset) if unset else base
        values = {name: value for name, value in options.items() if value is not None}
        return self.stage(merged.merge(values) if values else merged)

    def discard(self) -> None:
        """Forget staged changes (back to what is in effect)."""
        with self.lock:
            self._staged = None
        self._notify()

    def apply(self, save: bool = True) -> ApplyResult:
        """Apply the staged configuration now, and save it for restarts."""
        with self.lock:
            conf = self.staged()
            result = apply(conf)
            self.last_apply = result
            self._staged = None
            if save:
                persist.save(result.requested)
        self._notify()
        return result

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


def get_session(shell: Any = None) -> Session:
    """The session of ``shell`` (one per shell object; a default one without a shell)."""
    key = id(shell)
    with _SESSIONS_LOCK:
        if key not in _SESSIONS:
            _SESSIONS[key] = Session()
        return _SESSIONS[key]


def drop_session(shell: Any = None) -> None:
    """Forget the session of ``shell`` (on ``%unload_ext``)."""
    with _SESSIONS_LOCK:
        _SESSIONS.pop(id(shell), None)
