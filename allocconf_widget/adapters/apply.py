"""Carry out a configuration change at the right moment, then check that it took.

:func:`apply` writes the variable torch will actually read (the right name
for the installed release, the one that already wins if several are set),
calls torch's runtime setter with the *complete* string once torch is
imported, and reports per option what happened. Invalid input changes
nothing: the configuration is validated for the installed torch before the
environment or torch is touched.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from dataclasses import dataclass, field

from allocconf_widget._errors import AllocConfError
from allocconf_widget.adapters import torch_private
from allocconf_widget.adapters.runtime_state import Phase, RuntimeState, detect_state
from allocconf_widget.core.config.conf import AllocConf, parse_conf
from allocconf_widget.core.config.envvars import read_order, variable_to_write
from allocconf_widget.core.config.plan import (
    Action,
    OptionPlan,
    RuntimeFacts,
    plan_apply,
    setter_string,
)


@dataclass(frozen=True)
class ApplyResult:
    """What :func:`apply` did."""

    requested: AllocConf
    previous: AllocConf
    variable: str
    plan: tuple[OptionPlan, ...]
    setter_called: str | None = None
    fraction_devices: tuple[int, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def restart_needed(self) -> bool:
        return any(p.action is Action.NEEDS_RESTART for p in self.plan)

    def summary(self) -> str:
        """Human summary, one line per changed option."""
        if not self.plan:
            return f"nothing to change: {self.variable}={self.requested.to_string()!r} already"
        lines = [str(p) for p in self.plan]
        lines.append(f"{self.variable}={self.requested.to_string()!r}")
        lines.extend(self.notes)
        return "\n".join(lines)


def facts_from(state: RuntimeState) -> RuntimeFacts:
    """The plan's view of a runtime state."""
    return RuntimeFacts(
        version=state.version,
        torch_imported=state.phase is not Phase.NOT_IMPORTED,
        cuda_built=state.phase is not Phase.NO_CUDA,
        live=state.phase is Phase.LIVE,
        can_set_live=state.can_set_live,
        load_time_backend=state.backend,
    )


#: the environment's text, its release and the configuration read from it: every view of one
#: action reads the environment again, and it is parsed once while it stays the same
_LAST_READ: tuple[str, tuple[int, int], str, AllocConf] | None = None


def current_conf(state: RuntimeState) -> AllocConf:
    """The configuration torch has read (or will read) from the environment, if valid.

    An invalid value already in the environment counts as empty here; the
    environment report carries the error for the user.
    """
    global _LAST_READ  # noqa: PLW0603  (one entry: the environment as last read)
    text = state.env.effective_text or ""
    last = _LAST_READ
    if last is not None and last[:3] == (text, state.version.key, state.version.build):
        return last[3]
    try:
        conf = parse_conf(text, state.version, warn=False)
    except AllocConfError:
        conf = parse_conf("", state.version, warn=False)
    _LAST_READ = (text, state.version.key, state.version.build, conf)
    return conf


def preview(requested: AllocConf, state: RuntimeState | None = None) -> tuple[OptionPlan, ...]:
    """What :func:`apply` would do, without doing it."""
    state = state or detect_state()
    conf = _validated(requested, state)
    return plan_apply(current_conf(state), conf, facts_from(state))


def apply(requested: AllocConf, *, environ: MutableMapping[str, str] | None = None,
          state: RuntimeState | None = None) -> ApplyResult:
    """Make ``requested`` the allocator configuration of this process, as far as possible now.

    Raises:
        AllocConfError: ``requested`` is not valid for the installed torch (nothing changed).
    """
    environ = os.environ if environ is None else environ
    state = state or detect_state(dict(environ))
    conf = _validated(requested, state)
    _refuse_unkeepable_split(state)
    previous = current_conf(state)
    facts = facts_from(state)
    plan = plan_apply(previous, conf, facts)
    variable = variable_to_write(state.version, environ)
    setter_text = None
    devices: tuple[int, ...] = ()
    torch = torch_private.imported_torch()
    if torch is not None and facts.cuda_built and facts.can_set_live and plan:
        setter_text = setter_string(previous, conf, facts)
        torch_private.set_allocator_settings(torch, setter_text)  # may raise: env untouched yet
        fraction = conf.get("per_process_memory_fraction")
        if facts.live and any(p.option == "per_process_memory_fraction" for p in plan):
            devices = tuple(torch_private.set_memory_fraction(torch, fraction or 1.0))
    env_conf = conf
    if any(p.option == "backend" and p.action is Action.NEEDS_RESTART for p in plan):
        # this process already chose its backend; a different one in its environment would
        # make torch assert at the next parse. The restart picks it up from the saved settings.
        env_conf = conf.without("backend")
    _write_env(environ, variable, env_conf.to_string(), state)
    notes = _notes(state, plan)
    return ApplyResult(conf, previous, variable, plan, setter_text, devices, notes)


def _refuse_unkeepable_split(state: RuntimeState) -> None:
    """Refuse to write when the settings torch runs cannot be carried into one variable.

    With the generic keys read from one variable and the CUDA keys from another, a write
    goes into the variable that wins both (:func:`variable_to_write`), carrying what torch
    ran (:attr:`EnvReport.effective_text`). When one half is invalid, or the two halves
    clash, that cannot be done faithfully: writing anyway would silently drop the other
    half's options, so nothing is changed and the message says what to fix.
    """
    env = state.env
    if not env.split:
        return
    try:
        parse_conf(env.effective_text or "", state.version, warn=False)
    except AllocConfError as exc:
        raise AllocConfError(
            f"not applied: torch {state.version} takes the generic keys from {env.generic_from} "
            f"and the CUDA keys from {env.device_from}, and together they are not valid ({exc}); "
            "writing one variable now would silently drop options torch was running",
            fix=f"fix or unset {env.generic_from} or {env.device_from} (%env or os.environ), "
            "then set again") from None


def _validated(requested: AllocConf, state: RuntimeState) -> AllocConf:
    """``requested`` checked against the installed torch: an ``AllocConf`` parsed for that
    release already is (it is immutable); another release's is checked option by option."""
    if requested.torch_version.key == state.version.key:
        return requested
    return requested.for_release(state.version)


def _write_env(environ: MutableMapping[str, str], variable: str, text: str,
               state: RuntimeState) -> None:
    if text:
        environ[variable] = text
        return
    # the defaults: remove every variable torch reads (an empty one would still count as set
    # and shadow the others; leaving a lower-priority one would let it take over)
    for name in read_order(state.version).read:
        environ.pop(name, None)


def _notes(state: RuntimeState, plan: tuple[OptionPlan, ...]) -> tuple[str, ...]:
    notes = [str(p) for p in state.env.problems if p.misread]
    if any(p.action is Action.NEEDS_RESTART for p in plan):
        notes.append("Restart the kernel to finish: the saved settings are re-applied by "
                     "%load_ext allocconf_widget in the new kernel.")
    return tuple(notes)
