"""The monitor's use case: which source to watch, one running monitor per Session, OOM marks.

``%allocconf monitor``, the panel's Monitor tab and ``start_monitor()`` all start a
:class:`MonitorRun` through :meth:`Monitors.start` (the Session holds one
:class:`Monitors`): live samples of this process's allocator, or a replay of the bundled
GPU recording when no GPU can ever be seen here (always labelled as a recording). Starting
another stops the previous run and tells whoever drew it (:meth:`MonitorRun.on_close`), so
an old chart's widgets and callbacks are released instead of accumulating.

Once the program has initialised CUDA a live run listens to torch's OOM observer and marks
the timeline at the moment of failure (attaching earlier would initialise CUDA itself); the
end of a failed cell marks it too when the observer was not there to. The views (the widget,
the magic's text) render a run; they decide nothing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from allocconf_widget.adapters import nvml, torch_private
from allocconf_widget.adapters.replay import IDLE_SKIP_S, ReplaySampler
from allocconf_widget.adapters.sampler import OK, Sampler
from allocconf_widget.core.memory.recording import Recording, load_demo
from allocconf_widget.core.units import format_bytes

Source = Sampler | ReplaySampler
#: the interval bounds every front end enforces (10 Hz default; 100 Hz at most)
MIN_INTERVAL, MAX_INTERVAL = 0.01, 60.0


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


def check_options(*, interval: float, device: int | None) -> None:
    """Refuse options no source can honour, with what to use instead.

    Raises:
        ValueError: the interval or the device index is out of range.
    """
    if math.isnan(interval):  # NaN compares false with everything: it read as "too long"
        raise ValueError("interval nan is not a number of seconds: give e.g. --interval 0.5")
    if interval < MIN_INTERVAL:
        raise ValueError(f"interval {interval:g} s is too short: sample at most every "
                         f"{MIN_INTERVAL} s (100 Hz)")
    if not interval <= MAX_INTERVAL:  # also inf: the thread could not sleep that long
        raise ValueError(f"interval {interval:g} s is too long: use at most {MAX_INTERVAL:g} s")
    if device is not None and device < 0:
        raise ValueError(f"device {device}: GPU indices start at 0")


class MonitorRun:
    """One monitored source and what happens to it: started, stopped, OOMs marked, closed."""

    def __init__(self, source: Source, recording: Recording | None) -> None:
        self.source = source
        self.recording = recording
        self._lock = threading.RLock()
        self._oom_seen_at = 0.0
        self._oom_listener_on = False
        self._closed = False
        self._on_close: list[Callable[[], None]] = []
        self._stop_listening: Callable[[], None] | None = None
        self.view: object | None = None  # the widget drawing this run, for ``active_monitor()``

    @property
    def is_replay(self) -> bool:
        return isinstance(self.source, ReplaySampler)

    @property
    def running(self) -> bool:
        return bool(self.source.running)

    def play(self) -> None:
        """Replay the recording on the calling thread, to its end (no background thread).

        Raises:
            RuntimeError: this run shows live data, not a recording.
        """
        if not isinstance(self.source, ReplaySampler):
            raise RuntimeError("play() replays a recording; this monitor shows live data")
        self.source.play()

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> MonitorRun:
        """Start sampling (or the replay); from the first samples after CUDA starts, OOMs are
        marked by torch's observer."""
        if self._closed:
            raise RuntimeError("this monitor was closed; start a new one with %allocconf monitor")
        with self._lock:
            if self._stop_listening is None and not self.is_replay:
                self._stop_listening = self.source.add_listener(lambda _samples: self.attach_oom_observer())
        self.source.start()
        return self

    def stop(self) -> None:
        """Stop sampling; the data stays (idempotent)."""
        self.source.stop()
        with self._lock:
            if self._oom_listener_on:
                torch_private.remove_oom_listener(self._on_oom)
                self._oom_listener_on = False

    def close(self) -> None:
        """Stop for good and tell every view drawing this run to let go of it."""
        self.stop()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._stop_listening is not None:
                self._stop_listening()
                self._stop_listening = None
            callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            with contextlib.suppress(Exception):  # a view that fails to close must not stop the rest
                callback()

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` when this run is closed (replaced by a new monitor, or unloaded)."""
        with self._lock:
            self._on_close.append(callback)

    # -- states a view shows -------------------------------------------------------
    def state_text(self) -> str:
        """"live", "stopped", the replay's state, or why the sampler shows nothing."""
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

    def empty_text(self) -> str:
        """What an empty chart says."""
        latest = self.source.latest.get(None)
        if latest is not None and latest.status != OK:
            return latest.message
        return "no samples yet" if self.running else "stopped"

    def segments(self, device: int) -> tuple[list[dict[str, Any]], str, str] | str:
        """The cached segments to draw, their title and the moment they belong to (the chart's
        numbers are the last sample's: the two are said apart), or why there are none."""
        if self.recording is not None:
            segments: list[dict[str, Any]] = [dict(s) for s in self.recording.snapshot()["segments"]
                                              if s.get("device", 0) == device]
            return (segments, f"Recording: segments at the end of the run (GPU {device}), not at "
                    "the last sample", "in the end-of-run snapshot")
        torch = torch_private.imported_torch()
        if torch is None or not torch_private.cuda_initialized(torch):
            return "no segments yet: CUDA is not initialised"
        live = [s for s in torch_private.trace_free_snapshot(torch) if s.get("device", 0) == device]
        return (live, f"segments now (GPU {device}), snapshot taken at {time.strftime('%H:%M:%S')}",
                "in this snapshot")

    # -- cells and OOMs ----------------------------------------------------------------
    def cell_started(self, label: str) -> None:
        self.source.timeline.cell_started(label, x=self.source.now_x())

    def cell_finished(self, error: BaseException | None) -> None:
        """Mark the cell's end, and an OOM the observer did not mark (it was not attached)."""
        timeline = self.source.timeline
        timeline.cell_finished(x=self.source.now_x())
        torch = torch_private.imported_torch()
        oom_type = torch_private.out_of_memory_error(torch) if torch is not None else None
        is_oom = error is not None and oom_type is not None and isinstance(error, oom_type)
        if is_oom and time.monotonic() - self._oom_seen_at > 2.0:
            first = str(error).strip().splitlines()[0] if str(error).strip() else "out of memory"
            timeline.mark("oom", first[:300], x=self.source.now_x())

    def attach_oom_observer(self) -> None:
        """Once the program has initialised CUDA, listen for OOMs (marks the chart at once)."""
        if self._oom_listener_on or self.is_replay:
            return
        torch = torch_private.imported_torch()
        if torch is None or not torch_private.cuda_initialized(torch):
            return
        with self._lock:
            if not self._oom_listener_on:
                self._oom_listener_on = torch_private.add_oom_listener(torch, self._on_oom)

    def _on_oom(self, device: int, alloc: int, _total: int, free: int) -> None:
        now = time.monotonic()
        if now - self._oom_seen_at < 0.5:  # torch may call the observer several times per failure
            return
        self._oom_seen_at = now
        self.source.timeline.mark(
            "oom", f"CUDA out of memory on GPU {device}: could not get {format_bytes(alloc)} "
            f"({format_bytes(free)} free)", x=self.source.now_x(), device=device)


def choose_source(*, interval: float = 0.1, demo: bool | None = None, step_sync: bool = False,
                  skip_idle: bool = True) -> MonitorRun:
    """Live samples, or the bundled recording replayed (``demo``; None: only when no GPU can
    ever be seen here). Not started."""
    replay = (not gpu_expected()) if demo is None else demo
    recording = load_demo() if replay else None
    source: Source
    if recording is not None:
        source = ReplaySampler(recording, interval=interval,
                               skip_idle=IDLE_SKIP_S if skip_idle else None)
    else:
        source = Sampler(interval=interval, step_sync=step_sync)
    return MonitorRun(source, recording)


class Monitors:
    """The Session's monitor: at most one runs, like one training loop."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._active: MonitorRun | None = None

    @property
    def active(self) -> MonitorRun | None:
        """The run started last, until :meth:`stop` (a view's Stop button only pauses it)."""
        with self._lock:
            return self._active

    def start(self, *, interval: float = 0.1, device: int | None = None, demo: bool | None = None,
              step_sync: bool = False, skip_idle: bool = True,
              attach: Callable[[MonitorRun], object] | None = None) -> MonitorRun:
        """Choose the source, make it the Session's one monitor and start it. The previous run
        is closed, and its views let go. ``attach(run)`` (a view) is called instead of starting
        the run itself, so the view is listening before the first sample.

        Raises:
            ValueError: an option is out of range (:func:`check_options`).
        """
        check_options(interval=interval, device=device)
        if demo and step_sync:
            raise ValueError("step_sync samples your training loop; demo replays a recording: "
                             "choose one")
        # the whole swap under the lock: panel callbacks on subshell threads may start and stop
        # concurrently, and an unlocked stop-then-start let sampler threads escape every stop
        with self._lock:
            previous, self._active = self._active, None
            if previous is not None:
                previous.close()
            run = choose_source(interval=interval, demo=demo, step_sync=step_sync,
                                skip_idle=skip_idle)
            self._active = run
            if attach is not None:
                attach(run)
            else:
                run.start()
        return run

    def stop(self) -> MonitorRun | None:
        """Stop the running monitor, if any (its chart stays visible); returns it."""
        with self._lock:
            run, self._active = self._active, None
            if run is not None:
                run.stop()
        return run
