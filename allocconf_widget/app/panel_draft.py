"""The panel's state and logic, without any widget: testable headless, safe across threads.

Each control edits a *draft* (option name → text, or None for "default
(unset)"). Every edit re-validates the whole draft with the configuration
model; a valid draft is staged in the session (never written to the
environment: only Apply does that), an invalid one keeps the previous staged
configuration and exposes the error, tied to the option it is about (the panel
shows it on that row; a character position in a string the user never typed
would mean nothing). So a bad slider value can never reach ``os.environ`` or torch.

Ticking a row stages a value that is valid with the rest of the draft: torch's
default where it is a number (``large_segment_size_mb`` ticks at 20, so an
existing ``max_split_size_mb:128`` stays valid), the non-default for a switch,
otherwise the first round value the draft accepts. A size larger than the
device's memory (from NVML, never from CUDA) is allowed but warned about.
"""

from __future__ import annotations

import html
import threading
from dataclasses import dataclass

from allocconf_widget._errors import AllocConfError
from allocconf_widget.adapters.runtime_state import RuntimeState
from allocconf_widget.app.session import ApplyOutcome, ConfigView, Session
from allocconf_widget.core.config import options as opt
from allocconf_widget.core.config.conf import conf_from_values, format_value
from allocconf_widget.core.config.envvars import snippets, variable_to_write
from allocconf_widget.core.config.plan import Action, OptionPlan
from allocconf_widget.core.units import MIB, format_bytes

#: Values tried, in order, when ticking a size whose default is not a number ("unlimited").
_TICK_SIZES_MB = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
#: What a ticked row starts at when torch's default cannot be written as a value.
_TICK_FALLBACK = {
    opt.Kind.FRACTION: "0.8",
    opt.Kind.ROUNDUP: "4",
    opt.Kind.COUNT: "1",
    opt.Kind.BACKEND: "native",
    opt.Kind.RESERVE: "0.5",
}


@dataclass(frozen=True)
class DraftStatus:
    """What the panel shows below the controls."""

    text: str
    variable: str
    error: str | None
    warnings: tuple[str, ...]
    plans: tuple[OptionPlan, ...]
    has_changes: bool = False
    error_option: str | None = None  # the row the error is about, when it is about one

    @property
    def restart_needed(self) -> bool:
        return any(p.action is Action.NEEDS_RESTART for p in self.plans)

    @property
    def can_apply(self) -> bool:
        """Valid and different from what is applied (Apply on "No changes" would do nothing)."""
        return self.error is None and self.has_changes


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
        self.device_total = device_total_bytes(self.view.state)
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
        if error is not None:  # an invalid draft is never what is applied: it is a change
            option = error.option if error.option in self.draft else None
            return DraftStatus(text, variable, error_text(error), (), (), has_changes=True,
                               error_option=option)
        view = self.session.view()
        conf = view.staged  # the draft, as set_option staged it (parsed there, once)
        warnings = tuple(str(w) for w in conf.warnings) + self.size_warnings()
        return DraftStatus(conf.to_string(), variable, None, warnings, view.plans, view.has_changes)

    def size_warnings(self) -> tuple[str, ...]:
        """Device-memory sizes larger than the GPU (none without a GPU: nothing to compare with)."""
        if not self.device_total:
            return ()
        out = []
        with self.lock:
            items = [(k, v) for k, v in self.draft.items() if v is not None]
        for name, value in items:
            spec = opt.spec_for(name)
            if spec is None or spec.kind is not opt.Kind.SIZE_MB or name.startswith("pinned_"):
                continue
            try:
                size = int(value) * MIB
            except ValueError:
                continue
            if size > self.device_total:
                out.append(f"{name}:{value} is {format_bytes(size)}, more than this GPU's "
                           f"{format_bytes(self.device_total)}: check the unit (MiB)")
        return tuple(out)

    # -- editing ----------------------------------------------------------------
    def set_option(self, name: str, value: str | None) -> str | None:
        """Set (text) or unset (None) one option; returns the error message, or None if valid.

        Ticking an unset option (``None`` before, a value now) stages :meth:`tick_value`
        instead of whatever the row happened to show.
        """
        with self.lock:
            if value is not None and self.draft.get(name) is None:
                value = self.tick_value(name, value)
            self.draft[name] = value
            try:
                conf = conf_from_values({k: v for k, v in self.draft.items() if v is not None},
                                        self.version)
            except AllocConfError as exc:
                self._error = exc
                return error_text(exc)
            self._error = None
        self.session.stage(conf, eager=False)
        return None

    def tick_value(self, name: str, shown: str) -> str:
        """The value a newly ticked option starts at: valid with the rest of the draft."""
        spec = opt.spec_for(name)
        if spec is None:
            return shown
        tries: list[str] = []
        default = default_number(spec)
        if spec.kind is opt.Kind.BOOL:
            tries.append("False" if spec.default == "True" else "True")
        elif default is not None:
            tries.append(default)
        if spec.kind is opt.Kind.SIZE_MB:
            tries += [str(n) for n in _TICK_SIZES_MB]
        elif default is None and spec.kind in _TICK_FALLBACK:
            tries.append(_TICK_FALLBACK[spec.kind])
        tries.append(shown)
        others = {k: v for k, v in self.draft.items() if v is not None and k != name}
        for candidate in tries:
            try:
                conf_from_values({**others, name: candidate}, self.version)
            except AllocConfError:
                continue
            return candidate
        return tries[0]

    def apply(self) -> ApplyOutcome:
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
        # the line a draft would write; "(after Apply)" whenever it is not what is applied, an
        # invalid draft included: the variable holds the applied settings, not this line
        shown = f"<code>{html.escape(status.variable)}={html.escape(status.text)!s}</code>"
        parts = [f"{shown} (after Apply)" if status.has_changes else shown]
        if status.error:
            where = f"<b>{html.escape(status.error_option)}</b>: " if status.error_option else ""
            parts.append(f"<span style='color:#b00020'>✖ {where}{html.escape(status.error)}</span>")
        parts += [f"<span style='color:#8a6d00'>⚠ {html.escape(w)}</span>" for w in status.warnings]
        for plan in status.plans:
            parts.append(f"• {html.escape(str(plan))}")
        if not status.error and not status.has_changes:
            parts.append("No changes to apply.")
        return "<br>".join(parts)


def error_text(exc: AllocConfError) -> str:
    """The message without a character position: the panel points at the row instead."""
    return f"{exc.reason}. Fix: {exc.fix}" if exc.fix else exc.reason


def default_number(spec: opt.OptionSpec) -> str | None:
    """Torch's default as a value the option accepts ("20", "1.0"), or None ("unlimited", "off")."""
    head = spec.default.split(" ", 1)[0]
    if spec.kind in (opt.Kind.SIZE_MB, opt.Kind.COUNT) and head.isdigit():
        return head
    if spec.kind is opt.Kind.FRACTION:
        try:
            float(head)
        except ValueError:
            return None
        return head
    if spec.kind in (opt.Kind.BOOL, opt.Kind.BACKEND):
        return spec.default
    return None


def device_total_bytes(state: RuntimeState) -> int | None:
    """The largest GPU's memory as NVML reports it (None on a machine without one)."""
    gpus = state.gpus
    return max((g.total_bytes for g in gpus), default=None) if gpus else None
