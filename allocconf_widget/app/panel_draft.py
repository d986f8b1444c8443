"""The panel's state and logic, without any widget: testable headless, safe across threads.

Each control edits a *draft* (option name → text, or None for "default
(unset)"). Every edit re-validates the whole draft with the configuration
model; a valid draft is staged in the session (never written to the
environment: only Apply does that), an invalid one keeps the previous staged
configuration and exposes the error. So a bad slider value can never reach
``os.environ`` or torch.
"""

from __future__ import annotations

import html
import threading
from dataclasses import dataclass

from allocconf_widget._errors import AllocConfError
from allocconf_widget.adapters.apply import ApplyResult
from allocconf_widget.adapters.runtime_state import RuntimeState
from allocconf_widget.app.session import ConfigView, Session
from allocconf_widget.core.config import options as opt
from allocconf_widget.core.config.conf import conf_from_values, format_value, parse_conf
from allocconf_widget.core.config.envvars import snippets, variable_to_write
from allocconf_widget.core.config.plan import Action, OptionPlan


@dataclass(frozen=True)
class DraftStatus:
    """What the panel shows below the controls."""

    text: str
    variable: str
    error: str | None
    warnings: tuple[str, ...]
    plans: tuple[OptionPlan, ...]
    has_changes: bool = False

    @property
    def restart_needed(self) -> bool:
        return any(p.action is Action.NEEDS_RESTART for p in self.plans)

    @property
    def can_apply(self) -> bool:
        return self.error is None


class PanelModel:
    """Draft values for every option of the installed torch, validated on each edit."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.lock = threading.RLock()
        self.view: ConfigView = session.view()
        self.version = self.view.state.version
        self.specs: tuple[opt.OptionSpec, ...] = tuple(opt.options_for(self.version))
        self.draft: dict[str, str | None] = {}
        self._error: AllocConfError | None = None
        self.reload()

    # -- reading ----------------------------------------------------------------
    @property
    def state(self) -> RuntimeState:
        """The runtime state as of the last :meth:`reload`."""
        return self.view.state

    def reload(self) -> None:
        """Reset the draft to the session's staged configuration, read fresh from the session."""
        with self.lock:
            self.view = self.session.view()
            staged = self.view.staged
            self.draft = {s.name: None for s in self.specs}
            self.draft.update({k: format_value(v) for k, v in staged.items()})
            self._error = None

    def draft_text(self) -> str:
        """The draft as a configuration string (possibly invalid)."""
        with self.lock:
            return ",".join(f"{k}:{v}" for k, v in self.draft.items() if v is not None)

    def status(self) -> DraftStatus:
        """Resulting string, variable, error or warnings, and what Apply would do per option."""
        with self.lock:
            text = self.draft_text()
            error = self._error
        variable = variable_to_write(self.version, self.state.env.set_vars)
        if error is not None:
            return DraftStatus(text, variable, str(error), (), ())
        conf = parse_conf(text, self.version, warn=False)
        view = self.session.view()
        return DraftStatus(conf.to_string(), variable, None,
                           tuple(str(w) for w in conf.warnings), view.plans, view.has_changes)

    # -- editing ----------------------------------------------------------------
    def set_option(self, name: str, value: str | None) -> str | None:
        """Set (text) or unset (None) one option; returns the error message, or None if valid."""
        with self.lock:
            self.draft[name] = value
            try:
                conf = conf_from_values({k: v for k, v in self.draft.items() if v is not None},
                                        self.version)
            except AllocConfError as exc:
                self._error = exc
                return str(exc)
            self._error = None
        self.session.stage(conf, eager=False)
        return None

    def apply(self) -> ApplyResult:
        """Apply the (valid) draft and save it; raises AllocConfError if the draft is invalid."""
        with self.lock:
            if self._error is not None:
                raise self._error
        return self.session.apply()

    def snippets(self) -> dict[str, str]:
        """Copyable lines for the draft, with the variable right for the installed torch."""
        status = self.status()
        return snippets(status.text if status.error is None else "", status.variable)

    # -- presentation helpers -----------------------------------------------------
    def banner_html(self) -> str:
        """Runtime state and environment problems as a small HTML block."""
        state = self.state
        lines = [f"<b>{html.escape(state.describe())}</b>"]
        lines += [f"⚠ {html.escape(p.message)}" for p in state.env.problems]
        return "<br>".join(lines)

    def status_html(self, status: DraftStatus) -> str:
        """The resulting string, validation message and per-option plan as HTML."""
        parts = [f"<code>{html.escape(status.variable)}={html.escape(status.text)!s}</code>"]
        if status.error:
            parts.append(f"<span style='color:#b00020'>✖ {html.escape(status.error)}</span>")
        parts += [f"<span style='color:#8a6d00'>⚠ {html.escape(w)}</span>" for w in status.warnings]
        for plan in status.plans:
            parts.append(f"• {html.escape(str(plan))}")
        if not status.error and not status.has_changes:
            parts.append("No changes to apply.")
        return "<br>".join(parts)
