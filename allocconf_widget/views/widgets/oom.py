"""The OOM assistant: after a cell dies of ``torch.OutOfMemoryError``, say where the memory was.

``install_oom_assistant(ipython)`` registers an IPython ``post_run_cell`` hook
that looks at ``result.error_in_exec``; for a CUDA OOM it parses torch's
message (:mod:`allocconf_widget.core.memory.oom`) and shows

* the breakdown of the GPU: allocated, reserved-but-unallocated, non-PyTorch
  (this process), other processes, free;
* the concrete settings change and its reason from :func:`~allocconf_widget.core.memory.oom.advise`,
  judged against the settings in effect (so expandable segments are never
  suggested when they are already on);
* a "Save snapshot" button writing ``allocconf-oom-<time>.pickle`` from
  ``torch.cuda.memory._snapshot()`` (once, on demand: with stack history on it
  can take seconds).

When CUDA is already initialised it also attaches torch's OOM observer
(attaching initialises CUDA, so never earlier), which reports the device, the
segment size that could not be had and the free memory at the moment of
failure, and lets us read ``memory_stats()`` before Python frees anything.
In terminal IPython the same report is printed as text.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from dataclasses import dataclass, field
from html import escape
from typing import Any

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

_PART_COLORS = {
    "allocated by PyTorch": "#ff7f0e",
    "reserved by PyTorch, unallocated": "#1f77b4",
    "this process, outside PyTorch": "#7f7f7f",
    "other processes": "#8c564b",
    "outside PyTorch (this process or others)": "#bcbcbc",
    "free": "#e8eef5",
}
_ATTR = "_allocconf_oom_assistant"


@dataclass(frozen=True)
class ObservedOom:
    """What torch's OOM observer reported (bytes), and ``memory_stats()`` read right then."""

    device: int
    alloc: int
    device_total_or_allowed: int
    device_free: int
    stats: dict[str, Any] | None = None
    at: float = field(default_factory=time.monotonic)


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


# ----------------------------------------------------------------- building the report


def effective_settings() -> tuple[dict[str, Any], tuple[int, int], str]:
    """The allocator settings in force, torch's ``(major, minor)``, and a one-line description.

    From the environment as torch reads it (``current_conf``); once CUDA is up,
    the parsed values torch reports back override it (the runtime setter may
    have changed them), and ``backend`` is the one fixed at import.
    """
    from allocconf_widget.adapters.apply import current_conf
    from allocconf_widget.adapters.runtime_state import detect_state

    state = detect_state()
    conf = current_conf(state)
    settings: dict[str, Any] = dict(conf.as_dict())
    torch = torch_private.imported_torch()
    live = torch_private.effective_settings(torch) if torch is not None else None
    if live:
        settings.pop("max_split_size_mb", None)
        settings.update({k: live[k] for k in ("expandable_segments", "max_split_size") if k in live})
    if state.backend:
        settings["backend"] = state.backend
    text = conf.to_string() or "torch's defaults"
    if live is not None:
        text += " (read back from the running allocator)"
    version = state.version
    return settings, (version.major, version.minor), text


def build_report(
    message: str,
    *,
    settings: dict[str, Any] | None = None,
    torch_version: tuple[int, int] | None = None,
    settings_text: str | None = None,
    observed: ObservedOom | None = None,
) -> OomReport:
    """Parse the message and advise; settings default to :func:`effective_settings`."""
    if settings is None or torch_version is None:
        found, version, text = effective_settings()
        settings = found if settings is None else settings
        torch_version = version if torch_version is None else torch_version
        settings_text = settings_text or text
    info = parse_oom_message(message)
    breakdown: MemoryBreakdown | None = None
    advice: tuple[Advice, ...] = ()
    if info is not None:
        breakdown = breakdown_from_oom(info)
        advice = tuple(advise(info, settings, torch_version))
    elif observed is not None and observed.stats is not None:
        breakdown = breakdown_from_stats(observed.stats, observed.device_total_or_allowed,
                                         observed.device_free)
    return OomReport(message, info, breakdown, advice, settings_text or "unknown", observed)


# ----------------------------------------------------------------- rendering


def _advice_action(item: Advice) -> str:
    if item.conf_change:
        key, _, value = item.conf_change.partition(":")
        return (f"set {item.conf_change} (%allocconf set {key}={value}, then %allocconf apply)")
    if item.unset:
        names = " ".join(item.unset)
        return f"remove {', '.join(item.unset)} (%allocconf unset {names}, then %allocconf apply)"
    return _NO_SETTING_LABELS.get(item.rule, "outside the allocator settings")


#: What the user does for advice that changes no allocator setting: never "no setting to
#: change" next to a replay verdict that found one, unless no setting helps.
_NO_SETTING_LABELS = {
    "fraction_limit": "raise the memory fraction",
    "no_allocator_fix": "no allocator setting helps",
    "expandable_already_on": "already on",
    "upgrade_for_expandable": "upgrade torch",
    "non_pytorch_memory": "memory outside PyTorch",
    "other_processes": "other processes",
    "memory_outside_pytorch": "memory outside PyTorch",
}


def report_text(report: OomReport) -> str:
    """The report as plain text (terminal IPython, logs, tests)."""
    lines = [report.headline]
    b = report.breakdown
    if b is not None:
        lines.append(f"GPU memory ({format_bytes(b.total)}"
                     + (f", {format_bytes(b.allowed)} allowed to PyTorch" if b.allowed else "") + "):")
        lines += [f"  {label:<42} {format_bytes(size):>12}" for label, size in b.parts()]
    if report.observed is not None:
        o = report.observed
        lines.append(f"torch's OOM observer: GPU {o.device} could not get {format_bytes(o.alloc)}; "
                     f"{format_bytes(o.device_free)} free; limit {format_bytes(o.device_total_or_allowed)}")
    lines.append(f"settings in effect: {report.settings_text}")
    if report.advice:
        lines.append("what to do:")
        for item in report.advice:
            lines.append(f"  - {_advice_action(item)}: {item.reason}")
    elif report.info is None:
        lines.append("the message did not contain torch's usual numbers; see the traceback above")
    return "\n".join(lines)


def _bar_html(b: MemoryBreakdown) -> str:
    cells = []
    for label, size in b.parts():
        share = 100 * size / b.total if b.total else 0
        cells.append(f'<div title="{escape(label)}: {format_bytes(size)}" style="width:{share:.3f}%;'
                     f'background:{_PART_COLORS.get(label, "#999")};min-width:2px"></div>')
    legend = " · ".join(
        f'<span style="color:{_PART_COLORS.get(label, "#999")}">■</span> {escape(label)} '
        f"<b>{format_bytes(size)}</b>" for label, size in b.parts())
    return (f'<div style="display:flex;height:18px;border:1px solid #ccc;max-width:720px">'
            f'{"".join(cells)}</div><div style="font-size:12px;margin:4px 0">{legend}</div>')


def report_html(report: OomReport) -> str:
    """The report as HTML for an ``ipywidgets.HTML`` (no scripts, everything escaped)."""
    parts = [f'<div style="font-weight:600;color:#d62728">{escape(report.headline)}</div>']
    if report.breakdown is not None:
        parts.append(_bar_html(report.breakdown))
    if report.observed is not None:
        o = report.observed
        parts.append(f"<div>torch's OOM observer: GPU {o.device} could not get "
                     f"{format_bytes(o.alloc)}; {format_bytes(o.device_free)} free</div>")
    parts.append(f"<div>settings in effect: <code>{escape(report.settings_text)}</code></div>")
    if report.advice:
        items = "".join(f"<li><b>{escape(_advice_action(a))}</b>: {escape(a.reason)}</li>"
                        for a in report.advice)
        parts.append(f"<div>What to do:</div><ul style='margin-top:2px'>{items}</ul>")
    return f'<div class="allocconf-oom-report">{"".join(parts)}</div>'


class OomPanel:
    """The widget the assistant displays: report, Save-snapshot button, status line."""

    def __init__(self, report: OomReport) -> None:
        import ipywidgets as widgets

        self.report = report
        self.body = widgets.HTML(value=report_html(report))
        self.body.add_class("allocconf-oom-body")
        self.save = widgets.Button(description="Save snapshot",
                             tooltip="write allocconf-oom-<time>.pickle for pytorch.org/memory_viz")
        self.save.add_class("allocconf-oom-save")
        self.save.on_click(self._on_save)
        self.status = widgets.HTML(value="")
        self.status.add_class("allocconf-oom-status")
        self.widget = widgets.VBox([self.body, widgets.HBox([self.save, self.status])])
        self.widget.add_class("allocconf-oom")
        self.saved: Any = None

    def _on_save(self, _button: Any = None) -> None:
        from allocconf_widget.app.exports import write_live_snapshot

        try:
            self.saved = write_live_snapshot(kind="oom")
        except Exception as exc:
            self.status.value = f"could not save a snapshot: {escape(str(exc))}"
            return
        self.status.value = (f"saved <code>{escape(str(self.saved))}</code>: open it at "
                             "pytorch.org/memory_viz (record stacks first with "
                             "<code>torch.cuda.memory._record_memory_history()</code> to see who allocated)")


# ----------------------------------------------------------------- the IPython hook


class OomAssistant:
    """Watches cells for CUDA OOMs; one per shell (see :func:`install_oom_assistant`)."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.reports: list[OomReport] = []
        self.last_panel: OomPanel | None = None
        self._observed: ObservedOom | None = None
        self._observer_on = False
        self._lock = threading.Lock()
        self._cell_started: float | None = None
        self.last_flight: Any = None

    def install(self) -> None:
        self.shell.events.register("pre_run_cell", self.pre_run_cell)
        self.shell.events.register("post_run_cell", self.post_run_cell)
        self.attach_observer()

    def uninstall(self) -> None:
        for name, callback in (("pre_run_cell", self.pre_run_cell), ("post_run_cell", self.post_run_cell)):
            with contextlib.suppress(ValueError):
                self.shell.events.unregister(name, callback)
        if self._observer_on:
            torch_private.remove_oom_listener(self.observe)
            self._observer_on = False

    def attach_observer(self) -> bool:
        """Listen to torch's OOM observer, only if the program already initialised CUDA."""
        torch = torch_private.imported_torch()
        if self._observer_on or torch is None or not torch_private.cuda_initialized(torch):
            return self._observer_on
        self._observer_on = torch_private.add_oom_listener(torch, self.observe)
        return self._observer_on

    def observe(self, device: int, alloc: int, device_total: int, device_free: int) -> None:
        """torch's observer callback (GIL held, allocator lock released): record, read stats."""
        torch = torch_private.imported_torch()
        stats = torch_private.memory_stats(torch, device) if torch is not None else None
        with self._lock:
            self._observed = ObservedOom(device, alloc, device_total, device_free, stats)

    def pre_run_cell(self, _info: Any = None) -> None:
        with self._lock:
            self._observed = None
            self._cell_started = time.time()
        self.attach_observer()

    def post_run_cell(self, result: Any = None) -> None:
        error = getattr(result, "error_in_exec", None)
        if error is None or not is_cuda_oom(error):
            return
        with self._lock:
            observed, self._observed = self._observed, None
        self.show(build_report(str(error), observed=observed))

    def show(self, report: OomReport) -> None:
        """Display the report under the failed cell (text in terminal IPython)."""
        from allocconf_widget.adapters.frontend import Frontend, detect_frontend

        self.reports.append(report)
        if self._show_flight(report):
            return
        if detect_frontend() in (Frontend.TERMINAL, Frontend.PLAIN):
            print(report_text(report))
            return
        from IPython.display import display

        self.last_panel = OomPanel(report)
        display(self.last_panel.widget)


    def _show_flight(self, report: OomReport) -> bool:
        """With the flight recorder's capture of this cell, show the full OOM view instead."""
        from allocconf_widget.adapters.flight_history import flight_history
        from allocconf_widget.app.session import get_session
        from allocconf_widget.views.widgets.flight import flight_capture_for_cell, show_flight_oom

        capture = flight_capture_for_cell(self._cell_started)
        if capture is None:
            return False
        capture = dataclasses.replace(capture, message=report.message)
        flight_history().set_capture(capture)
        self.last_flight = show_flight_oom(capture, session=get_session(self.shell),
                                           report_text=report_text(report),
                                           report_html=report_html(report))
        return True


def is_cuda_oom(error: BaseException) -> bool:
    """``torch.OutOfMemoryError``, or (torch < 1.13) a RuntimeError saying "CUDA out of memory"."""
    torch = torch_private.imported_torch()
    oom_type = torch_private.out_of_memory_error(torch) if torch is not None else None
    if oom_type is not None and isinstance(error, oom_type):
        return True
    return isinstance(error, RuntimeError) and "CUDA out of memory" in str(error)


def install_oom_assistant(ipython: Any) -> OomAssistant:
    """Show the OOM assistant after any cell that fails with a CUDA OOM (idempotent)."""
    assistant = getattr(ipython, _ATTR, None)
    if assistant is None:
        assistant = OomAssistant(ipython)
        assistant.install()
        setattr(ipython, _ATTR, assistant)
    else:
        assistant.attach_observer()
    return assistant


def uninstall_oom_assistant(ipython: Any) -> None:
    """Remove the hooks (torch's observer trampoline stays, silent: torch cannot detach it)."""
    assistant = getattr(ipython, _ATTR, None)
    if assistant is not None:
        assistant.uninstall()
        delattr(ipython, _ATTR)
