"""The sampling layer of the live monitor: cheap allocator readings, never a side effect.

Shaped after nvitop's ``api`` layer: one synchronous choke point
(:func:`sample` / :meth:`Probe.read`) that returns a :class:`Sample` whose
fields are ``None`` when a figure is unavailable, and a :class:`Sampler` that
calls it from a daemon thread (or from torch's optimizer step hook) and keeps
the results in a bounded :class:`~allocconf_widget.core.memory.timeline.Timeline`.

Rules (docs/internals/allocator_facts.md §5, §8; the costs are in docs/monitor.md, "Costs"):

* ``torch.cuda.memory_stats(device)`` (cheap) on every tick, but only once
  ``torch.cuda.is_initialized()``: before that the sample says "waiting for
  CUDA". Nothing here imports torch, initialises CUDA or freezes the settings.
* ``torch.cuda.memory_snapshot(include_traces=False)`` (costlier, growing with the
  segments, and it holds the allocator lock) only within a duty-cycle budget: after a
  snapshot (plus its fragmentation maths) took *c* seconds, the next waits
  ``max(min_interval, c / budget)``, so it can never cost more than the ``budget``
  share of wall time, however large the snapshot grows.
  ``torch.cuda.memory._snapshot()`` with history is never called here.
* NVML (process or device "used", for the non-PyTorch share) at most every
  ``nvml_interval`` seconds; it is a driver call and the value moves slowly.
* ``backend:cudaMallocAsync``: no snapshot exists (RuntimeError) and most
  counters are 0; we keep reserved/allocated, report the rest as ``None`` and
  say so in :attr:`Sample.degraded` / :attr:`Sampler.degraded`.

No ipywidgets, plotly or IPython here: the benchmark runs this module on a
machine with only torch installed.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import Any

from allocconf_widget.adapters import step_hook, torch_private
from allocconf_widget.adapters.probe import (
    ASYNC_NOTE,
    ERROR,
    NO_CUDA,
    NO_TORCH,
    OK,
    STATUS_TEXT,
    WAITING,
    Probe,
    Sample,
    SnapshotBudget,
    sample,
)
from allocconf_widget.core.memory.metrics import Metrics, segment_metrics
from allocconf_widget.core.memory.timeline import Timeline

__all__ = [
    "ASYNC_NOTE",
    "ERROR",
    "NO_CUDA",
    "NO_TORCH",
    "OK",
    "STATUS_TEXT",
    "THREAD_PREFIX",
    "WAITING",
    "Listener",
    "Probe",
    "Sample",
    "Sampler",
    "SnapshotBudget",
    "sample",
]

THREAD_PREFIX = "allocconf"


# ----------------------------------------------------------------- the sampler

Listener = Callable[[list[Sample]], None]
_live: weakref.WeakSet[Sampler] = weakref.WeakSet()
_atexit_registered = threading.Event()


def _stop_all_at_exit() -> None:
    for sampler in list(_live):
        with contextlib.suppress(Exception):
            sampler.stop(timeout=1.0)


MAX_INTERVAL_S = 3600.0  # an hour between samples; beyond that nothing would be live


class Sampler:
    """Samples memory in the background (or per optimizer step) into a bounded timeline.

    Args:
        interval: seconds between samples in thread mode (default 10 Hz).
        devices: CUDA device indices; None = every device, found once CUDA is up.
        step_sync: no thread; sample once per optimizer step, from torch's global
            post-step hook, on the training loop's own thread (x axis: step).
            This is the mode for front ends that do not draw updates sent from
            a background thread (Colab).
        snapshot_budget: share of wall time trace-free snapshots may take
            (0 disables them, and with them the fragmentation figure).
        snapshot_min_interval: never more than one snapshot per this many seconds.
        step_budget: in step mode, share of step time sampling may take; steps
            are skipped (sampled every k-th) to stay within it.
        max_points: timeline points kept per device.

    ``start``/``stop`` are idempotent; listeners get every round of samples
    (on the sampler thread, or on the training thread in step mode) and must be
    quick and thread-safe. A listener that raises is counted and skipped.
    """

    def __init__(
        self,
        interval: float = 0.1,
        devices: int | Sequence[int] | None = None,
        *,
        step_sync: bool = False,
        snapshot_budget: float = 0.01,
        snapshot_min_interval: float = 1.0,
        step_budget: float = 0.01,
        nvml_interval: float = 0.5,
        max_points: int = 2048,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < interval <= MAX_INTERVAL_S:  # also refuses nan and inf
            raise ValueError(f"interval={interval!r}: the sampling interval must be between 0 and "
                             f"{MAX_INTERVAL_S:g} seconds")
        if not 0 <= snapshot_budget < 1:
            raise ValueError(f"snapshot_budget={snapshot_budget!r} must be in [0, 1)")
        self.interval = float(interval)
        self.devices_requested = [devices] if isinstance(devices, int) else devices
        self.step_sync = step_sync
        self.step_budget = step_budget
        self.probe = Probe(nvml_interval=nvml_interval, clock=clock)
        self.budget = SnapshotBudget(snapshot_budget, snapshot_min_interval)
        self.timeline = Timeline(
            max_points=max_points, x_label="training step" if step_sync else "time (s)"
        )
        self.status = NO_TORCH
        self.degraded: str | None = None
        self.latest: dict[int | None, Sample] = {}
        self.steps = 0
        self.rounds = 0
        self.listener_errors = 0
        self.last_error: str | None = None
        self._cost_ms = 0.0
        self._sampled = 0
        self._listeners: list[Listener] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hooked = False
        self.steps_note: str | None = None
        """Why optimizer steps are not being counted (None while they are, or before start)."""
        self._stride = 1
        self._last_step_at: float | None = None
        self._step_interval: float | None = None
        self._started_at: float | None = None
        self._ran_s = 0.0  # time spent running in earlier start/stop periods

    # ------------------------------------------------------------- lifecycle
    @property
    def running(self) -> bool:
        with self._lock:
            if self._started_at is None:
                return False
            thread = self._thread
        if thread is not None and not thread.is_alive():  # the thread died: say so, once
            self.stop()
            return False
        return True

    def start(self) -> Sampler:
        """Begin sampling (idempotent). Never touches CUDA until the program has."""
        with self._lock:
            if self._started_at is not None:
                return self
            self._install_step_hook()  # raises in step mode without torch: nothing started
            self._started_at = self.probe.clock()
            self._stop.clear()
            if not self.step_sync:
                self._thread = threading.Thread(
                    target=self._run, name=f"{THREAD_PREFIX}-sampler", daemon=True
                )
                self._thread.start()
            _live.add(self)
            if not _atexit_registered.is_set():
                _atexit_registered.set()
                atexit.register(_stop_all_at_exit)
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Stop sampling, leave the step hook (idempotent); joins the thread.

        Safe from any thread, also while the training loop runs: torch's hook
        itself is only removed from the main thread (see ``step_hook``).
        """
        with self._lock:
            if self._started_at is None:
                return
            self._ran_s += self.probe.clock() - self._started_at
            self._started_at = None
            self._stop.set()
            thread, self._thread = self._thread, None
            hooked, self._hooked = self._hooked, False
        if hooked:
            step_hook.leave(self._on_step)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        _live.discard(self)

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(samples)`` after every round; returns a function that removes it."""
        with self._lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    # ------------------------------------------------------------- sampling
    def tick(self, step: int | None = None) -> list[Sample]:
        """One round over the devices: record into the timeline, tell listeners, return it."""
        status, torch = self.probe.status()
        if status != OK or torch is None:
            samples = [self.probe.status_sample(status, step)]
        else:
            samples = self._read_devices(torch, step)
        with self._lock:
            self.status = samples[0].status if samples else status
            self.rounds += 1
            for s in samples:
                self.latest[s.device] = s
                if s.status == OK:
                    self._sampled += 1
                    self._cost_ms += s.cost_ms
                    x = float(step) if self.step_sync and step is not None else s.t
                    self.timeline.add(x, s.values(), s.device)
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(samples)
            except Exception as exc:  # a broken view must not stop sampling
                self.listener_errors += 1
                self.last_error = f"listener failed: {exc!r}"
        return samples

    def _devices(self, torch: ModuleType) -> list[int]:
        if self.devices_requested is not None:
            return list(self.devices_requested)
        return self.probe.devices(torch)

    def _read_devices(self, torch: ModuleType, step: int | None) -> list[Sample]:
        self.degraded = self.probe.degraded(torch)
        if self.degraded is not None and self.budget.disabled is None:
            self.budget.disabled = self.degraded
        devices = self._devices(torch)
        per_device, snap_ms = self._snapshot_metrics(torch, devices)
        share = snap_ms / max(1, len(devices)) if snap_ms is not None else None
        return [
            self.probe.read(torch, d, snapshot=per_device.get(d), snapshot_ms=share, step=step)
            for d in devices
        ]

    def _snapshot_metrics(
        self, torch: ModuleType, devices: Iterable[int]
    ) -> tuple[dict[int, Metrics], float | None]:
        """Fragmentation per device from one trace-free snapshot, if the budget allows one now."""
        now = self.probe.clock()
        if not self.budget.due(now):
            return {}, None
        started = time.perf_counter()
        try:
            segments = torch_private.trace_free_snapshot(torch)
        except RuntimeError as exc:
            self.budget.disabled = f"memory_snapshot() failed: {exc}"
            return {}, None
        by_device: dict[int, list[Any]] = {d: [] for d in devices}
        for segment in segments:
            bucket = by_device.get(segment.get("device", 0))
            if bucket is not None:
                bucket.append(segment)
        result = {d: segment_metrics(segs) for d, segs in by_device.items()}
        seconds = time.perf_counter() - started
        self.budget.spent(self.probe.clock(), seconds)
        return result, seconds * 1e3

    def _run(self) -> None:
        """Thread body; if it ever ends by an error, :attr:`last_error` says why and it stops."""
        try:
            self._loop()
        except BaseException as exc:
            self.last_error = f"the sampler thread stopped: {type(exc).__name__}: {exc}"

    def _loop(self) -> None:
        """Tick every ``interval`` seconds until stopped."""
        next_at = self.probe.clock()
        while not self._stop.is_set():
            try:
                self.tick(self.steps or None)
            except Exception as exc:  # keep sampling through transient driver errors
                self.last_error = repr(exc)
            next_at += self.interval
            delay = next_at - self.probe.clock()
            if delay < 0:  # fell behind (a long snapshot, a GIL-heavy loop): don't burst
                next_at = self.probe.clock()
                delay = 0.0
            self._stop.wait(delay)

    # ------------------------------------------------------------- step hook
    def _install_step_hook(self) -> None:
        torch = torch_private.imported_torch()
        if torch is None:
            if self.step_sync:
                raise RuntimeError(
                    "step-synchronous monitoring needs torch imported first: import torch, "
                    "then start the monitor (it hooks torch.optim's global step hook)"
                )
            return
        step_hook.release_if_idle()
        self._hooked = step_hook.join(torch, self._on_step)
        if not self._hooked and self.step_sync:
            raise RuntimeError("this torch has no global optimizer step hook (needs torch >= 2.0)")
        self.steps_note = None if self._hooked else (
            f"steps not counted: torch {getattr(torch, '__version__', '?')} has no global "
            "optimizer step hook (needs torch >= 2.0)")

    def _on_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        """torch calls this after every ``optimizer.step()`` of any optimizer."""
        now = self.probe.clock()
        with self._lock:
            self.steps += 1
            step = self.steps
            if self._last_step_at is not None:
                gap = now - self._last_step_at
                self._step_interval = gap if self._step_interval is None else (
                    0.9 * self._step_interval + 0.1 * gap
                )
            self._last_step_at = now
        if not self.step_sync:
            self.timeline.step(now - self.probe.t0, step)
            return
        if (step - 1) % self._stride:
            return
        try:
            samples = self.tick(step)
        except Exception as exc:  # never break the user's training step
            self.last_error = repr(exc)
            return
        self._adapt_stride(samples)

    def _adapt_stride(self, samples: list[Sample]) -> None:
        """Sample every k-th step so that sampling stays within ``step_budget`` of step time."""
        if self._step_interval is None or self._step_interval <= 0 or self.step_budget <= 0:
            return
        cost_s = sum(s.cost_ms for s in samples) / 1e3
        needed = cost_s / (self.step_budget * self._step_interval)
        stride = 1
        while stride < needed and stride < 1 << 16:
            stride *= 2
        self._stride = stride

    def now_x(self) -> float:
        """The x a marker placed now gets: seconds since start, or the step count in step mode."""
        if self.step_sync:
            return float(self.steps)
        return self.probe.clock() - self.probe.t0

    # ------------------------------------------------------------- reporting
    def overhead(self) -> dict[str, float | int | str | None]:
        """What sampling cost so far: per-sample time, snapshot count/cost/duty, step stride."""
        with self._lock:
            elapsed = self._ran_s + (
                self.probe.clock() - self._started_at if self._started_at is not None else 0.0
            )
            return {
                "samples": self._sampled,
                "mean_sample_ms": self._cost_ms / self._sampled if self._sampled else None,
                "snapshots": self.budget.taken,
                "last_snapshot_ms": self.budget.last_ms,
                "snapshot_interval_s": self.budget.interval,
                "snapshot_duty": (self.budget.total_s / elapsed) if elapsed else None,
                "step_stride": self._stride,
                "steps": None if self.steps_note else self.steps,
                "steps_note": self.steps_note,
            }
