"""The live memory monitor widget: ``start_monitor()`` / ``stop_monitor()`` / ``active_monitor()``.

A :class:`MonitorView` shows one source, a live
:class:`~allocconf_widget.adapters.sampler.Sampler` or a
:class:`~allocconf_widget.adapters.replay.ReplaySampler` of the bundled H200
recording (when there is no GPU, or ``demo=True``; always labelled
"Recording: …"). Its chart is an inline-SVG ``HTML`` widget or a plotly
``FigureWidget`` (see :mod:`allocconf_widget.views.charts.monitor_render`).

Threading: redraws come from the sampler thread (thread mode), the training
thread (step-synchronous mode) or widget callbacks, which ipykernel 7 may run
on a subshell thread while a cell is busy (docs/internals/notebook_facts.md §5). All view state is
behind one lock; a redraw already in progress is never waited for (the next
sample redraws). Redraws are throttled to ``min_update_interval`` (0.5 s: at
most 2 Hz) and send a decimated payload (≤ 400 points per series), so the bytes
per update stay bounded however long the run is.
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading
import time
from pathlib import Path
from typing import Any

from allocconf_widget.adapters import nvml, torch_private
from allocconf_widget.adapters.frontend import Frontend, detect_frontend
from allocconf_widget.adapters.replay import IDLE_SKIP_S, ReplaySampler
from allocconf_widget.adapters.sampler import OK, Sampler
from allocconf_widget.core.memory.recording import Recording, load_demo
from allocconf_widget.views.charts.monitor_render import (
    FIGURE_POINTS,
    RENDERERS,
    SVG_POINTS,
    build_chart,
    choose_renderer,
    status_html,
)

MIN_UPDATE_INTERVAL = 0.5
"""Seconds between chart redraws (≤ 2 Hz): plotly and ipywidgets do no rate limiting themselves."""

_active_lock = threading.RLock()
_active: MonitorView | None = None


# ----------------------------------------------------------------- live or recording?


def gpu_expected() -> bool:
    """Whether a live monitor can ever show data here; answered without initialising CUDA."""
    torch = torch_private.imported_torch()
    if torch is not None:
        return torch_private.cuda_built(torch) and torch_private.device_count(torch) > 0
    found = nvml.gpus()
    if found is not None:
        return bool(found)
    if importlib.util.find_spec("torch") is None:
        return False
    return Path("/dev/nvidiactl").exists()


# ----------------------------------------------------------------- the view


class MonitorView:
    """Chart + status line + Start/Stop/Export buttons over one sampling source.

    Display it with ``display(view)`` (or put ``view.widget`` in your own layout).
    """

    def __init__(
        self,
        source: Sampler | ReplaySampler,
        *,
        renderer: str = "auto",
        device: int | None = None,
        recording: Recording | None = None,
        frontend: Frontend | None = None,
        min_update_interval: float = MIN_UPDATE_INTERVAL,
        shell: Any = None,
    ) -> None:
        import ipywidgets as widgets

        self.source = source
        self.recording = recording
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
        self.last_export: Path | None = None
        self._remove_listener: Any = None
        self._events: list[tuple[str, Any]] = []
        self._oom_seen_at = 0.0
        self._oom_listener_on = False
        self._closed = False
        # the header carries the full description; the chart keeps a short label of its own
        title = f"Recording: {recording.name} (replayed)" if recording is not None else None
        self.renderer_requested = renderer
        wanted = choose_renderer(renderer, self.frontend)
        self.chart, self._note = build_chart(wanted, self._payload(), title)
        self.renderer = self.chart.name
        self._build_controls(widgets)

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
            if self._closed:
                raise RuntimeError("this monitor was closed; start a new one with start_monitor()")
            if self._remove_listener is None:
                self._remove_listener = self.source.add_listener(self._on_samples)
            self._register_events()
        self.source.start()
        self.refresh(force=True)
        return self

    def stop(self) -> None:
        """Stop sampling, unregister the hooks; the chart keeps the data (idempotent)."""
        self.source.stop()
        with self._lock:
            self._unregister_events()
            if self._oom_listener_on:
                torch_private.remove_oom_listener(self._on_oom)
                self._oom_listener_on = False
        self.refresh(force=True)

    def close(self) -> None:
        """Stop and close the widgets (frees the front-end views)."""
        self.stop()
        with self._lock:
            self._closed = True
            if self._remove_listener is not None:
                self._remove_listener()
                self._remove_listener = None
        # close our own widgets only (Widget.close_all() would close every widget in the kernel)
        for widget in (*self.buttons.values(), self.toolbar, self.header, self.status,
                       self.device_picker, self.segments, self.chart.widget, self.widget):
            with contextlib.suppress(Exception):
                widget.close()

    def play(self) -> None:
        """Replay the recording on this thread (no background thread; for Colab). Demo only."""
        if not isinstance(self.source, ReplaySampler):
            raise RuntimeError("play() replays a recording; this monitor shows live data")
        with self._lock:
            if self._remove_listener is None:
                self._remove_listener = self.source.add_listener(self._on_samples)
        self.source.play()
        self.refresh(force=True)

    # ------------------------------------------------------------- rendering
    def _payload(self) -> Any:
        timeline = self.source.timeline
        devices = timeline.devices
        device = self._device if self._device in devices else (devices[0] if devices else 0)
        points = SVG_POINTS if getattr(self, "renderer", "svg") == "svg" else FIGURE_POINTS
        return timeline.render(device, max_points=points)

    def _on_samples(self, samples: list[Any]) -> None:
        self._attach_oom_observer()
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
        latest = self.source.latest.get(None)
        if latest is not None and latest.status != OK:
            return latest.message
        return "no samples yet" if self.running else "stopped"

    def _state_text(self) -> str:
        if isinstance(self.source, ReplaySampler):
            state = self.source.status.replace("_", " ")
            if self.source.status == "replay_finished":
                state += " (Start replays it on a new chart)"
            return state
        if not self.running:
            error = getattr(self.source, "last_error", None)
            return f"stopped ({error})" if error and "sampler thread stopped" in error else "stopped"
        latest = self.source.latest.get(None)
        return latest.message if latest is not None and latest.status != OK else "live"

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
        import re

        html = status_html(payload=self._payload(), state=self._state_text(),
                           overhead=self.source.overhead(),
                           sample=self.source.latest.get(self._device), note=self._note)
        return re.sub(r"<[^>]+>", "", html)

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

        try:
            path = Path(write())
        except Exception as exc:  # show, don't raise into the widget callback machinery
            self._say(f"failed: {exc}")
            return
        self.last_export = path
        try:
            shown = path.relative_to(Path.cwd())
        except ValueError:
            shown = path
        link = download_link(path, self.frontend)
        note = f"{what} written to {shown}{hint}"
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
        from allocconf_widget.app.exports import write_live_snapshot, write_snapshot

        if self.recording is not None:
            rec = self.recording
            self._export("recording's snapshot",
                         lambda: write_snapshot(rec.snapshot(), kind="recording"))
        else:
            self._export("snapshot", write_live_snapshot, " (open it at pytorch.org/memory_viz)")

    def _on_segments(self, _button: Any = None) -> None:
        self._guarded(self._show_segments)

    def _show_segments(self) -> str:
        from allocconf_widget.views.charts.segment_svg import segment_panel_html

        device = self._device or 0
        if self.recording is not None:
            segments: list[Any] = [s for s in self.recording.snapshot()["segments"]
                                   if s.get("device", 0) == device]
            title = f"Recording: segments at the end of the run (GPU {device}), not at the last sample"
            moment = "in the end-of-run snapshot"
        else:
            torch = torch_private.imported_torch()
            if torch is None or not torch_private.cuda_initialized(torch):
                return "no segments yet: CUDA is not initialised"
            segments = [s for s in torch_private.trace_free_snapshot(torch)
                        if s.get("device", 0) == device]
            title = f"segments now (GPU {device}), snapshot taken at {time.strftime('%H:%M:%S')}"
            moment = "in this snapshot"
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
        if shell is None or self._events or isinstance(self.source, ReplaySampler):
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
        self.source.timeline.cell_started(self._cell_label(), x=self.source.now_x())

    def _post_run_cell(self, result: Any = None) -> None:
        timeline = self.source.timeline
        timeline.cell_finished(x=self.source.now_x())
        error = getattr(result, "error_in_exec", None)
        torch = torch_private.imported_torch()
        oom_type = torch_private.out_of_memory_error(torch) if torch is not None else None
        is_oom = error is not None and oom_type is not None and isinstance(error, oom_type)
        if is_oom and time.monotonic() - self._oom_seen_at > 2.0:  # the observer has not marked it
            first = str(error).strip().splitlines()[0] if str(error).strip() else "out of memory"
            timeline.mark("oom", first[:300], x=self.source.now_x())
        self.refresh(force=True)

    def _attach_oom_observer(self) -> None:
        """Once the program has initialised CUDA, listen for OOMs (marks the chart at once)."""
        if self._oom_listener_on or isinstance(self.source, ReplaySampler):
            return
        torch = torch_private.imported_torch()
        if torch is None or not torch_private.cuda_initialized(torch):
            return
        with self._lock:
            if not self._oom_listener_on:
                self._oom_listener_on = torch_private.add_oom_listener(torch, self._on_oom)

    def _on_oom(self, device: int, alloc: int, _total: int, free: int) -> None:
        from allocconf_widget.core.units import format_bytes

        now = time.monotonic()
        if now - self._oom_seen_at < 0.5:  # torch may call the observer several times per failure
            return
        self._oom_seen_at = now
        self.source.timeline.mark(
            "oom", f"CUDA out of memory on GPU {device}: could not get {format_bytes(alloc)} "
            f"({format_bytes(free)} free)", x=self.source.now_x(), device=device)


# ----------------------------------------------------------------- module functions


def _shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


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
        demo: replay the bundled H200 recording instead of live data; None = only
            when no GPU can ever be seen here (CPU-only machine).
        step_sync: sample once per optimizer step from the training loop's own
            thread (x axis: step); the mode for Colab, where updates sent from a
            background thread may not be drawn.
        skip_idle: in a replay, cut stretches where no memory counter moved for more than
            a second (the recording's 6 s of set-up) to half a second, marked on the chart.

    A monitor that is already running is stopped first (one at a time).
    """
    if not interval >= 0.01:
        raise ValueError(f"interval={interval!r}: sample at most every 0.01 s (100 Hz)")
    if renderer not in RENDERERS:
        raise ValueError(f"renderer={renderer!r}: use one of {', '.join(RENDERERS)}")
    if device is not None and device < 0:
        raise ValueError(f"device={device}: GPU indices start at 0")
    replay = (not gpu_expected()) if demo is None else demo
    recording = load_demo() if replay else None
    source: Sampler | ReplaySampler
    if recording is not None:
        source = ReplaySampler(recording, interval=interval, skip_idle=IDLE_SKIP_S if skip_idle else None)
    else:
        source = Sampler(interval=interval, step_sync=step_sync)
    view = MonitorView(source, renderer=renderer, device=device, recording=recording, shell=_shell())
    global _active  # one monitor per process, like one training loop
    # the whole swap under the lock: panel callbacks on subshell threads may start and stop
    # concurrently, and an unlocked stop-then-start let sampler threads escape every stop
    with _active_lock:
        previous, _active = _active, view
        if previous is not None:
            previous.stop()
        return view.start()


def stop_monitor() -> None:
    """Stop the running monitor, if any (its chart stays visible)."""
    global _active
    with _active_lock:
        view, _active = _active, None
        if view is not None:
            view.stop()


def active_monitor() -> MonitorView | None:
    """The monitor ``start_monitor()`` started, until ``stop_monitor()`` (Stop only pauses it)."""
    with _active_lock:
        return _active
