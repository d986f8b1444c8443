"""The live memory monitor widget: ``start_monitor()`` / ``stop_monitor()`` / ``active_monitor()``.

A :class:`MonitorView` shows one source, a live
:class:`~allocconf_widget.adapters.sampler.Sampler` or a
:class:`~allocconf_widget.adapters.replay.ReplaySampler` of the bundled GPU
recording (when there is no GPU, or ``demo=True``; always labelled
"Recording: …"). Its chart is an inline-SVG ``HTML`` widget or a plotly
``FigureWidget`` (see :mod:`allocconf_widget.views.charts.monitor_render`).

Threading: redraws come from the sampler thread (thread mode), the training
thread (step-synchronous mode) or widget callbacks, which ipykernel 7 may run
on a subshell thread while a cell is busy (docs/internals/notebook_facts.md §5). All view state is
behind one lock; a redraw already in progress is never waited for (the next
sample redraws). Redraws are throttled to ``min_update_interval`` (at most
2 Hz by default) and send a decimated payload (≤ 400 points per series), so the bytes
per update stay bounded however long the run is.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

from allocconf_widget.adapters.frontend import Frontend, detect_frontend
from allocconf_widget.app.monitor import MonitorRun, gpu_expected
from allocconf_widget.core.memory.recording import Recording
from allocconf_widget.views.charts.monitor_render import (
    FIGURE_POINTS,
    RENDERERS,
    SVG_POINTS,
    build_chart,
    choose_renderer,
    status_html,
    status_text,
)

MIN_UPDATE_INTERVAL = 0.5
"""Seconds between chart redraws (≤ 2 Hz): plotly and ipywidgets do no rate limiting themselves."""

__all__ = ["MonitorView", "active_monitor", "gpu_expected", "start_monitor", "stop_monitor"]


# ----------------------------------------------------------------- the view


class MonitorView:
    """Chart + status line + Start/Stop/Export buttons over one sampling source.

    Display it with ``display(view)`` (or put ``view.widget`` in your own layout).
    """

    def __init__(
        self,
        run: MonitorRun,
        *,
        renderer: str = "auto",
        device: int | None = None,
        frontend: Frontend | None = None,
        min_update_interval: float = MIN_UPDATE_INTERVAL,
        shell: Any = None,
    ) -> None:
        import ipywidgets as widgets

        self.run = run
        self.source = run.source
        self.recording: Recording | None = run.recording
        self.frontend = frontend or detect_frontend()
        self.min_update_interval = min_update_interval
        self.shell = shell
        self.updates = 0
        self.skipped = 0
        self.last_error: str | None = None
        self._lock = threading.RLock()
        self._render_lock = threading.Lock()
        self._device = device
        self._last_render = 0.0
        self._last_version: Any = None
        self._note: str | None = None
        self._link: tuple[str, str] | None = None  # (url, text) of the last export
        self._remove_listener: Any = None
        self._events: list[tuple[str, Any]] = []
        self._closed = False
        # the header carries the full description; the chart keeps a short label of its own
        title = f"Recording: {run.recording.name} (replayed)" if run.recording is not None else None
        wanted = choose_renderer(renderer, self.frontend)
        self.chart, self._note = build_chart(wanted, self._payload(), title)
        self.renderer = self.chart.name
        self._build_controls(widgets)
        run.on_close(self.release)  # a newer monitor replaced this one: let go of the run

    # ------------------------------------------------------------- widgets
    def _build_controls(self, widgets: Any) -> None:
        self.header = widgets.HTML(value=self._header_text())
        self.header.add_class("allocconf-monitor-header")
        self.status = widgets.HTML(value="")
        self.status.add_class("allocconf-monitor-status")
        self.device_picker = widgets.Dropdown(options=[], description="GPU")
        self.device_picker.add_class("allocconf-monitor-device")
        self.device_picker.observe(self._on_device, names="value")
        self.segments = widgets.HTML(value="")
        self.segments.add_class("allocconf-monitor-segmap")
        self.buttons = {}
        for name, text, tip, handler in (
            ("start", "Start", "start (or resume) sampling", self._on_start),
            ("stop", "Stop", "stop sampling; the chart stays", self._on_stop),
            ("segments", "Segments", "show how full each cached segment is (one snapshot)",
             self._on_segments),
            ("csv", "Export CSV", "write the timeline to ./allocconf-exports/ (with a download link)",
             self._on_csv),
            ("json", "Export JSON", "write the timeline to ./allocconf-exports/ (with a download link)",
             self._on_json),
            ("snapshot", "Save snapshot", "write a snapshot pickle for pytorch.org/memory_viz into "
             "./allocconf-exports/", self._on_snapshot),
        ):
            button = widgets.Button(description=text, tooltip=tip, layout=widgets.Layout(width="auto"))
            button.add_class(f"allocconf-monitor-{name}")
            button.on_click(handler)
            self.buttons[name] = button
        self.toolbar = widgets.HBox(list(self.buttons.values()))
        self.widget = widgets.VBox([self.header, self.chart.widget, self.status, self.toolbar, self.segments])
        self.widget.add_class("allocconf-monitor")

    def _header_text(self) -> str:
        from html import escape

        if self.recording is not None:
            return (f"<b>Recording:</b> {escape(self.recording.description)} "
                    "<i>(replayed: not this machine's GPU)</i>")
        mode = "per optimizer step" if getattr(self.source, "step_sync", False) else (
            f"every {getattr(self.source, 'interval', 0.1):g} s")
        return f"<b>Live GPU memory</b> · sampled {mode}"

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def __repr__(self) -> str:
        return f"<MonitorView {self.renderer} {'running' if self.running else 'stopped'}: {self.text()}>"

    # ------------------------------------------------------------- lifecycle
    @property
    def running(self) -> bool:
        return bool(self.source.running)

    @property
    def timeline(self) -> Any:
        return self.source.timeline

    def start(self) -> MonitorView:
        """Start sampling (or the replay); register the cell hooks; idempotent."""
        with self._lock:
            if self._closed or self.run.closed:
                raise RuntimeError("this monitor was closed; start a new one with start_monitor()")
            if self._remove_listener is None:
                self._remove_listener = self.source.add_listener(self._on_samples)
            self._register_events()
        self.run.start()
        self.refresh(force=True)
        return self

    def stop(self) -> None:
        """Stop sampling, unregister the hooks; the chart keeps the data (idempotent)."""
        self.run.stop()
        with self._lock:
            self._unregister_events()
        self.refresh(force=True)

    def release(self) -> None:
        """A newer monitor replaced this one: stop, drop every callback, keep the last picture.

        The chart and its status line stay on screen as they were; the controls (whose
        callbacks are what kept this view, its sampler and its whole timeline alive) are
        closed, so repeated starts do not pile up memory.
        """
        self._let_go()
        self.status.value += " <i>(replaced by a newer monitor)</i>"
        self.widget.children = (self.header, self.chart.widget, self.status)
        for widget in (*self.buttons.values(), self.toolbar, self.device_picker, self.segments):
            with contextlib.suppress(Exception):
                widget.close()

    def _let_go(self) -> None:
        """Stop, and drop the sampler listener: nothing of the run is called from here on."""
        self.stop()
        with self._lock:
            self._closed = True
            if self._remove_listener is not None:
                self._remove_listener()
                self._remove_listener = None

    def close(self) -> None:
        """Stop and close the widgets (frees the front-end views)."""
        self._let_go()
        # close our own widgets only (Widget.close_all() would close every widget in the kernel)
        for widget in (*self.buttons.values(), self.toolbar, self.header, self.status,
                       self.device_picker, self.segments, self.chart.widget, self.widget):
            with contextlib.suppress(Exception):
                widget.close()

    def play(self) -> None:
        """Replay the recording on this thread (no background thread; for Colab). Demo only."""
        if not self.run.is_replay:
            raise RuntimeError("play() replays a recording; this monitor shows live data")
        with self._lock:
            if self._remove_listener is None:
                self._remove_listener = self.source.add_listener(self._on_samples)
        self.run.play()
        self.refresh(force=True)

    # ------------------------------------------------------------- rendering
    def _payload(self) -> Any:
        timeline = self.source.timeline
        devices = timeline.devices
        device = self._device if self._device in devices else (devices[0] if devices else 0)
        points = SVG_POINTS if getattr(self, "renderer", "svg") == "svg" else FIGURE_POINTS
        return timeline.render(device, max_points=points)

    def _on_samples(self, samples: list[Any]) -> None:
        self.refresh(force=not samples)  # an empty round = the replay ended: draw the end state

    def refresh(self, force: bool = False) -> bool:
        """Redraw now if due (≤ 2 Hz) and something changed; returns whether it redrew."""
        now = time.monotonic()
        with self._lock:
            # what the chart shows: the data, and the state line of an empty chart
            version = (self.source.timeline.version, self._state_text())
            due = force or (now - self._last_render >= self.min_update_interval
                            and version != self._last_version)
            if not due or self._closed:
                if not due:
                    self.skipped += 1
                return False
            self._last_render = now
            self._last_version = version
        # Another thread drawing: a routine redraw is skipped (the next sample redraws), a
        # forced one (start, stop, end of cell) waits so the final state is never lost.
        if not self._render_lock.acquire(blocking=force, timeout=5.0 if force else -1):
            return False
        try:
            self._draw()
        except Exception as exc:  # a failed redraw must not stop sampling
            self.last_error = repr(exc)
            return False
        finally:
            # The interval counts from the end of a draw, not its start: on a loaded machine
            # a draw can take a good part of the interval, and the next one, due on time, would
            # reach the browser right after it. Counted from here, what the browser gets stays
            # at or below 2 Hz however long a draw takes.
            with self._lock:
                self._last_render = max(self._last_render, time.monotonic())
            self._render_lock.release()
        self.updates += 1
        return True

    def _draw(self) -> None:
        payload = self._payload()
        self._sync_devices()
        self.chart.update(payload, self._empty_text())
        device = payload.device
        sample = self.source.latest.get(device) or self.source.latest.get(None)
        self.status.value = status_html(payload=payload, state=self._state_text(),
                                        overhead=self.source.overhead(), sample=sample,
                                        note=self._note, link=self._link)

    def _empty_text(self) -> str:
        return self.run.empty_text()

    def _state_text(self) -> str:
        return self.run.state_text()

    def _sync_devices(self) -> None:
        devices = [d for d in self.source.timeline.devices if d is not None]
        options = [(f"GPU {d}", d) for d in devices]
        if len(devices) > 1 and list(self.device_picker.options) != options:
            self.device_picker.options = options
            if self._device in devices:
                self.device_picker.value = self._device
        if len(devices) > 1 and self.device_picker not in self.widget.children:
            self.widget.children = (self.header, self.device_picker, *self.widget.children[1:])

    def text(self) -> str:
        """The status as plain text (terminal IPython, logs)."""
        return status_text(self.run, self._device, self._note)

    # ------------------------------------------------------------- callbacks (any thread)
    def _on_device(self, change: dict[str, Any]) -> None:
        with self._lock:
            self._device = change["new"]
        self.refresh(force=True)

    def _on_start(self, _button: Any = None) -> None:
        self.start()

    def _on_stop(self, _button: Any = None) -> None:
        self.stop()

    def _say(self, note: str, link: tuple[str, str] | None = None) -> None:
        with self._lock:
            self._note = note
            self._link = link
        self.refresh(force=True)

    def _export(self, what: str, write: Any, hint: str = "") -> None:
        """Write one export into ./allocconf-exports/ and show where, with a download link."""
        from allocconf_widget.adapters.frontend import download_link
        from allocconf_widget.app.exports import SavedSnapshot

        try:
            written = write()
        except Exception as exc:  # show, don't raise into the widget callback machinery
            self._say(f"failed: {exc}")
            return
        # a snapshot comes with its replay sidecar (or a line saying why there is none)
        beside = f"; {written.sidecar_note()}" if isinstance(written, SavedSnapshot) else ""
        path = Path(written.path if isinstance(written, SavedSnapshot) else written)
        try:
            shown = path.relative_to(Path.cwd())
        except ValueError:
            shown = path
        link = download_link(path, self.frontend)
        note = f"{what} written to {shown}{hint}{beside}"
        if link.note:
            note += f" ({link.note})"
        self._say(note, (link.url, "download") if link.url else None)

    def _on_csv(self, _button: Any = None) -> None:
        from allocconf_widget.app.exports import write_timeline_csv

        self._export("timeline", lambda: write_timeline_csv(self.source.timeline))

    def _on_json(self, _button: Any = None) -> None:
        from allocconf_widget.app.exports import write_timeline_json

        meta = {"recording": self.recording.label} if self.recording is not None else {}
        self._export("timeline", lambda: write_timeline_json(self.source.timeline, meta=meta))

    def _on_snapshot(self, _button: Any = None) -> None:
        """The snapshot and its replay sidecar, so ``allocconf simulate`` on it knows the torch
        release, the device's memory and the memory fraction."""
        from allocconf_widget.app.exports import write_live_snapshot, write_recording_snapshot

        rec, device = self.recording, self._device
        if rec is not None:
            self._export("recording's snapshot", lambda: write_recording_snapshot(rec),
                         " (open it at pytorch.org/memory_viz)")
        else:
            self._export("snapshot", lambda: write_live_snapshot(device=device),
                         " (open it at pytorch.org/memory_viz)")

    def _on_segments(self, _button: Any = None) -> None:
        self._guarded(self._show_segments)

    def _show_segments(self) -> str:
        from allocconf_widget.views.charts.segment_svg import segment_panel_html

        device = self._device or 0
        found = self.run.segments(device)
        if isinstance(found, str):
            return found
        segments, title, moment = found
        self.segments.value = segment_panel_html(segments, device=device, title=title, moment=moment)
        return f"{len(segments)} segments shown below"

    def _guarded(self, action: Any) -> None:
        try:
            self._say(str(action()))
        except Exception as exc:  # show, don't raise into the widget callback machinery
            self._say(f"failed: {exc}")

    # ------------------------------------------------------------- IPython cell hooks
    def _register_events(self) -> None:
        shell = self.shell
        if shell is None or self._events or self.run.is_replay:
            return
        for name, callback in (("pre_run_cell", self._pre_run_cell),
                               ("post_run_cell", self._post_run_cell)):
            shell.events.register(name, callback)
            self._events.append((name, callback))

    def _unregister_events(self) -> None:
        while self._events:
            name, callback = self._events.pop()
            with contextlib.suppress(ValueError):
                self.shell.events.unregister(name, callback)

    def _cell_label(self) -> str:
        count = getattr(self.shell, "execution_count", None)
        return f"cell [{count}]" if count is not None else "cell"

    def _pre_run_cell(self, _info: Any = None) -> None:
        self.run.cell_started(self._cell_label())

    def _post_run_cell(self, result: Any = None) -> None:
        self.run.cell_finished(getattr(result, "error_in_exec", None))
        self.refresh(force=True)


# ----------------------------------------------------------------- module functions


def _shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _session() -> Any:
    from allocconf_widget.app.session import get_session

    return get_session(_shell())


def start_monitor(
    interval: float = 0.1,
    device: int | None = None,
    renderer: str = "auto",
    demo: bool | None = None,
    step_sync: bool = False,
    skip_idle: bool = True,
) -> MonitorView:
    """Start the memory monitor and return its view (display it, or use ``view.widget``).

    Args:
        interval: seconds between samples (thread mode); ≥ 0.01.
        device: the GPU shown first (all GPUs are sampled); None = the first.
        renderer: ``"auto"``, ``"figurewidget"`` (plotly) or ``"svg"`` (works everywhere).
        demo: replay the bundled GPU recording instead of live data; None = only
            when no GPU can ever be seen here (CPU-only machine).
        step_sync: sample once per optimizer step from the training loop's own
            thread (x axis: step); the mode for Colab, where updates sent from a
            background thread may not be drawn.
        skip_idle: in a replay, cut stretches where no memory counter moved for more than
            a second (the recording's set-up) to half a second, marked on the chart.

    The Session's monitor (:mod:`allocconf_widget.app.monitor`) that is already running is
    stopped first and its view lets go of it (one at a time).
    """
    if renderer not in RENDERERS:
        raise ValueError(f"renderer={renderer!r}: use one of {', '.join(RENDERERS)}")
    views: list[MonitorView] = []

    def attach(run: MonitorRun) -> None:
        view = MonitorView(run, renderer=renderer, device=device, shell=_shell())
        run.view = view  # what active_monitor() returns
        views.append(view.start())

    _session().monitors.start(interval=interval, device=device, demo=demo, step_sync=step_sync,
                              skip_idle=skip_idle, attach=attach)
    return views[0]


def stop_monitor() -> None:
    """Stop the running monitor, if any (its chart stays visible)."""
    run = _session().monitors.stop()
    view = getattr(run, "view", None) if run is not None else None
    if isinstance(view, MonitorView):
        view.stop()


def active_monitor() -> MonitorView | None:
    """The monitor ``start_monitor()`` started, until ``stop_monitor()`` (Stop only pauses it)."""
    run = _session().monitors.active
    view = getattr(run, "view", None) if run is not None else None
    return view if isinstance(view, MonitorView) else None
