"""What keeps the user's real state exactly as it was, whatever the dry-run step does.

Each class here is a :class:`.ports.Patch`: it notes something on entry and puts it back on
exit. Together they cover what a step can change outside its fake tensors (docs/dryrun.md,
"What a dry run leaves as it was"):

* torch's process-wide defaults and every random generator (CPU, each CUDA device's and the
  seed queued for devices that have not started, Python's, NumPy's):
  :class:`TorchDefaultsRestored`;
* the user's modules, optimizers, LR schedulers and gradient scalers, wherever they are
  reached from: :class:`UserObjectsRestored`;
* attributes of real tensors (``.grad``, ``.requires_grad``): :class:`RealTensorAttributes`
  (in-place ops on real tensors never run: the recorder hands them the tensor's fake);
* the machinery fake CUDA tensors need (:class:`GpuContextInitBlocked`,
  :class:`FakeParameterSwaps`, :class:`FakeForeachDefault`);
* and Ctrl-C, held back while the dry run patches and unpatches, and while torch's C++ runs one
  of the step's ops (:class:`SignalsHeld`), so an interrupt never leaves torch half patched nor
  ends the process.
"""

from __future__ import annotations

import gc
import random
import signal
import sys
import threading
import warnings
import weakref
from types import FrameType, ModuleType
from typing import Any

from allocconf_widget.adapters.dryrun.tensors import is_fake_tensor

#: torch's Python code that its C++ calls back while an op runs: an exception raised there can
#: end the process (``std::terminate``), so a Ctrl-C landing in it waits for a safe point
_DISPATCH_FILES = ("/torch/_subclasses/", "/torch/utils/_python_dispatch.py", "/torch/_ops.py",
                   "/torch/_prims", "/torch/_decomp/", "/torch/_refs/")


def inside_dispatch(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside an op's dispatch callback (a ``__torch_dispatch__``, fake
    tensor or decomposition code that torch's C++ called)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__torch_dispatch__" or any(part in code.co_filename for part in _DISPATCH_FILES):
            return True
        frame = frame.f_back
    return False


class SignalsHeld:
    """Where a Ctrl-C (SIGINT) may land while a dry run is entered.

    While :attr:`holding` (the dry run patches or unpatches torch) every Ctrl-C is held back, so
    torch is never left half patched. Otherwise (the user's step runs) it stops the step at once,
    unless torch's C++ is running an op of the step (:meth:`op_starts` .. :meth:`op_ends`) or one
    of its dispatch callbacks (:func:`inside_dispatch`): an exception raised in Python code that
    C++ called back can end the process, so there the Ctrl-C waits for the op's end.

    Only the main thread receives signals; elsewhere this does nothing. :meth:`release` puts the
    previous handler back and, if a Ctrl-C is still held, raises the signal again so that
    handler (Python's: ``KeyboardInterrupt``) sees it now."""

    def __init__(self) -> None:
        self.pending = False
        self.holding = True
        self._depth = 0  # ops of the main thread under way
        self._main = threading.main_thread().ident
        self._previous: Any = None
        self._active = False

    def __enter__(self) -> SignalsHeld:
        if threading.get_ident() == self._main:
            try:
                self._previous = signal.signal(signal.SIGINT, self._interrupted)
                self._active = True
            except (ValueError, OSError):  # an embedded interpreter that owns the handler
                self._active = False
        return self

    def _interrupted(self, _signum: int, frame: FrameType | None) -> None:
        if self.holding or self._depth or inside_dispatch(frame):
            self.pending = True
            return
        raise KeyboardInterrupt

    def op_starts(self) -> None:
        """The step calls one of torch's ops (on this thread)."""
        if threading.get_ident() == self._main:
            self._depth += 1

    def op_ends(self) -> None:
        """That op returned or raised: a Ctrl-C held meanwhile is delivered now."""
        if threading.get_ident() == self._main:
            self._depth -= 1
            ready = not self._depth and not self.holding
            if self.pending and ready and not inside_dispatch(sys._getframe(1)):
                self.pending = False
                raise KeyboardInterrupt

    def release(self) -> None:
        """Restore the previous handler and deliver a held Ctrl-C to it."""
        if self._active:
            self._active = False
            signal.signal(signal.SIGINT, self._previous)
            if self.pending:
                self.pending = False
                signal.raise_signal(signal.SIGINT)

    def __exit__(self, *exc: object) -> None:
        self.release()


class TorchWarningsQuiet:
    """While entered, torch's warnings about what a dry run does on purpose are not shown: a fake
    tensor's data pointer (read by ``.item()`` paths and printing), which torch calls "almost
    definitely a bug in your code". The dry run says what it did instead, in its notes."""

    MESSAGES = ("Accessing the data pointer of FakeTensor",)

    def __init__(self) -> None:
        self._saved: list[Any] | None = None

    def __enter__(self) -> TorchWarningsQuiet:
        self._saved = list(warnings.filters)
        for message in self.MESSAGES:
            warnings.filterwarnings("ignore", message=message)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            filters: list[Any] = warnings.filters  # type: ignore[assignment]
            filters[:] = self._saved
            warnings._filters_mutated()  # type: ignore[attr-defined]
            self._saved = None


class GpuContextInitBlocked:
    """While entered, fake CUDA tensors do not run ``torch.empty(1, device="cuda")``.

    ``FakeTensor.__new__`` calls ``fake_tensor.init_gpu_context`` the first time it makes a
    CUDA fake, which starts CUDA and freezes the allocator settings (docs/dryrun.md)."""

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
    which refuses a tensor that has a weakref; an ``nn.Parameter`` made of a fake tensor always
    has one (the fake mode's weak-valued describer map). For fake tensors only, the check is
    skipped: that map holds ids of tensors the dry run never looks up again."""

    def __init__(self, torch: ModuleType) -> None:
        self._utils = torch.utils
        self._saved: Any = None

    def __enter__(self) -> FakeParameterSwaps:
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


def _optimizer_module(torch: ModuleType) -> Any:
    """``torch.optim.optimizer``, the module (``torch/optim/__init__.py`` deletes that name from
    the package, so ``torch.optim.optimizer`` is not it)."""
    module = sys.modules.get("torch.optim.optimizer")
    return module or getattr(getattr(torch, "optim", None), "optimizer", None)


class FakeForeachDefault:
    """While entered, optimizers pick their CUDA default (foreach) for fake CUDA parameters.

    ``torch.optim`` uses the foreach implementation only for parameters whose type is in
    ``optimizer._foreach_supported_types`` (Tensor, Parameter); a fake parameter's type is
    ``FakeTensor``, so without this the dry run would take the single-tensor path, whose
    temporaries differ from what the GPU run allocates."""

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


class TorchDefaultsRestored:
    """Note torch's process-wide defaults and every random generator on entry; restore on exit.

    A dry-run cell that starts as training scripts do (``torch.set_default_device("cuda")``,
    ``torch.manual_seed(0)``) must leave neither behind: the default device would make every
    later ``torch.zeros`` start CUDA, and the seed, queued for CUDA until it starts, would
    change the real run's dropout masks. Restored: the default device and dtype, grad mode,
    anomaly detection, deterministic algorithms, the float32 matmul precision, cuDNN's flags,
    the CPU generator, each started CUDA device's generator, the seeds queued for CUDA's start
    (and every call queued there), Python's and NumPy's global generators. None of these reads
    or starts CUDA (the thread's dispatch keys are :func:`.tensors.dispatch_keys_preserved`'s).
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
            (random.getstate, random.setstate),
        ]
        if hasattr(torch, "is_autocast_cache_enabled"):
            pairs.append((torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled))
        if hasattr(torch, "are_deterministic_algorithms_enabled"):
            pairs.append((lambda: (torch.are_deterministic_algorithms_enabled(),
                                   torch.is_deterministic_algorithms_warn_only_enabled()),
                          lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])))
        if hasattr(torch, "get_float32_matmul_precision"):
            pairs.append((torch.get_float32_matmul_precision, torch.set_float32_matmul_precision))
        backends = getattr(torch, "backends", None)
        cudnn = getattr(backends, "cudnn", None)
        for flag in ("enabled", "benchmark", "deterministic", "allow_tf32"):
            if cudnn is not None and hasattr(cudnn, flag):
                pairs.append((lambda f=flag: getattr(cudnn, f), lambda v, f=flag: setattr(cudnn, f, v)))
        matmul = getattr(getattr(backends, "cuda", None), "matmul", None)
        for flag in ("allow_tf32", "allow_fp16_reduced_precision_reduction",
                     "allow_bf16_reduced_precision_reduction"):
            if matmul is not None and hasattr(matmul, flag):
                pairs.append((lambda f=flag: getattr(matmul, f), lambda v, f=flag: setattr(matmul, f, v)))
        cuda_backends = getattr(backends, "cuda", None)
        for kind in ("flash", "mem_efficient", "math", "cudnn"):  # which attention kernels may run
            probe, setter = getattr(cuda_backends, f"{kind}_sdp_enabled", None), \
                getattr(cuda_backends, f"enable_{kind}_sdp", None)
            if callable(probe) and callable(setter):
                pairs.append((probe, setter))
        numpy_random = getattr(sys.modules.get("numpy"), "random", None)
        if numpy_random is not None and hasattr(numpy_random, "get_state"):
            pairs.append((numpy_random.get_state, numpy_random.set_state))
        pairs.append((lambda: _cuda_seeds(torch), lambda v: _restore_cuda_seeds(torch, v)))
        self._saved = [(setter, getter()) for getter, setter in pairs]
        return self

    def __exit__(self, *exc: object) -> None:
        torch = self._torch
        for setter, value in self._saved:
            try:
                setter(value)
            except (RuntimeError, TypeError, ValueError):  # one that cannot go back must not stop the rest
                continue
        # compared as torch's own context objects: ``get_default_device()`` resolves a "cuda"
        # default to an index, which starts CUDA (and raises on a CPU build)
        if _default_device_context(torch) is not self._device:
            torch.set_default_device(None if self._device is None else self._device.device)


def _default_device_context(torch: ModuleType) -> Any:
    """The ``DeviceContext`` that ``torch.set_default_device`` left in force, or None."""
    holder = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    return getattr(holder, "device_context", None)


def _cuda_seeds(torch: ModuleType) -> tuple[list[Any], dict[str, Any], Any]:
    """What CUDA's generators would start from: the calls queued for CUDA's start (seeds among
    them), and once CUDA runs, every device's generator state (reading it starts nothing)."""
    cuda = torch.cuda
    queued = list(getattr(cuda, "_queued_calls", []))
    tracker = getattr(cuda, "_lazy_seed_tracker", None)
    seeds = {k: list(v) if isinstance(v, list) else v for k, v in vars(tracker).items()} if tracker else {}
    states = None
    try:
        if cuda.is_initialized():
            states = cuda.get_rng_state_all()
    except RuntimeError:
        states = None
    return queued, seeds, states


def _restore_cuda_seeds(torch: ModuleType, saved: tuple[list[Any], dict[str, Any], Any]) -> None:
    cuda = torch.cuda
    queued, seeds, states = saved
    calls = getattr(cuda, "_queued_calls", None)
    if isinstance(calls, list):
        calls[:] = queued
    tracker = getattr(cuda, "_lazy_seed_tracker", None)
    if tracker is not None:
        vars(tracker).clear()
        vars(tracker).update({k: list(v) if isinstance(v, list) else v for k, v in seeds.items()})
    if states is not None:
        cuda.set_rng_state_all(states)


# ---------------------------------------------------------------- the user's objects

def _watched_classes(torch: ModuleType) -> tuple[type, ...]:
    """Objects a step changes in place that hold the user's training state."""
    found: list[type] = [torch.nn.Module, torch.optim.Optimizer]
    for owner, name in ((getattr(torch.optim, "lr_scheduler", None), "LRScheduler"),
                        (getattr(torch.optim, "lr_scheduler", None), "ReduceLROnPlateau"),
                        (getattr(torch, "amp", None), "GradScaler")):
        cls = getattr(owner, name, None)
        if isinstance(cls, type):
            found.append(cls)
    return tuple(found)


def _contents(value: Any) -> Any:
    """A shallow copy of a dict's or list's contents (restored into the same object)."""
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    return None


class UserObjectsRestored:
    """Note every module, optimizer, LR scheduler and gradient scaler that exists when the dry
    run starts; on exit, put each back as it was, wherever it is reached from.

    Found by a walk of the garbage collector's objects (by exact type, so no object's
    ``__class__`` property runs), not through the notebook's names: a model held by a trainer,
    a dict of models, a pipeline's ``.model`` or an EMA copy is the user's too. For each: its
    attributes, and the contents of every dict and list among them (a module's parameters,
    buffers, children and hooks; an optimizer's state and parameter groups, which one-cycle
    and cyclic schedulers rewrite as they are made; a scaler's scale). Objects made inside the
    dry run are the step's own and are left alone.

    Two things a GPU run does are kept while the step runs: ``Module._apply`` (``.to``,
    ``.cuda``, ``.half``) on fakes makes new Parameter objects where the GPU keeps the old
    ones, so an optimizer made before ``.to("cuda")`` is pointed at the moved parameters when
    it steps (:func:`_follow_moves`); and on releases that swap a parameter's contents in
    place (``torch.utils.swap_tensors``), each swap of a real tensor is swapped back on exit.
    """

    def __init__(self, torch: ModuleType) -> None:
        self._torch = torch
        self._saved: list[tuple[Any, dict[str, Any], dict[str, Any]]] = []
        self._groups: list[tuple[list[Any], list[tuple[Any, dict[str, Any]]]]] = []
        self._states: list[tuple[Any, dict[Any, Any]]] = []
        self._swaps: list[tuple[Any, Any]] = []
        self._moved: dict[int, tuple[Any, Any]] = {}  # id(old parameter) -> (old, its replacement)
        self._saved_apply: Any = None
        self._saved_swap: Any = None
        self._hook: Any = None

    def __enter__(self) -> UserObjectsRestored:
        torch = self._torch
        classes = _watched_classes(torch)
        optimizer_cls = torch.optim.Optimizer
        watched: dict[type, bool] = {}
        for obj in gc.get_objects():
            kind = type(obj)
            known = watched.get(kind)
            if known is None:
                known = watched[kind] = issubclass(kind, classes)
            if not known:
                continue
            attributes = dict(vars(obj))
            contents = {k: c for k, v in attributes.items() if (c := _contents(v)) is not None}
            self._saved.append((obj, attributes, contents))
            if issubclass(type(obj), optimizer_cls):
                groups = obj.param_groups
                self._groups.append((groups, [(g, dict(g)) for g in groups if isinstance(g, dict)]))
                self._states.append((obj.state, {p: _contents(s) if isinstance(s, dict) else s
                                                 for p, s in obj.state.items()}))
        self._patch_moves(torch)
        return self

    def _patch_moves(self, torch: ModuleType) -> None:
        module_cls, utils = torch.nn.Module, torch.utils
        moved, swaps = self._moved, self._swaps
        original_apply = self._saved_apply = module_cls._apply
        original_swap = self._saved_swap = getattr(utils, "swap_tensors", None)

        future = torch.__future__

        def _apply(module: Any, *args: Any, **kwargs: Any) -> Any:
            before = dict(module._parameters)
            # A moved parameter is a new Parameter of the fake tensor, as torch 2.10 and later do
            # for fake tensors: before that, ``param.data = fake`` left a parameter of meta
            # storage that no op of the step could mix with the fake inputs.
            overwrite = future.get_overwrite_module_params_on_conversion()
            future.set_overwrite_module_params_on_conversion(True)
            try:
                result = original_apply(module, *args, **kwargs)
            finally:
                future.set_overwrite_module_params_on_conversion(overwrite)
            for key, old in before.items():
                new = module._parameters.get(key)
                if old is not None and new is not None and new is not old:
                    moved[id(old)] = (old, new)  # (old kept alive: its id stays its own)
            return result

        module_cls._apply = _apply
        if original_swap is not None:
            def swap_tensors(t1: Any, t2: Any) -> Any:
                if not is_fake_tensor(t1):  # the fake mode holds weak references to real tensors
                    result = _swap_ignoring_weakrefs(torch, t1, t2, original_swap)
                    swaps.append((t1, t2))
                    return result
                return original_swap(t1, t2)

            utils.swap_tensors = swap_tensors

        def follow(optimizer: Any, *_args: Any) -> None:
            _follow_moves(optimizer, moved)

        register = getattr(_optimizer_module(torch), "register_optimizer_step_pre_hook", None)
        if register is not None:
            self._hook = register(follow)

    def __exit__(self, *exc: object) -> None:
        torch = self._torch
        if self._saved_apply is not None:
            torch.nn.Module._apply = self._saved_apply
        if self._saved_swap is not None:
            torch.utils.swap_tensors = self._saved_swap
        if self._hook is not None:
            self._hook.remove()
        for t1, t2 in reversed(self._swaps):
            _swap_ignoring_weakrefs(torch, t1, t2, torch.utils.swap_tensors)
        for obj, attributes, contents in self._saved:
            for key, value in contents.items():
                holder = attributes[key]
                if isinstance(holder, dict):
                    holder.clear()
                    holder.update(value)
                else:
                    holder[:] = value
            current = vars(obj)
            for key in [k for k in current if k not in attributes]:
                del current[key]
            current.update(attributes)
        for _groups, saved in self._groups:
            for group, values in saved:
                group.clear()
                group.update(values)
        for state, values in self._states:
            state.clear()
            state.update({p: dict(s) if isinstance(s, dict) else s for p, s in values.items()})
        self._saved.clear()
        self._groups.clear()
        self._states.clear()
        self._swaps.clear()
        self._moved.clear()


def _follow_moves(optimizer: Any, moved: dict[int, Any]) -> None:
    """Point ``optimizer`` at the parameters ``Module._apply`` replaced its own with.

    On a GPU, ``.to("cuda")`` keeps each Parameter object (it replaces ``.data``), so an
    optimizer made before it steps the moved parameters. On fakes ``_apply`` makes new Parameter
    objects (a real and a fake tensor cannot share a ``.data``), so such an optimizer would step
    stale CPU parameters and its state would be missing from the estimate. Its groups and state
    are restored afterwards (:class:`UserObjectsRestored`)."""
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


def _swap_ignoring_weakrefs(torch: ModuleType, t1: Any, t2: Any, swap: Any) -> Any:
    """``swap(t1, t2)`` with its weakref check told these two have none: the fake mode holds
    weak references to the real tensors it converted (its memo, discarded with the mode), and
    ``swap_tensors`` refuses a tensor with any."""
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


class RealTensorAttributes:
    """Attributes of real tensors the step set (``.grad``, ``.data``, ``requires_grad``), noted
    before the first change and put back on exit. The values of real tensors never change: the
    recorder hands an in-place op on a real tensor its fake instead."""

    def __init__(self) -> None:
        self._saved: dict[tuple[int, str], tuple[Any, Any]] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> RealTensorAttributes:
        return self

    def note(self, tensor: Any, attribute: str) -> None:
        """Remember ``tensor.<attribute>`` before the step changes it (once per attribute)."""
        key = (id(tensor), attribute)
        with self._lock:
            if key not in self._saved:
                self._saved[key] = (tensor, getattr(tensor, attribute))

    def __exit__(self, *exc: object) -> None:
        for (_, attribute), (tensor, value) in reversed(list(self._saved.items())):
            try:
                setattr(tensor, attribute, value)
            except (RuntimeError, TypeError):  # e.g. requires_grad on a non-leaf: it was one
                continue
        self._saved.clear()
