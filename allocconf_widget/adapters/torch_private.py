"""The single home of every call into torch's private allocator API.

Private names drift between releases (``_set_allocator_settings`` became a
deprecated wrapper of ``torch._C._accelerator_setAllocatorSettings`` in
2.10, ``_cuda_memorySnapshot`` gained an ``include_traces`` flag in 2.11 …),
so each function here feature-detects and degrades to ``None``/False rather
than raising. None of them imports torch: they act only on an already-imported
torch (``sys.modules``), because importing it ourselves would fix ``backend``
and could be the very thing the user did not want yet.

What each call does to the runtime was measured on an H200 with torch 2.11
(``benchmarks/gpu/probe_runtime.py``): ``get_allocator_backend`` and
``_accelerator_isAllocatorInitialized`` leave the configuration open;
``memory_snapshot`` freezes it without any flag showing it; the setter works
before CUDA initialisation and does not initialise CUDA.
"""

from __future__ import annotations

import sys
import warnings
from types import ModuleType
from typing import Any


def imported_torch() -> ModuleType | None:
    """torch if the user (or a library) already imported it; we never import it here."""
    return sys.modules.get("torch")


def cuda_built(torch: ModuleType) -> bool:
    """True for CUDA and ROCm builds; False for CPU-only wheels."""
    version = getattr(torch, "version", None)
    return bool(getattr(version, "cuda", None) or getattr(version, "hip", None))


def cuda_initialized(torch: ModuleType) -> bool:
    """``torch.cuda.is_initialized()``: cheap, initialises nothing."""
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a broken CUDA setup must not break looking
        return False


def allocator_initialized(torch: ModuleType) -> bool | None:
    """Whether per-device allocators exist (2.9+); None when torch cannot say.

    Note: it stays False after ``memory_snapshot()`` even though that call
    already froze the configuration (measured, torch 2.11).
    """
    probe = getattr(torch._C, "_accelerator_isAllocatorInitialized", None)
    if probe is None or not cuda_built(torch):
        return None
    try:
        return bool(probe())
    except RuntimeError:
        return None


def load_time_backend(torch: ModuleType) -> str | None:
    """The backend chosen when torch was imported (``native`` / ``cudaMallocAsync``)."""
    getter = getattr(torch._C, "_cuda_getAllocatorBackend", None)
    if getter is None:
        return None
    try:
        return str(getter())
    except RuntimeError:
        return None


def has_setter(torch: ModuleType) -> bool:
    """Whether this torch can change allocator settings at run time."""
    return _setter(torch) is not None


def _setter(torch: ModuleType) -> Any:
    new = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if new is not None:
        return new
    return getattr(torch._C, "_cuda_cudaCachingAllocator_set_allocator_settings", None)


def set_allocator_settings(torch: ModuleType, text: str) -> None:
    """Call torch's runtime setter with ``text`` (raises what torch raises)."""
    setter = _setter(torch)
    if setter is None:
        raise RuntimeError("this torch build has no runtime allocator setter")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        setter(text)


def last_settings_string(torch: ModuleType) -> str | None:
    """``_accelerator_getAllocatorSettings()`` (2.12+), only once the allocator is live.

    Calling it earlier would make torch parse the environment now, freezing it.
    """
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    if getter is None or not (cuda_initialized(torch) or allocator_initialized(torch)):
        return None
    try:
        return str(getter())
    except RuntimeError:
        return None


def effective_settings(torch: ModuleType) -> dict[str, Any] | None:
    """The parsed settings torch uses (``allocator_settings`` of a snapshot), if live.

    Uses the trace-free snapshot where the binding takes the flag (2.11+), so a
    process with allocation history enabled does not pay for copying it.
    """
    if not cuda_built(torch) or not cuda_initialized(torch):
        return None
    snapshot_fn = getattr(torch._C, "_cuda_memorySnapshot", None)
    if snapshot_fn is None:
        return None
    for argument in ((0, 0, False), None):
        try:
            snapshot = snapshot_fn(argument)
        except (TypeError, RuntimeError):
            continue
        settings = snapshot.get("allocator_settings") if isinstance(snapshot, dict) else None
        return dict(settings) if isinstance(settings, dict) else None
    return None


def stats_max_split(torch: ModuleType, device: int = 0) -> int | None:
    """``memory_stats()["max_split_size"]``: the value set when the allocator was built."""
    if not cuda_initialized(torch):
        return None
    try:
        value = torch.cuda.memory_stats(device).get("max_split_size")
    except (RuntimeError, AssertionError):
        return None
    return None if value is None else int(value)


def set_memory_fraction(torch: ModuleType, fraction: float) -> list[int]:
    """``set_per_process_memory_fraction`` on every device whose allocator is live.

    The ``per_process_memory_fraction`` key is read only when an allocator is
    built, so once CUDA runs this public call is the way to change the cap.
    Returns the devices changed. Only called when CUDA is already initialised.
    """
    if not cuda_initialized(torch):
        return []
    has_context = getattr(torch._C, "_cuda_hasPrimaryContext", lambda _index: True)
    changed = []
    for device in range(torch.cuda.device_count()):
        if has_context(device):  # never create a context on a GPU the program does not use
            torch.cuda.set_per_process_memory_fraction(fraction, device)
            changed.append(device)
    return changed
