"""The OOM card: after a cell dies of ``torch.OutOfMemoryError``, show where the memory was.

The report and its one recommendation are :mod:`allocconf_widget.app.oom`'s; this module
draws them (:func:`report_html`, :class:`OomPanel`) and hooks IPython:
:class:`OomAssistant` registers ``pre_run_cell`` / ``post_run_cell`` handlers, and after a cell
that failed with a CUDA OOM shows the card (the flight recorder's fuller view when it has the
window; text in terminal IPython). The card breaks the GPU down (allocated,
reserved-but-unallocated, outside PyTorch, free), says what to do, and offers a "Save
snapshot" button writing ``allocconf-exports/allocconf-oom-<time>.pickle`` (once, on demand:
with stack history on it can take seconds).
"""

from __future__ import annotations

import contextlib
import threading
import time
from html import escape
from typing import Any

from allocconf_widget.app.oom import OomObserver, OomReport, build_report, is_cuda_oom, settings_in_force
from allocconf_widget.views.text.oom import report_text
from allocconf_widget.views.widgets.oom_card import report_html

_ATTR = "_allocconf_oom_assistant"


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
            saved = write_live_snapshot(kind="oom")
        except Exception as exc:
            self.status.value = f"could not save a snapshot: {escape(str(exc))}"
            return
        self.saved = saved.path
        self.status.value = (f"saved <code>{escape(str(saved.path))}</code>: open it at "
                             "pytorch.org/memory_viz (record stacks first with "
                             "<code>torch.cuda.memory._record_memory_history()</code> to see who "
                             f"allocated); {escape(saved.sidecar_note())}")


# ----------------------------------------------------------------- the IPython hook


class OomAssistant:
    """Watches cells for CUDA OOMs; one per shell (see :func:`install_oom_assistant`)."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.reports: list[OomReport] = []
        self.last_panel: OomPanel | None = None
        self.observer = OomObserver()
        self._lock = threading.Lock()
        self._cell_started: float | None = None

    def install(self) -> None:
        self.shell.events.register("pre_run_cell", self.pre_run_cell)
        self.shell.events.register("post_run_cell", self.post_run_cell)
        self.observer.attach()

    def uninstall(self) -> None:
        for name, callback in (("pre_run_cell", self.pre_run_cell), ("post_run_cell", self.post_run_cell)):
            with contextlib.suppress(ValueError):
                self.shell.events.unregister(name, callback)
        self.observer.detach()

    def attach_observer(self) -> bool:
        return self.observer.attach()

    def pre_run_cell(self, _info: Any = None) -> None:
        self.observer.clear()
        with self._lock:
            self._cell_started = time.time()
        self.observer.attach()

    def post_run_cell(self, result: Any = None) -> None:
        from allocconf_widget.app.session import get_session

        error = getattr(result, "error_in_exec", None)
        if error is None or not is_cuda_oom(error):
            return
        settings = settings_in_force(get_session(self.shell))
        self.show(build_report(str(error), settings, observed=self.observer.take()))

    def show(self, report: OomReport) -> None:
        """Display the report under the failed cell (text in terminal IPython)."""
        from allocconf_widget.adapters.frontend import detect_frontend

        self.reports.append(report)
        if self._show_flight(report):
            return
        if not detect_frontend().shows_widgets:
            print(report_text(report))
            return
        from IPython.display import display

        self.last_panel = OomPanel(report)
        display(self.last_panel.widget)

    def _show_flight(self, report: OomReport) -> bool:
        """With the flight recorder's capture of this cell, show the full OOM view instead."""
        from allocconf_widget.app.flight import capture_for_cell
        from allocconf_widget.app.session import get_session
        from allocconf_widget.views.widgets.flight import show_flight_oom

        capture = capture_for_cell(self._cell_started, report.message)
        if capture is None:
            return False
        show_flight_oom(capture, session=get_session(self.shell), report=report)
        return True


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
