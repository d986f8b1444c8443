"""The single home of every call into torch's private allocator API (the dry run's fake-tensor
machinery has its own package, ``adapters/dryrun/``).

Private names drift between releases (``_set_allocator_settings`` became a
deprecated wrapper of ``torch._C._accelerator_setAllocatorSettings`` in
2.10, ``_cuda_memorySnapshot`` gained an ``include_traces`` flag in 2.11 …),
so each function here feature-detects and degrades to ``None``/False rather
than raising. None of them imports torch: they act only on an already-imported
torch (``sys.modules``), because importing it ourselves would fix ``backend``
and could be the very thing the user did not want yet.

What each call does to the runtime was measured on a GPU
(``benchmarks/gpu/probe_runtime.py``; docs/lifecycle.md): ``get_allocator_backend`` and
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
    except Exception:  # a broken CUDA setup must not break looking
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


# ----------------------------------------------------------------- monitor and OOM assistant
# Added for the live monitor (adapters/sampler.py) and the OOM assistant
# (views/widgets/oom.py). Same rules: never import torch, never initialise CUDA.


def device_count(torch: ModuleType) -> int:
    """``torch.cuda.device_count()``: NVML-based where possible, initialises nothing.

    See docs/internals/allocator_facts.md §5.
    """
    if not cuda_built(torch):
        return 0
    try:
        return int(torch.cuda.device_count())
    except Exception:  # a broken driver must not break looking
        return 0


def current_device(torch: ModuleType) -> int:
    """The process's current CUDA device, once CUDA is initialised (0 before: nothing is touched)."""
    if not cuda_initialized(torch):
        return 0
    try:
        return int(torch.cuda.current_device())
    except (RuntimeError, AssertionError):
        return 0


def memory_stats(torch: ModuleType, device: int) -> dict[str, Any] | None:
    """Flat ``memory_stats(device)`` once CUDA is initialised (cheap); None before.

    Before initialisation torch returns ``{}`` anyway; checking first keeps us
    from ever being the caller that touches a device.
    """
    if not cuda_initialized(torch):
        return None
    try:
        return dict(torch.cuda.memory_stats(device))
    except (RuntimeError, AssertionError, ValueError):
        return None


def trace_free_snapshot(torch: ModuleType) -> list[dict[str, Any]]:
    """Every device's segments without the trace ring buffer (``include_traces=False``, 2.11+).

    Only called once CUDA is initialised (it would freeze the configuration
    otherwise). Costs milliseconds on a large allocator and holds the
    allocator lock, so callers budget it (docs/monitor.md). Raises ``RuntimeError`` under
    ``backend:cudaMallocAsync`` (no segments there).
    """
    if not cuda_initialized(torch):
        raise RuntimeError("CUDA is not initialised; a snapshot now would freeze the allocator settings")
    try:
        segments = torch.cuda.memory_snapshot(include_traces=False)
    except TypeError:  # torch < 2.11 has no include_traces
        segments = torch.cuda.memory_snapshot()
    return list(segments)


def full_snapshot(torch: ModuleType) -> dict[str, Any]:
    """``torch.cuda.memory._snapshot()`` with whatever history is being recorded.

    With stack history on this can take seconds (docs/internals/allocator_facts.md §8): call it once,
    on demand (the OOM assistant's Save button), never on a timer.
    """
    if not cuda_initialized(torch):
        raise RuntimeError("CUDA is not initialised: there is no allocator state to save")
    return dict(torch.cuda.memory._snapshot())


def record_history(torch: ModuleType, *, max_entries: int | None, stacks: str = "python") -> None:
    """Start (``max_entries``) or stop (None) torch's allocation-history ring buffer."""
    memory = torch.cuda.memory
    if max_entries is None:
        memory._record_memory_history(enabled=None)
    else:
        memory._record_memory_history(enabled="all", context=None, stacks=stacks,
                                      max_entries=max_entries)


def set_memory_metadata(torch: ModuleType, text: str) -> str | None:
    """Stamp ``text`` on the trace entries torch records from now (2.11+); returns the
    metadata it replaced (``""`` when none), or None when this torch cannot do it."""
    memory = torch.cuda.memory
    setter = getattr(memory, "_set_memory_metadata", None)
    getter = getattr(memory, "_get_memory_metadata", None)
    if setter is None or getter is None:
        return None
    try:
        previous = str(getter() or "")
        setter(text)
    except (RuntimeError, AttributeError, TypeError):
        return None
    return previous


def snapshot_with_history(torch: ModuleType) -> dict[str, Any]:
    """``torch.cuda.memory._snapshot()`` as it stands (the recorder's end-of-cell capture)."""
    return dict(torch.cuda.memory._snapshot())


def mem_get_info(torch: ModuleType, device: int) -> tuple[int, int] | None:
    """``(free, total)`` of a device this process already has a context on; None otherwise.

    ``mem_get_info`` initialises CUDA and would create a context on a device the
    program never used, so both are checked first.
    """
    if not cuda_initialized(torch):
        return None
    has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
    try:
        if has_context is not None and not has_context(device):
            return None
        free, total = torch.cuda.mem_get_info(device)
    except (RuntimeError, AssertionError, ValueError):
        return None
    return int(free), int(total)


def out_of_memory_error(torch: ModuleType) -> type[BaseException] | None:
    """``torch.OutOfMemoryError`` (2.4+), ``torch.cuda.OutOfMemoryError`` (1.13+), or None."""
    for owner in (torch, getattr(torch, "cuda", None)):
        error = getattr(owner, "OutOfMemoryError", None)
        if isinstance(error, type) and issubclass(error, BaseException):
            return error
    return None


def register_step_hook(torch: ModuleType, hook: Any) -> Any:
    """Register a global optimizer post-step hook (``hook(optimizer, args, kwargs)``).

    Returns torch's removable handle, or None when this torch has no global hook
    (< 2.0). ``torch.optim.optimizer`` is loaded by ``import torch``; we look it
    up in ``sys.modules`` rather than importing anything.
    """
    register = getattr(_optimizer_module(torch), "register_optimizer_step_post_hook", None)
    if register is None:
        return None
    return register(hook)


def _optimizer_module(torch: ModuleType) -> Any:
    """``torch.optim.optimizer``, the module. ``torch/optim/__init__.py`` deletes that name
    from the package (``del optimizer``), so ``torch.optim.optimizer`` is not it: two patches
    that looked it up that way silently did nothing."""
    return sys.modules.get("torch.optim.optimizer") or getattr(
        getattr(torch, "optim", None), "optimizer", None)


_oom_listeners: list[Any] = []
_oom_state = {"attached": False}


def _oom_trampoline(device: int, alloc: int, device_total: int, device_free: int) -> None:
    for listener in list(_oom_listeners):
        try:
            listener(device, alloc, device_total, device_free)
        except Exception:  # an observer must never turn an OOM into another error
            continue


def add_oom_listener(torch: ModuleType, listener: Any) -> bool:
    """Call ``listener(device, alloc, device_total_or_allowed, device_free)`` on every CUDA OOM.

    torch offers no way to detach an observer, so one trampoline is attached per
    process and listeners come and go from its list. Attaching initialises CUDA
    (docs/internals/allocator_facts.md §9), so this does nothing (returns False) until the program
    has initialised CUDA itself.
    """
    if not cuda_initialized(torch):
        return False
    return _attach_listener(torch, listener)


def _attach_listener(torch: ModuleType, listener: Any) -> bool:
    """Attach the one trampoline (once per process) and add ``listener`` to its list."""
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None:
        return False
    if not _oom_state["attached"]:
        attach(_oom_trampoline)
        _oom_state["attached"] = True
    if listener not in _oom_listeners:
        _oom_listeners.append(listener)
    return True


def remove_oom_listener(listener: Any) -> None:
    """Stop calling ``listener`` (the trampoline itself stays: torch cannot detach it)."""
    while listener in _oom_listeners:
        _oom_listeners.remove(listener)


# ----------------------------------------------------------------- flight recorder
# Added for the OOM flight recorder (adapters/flight_history.py). Same rules: never
# import torch, never initialise CUDA.


def start_history(torch: ModuleType, *, max_entries: int, python_stacks: bool) -> None:
    """Keep torch's allocation-history ring buffer (``_record_memory_history``), bounded.

    Trace only (``context=None``) records action, address, size, stream and time per
    entry; with ``python_stacks`` the allocation's Python frames are kept too
    (``context="alloc"``, which also tags live blocks; ``stacks="python"``: no C++
    unwinding, the expensive part). Raises ``RuntimeError`` where the backend keeps
    no history (``cudaMallocAsync``).
    """
    torch.cuda.memory._record_memory_history(
        enabled="all", context="alloc" if python_stacks else None, stacks="python",
        max_entries=max_entries)


def stop_history(torch: ModuleType) -> None:
    """Stop recording and drop the ring buffer (what ``enabled=None`` does)."""
    torch.cuda.memory._record_memory_history(enabled=None)


def call_at_cuda_init(torch: ModuleType, callback: Any) -> bool:
    """Run ``callback()`` right after torch initialises CUDA, before the first allocation.

    torch queues such calls itself (``torch.cuda._lazy_call``, how ``manual_seed``
    reaches devices that do not exist yet); when CUDA is already up it runs now.
    An exception from a queued call would break the user's CUDA initialisation, so
    the callback must not raise. False when this torch has no such queue.
    """
    lazy_call = getattr(torch.cuda, "_lazy_call", None)
    if lazy_call is None:
        return False
    lazy_call(callback)
    return True


def attach_oom_listener_during_init(torch: ModuleType, listener: Any) -> bool:
    """:func:`add_oom_listener` from a :func:`call_at_cuda_init` callback.

    Inside torch's initialisation ``is_initialized()`` is still False although the
    driver is up (``_cuda_init`` ran), so the check of :func:`add_oom_listener` is
    skipped here; attaching then initialises nothing that is not initialised.
    """
    return _attach_listener(torch, listener)


def snapshot_at_oom(torch: ModuleType) -> dict[str, Any]:
    """``torch.cuda.memory._snapshot()`` from inside torch's OOM observer.

    torch calls observers after it wrote the ``oom`` trace entry and released the
    allocator lock, before it raises: the snapshot holds the segments as they were
    and the history that led there. It is built in host memory, so it cannot cause
    a second GPU out-of-memory error.
    """
    return dict(torch.cuda.memory._snapshot())


def memory_fraction(torch: ModuleType, device: int) -> float | None:
    """``torch.cuda.get_per_process_memory_fraction`` (2.8+) once CUDA is up; None otherwise."""
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if getter is None or not cuda_initialized(torch):
        return None
    try:
        return float(getter(device))
    except (RuntimeError, AssertionError, ValueError, TypeError):
        return None


def memory_viz_html(torch: ModuleType, snapshot: Any, kind: str) -> str:
    """PyTorch's own viewer page (``torch.cuda._memory_viz``) for ``snapshot``.

    ``kind`` is ``"trace"`` (``trace_plot``: the allocation timeline) or ``"segments"``
    (``segment_plot``). The page embeds the snapshot and loads its script
    (MemoryViz.js) from cdn.jsdelivr.net, so it needs the internet to draw.
    """
    viz = getattr(torch.cuda, "_memory_viz", None)
    if viz is None:  # a submodule torch does not import by itself; torch is already here
        import importlib

        viz = importlib.import_module("torch.cuda._memory_viz")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if kind == "segments":
            return str(viz.segment_plot(snapshot))
        return str(viz.trace_plot(snapshot))
