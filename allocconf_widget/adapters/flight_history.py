"""The OOM flight recorder's hold on torch: keep the allocation history, catch the OOM.

torch keeps allocation history in a bounded ring buffer once asked
(``_record_memory_history``) and calls observers at the moment an allocation
fails, after it wrote the ``oom`` entry and before it raises. This adapter keeps
that ring buffer running across cells while the user wants it, and takes the
snapshot from inside the observer, so the OOM view later shows the segments as
they were and the history that led there.

One per process (torch's ring buffer is process-wide). Nothing is saved: a new
kernel starts with the recorder off. Looking (:meth:`FlightHistory.status`)
never imports torch and never initialises CUDA. Turning it on before CUDA is up
*arms* it: before ``import torch`` a one-shot import watcher waits for torch;
then torch's own queue of calls at CUDA initialisation starts the history right
after CUDA starts, before the first allocation. Every private torch call goes
through :mod:`allocconf_widget.adapters.torch_private`.
"""

from __future__ import annotations

import contextlib
import enum
import importlib.abc
import importlib.machinery
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from allocconf_widget.adapters import torch_private
from allocconf_widget.adapters.fraction_calls import FractionCallLog
from allocconf_widget.core.sim.limits import FRACTION_CHANGES_KEY

#: Default ring-buffer size. 100k entries is ~80 training steps of a 6-layer transformer
#: (~1,200 entries per step); the memory bound is in docs/flight.md.
DEFAULT_MAX_ENTRIES = 100_000
MIN_ENTRIES, MAX_ENTRIES = 1_000, 10_000_000
_ASYNC = re.compile(r"backend\s*:\s*cudaMallocAsync")
_ASYNC_LINE = ("backend:cudaMallocAsync keeps no allocation history (the driver's pool has no "
               "ring buffer): the flight recorder cannot record; the OOM view still shows the "
               "breakdown and advice")


class Mode(enum.Enum):
    """Where the recorder stands."""

    OFF = "off"
    WAITING_FOR_TORCH = "armed: starts when torch is imported and CUDA starts"
    WAITING_FOR_CUDA = "armed: starts when CUDA starts (before the first allocation)"
    RECORDING = "recording"
    UNSUPPORTED = "unavailable"


@dataclass(frozen=True)
class FlightSettings:
    """How much history to keep: ``max_entries`` ring-buffer entries, Python stacks or not."""

    max_entries: int = DEFAULT_MAX_ENTRIES
    python_stacks: bool = False

    def __post_init__(self) -> None:
        if not MIN_ENTRIES <= self.max_entries <= MAX_ENTRIES:
            raise ValueError(f"max_entries={self.max_entries:,} is out of range: use "
                             f"{MIN_ENTRIES:,} to {MAX_ENTRIES:,} (default {DEFAULT_MAX_ENTRIES:,})")

    def describe(self) -> str:
        stacks = "with Python stacks" if self.python_stacks else "trace only, no stacks"
        return f"last {self.max_entries:,} allocator events, {stacks}"


@dataclass(frozen=True)
class FlightStatus:
    """What ``%allocconf flight status`` says; built without touching CUDA."""

    mode: Mode
    settings: FlightSettings
    line: str
    last_capture_at: float | None = None

    @property
    def on(self) -> bool:
        """The user asked for it and it records or is armed to."""
        return self.mode in (Mode.RECORDING, Mode.WAITING_FOR_CUDA, Mode.WAITING_FOR_TORCH)


@dataclass(frozen=True)
class OomCapture:
    """What was taken at one CUDA out-of-memory error.

    ``limit`` is what torch's observer reports: the memory-fraction cap when one is
    set, else the device's capacity. ``when`` says whether the snapshot came from
    inside the observer (``"at the OOM"``) or after the cell failed.
    """

    snapshot: dict[str, Any]
    device: int
    requested: int | None
    limit: int | None
    device_free: int | None
    device_total: int | None
    fraction: float | None
    stats: dict[str, Any] | None
    settings: FlightSettings
    torch_version: str | None
    when: str = "at the OOM"
    seconds: float = 0.0
    at: float = field(default_factory=time.time)
    notes: tuple[str, ...] = ()
    message: str = ""  # torch's OOM message, once the failed cell has been seen

    @property
    def events(self) -> int:
        traces = self.snapshot.get("device_traces") or []
        return len(traces[self.device]) if self.device < len(traces) else 0

    @property
    def non_pytorch_bytes(self) -> int:
        """Device memory in use outside this allocator at the OOM (context, libraries, others)."""
        if self.device_total is None or self.device_free is None:
            return 0
        reserved = int((self.stats or {}).get("reserved_bytes.all.current", 0) or 0)
        return max(0, self.device_total - self.device_free - reserved)


class _TorchImportWatcher(importlib.abc.MetaPathFinder):
    """Calls ``callback(torch)`` once ``import torch`` has finished executing, then leaves."""

    def __init__(self, callback: Callable[[ModuleType], None]) -> None:
        self.callback = callback

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        del target  # part of the finder protocol; torch is never reloaded through us
        if fullname != "torch":
            return None
        self.remove()
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader
        spec.loader = _AfterExecLoader(original, self.callback)
        return spec

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def remove(self) -> None:
        while self in sys.meta_path:
            sys.meta_path.remove(self)


class _AfterExecLoader(importlib.abc.Loader):
    """Runs the real loader, puts it back on the module, then calls the callback."""

    def __init__(self, loader: Any, callback: Callable[[ModuleType], None]) -> None:
        self.loader, self.callback = loader, callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self.loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        if spec is not None:
            spec.loader = self.loader
        module.__loader__ = self.loader
        self.loader.exec_module(module)
        with contextlib.suppress(Exception):  # never break the user's `import torch`
            self.callback(module)


class FlightHistory:
    """The process's flight recorder state (use :func:`flight_history`)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.mode = Mode.OFF
        self.settings = FlightSettings()
        self.reason = ""
        self._generation = 0
        self._listening = False
        self._watcher: _TorchImportWatcher | None = None
        self._capture: OomCapture | None = None
        self.capture_errors: list[str] = []
        self.on_capture: list[Callable[[OomCapture], None]] = []
        # the program's set_per_process_memory_fraction calls while recording: the allocator
        # writes no trace entry for them, and a what-if of the capture replays them
        self._fraction_calls = FractionCallLog()

    # ------------------------------------------------------------- on / off / status
    def turn_on(self, settings: FlightSettings | None = None) -> FlightStatus:
        """Record now if CUDA is up, else arm; never imports torch or initialises CUDA."""
        with self._lock:
            if settings is not None:
                if self.mode is Mode.RECORDING and settings != self.settings:
                    self._stop_torch()
                self.settings = settings
            self._generation += 1
            self.reason = ""
            torch = torch_private.imported_torch()
            if torch is None:
                if any(_ASYNC.search(os.environ.get(v, "")) for v in
                       ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")):
                    self._unsupported(_ASYNC_LINE)
                else:
                    self.mode = Mode.WAITING_FOR_TORCH
                    self._watch_import()
            else:
                self._arm(torch)
            return self.status()

    def turn_off(self) -> FlightStatus:
        """Stop recording, drop the ring buffer, stop listening; the last capture stays."""
        with self._lock:
            self._generation += 1
            if self._watcher is not None:
                self._watcher.remove()
                self._watcher = None
            if self.mode is Mode.RECORDING:
                self._stop_torch()
            self._stop_listening()
            self._fraction_calls.remove()
            self._fraction_calls.clear()
            self.mode, self.reason = Mode.OFF, ""
            return self.status()

    def status(self) -> FlightStatus:
        """The current state in one line (reads only; CUDA is never initialised here)."""
        with self._lock:
            at = self._capture.at if self._capture is not None else None
            line = {
                Mode.OFF: "flight recorder off",
                Mode.WAITING_FOR_TORCH: "flight recorder armed: it starts recording when torch is "
                                        "imported and CUDA starts (nothing initialised now)",
                Mode.WAITING_FOR_CUDA: "flight recorder armed: it starts recording when CUDA "
                                       "starts, before the first allocation (nothing initialised now)",
                Mode.RECORDING: "flight recorder on",
                Mode.UNSUPPORTED: f"flight recorder unavailable: {self.reason}",
            }[self.mode]
            if self.mode is not Mode.OFF and self.mode is not Mode.UNSUPPORTED:
                line += f": {self.settings.describe()}"
            return FlightStatus(self.mode, self.settings, line, at)

    # ------------------------------------------------------------- captures
    def last_capture(self) -> OomCapture | None:
        with self._lock:
            return self._capture

    def take_capture(self, since: float | None = None) -> OomCapture | None:
        """The capture (taken after ``since``, a ``time.time()``), handed over once."""
        with self._lock:
            capture = self._capture
            if capture is None or (since is not None and capture.at < since):
                return None
            return capture

    def capture_after_cell(self, device: int = 0) -> OomCapture | None:
        """When the observer did not fire: snapshot now, after the cell failed (history intact)."""
        torch = torch_private.imported_torch()
        if self.mode is not Mode.RECORDING or torch is None:
            return None
        capture = self._take(torch, device, None, None, None,
                             when="after the cell (torch's OOM observer did not report it)")
        if capture is not None:
            with self._lock:
                self._capture = capture
        return capture

    def clear_capture(self) -> None:
        """Drop the last capture (its snapshot can be tens of MiB of host memory)."""
        with self._lock:
            self._capture = None

    def set_capture(self, capture: OomCapture | None) -> None:
        """Hold ``capture`` as the last one (tests use a recorded one); None forgets it."""
        with self._lock:
            self._capture = capture

    # ------------------------------------------------------------- the recorder's cell
    def after_recording(self, torch: ModuleType) -> None:
        """``%%allocconf record`` used the ring buffer: restart ours, or stop it if we are off."""
        with self._lock:
            if self.mode is Mode.RECORDING:
                try:
                    self._start_torch(torch)
                    return
                except RuntimeError as exc:
                    self._unsupported(str(exc))
            torch_private.stop_history(torch)

    # ------------------------------------------------------------- internals
    def _watch_import(self) -> None:
        if self._watcher is None:
            generation = self._generation

            def imported(torch: ModuleType) -> None:
                with self._lock:
                    self._watcher = None
                    if generation == self._generation and self.mode is Mode.WAITING_FOR_TORCH:
                        self._arm(torch)

            self._watcher = _TorchImportWatcher(imported)
        self._watcher.install()

    def _arm(self, torch: ModuleType) -> None:
        if not torch_private.cuda_built(torch):
            self._unsupported("this torch is a CPU-only build (no CUDA allocator to record)")
            return
        if torch_private.load_time_backend(torch) == "cudaMallocAsync":
            self._unsupported(_ASYNC_LINE)
            return
        if torch_private.cuda_initialized(torch):
            self._start_now(torch, during_init=False)
            return
        generation = self._generation

        def at_cuda_init() -> None:
            try:
                with self._lock:
                    if generation == self._generation and self.mode is Mode.WAITING_FOR_CUDA:
                        self._start_now(torch, during_init=True)
            except Exception:  # a queued call that raises would break the user's CUDA start
                pass

        self.mode = Mode.WAITING_FOR_CUDA
        if not torch_private.call_at_cuda_init(torch, at_cuda_init):
            self._unsupported("this torch cannot run a call when CUDA starts; turn the recorder "
                              "on again once CUDA is up")

    def _start_now(self, torch: ModuleType, *, during_init: bool) -> None:
        if torch_private.load_time_backend(torch) == "cudaMallocAsync":
            self._unsupported(_ASYNC_LINE)
            return
        try:
            self._start_torch(torch)
        except RuntimeError as exc:
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self._unsupported(_ASYNC_LINE if "cudaMallocAsync" in text else
                              f"torch refused to record history ({text[:200]})")
            return
        self.mode = Mode.RECORDING
        self._fraction_calls.install(torch)
        if not self._listening:
            attach = (torch_private.attach_oom_listener_during_init if during_init
                      else torch_private.add_oom_listener)
            self._listening = attach(torch, self._on_oom)

    def _start_torch(self, torch: ModuleType) -> None:
        torch_private.start_history(torch, max_entries=self.settings.max_entries,
                                    python_stacks=self.settings.python_stacks)

    def _stop_torch(self) -> None:
        torch = torch_private.imported_torch()
        if torch is not None:
            with contextlib.suppress(RuntimeError):
                torch_private.stop_history(torch)

    def _stop_listening(self) -> None:
        if self._listening:
            torch_private.remove_oom_listener(self._on_oom)
            self._listening = False

    def _unsupported(self, reason: str) -> None:
        self.mode, self.reason = Mode.UNSUPPORTED, reason
        self._stop_listening()
        self._fraction_calls.remove()

    def _on_oom(self, device: int, alloc: int, limit: int, device_free: int) -> None:
        """torch's observer (GIL held, allocator lock released): snapshot, never raise."""
        if self.mode is not Mode.RECORDING:
            return
        torch = torch_private.imported_torch()
        if torch is None:
            return
        capture = self._take(torch, device, alloc, limit, device_free, when="at the OOM")
        if capture is None:
            return
        with self._lock:
            self._capture = capture
        for callback in list(self.on_capture):
            try:
                callback(capture)
            except Exception:
                continue

    def _take(self, torch: ModuleType, device: int, alloc: int | None, limit: int | None,
              device_free: int | None, *, when: str) -> OomCapture | None:
        started = time.perf_counter()
        try:
            snapshot = torch_private.snapshot_at_oom(torch)
        except Exception as exc:  # an observer must never turn an OOM into another error
            self.capture_errors.append(f"{type(exc).__name__}: {exc}"[:300])
            return None
        seconds = time.perf_counter() - started
        fraction_calls = self._fraction_calls.calls()
        if fraction_calls and isinstance(snapshot, dict):
            # the replay applies them where they happened (core/sim/limits.py)
            snapshot[FRACTION_CHANGES_KEY] = fraction_calls
        stats = torch_private.memory_stats(torch, device)
        info = torch_private.mem_get_info(torch, device)
        total = info[1] if info is not None else None
        if device_free is None and info is not None:
            device_free = info[0]
        fraction = torch_private.memory_fraction(torch, device)
        if fraction is None and limit is not None and total and limit < total:
            fraction = limit / total
        if fraction is not None and fraction >= 1.0:
            fraction = None
        if limit is None and total is not None:
            limit = int(total * fraction) if fraction is not None else total
        return OomCapture(snapshot, device, alloc, limit, device_free, total, fraction, stats,
                          self.settings, str(getattr(torch, "__version__", "")) or None,
                          when=when, seconds=seconds)


_HISTORY = FlightHistory()


def flight_history() -> FlightHistory:
    """The process-wide recorder."""
    return _HISTORY
