"""GPU facts from NVML, the one source that never initialises CUDA.

torch's ``get_device_name`` / ``mem_get_info`` initialise CUDA (and freeze the
allocator settings), so the panel reads names and memory from NVML instead.
Every function degrades to ``None`` when NVML or a GPU is missing (CI, laptops,
``pip install`` without ``nvidia-ml-py``), like nvitop's ``NA``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from allocconf_widget.core.dryrun.profiles import GpuProfile


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the driver sees it."""

    index: int
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int


@functools.lru_cache(maxsize=1)
def _nvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml


def _name(nvml: ModuleType, handle: object) -> str:
    name = nvml.nvmlDeviceGetName(handle)
    return name.decode() if isinstance(name, bytes) else str(name)


def gpus() -> list[GpuInfo] | None:
    """All GPUs NVML sees, or None when NVML is unavailable."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        result = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            result.append(GpuInfo(index, _name(nvml, handle), int(memory.total), int(memory.used),
                                  int(memory.free)))
    except Exception:
        return None
    return result


def process_used_bytes(index: int, pid: int | None = None) -> int | None:
    """Device memory this process holds on GPU ``index`` (context + every allocator), if visible.

    Inside containers NVML often reports no per-process usage (PID namespaces);
    None then, and callers fall back to device-wide figures.
    """
    nvml = _nvml()
    if nvml is None:
        return None
    pid = os.getpid() if pid is None else pid
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
    except Exception:
        return None
    return None


def runtime_profile(index: int = 0) -> GpuProfile | None:
    """The GPU this runtime has, as a dry-run profile (NVML only: CUDA does not start)."""
    from allocconf_widget.core.dryrun.profiles import match_name

    found = gpus()
    if not found or not 0 <= index < len(found):
        return None
    info = found[index]
    return match_name(info.name, info.total_bytes)
