"""The OOM assistant's use case: one report of one out-of-memory error, and one recommendation.

A cell dies of ``torch.OutOfMemoryError``; :func:`build_report` parses torch's message
(:mod:`allocconf_widget.core.memory.oom`), breaks the GPU's memory down, and advises from
rules of thumb, judged against the settings this kernel runs — read from the Session's view
(:func:`settings_in_force`), never from a private look at the environment. When the flight
recorder also has the window before the OOM, its replay verdict
(:mod:`allocconf_widget.app.flight`) decides: ``flight.recommendation_of`` names **one**
setting, the replay's when it has one, and the rules of thumb then say they yield to it.

:class:`OomObserver` wires torch's OOM observer (attached only once CUDA is up: attaching
initialises CUDA), which tells the device, the size that could not be had and the free
memory at the moment of failure, and reads ``memory_stats()`` before Python frees anything.
The views (the OOM card, terminal text) render these results and hold no logic of their own.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from allocconf_widget.adapters import torch_private
from allocconf_widget.core.memory.oom import (
    Advice,
    MemoryBreakdown,
    OomInfo,
    advise,
    breakdown_from_oom,
    breakdown_from_stats,
    parse_oom_message,
)
from allocconf_widget.core.units import format_bytes
from allocconf_widget.core.versions import TorchVersion

if TYPE_CHECKING:
    from allocconf_widget.adapters.flight_history import OomCapture
    from allocconf_widget.app.session import Session


@dataclass(frozen=True)
class ObservedOom:
    """What torch's OOM observer reported (bytes), and ``memory_stats()`` read right then."""

    device: int
    alloc: int
    device_total_or_allowed: int
    device_free: int
    stats: dict[str, object] | None = None
    at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class SettingsInForce:
    """The allocator settings an OOM happened under, as the advice rules read them."""

    values: dict[str, object]  # option → value, torch's read-back where it has one
    torch_version: TorchVersion
    text: str  # one line for the card ("max_split_size_mb:128 (read back from …)")


def settings_in_force(session: Session) -> SettingsInForce:
    """What this kernel runs: the Session's effective settings; once CUDA is up, torch's own
    parsed values override them (the runtime setter may have changed them since), and
    ``backend`` is the one fixed at import."""
    view = session.view()
    values: dict[str, object] = dict(view.effective.as_dict())
    torch = torch_private.imported_torch()
    live = torch_private.effective_settings(torch) if torch is not None else None
    if live:
        values.pop("max_split_size_mb", None)
        values.update({k: live[k] for k in ("expandable_segments", "max_split_size") if k in live})
    if view.state.backend:
        values["backend"] = view.state.backend
    text = view.effective.to_string() or "torch's defaults"
    if live is not None:
        text += " (read back from the running allocator)"
    return SettingsInForce(values, view.state.version, text)


def recorded_settings(allocator_settings: dict[str, object], torch_version: TorchVersion) -> SettingsInForce:
    """The settings of a recording that is not this kernel's (the bundled OOM demo)."""
    text = str(allocator_settings.get("PYTORCH_CUDA_ALLOC_CONF") or "torch's defaults")
    return SettingsInForce(dict(allocator_settings), torch_version, f"{text} (as recorded)")


@dataclass(frozen=True)
class OomReport:
    """Everything the assistant shows for one out-of-memory error."""

    message: str
    info: OomInfo | None
    breakdown: MemoryBreakdown | None
    advice: tuple[Advice, ...]
    settings_text: str
    observed: ObservedOom | None = None

    @property
    def headline(self) -> str:
        if self.info is None:
            return "CUDA out of memory (torch's message could not be parsed)"
        device = f" on GPU {self.info.device}" if self.info.device is not None else ""
        return (f"CUDA out of memory{device}: tried to allocate "
                f"{format_bytes(self.info.tried_to_allocate)}")


def build_report(message: str, settings: SettingsInForce, *,
                 observed: ObservedOom | None = None) -> OomReport:
    """Parse torch's message, break the memory down and advise against ``settings``."""
    info = parse_oom_message(message)
    breakdown: MemoryBreakdown | None = None
    advice: tuple[Advice, ...] = ()
    if info is not None:
        breakdown = breakdown_from_oom(info)
        advice = tuple(advise(info, settings.values, settings.torch_version))
    elif observed is not None and observed.stats is not None:
        breakdown = breakdown_from_stats(observed.stats, observed.device_total_or_allowed,
                                         observed.device_free)
    return OomReport(message, info, breakdown, advice, settings.text, observed)


def report_for_capture(capture: OomCapture, settings: SettingsInForce) -> OomReport:
    """The report of a flight-recorder capture (what its observer saw, its message)."""
    observed = None
    if capture.requested is not None and capture.limit is not None:
        observed = ObservedOom(capture.device, capture.requested, capture.limit,
                               capture.device_free or 0, capture.stats)
    return build_report(capture.message or "", settings, observed=observed)


@dataclass(frozen=True)
class OomRecommendation:
    """The card's one recommendation, and how the rules of thumb relate to it."""

    conf: str | None  # the setting to apply (None: no setting is recommended)
    by_replay: bool  # the flight recorder's replay chose it (else a rule of thumb)
    #: the rules of thumb, each with whether it agrees with the recommendation
    rules: tuple[tuple[Advice, bool], ...]

    @property
    def yields_note(self) -> str | None:
        """What the card says under rules of thumb that disagree with the replay."""
        if not self.by_replay or all(agrees for _, agrees in self.rules):
            return None
        return ("read from torch's message alone; the replay of what the program "
                "really allocated (the verdict) decides, and recommends "
                f"{self.conf or 'no setting change'}")


def is_cuda_oom(error: BaseException) -> bool:
    """``torch.OutOfMemoryError``, or (torch < 1.13) a RuntimeError saying "CUDA out of memory"."""
    torch = torch_private.imported_torch()
    oom_type = torch_private.out_of_memory_error(torch) if torch is not None else None
    if oom_type is not None and isinstance(error, oom_type):
        return True
    return isinstance(error, RuntimeError) and "CUDA out of memory" in str(error)


class OomObserver:
    """torch's OOM observer, attached once CUDA is up, keeping what it saw for the next report."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._observed: ObservedOom | None = None
        self._on = False

    def attach(self) -> bool:
        """Listen to torch's OOM observer, only if the program already initialised CUDA."""
        torch = torch_private.imported_torch()
        if self._on or torch is None or not torch_private.cuda_initialized(torch):
            return self._on
        self._on = torch_private.add_oom_listener(torch, self.observe)
        return self._on

    def detach(self) -> None:
        """Stop listening (torch's trampoline stays, silent: torch cannot detach it)."""
        if self._on:
            torch_private.remove_oom_listener(self.observe)
            self._on = False

    def observe(self, device: int, alloc: int, device_total: int, device_free: int) -> None:
        """torch's observer callback (GIL held, allocator lock released): record, read stats."""
        torch = torch_private.imported_torch()
        stats = torch_private.memory_stats(torch, device) if torch is not None else None
        with self._lock:
            self._observed = ObservedOom(device, alloc, device_total, device_free, stats)

    def clear(self) -> None:
        with self._lock:
            self._observed = None

    def take(self) -> ObservedOom | None:
        """What the observer saw since :meth:`clear` (and forget it)."""
        with self._lock:
            observed, self._observed = self._observed, None
            return observed
