"""The single home of every call into torch's private allocator API.

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

import contextlib
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


# ---------------------------------------------------------------- the dry run (fake CUDA tensors)
# adapters/dryrun.py runs user code on FakeTensorMode's fake "cuda" tensors; the fake-tensor
# machinery is private, so every name it needs is reached through here.

def dispatch_keys_preserved(torch: ModuleType) -> Any:
    """torch's ``_PreserveDispatchKeyGuard``: the thread's dispatch-key sets (what is included,
    such as Meta while a fake op runs, and excluded, such as Autograd below it) as they were on
    entry, put back on exit. A Ctrl-C between a fake op's context manager entering and its
    ``with`` taking hold left that generator suspended; finalized later, its own guard restored
    the sets of *inside* an op, and autograd stopped working in the user's next training step.
    A no-op context where torch lacks it."""
    guard = getattr(getattr(torch, "_C", None), "_PreserveDispatchKeyGuard", None)
    return guard() if guard is not None else contextlib.nullcontext()


def fake_cuda_mode() -> Any:
    """A ``FakeTensorMode`` that turns real tensors it meets into fakes (a model built on the CPU
    before the dry run can be moved to "cuda" inside it), and never touches the GPU.

    FakeTensorMode avoids the device only where no GPU is visible (``avoid_device_init``).
    With one, it *constant-propagates*: a one-element tensor made by ``torch.tensor`` (BatchNorm's
    ``num_batches_tracked``, the scalars transformers builds) keeps a real value, and moving it
    to "cuda" ran the real copy on the GPU from C++. That started the CUDA runtime and the
    caching allocator, which read and froze ``PYTORCH_CUDA_ALLOC_CONF``, while Python's
    ``torch.cuda.is_initialized()`` stayed False (``benchmarks/gpu/probe_freeze.py``; a
    BatchNorm2d forward alone froze the settings). The
    subclass always answers True, as on a machine without a GPU: constants are not copied to
    the device, and ``torch.tensor(..., device="cuda")`` stays fake.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    class DeviceFreeFakeTensorMode(FakeTensorMode):
        @property
        def avoid_device_init(self) -> bool:
            return True

        @avoid_device_init.setter
        def avoid_device_init(self, _value: bool) -> None:
            """Releases that assign it in ``__init__`` (a plain attribute there) keep ours."""

    return DeviceFreeFakeTensorMode(allow_non_fake_inputs=True)


def dispatch_mode_base() -> type:
    """``TorchDispatchMode``: sees every aten op after autograd, with its outputs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def function_mode_base(torch: ModuleType) -> type:
    """``TorchFunctionMode``: sees every torch call before C++ dispatch (``Tensor.item`` …)."""
    mode: type = torch.overrides.TorchFunctionMode
    return mode


def data_dependent_errors() -> tuple[type[BaseException], ...]:
    """The errors fake tensors raise where an op needs real values (``.item()``, ``nonzero``)."""
    from torch._subclasses import fake_tensor

    names = ("DataDependentOutputException", "DynamicOutputShapeException")
    found: list[type[BaseException]] = [getattr(fake_tensor, n) for n in names if hasattr(fake_tensor, n)]
    try:
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

        found.append(GuardOnDataDependentSymNode)
    except ImportError:
        pass
    return tuple(found)


def is_fake_tensor(value: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(value, FakeTensor)


def tree_leaves(value: Any) -> list[Any]:
    from torch.utils._pytree import tree_leaves as leaves

    return list(leaves(value))


class GpuContextInitBlocked:
    """While entered, fake CUDA tensors do not run ``torch.empty(1, device="cuda")``.

    ``FakeTensor.__new__`` calls ``fake_tensor.init_gpu_context`` the first time it makes a
    CUDA fake, which starts CUDA and freezes the allocator settings (docs/dryrun.md).
    """

    def __init__(self) -> None:
        from torch._subclasses import fake_tensor

        self._module: Any = fake_tensor
        self._saved: Any = None

    def __enter__(self) -> GpuContextInitBlocked:
        self._saved = getattr(self._module, "init_gpu_context", None)
        if self._saved is not None:
            self._module.init_gpu_context = _no_gpu_context
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            self._module.init_gpu_context = self._saved


def _no_gpu_context(*_args: Any) -> None:
    return None


class FakeParameterSwaps:
    """While entered, ``Module.to("cuda")`` / ``to_empty`` can move fake parameters.

    ``Module._apply`` swaps a fake parameter with its moved copy (``torch.utils.swap_tensors``),
    which refuses a tensor that has a weakref; an ``nn.Parameter`` made of a fake tensor
    always has one (the fake mode's weak-valued describer map, measured on torch 2.13). For
    fake tensors only, the check is skipped: that map holds ids of tensors the dry run never
    looks up again.
    """

    def __init__(self, torch: ModuleType) -> None:
        self._utils = torch.utils
        self._saved: Any = None

    def __enter__(self) -> FakeParameterSwaps:
        import weakref

        self._saved = getattr(self._utils, "weakref", None)
        if self._saved is weakref:
            self._utils.weakref = _FakeAwareWeakref(weakref)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            self._utils.weakref = self._saved


class _FakeAwareWeakref:
    def __init__(self, module: ModuleType) -> None:
        self._module = module

    def getweakrefs(self, obj: Any) -> list[Any]:
        if type(obj).__name__ == "FakeTensor" or getattr(obj, "fake_mode", None) is not None:
            return []
        return list(self._module.getweakrefs(obj))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


class TorchDefaultsRestored:
    """While entered, remember torch's process-wide defaults a step may set; on exit, restore them.

    A dry-run cell that calls ``torch.set_default_device("cuda")`` (common at the top of a
    training script) left it in force: every later ``torch.zeros`` then raised on a CPU build,
    or, on a GPU machine, started CUDA and froze the very allocator settings the dry run exists
    to keep open; one that called ``torch.set_grad_enabled(False)`` left the next real training
    cell without gradients. Restored: the default device and dtype, grad mode, anomaly
    detection, deterministic algorithms, the float32 matmul precision, cuDNN's flags, and the
    CPU random generator (a model built in the cell draws its initial weights from it), so the
    real run after a dry run computes what it would have computed without one (the thread's
    dispatch keys, Meta included, are :func:`dispatch_keys_preserved`'s). None of these reads
    or starts CUDA.
    """

    def __init__(self, torch: ModuleType) -> None:
        self._torch = torch
        self._saved: list[tuple[Any, Any]] = []  # (restore function, value)
        self._device: Any = None

    def __enter__(self) -> TorchDefaultsRestored:
        torch = self._torch
        self._device = _default_device_context(torch)
        pairs: list[tuple[Any, Any]] = [
            (torch.get_default_dtype, torch.set_default_dtype),
            (torch.is_grad_enabled, torch.set_grad_enabled),
            (torch.is_anomaly_enabled, torch.set_anomaly_enabled),
            (torch.get_rng_state, torch.set_rng_state),
        ]
        if hasattr(torch, "are_deterministic_algorithms_enabled"):
            pairs.append((lambda: (torch.are_deterministic_algorithms_enabled(),
                                   torch.is_deterministic_algorithms_warn_only_enabled()),
                          lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])))
        if hasattr(torch, "get_float32_matmul_precision"):
            pairs.append((torch.get_float32_matmul_precision, torch.set_float32_matmul_precision))
        cudnn = getattr(getattr(torch, "backends", None), "cudnn", None)
        for flag in ("enabled", "benchmark", "deterministic"):
            if cudnn is not None and hasattr(cudnn, flag):
                pairs.append((lambda f=flag: getattr(cudnn, f),
                              lambda v, f=flag: setattr(cudnn, f, v)))
        self._saved = [(setter, getter()) for getter, setter in pairs]
        return self

    def __exit__(self, *exc: object) -> None:
        torch = self._torch
        for setter, value in self._saved:
            setter(value)
        # compared as torch's own context objects: ``get_default_device()`` resolves a "cuda"
        # default to an index, which starts CUDA (and raises on a CPU build)
        if _default_device_context(torch) is not self._device:
            torch.set_default_device(None if self._device is None else self._device.device)


def _default_device_context(torch: ModuleType) -> Any:
    """The ``DeviceContext`` that ``torch.set_default_device`` left in force, or None."""
    holder = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    return getattr(holder, "device_context", None)


class FakeForeachDefault:
    """While entered, optimizers pick their CUDA default (foreach) for fake CUDA parameters.

    ``torch.optim`` uses the foreach implementation only for parameters whose type is in
    ``optimizer._foreach_supported_types`` (Tensor, Parameter); a fake parameter's type is
    ``FakeTensor``, so without this the dry run would take the single-tensor path, whose
    temporaries differ from what the GPU run allocates.
    """

    def __init__(self, torch: ModuleType) -> None:
        from torch._subclasses.fake_tensor import FakeTensor

        self._fake = FakeTensor
        self._types: Any = getattr(_optimizer_module(torch), "_foreach_supported_types", None)
        self._added = False

    def __enter__(self) -> FakeForeachDefault:
        if isinstance(self._types, list) and self._fake not in self._types:
            self._types.append(self._fake)
            self._added = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._added:
            self._types.remove(self._fake)
            self._added = False


class UserObjectsRestored:
    """While entered, note what the dry run changes on the user's own modules and optimizers,
    wherever they are reached from; on exit, put it back.

    The magic deep-copies the tensors, modules and optimizers bound to names in the notebook,
    but a model held by anything else (a trainer's attribute, a dict of models, a pipeline's
    ``.model``) is the user's object: ``.to("cuda")`` in the cell replaced its parameters with
    fake ones (no values: the trained weights were gone, and on a CPU-only build the next
    forward pass aborted the process). Three things can change such an object:

    * ``Module._apply`` (``to``, ``cuda``, ``half``, ``to_empty`` …) rebinds entries of
      ``_parameters`` and ``_buffers``: each module's two dicts are saved the first time it is
      applied to, and restored;
    * the same, on releases or tensor types where it swaps a parameter's contents in place
      (``torch.utils.swap_tensors``): each swap of a real tensor is swapped back;
    * an optimizer's step fills ``state`` and a scheduler changes ``param_groups`` (and sets
      attributes on the optimizer): both, and the optimizer's attribute names, are saved
      before its first step (torch's global step pre-hook) or its scheduler's making, and
      restored.

    An optimizer made before ``.to("cuda")`` is pointed at the moved parameters when it
    steps, as on a GPU (:func:`_follow_moves`).

    What the cell assigns to the user's objects by hand (``trainer.model = …``) is its own
    doing and stays (docs/dryrun.md says so).
    """

    def __init__(self, torch: ModuleType) -> None:
        self._torch = torch
        self._modules: dict[int, tuple[Any, dict[str, Any], dict[str, Any]]] = {}
        self._optimizers: dict[int, tuple[Any, dict[Any, Any], list[dict[str, Any]], set[str]]] = {}
        self._swaps: list[tuple[Any, Any]] = []
        self._saved_apply: Any = None
        self._saved_swap: Any = None
        self._saved_scheduler_init: Any = None
        self._moved: dict[int, tuple[Any, Any]] = {}  # id(old parameter) -> (old, its replacement)
        self._hook: Any = None

    def __enter__(self) -> UserObjectsRestored:
        torch = self._torch
        module_cls, utils = torch.nn.Module, torch.utils
        modules, optimizers, swaps = self._modules, self._optimizers, self._swaps
        original_apply = self._saved_apply = module_cls._apply
        original_swap = self._saved_swap = getattr(utils, "swap_tensors", None)

        moved = self._moved

        def _apply(module: Any, *args: Any, **kwargs: Any) -> Any:
            if id(module) not in modules:
                modules[id(module)] = (module, dict(module._parameters), dict(module._buffers))
            before = dict(module._parameters)
            result = original_apply(module, *args, **kwargs)
            for key, old in before.items():
                new = module._parameters.get(key)
                if old is not None and new is not None and new is not old:
                    moved[id(old)] = (old, new)  # (old kept alive: its id stays its own)
            return result

        module_cls._apply = _apply
        if original_swap is not None:
            def swap_tensors(t1: Any, t2: Any) -> Any:
                real = not is_fake_tensor(t1)
                if real:  # the fake mode holds weak references to real tensors it converted
                    result = _swap_ignoring_weakrefs(torch, t1, t2, original_swap)
                    swaps.append((t1, t2))
                    return result
                return original_swap(t1, t2)

            utils.swap_tensors = swap_tensors

        def note_optimizer(optimizer: Any, *_args: Any) -> None:
            if id(optimizer) not in optimizers:
                optimizers[id(optimizer)] = (optimizer, {p: dict(s) for p, s in optimizer.state.items()},
                                             [dict(g) for g in optimizer.param_groups],
                                             set(vars(optimizer)))
            _follow_moves(optimizer, moved)

        register = getattr(_optimizer_module(torch), "register_optimizer_step_pre_hook", None)
        if register is not None:
            self._hook = register(note_optimizer)
        # an LR scheduler changes its optimizer's groups (lr, initial_lr) and wraps its step as
        # it is made, before any step: note the optimizer first
        scheduler = getattr(getattr(torch.optim, "lr_scheduler", None), "LRScheduler", None)
        original_init = self._saved_scheduler_init = getattr(scheduler, "__init__", None)
        if scheduler is not None and original_init is not None:
            def scheduler_init(sched: Any, optimizer: Any, *args: Any, **kwargs: Any) -> None:
                note_optimizer(optimizer)
                original_init(sched, optimizer, *args, **kwargs)

            scheduler.__init__ = scheduler_init
        return self

    def __exit__(self, *exc: object) -> None:
        torch = self._torch
        torch.nn.Module._apply = self._saved_apply
        if self._saved_swap is not None:
            torch.utils.swap_tensors = self._saved_swap
        if self._hook is not None:
            self._hook.remove()
        scheduler = getattr(getattr(torch.optim, "lr_scheduler", None), "LRScheduler", None)
        if scheduler is not None and self._saved_scheduler_init is not None:
            scheduler.__init__ = self._saved_scheduler_init
        for t1, t2 in reversed(self._swaps):
            _swap_back(torch, t1, t2)
        for module, params, buffers in self._modules.values():
            module._parameters.clear()
            module._parameters.update(params)
            module._buffers.clear()
            module._buffers.update(buffers)
        for optimizer, state, groups, names in self._optimizers.values():
            optimizer.state.clear()
            optimizer.state.update({p: dict(s) for p, s in state.items()})
            for group, saved in zip(optimizer.param_groups, groups, strict=False):
                group.clear()
                group.update(saved)
            for name in set(vars(optimizer)) - names:  # e.g. the step wrapper a scheduler set
                delattr(optimizer, name)
        self._swaps.clear()
        self._modules.clear()
        self._optimizers.clear()
        self._moved.clear()


def _follow_moves(optimizer: Any, moved: dict[int, Any]) -> None:
    """Point ``optimizer`` at the parameters ``Module._apply`` replaced its own with.

    On a GPU, ``.to("cuda")`` keeps each Parameter object (it replaces ``.data``), so an
    optimizer made before it steps the moved parameters. On fakes ``_apply`` makes new
    Parameter objects (a real and a fake tensor cannot share a ``.data``), and such an
    optimizer stepped stale CPU parameters: its state was missing from the estimate. Its
    groups and state are restored afterwards (:class:`UserObjectsRestored`)."""
    if not moved:
        return

    def latest(param: Any) -> Any:
        seen = 0
        while id(param) in moved and seen < 64:  # .to("cuda").half(): a chain of moves
            param = moved[id(param)][1]
            seen += 1
        return param

    for group in optimizer.param_groups:
        group["params"] = [latest(p) for p in group["params"]]
    for old in [p for p in optimizer.state if id(p) in moved]:
        optimizer.state[latest(old)] = optimizer.state.pop(old)


def _swap_back(torch: ModuleType, t1: Any, t2: Any) -> None:
    """Undo ``swap_tensors(t1, t2)``."""
    _swap_ignoring_weakrefs(torch, t1, t2, torch.utils.swap_tensors)


def _swap_ignoring_weakrefs(torch: ModuleType, t1: Any, t2: Any, swap: Any) -> Any:
    """``swap(t1, t2)`` with its weakref check told these two have none: the fake mode holds
    weak references to the real tensors it converted (its memo, discarded with the mode),
    and ``swap_tensors`` refuses a tensor with any."""
    utils: Any = torch.utils
    saved = getattr(utils, "weakref", None)
    if saved is not None:
        utils.weakref = _NoWeakrefsOf(saved, {id(t1), id(t2)})
    try:
        return swap(t1, t2)
    finally:
        if saved is not None:
            utils.weakref = saved


class _NoWeakrefsOf:
    def __init__(self, module: Any, ids: set[int]) -> None:
        self._module = module
        self._ids = ids

    def getweakrefs(self, obj: Any) -> list[Any]:
        return [] if id(obj) in self._ids else list(self._module.getweakrefs(obj))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)
