"""The monitor's one choke point for reading allocator memory: :class:`Probe` and :func:`sample`.

Every reading the monitor makes, in every mode (background thread, optimizer
step hook, a one-off :func:`sample`), goes through :meth:`Probe.read`, which
returns a :class:`Sample` whose figures are ``None`` when unavailable (nvitop's
``NA`` idea). It touches torch only through :mod:`allocconf_widget.adapters.torch_private`
and only once the program has initialised CUDA itself; NVML readings are rate
limited; :class:`SnapshotBudget` decides when a trace-free snapshot may be
taken. No ipywidgets, plotly or IPython here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from allocconf_widget.adapters import nvml, torch_private
from allocconf_widget.core.memory.metrics import Metrics, cached_share

OK = "ok"
WAITING = "waiting_for_cuda"
NO_TORCH = "torch_not_imported"
NO_CUDA = "no_cuda"
ERROR = "error"

STATUS_TEXT = {
    OK: "sampling",
    WAITING: "waiting for CUDA: sampling starts when your code first uses the GPU",
    NO_TORCH: "waiting for torch to be imported",
    NO_CUDA: "this torch build has no CUDA",
    ERROR: "reading memory statistics failed",
}

ASYNC_NOTE = (
    "backend:cudaMallocAsync: no segment snapshot (so no fragmentation figure) and only "
    "reserved/allocated are reported by memory_stats(); the rest is shown as unavailable"
)


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of one device. Every figure is ``None`` when it could not be had.

    Attributes:
        t: seconds since the sampler (or probe) started, monotonic clock.
        wall: ``time.time()`` of the reading (for exports).
        device: CUDA device index, or None for a status-only sample.
        status: :data:`OK`, :data:`WAITING`, :data:`NO_TORCH`, :data:`NO_CUDA`, :data:`ERROR`.
        non_pytorch_source: ``"process"`` (NVML per-process usage), ``"device"``
            (device-wide used memory, so other processes are included), or None.
        fragmentation: external fragmentation (1 − largest free block / cached free)
            from a snapshot taken for this sample; None on samples without one.
        cost_ms: what producing this sample cost (stats + NVML + snapshot share).
        step: optimizer step number in step-synchronous mode.
        degraded: why some figures are missing (e.g. ``backend:cudaMallocAsync``).
    """

    t: float
    wall: float
    device: int | None
    status: str
    reserved: int | None = None
    allocated: int | None = None
    active: int | None = None
    requested: int | None = None
    inactive_split: int | None = None
    reserved_peak: int | None = None
    allocated_peak: int | None = None
    num_alloc_retries: int | None = None
    num_ooms: int | None = None
    non_pytorch: int | None = None
    non_pytorch_source: str | None = None
    device_total: int | None = None
    fragmentation: float | None = None
    largest_free_block: int | None = None
    segments: int | None = None
    snapshot_ms: float | None = None
    cost_ms: float = 0.0
    step: int | None = None
    degraded: str | None = None

    @property
    def cached_share(self) -> float | None:
        """``(reserved − allocated) / reserved``: memory PyTorch holds but no tensor uses."""
        return cached_share(self.reserved, self.allocated)

    @property
    def message(self) -> str:
        """Human text for the status line."""
        return STATUS_TEXT.get(self.status, self.status)

    def values(self) -> dict[str, float | None]:
        """The timeline's series values for this sample."""
        return {
            "reserved": _f(self.reserved),
            "allocated": _f(self.allocated),
            "active": _f(self.active),
            "requested": _f(self.requested),
            "non_pytorch": _f(self.non_pytorch),
            "cached_share": self.cached_share,
            "fragmentation": self.fragmentation,
        }


def _f(value: int | None) -> float | None:
    return None if value is None else float(value)


def _stat(stats: dict[str, Any], key: str) -> int | None:
    value = stats.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


# ----------------------------------------------------------------- NVML, rate limited


def _nvml_index(cuda_index: int, environ: dict[str, str] | os._Environ[str] = os.environ) -> int | None:
    """NVML's index of CUDA device ``cuda_index`` (CUDA_VISIBLE_DEVICES renumbers devices).

    UUID/MIG lists cannot be mapped without more NVML calls: None (no NVML figure).
    """
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return cuda_index
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    if cuda_index >= len(parts) or not parts[cuda_index].isdigit():
        return None
    return int(parts[cuda_index])


@dataclass
class _NvmlCache:
    """NVML readings refreshed at most every ``interval`` seconds."""

    interval: float
    at: float = -1e9
    used: dict[int, tuple[int | None, int | None, int | None]] = field(default_factory=dict)

    def get(self, cuda_index: int, now: float) -> tuple[int | None, int | None, int | None]:
        """``(process_used, device_used, device_total)`` for one CUDA device."""
        if now - self.at >= self.interval:
            self.at = now
            self.used.clear()
        if cuda_index not in self.used:
            self.used[cuda_index] = _read_nvml(cuda_index)
        return self.used[cuda_index]


def _read_nvml(cuda_index: int) -> tuple[int | None, int | None, int | None]:
    index = _nvml_index(cuda_index)
    if index is None:
        return None, None, None
    process = nvml.process_used_bytes(index)
    found = nvml.gpus()
    gpu = next((g for g in found or [] if g.index == index), None)
    if gpu is None:
        return process, None, None
    return process, gpu.used_bytes, gpu.total_bytes


# ----------------------------------------------------------------- the probe (choke point)


class Probe:
    """Reads one device at a time; holds the NVML cache and the backend facts.

    ``read`` is the only place the monitor touches torch: every reading of
    every mode (thread, step hook, one-off :func:`sample`) goes through it.
    """

    def __init__(self, *, nvml_interval: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.t0 = clock()
        self._nvml = _NvmlCache(nvml_interval)
        self._backend: str | None = None

    def status(self) -> tuple[str, ModuleType | None]:
        """Where torch stands, without touching CUDA."""
        torch = torch_private.imported_torch()
        if torch is None:
            return NO_TORCH, None
        if not torch_private.cuda_built(torch):
            return NO_CUDA, torch
        if not torch_private.cuda_initialized(torch):
            return WAITING, torch
        return OK, torch

    def backend(self, torch: ModuleType) -> str | None:
        if self._backend is None:
            self._backend = torch_private.load_time_backend(torch)
        return self._backend

    def degraded(self, torch: ModuleType) -> str | None:
        return ASYNC_NOTE if self.backend(torch) == "cudaMallocAsync" else None

    def devices(self, torch: ModuleType) -> list[int]:
        return list(range(torch_private.device_count(torch)))

    def status_sample(self, status: str, step: int | None = None) -> Sample:
        return Sample(self.clock() - self.t0, time.time(), None, status, step=step)

    def read(
        self,
        torch: ModuleType,
        device: int,
        *,
        snapshot: Metrics | None = None,
        snapshot_ms: float | None = None,
        step: int | None = None,
    ) -> Sample:
        """One reading of ``device`` (CUDA must already be initialised by the program)."""
        started = time.perf_counter()
        now = self.clock()
        stats = torch_private.memory_stats(torch, device)
        if stats is None:
            return Sample(now - self.t0, time.time(), device, ERROR, step=step)
        degraded = self.degraded(torch)
        full = degraded is None
        reserved = _stat(stats, "reserved_bytes.all.current")
        non_pytorch, source, total = self._outside(torch, device, reserved, now)
        sample = Sample(
            t=now - self.t0,
            wall=time.time(),
            device=device,
            status=OK,
            reserved=reserved,
            allocated=_stat(stats, "allocated_bytes.all.current"),
            active=_stat(stats, "active_bytes.all.current") if full else None,
            requested=_stat(stats, "requested_bytes.all.current") if full else None,
            inactive_split=_stat(stats, "inactive_split_bytes.all.current") if full else None,
            reserved_peak=_stat(stats, "reserved_bytes.all.peak"),
            allocated_peak=_stat(stats, "allocated_bytes.all.peak"),
            num_alloc_retries=_stat(stats, "num_alloc_retries") if full else None,
            num_ooms=_stat(stats, "num_ooms"),
            non_pytorch=non_pytorch,
            non_pytorch_source=source,
            device_total=total,
            step=step,
            degraded=degraded,
        )
        if snapshot is not None:
            sample = replace(
                sample,
                fragmentation=snapshot.external_fragmentation,
                largest_free_block=snapshot.largest_free_block_bytes,
                segments=snapshot.segment_count,
                snapshot_ms=snapshot_ms,
            )
        cost = (time.perf_counter() - started) * 1e3 + (snapshot_ms or 0.0)
        return replace(sample, cost_ms=cost)

    def _outside(
        self, torch: ModuleType, device: int, reserved: int | None, now: float
    ) -> tuple[int | None, str | None, int | None]:
        """Memory outside PyTorch's allocator: this process (NVML) or the whole device."""
        process, device_used, total = self._nvml.get(device, now)
        if reserved is None:
            return None, None, total
        if process is not None:
            return max(0, process - reserved), "process", total
        if device_used is None:
            info = self._mem_info(torch, device)
            if info is not None:
                free, total = info
                device_used = total - free
        if device_used is None:
            return None, None, total
        return max(0, device_used - reserved), "device", total

    def _mem_info(self, torch: ModuleType, device: int) -> tuple[int, int] | None:
        key = -1 - device  # stored beside the NVML figures, refreshed as rarely
        cached = self._nvml.used.get(key)
        if cached is None:
            info = torch_private.mem_get_info(torch, device)
            cached = (info[0], info[1], None) if info else (None, None, None)
            self._nvml.used[key] = cached
        free, total, _ = cached
        return None if free is None or total is None else (free, total)


_default_probe: Probe | None = None


def sample(device: int = 0) -> Sample:
    """One synchronous reading of ``device`` right now (no snapshot); never initialises CUDA."""
    global _default_probe  # noqa: PLW0603 - one lazily made probe keeps NVML rate limiting shared
    if _default_probe is None:
        _default_probe = Probe()
    status, torch = _default_probe.status()
    if status != OK or torch is None:
        return _default_probe.status_sample(status)
    return _default_probe.read(torch, device)


# ----------------------------------------------------------------- snapshot budget


@dataclass
class SnapshotBudget:
    """Decides when the next trace-free snapshot may be taken (duty cycle ≤ ``fraction``)."""

    fraction: float = 0.01
    min_interval: float = 1.0
    next_at: float = 0.0
    taken: int = 0
    total_s: float = 0.0
    last_ms: float | None = None
    disabled: str | None = None

    def due(self, now: float) -> bool:
        return self.disabled is None and self.fraction > 0 and now >= self.next_at

    def spent(self, now: float, seconds: float) -> None:
        """Account for one snapshot; push the next one out in proportion to its cost."""
        self.taken += 1
        self.total_s += seconds
        self.last_ms = seconds * 1e3
        self.next_at = now + max(self.min_interval, seconds / self.fraction)

    @property
    def interval(self) -> float | None:
        """Current spacing between snapshots, seconds (None until one was taken)."""
        if self.last_ms is None:
            return None
        return max(self.min_interval, self.last_ms / 1e3 / self.fraction)
