"""The CPU stand-in: a training step dry-run on a runtime without a GPU.

Fake CUDA tensors cannot record gradients without a GPU: a CPU-only torch aborts there (autograd
asks CUDA's device guard for the input's stream, which that build lacks), and a CUDA build with
no GPU stops at the backward. So where a step trains and no GPU is visible, the dry run runs it on
fake *CPU* tensors that stand for the CUDA tensors the code asks for:

* "cuda" in a device argument, ``.to("cuda")``, ``.cuda()`` and a "cuda" default device become
  the stand-in's device, and the tensors made so (and every tensor computed from them) are
  counted as the CUDA allocations they stand for; tensors the code keeps on the CPU (a batch
  before ``.to("cuda")``, ``.cpu()`` copies) are not;
* such tensors say they are on "cuda" (``.device``, ``.is_cuda``), so code that derives a
  device from a tensor (``torch.arange(n, device=x.device)``) makes GPU tensors as it would;
* ``torch.autocast("cuda")`` casts with CUDA's policy (``core/dryrun/autocast.CUDA_POLICY``),
  not CPU autocast's, so each tensor has the dtype, and the size, it has on the GPU;
* attention runs the profile's kernel (:mod:`.attention`) and the workspace rules apply
  (:mod:`.rules`), as in a fake-CUDA dry run.

What stays coarser: other ops dispatch by CPU rules (their temporaries may differ), and
``.device`` lies only to the user's code, not to C++. The estimate is labelled so;
docs/dryrun.md has its measured error against the GPU dry run and the real run.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from allocconf_widget.adapters.dryrun.log import Log
from allocconf_widget.adapters.dryrun.ports import Notes
from allocconf_widget.adapters.dryrun.tensors import fake_tensor_type, tree_leaves
from allocconf_widget.core.dryrun.autocast import (
    BANNED,
    CUDA_POLICY,
    FP32,
    FP32_SET_OPT_DTYPE,
    LOWER_PRECISION,
    PROMOTE,
)

#: the attribute a stand-in tensor carries (a plain Python attribute: reading it calls no torch)
TAG = "_allocconf_on_gpu"
#: torch calls that parse a device without making a tensor (``Module.to``'s argument parser)
_PARSERS = frozenset(("_parse_to",))
#: what the estimate is called wherever it is shown
LABEL = "CPU stand-in (coarser estimate)"


def _is_cuda_spec(value: Any, torch: ModuleType) -> bool:
    if isinstance(value, str):
        return value == "cuda" or value.startswith("cuda:")
    return isinstance(value, torch.device) and value.type == "cuda"


class Standin:
    """Which fake CPU tensors stand for GPU memory, and the calls that make them."""

    def __init__(self, torch: ModuleType, log: Log, notes: Notes) -> None:
        self.torch, self.log, self.notes = torch, log, notes
        self._tls = threading.local()
        self._moves = {torch.Tensor.to, torch.Tensor.cuda}
        self._host = {torch.Tensor.cpu}
        from torch.utils._device import _device_constructors

        self._constructors = _device_constructors()

    # ------------------------------------------------------------ per-thread state
    def _context(self) -> str | None:
        return getattr(self._tls, "context", None)

    @contextlib.contextmanager
    def _within(self, context: str) -> Iterator[None]:
        previous = self._context()
        self._tls.context = context
        try:
            yield
        finally:
            self._tls.context = previous

    @property
    def inside_fake_dispatch(self) -> bool:
        return bool(getattr(self._tls, "inside", False))

    @contextlib.contextmanager
    def fake_dispatch(self) -> Iterator[None]:
        """The fake mode's own work: tensors tell it their true device."""
        previous = self.inside_fake_dispatch
        self._tls.inside = True
        try:
            yield
        finally:
            self._tls.inside = previous

    def _fresh(self) -> set[int]:
        fresh = getattr(self._tls, "fresh", None)
        if fresh is None:
            fresh = self._tls.fresh = set()
        return fresh

    # ------------------------------------------------------------ which tensors count
    def is_gpu(self, tensor: Any) -> bool:
        """Whether ``tensor`` stands for GPU memory."""
        if getattr(tensor, TAG, False):
            return True
        try:
            key = id(tensor.untyped_storage())
        except (RuntimeError, NotImplementedError):
            return False
        return key in self.log.live or key in self._fresh()

    def counted(self, tensor: Any) -> bool:
        """The recorder's question: does this op output's storage count as GPU memory?"""
        try:
            key = id(tensor.untyped_storage())
        except (RuntimeError, NotImplementedError):
            return False
        if key in self.log.live or key in self._fresh():
            _tag(tensor)
            return True
        return False

    def classify(self, _func: Any, args: Any, out: Any) -> None:
        """Decide, per op, which new storages stand for GPU memory: those of an op with a GPU
        input, or made inside a call that asked for "cuda"; not those of a copy to the host."""
        fresh = self._fresh()
        fresh.clear()
        context = self._context()
        if context == "host":
            return
        torch = self.torch
        gpu = context == "gpu" or any(isinstance(a, torch.Tensor) and self.is_gpu(a)
                                      for a in tree_leaves(args))
        if not gpu:
            return
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                try:
                    fresh.add(id(leaf.untyped_storage()))
                except (RuntimeError, NotImplementedError):
                    continue
                _tag(leaf)

    # ------------------------------------------------------------ torch calls
    def call(self, func: Any, args: Any, kwargs: Any) -> Any:
        """A torch call in the stand-in (from the dry run's function mode)."""
        torch = self.torch
        if self.inside_fake_dispatch:
            return func(*args, **kwargs)
        first = args[0] if args else None
        if func in self._moves and isinstance(first, torch.Tensor):
            return self._move(func, first, args[1:], kwargs)
        if func in self._host and isinstance(first, torch.Tensor) and self.is_gpu(first):
            with self._within("host"):
                return torch.Tensor.to(first, "cpu", copy=True)
        name = getattr(func, "__name__", "")
        if name in _PARSERS or func is torch.device:  # a device, no tensor: "cuda" is what was asked
            return func(*args, **kwargs)
        if name in ("__get__", "__set__") and isinstance(first, torch.Tensor):
            attribute = getattr(getattr(func, "__self__", None), "__name__", "")
            if name == "__get__" and attribute in ("is_cuda", "is_cpu") and self.is_gpu(first):
                return attribute == "is_cuda"
            if name == "__set__" and attribute == "data" and len(args) > 1 and self.is_gpu(args[1]):
                result = func(*args, **kwargs)  # ``param.data = moved`` (Module._apply): now a GPU tensor
                _tag(first)
                return result
        if name == "record_stream":
            return None
        if name == "pin_memory" and isinstance(first, torch.Tensor):
            return first
        new_args, new_kwargs, asked = self._devices(args, kwargs)
        if not asked and func in self._constructors and "device" not in kwargs and self._default_is_cuda():
            new_kwargs = {**new_kwargs, "device": "cpu"}
            asked = True
        if asked:
            with self._within("gpu"):
                return func(*new_args, **new_kwargs)
        return func(*args, **kwargs)

    def _default_is_cuda(self) -> bool:
        holder = getattr(self.torch, "_GLOBAL_DEVICE_CONTEXT", None)
        context = getattr(holder, "device_context", None)
        device = getattr(context, "device", None)
        return device is not None and _is_cuda_spec(device, self.torch)

    def _devices(self, args: Any, kwargs: Any) -> tuple[Any, dict[str, Any], bool]:
        torch = self.torch
        asked = False

        def swap(value: Any) -> Any:
            nonlocal asked
            if _is_cuda_spec(value, torch):
                asked = True
                return torch.device("cpu")
            return value

        new_args = tuple(swap(a) for a in args)
        new_kwargs = {k: swap(v) if k in ("device", "device_type") else v for k, v in kwargs.items()}
        return new_args, new_kwargs, asked

    def _move(self, func: Any, tensor: Any, rest: Any, kwargs: Any) -> Any:
        """``.to(...)`` / ``.cuda()``: to "cuda", a copy that stands for GPU memory."""
        torch = self.torch
        target: str | None = "cuda" if func is torch.Tensor.cuda else None
        dtype = kwargs.get("dtype")
        kept = {k: v for k, v in kwargs.items() if k in ("non_blocking", "memory_format")}
        for value in (*rest, kwargs.get("device")):
            if isinstance(value, torch.Tensor):
                target = "cuda" if self.is_gpu(value) else value.device.type
                dtype = dtype or value.dtype
            elif isinstance(value, torch.dtype):
                dtype = value
            elif isinstance(value, int) and not isinstance(value, bool):
                target = "cuda"
            elif isinstance(value, str | torch.device):
                target = "cuda" if _is_cuda_spec(value, torch) else torch.device(value).type
        if target == "cuda":
            if self.is_gpu(tensor):
                if (dtype is None or dtype == tensor.dtype) and not kwargs.get("copy"):
                    return tensor
                return torch.Tensor.to(tensor, dtype, **kept)
            with self._within("gpu"):
                return torch.Tensor.to(tensor, "cpu", dtype=dtype or tensor.dtype, copy=True, **kept)
        if target == "cpu" and self.is_gpu(tensor):
            with self._within("host"):
                return torch.Tensor.to(tensor, "cpu", dtype=dtype or tensor.dtype, copy=True, **kept)
        return func(tensor, *rest, **kwargs)


def _tag(tensor: Any) -> None:
    with contextlib.suppress(AttributeError, TypeError):
        setattr(tensor, TAG, True)


class StandinDevices:
    """While entered, a stand-in tensor's ``.device`` reads "cuda" to the user's code (the fake
    mode's own work still sees the CPU)."""

    def __init__(self, standin: Standin) -> None:
        self._standin = standin
        self._cls = fake_tensor_type()
        self._saved: Any = None

    def __enter__(self) -> StandinDevices:
        standin, cls = self._standin, self._cls
        original = self._saved = cls.__dict__["device"]
        cuda = standin.torch.device("cuda", 0)

        def device(tensor: Any) -> Any:
            real = original.fget(tensor)
            if real.type == "cpu" and not standin.inside_fake_dispatch and getattr(tensor, TAG, False):
                return cuda
            return real

        setattr(cls, "device", property(device, original.fset))  # noqa: B010
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            setattr(self._cls, "device", self._saved)  # noqa: B010


class CudaAutocastOnCpu:
    """While entered, ``autocast("cuda")`` casts the stand-in's tensors with CUDA's policy.

    Entering ``autocast("cuda")`` also enters a CPU autocast of the same dtype, and torch's
    CPU-autocast kernels are overridden (Python kernels for the ``AutocastCPU`` key) by ones that
    apply ``CUDA_POLICY`` to tensors that stand for GPU memory, or pass the op on uncast where
    CUDA's autocast would not cast it. Dropping the library puts torch's own kernels back."""

    def __init__(self, torch: ModuleType, standin: Standin, notes: Notes) -> None:
        self._torch, self._standin, self._notes = torch, standin, notes
        self._library: Any = None
        self._saved: tuple[Any, Any] | None = None
        self._cache: dict[int, tuple[Any, Any]] = {}
        self._depth = threading.local()

    def __enter__(self) -> CudaAutocastOnCpu:
        torch = self._torch
        self._library = torch.library.Library("aten", "IMPL")
        names = {n.removeprefix("aten::") for n in torch._C._dispatch_get_all_op_names()
                 if n.startswith("aten::")}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name in names:
                full = f"aten::{name}"
                policy = CUDA_POLICY.get(name)
                if policy is None and not torch._C._dispatch_has_kernel_for_dispatch_key(full, "AutocastCPU"):
                    continue
                op = _overload(torch, name)
                if op is not None:
                    self._library.impl(name, self._kernel(op, policy), "AutocastCPU", with_keyset=True)
        self._patch_autocast(torch)
        return self

    def _patch_autocast(self, torch: ModuleType) -> None:
        cls = torch.amp.autocast_mode.autocast
        enter, exit_ = cls.__enter__, cls.__exit__
        self._saved = (enter, exit_)
        outer = self

        def enter_both(ctx: Any) -> Any:
            result = enter(ctx)
            if getattr(ctx, "device", None) == "cuda":
                cpu = torch.amp.autocast("cpu", dtype=ctx.fast_dtype, enabled=ctx._enabled,
                                         cache_enabled=getattr(ctx, "_cache_enabled", None))
                cpu.__enter__()
                vars(ctx)["_allocconf_cpu"] = cpu
                outer._depth.value = getattr(outer._depth, "value", 0) + 1
            return result

        def exit_both(ctx: Any, *exc: Any) -> Any:
            cpu = ctx.__dict__.pop("_allocconf_cpu", None)
            if cpu is not None:
                cpu.__exit__(*exc)
                outer._depth.value = getattr(outer._depth, "value", 1) - 1
                if outer._depth.value == 0:
                    outer._cache.clear()
            return exit_(ctx, *exc)

        cls.__enter__ = enter_both
        cls.__exit__ = exit_both

    def _kernel(self, op: Any, policy: str | None) -> Any:
        torch, standin, cache = self._torch, self._standin, self._cache
        autocast_key = torch._C.DispatchKey.AutocastCPU
        after = torch._C._dispatch_keyset_full_after(autocast_key)
        excluded = torch._C.DispatchKeySet(autocast_key)
        lower = (torch.float16, torch.bfloat16)

        def eligible(value: Any) -> bool:
            return (isinstance(value, torch.Tensor) and value.is_floating_point()
                    and value.dtype != torch.float64 and standin.is_gpu(value))

        def cast(value: Any, dtype: Any) -> Any:
            if isinstance(value, list | tuple):  # last first, as torch's C++ (built with GCC) evaluates them
                return type(value)(reversed([cast(v, dtype) for v in reversed(value)]))
            if not eligible(value) or value.dtype == dtype:
                return value
            if (dtype in lower and value.dtype == torch.float32 and value.requires_grad and value.is_leaf
                    and not value._is_view() and torch.is_autocast_cache_enabled()):
                hit = cache.get(id(value))
                if hit is not None and hit[0]() is value:
                    return hit[1]
                casted = value.to(dtype)
                cache[id(value)] = (weakref.ref(value), casted)
                return casted
            return value.to(dtype)

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            if policy is None:  # an op CPU autocast casts and CUDA's does not: pass it on uncast
                return op.redispatch(keyset & after, *args, **kwargs)
            if policy == BANNED:
                raise RuntimeError("torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe "
                                   "to autocast: use binary_cross_entropy_with_logits")
            with torch._C._ExcludeDispatchKeyGuard(excluded):
                if policy == LOWER_PRECISION:
                    dtype = torch.get_autocast_dtype("cpu")
                    args, kwargs = cast(args, dtype), {k: cast(v, dtype) for k, v in kwargs.items()}
                elif policy == FP32:
                    args = cast(args, torch.float32)
                    kwargs = {k: cast(v, torch.float32) for k, v in kwargs.items()}
                elif policy == PROMOTE:
                    widest = None
                    for leaf in tree_leaves((args, kwargs)):
                        if eligible(leaf):
                            widest = leaf.dtype if widest is None else torch.promote_types(widest, leaf.dtype)
                    if widest is not None:
                        args = cast(args, widest)
                        kwargs = {k: cast(v, widest) for k, v in kwargs.items()}
                elif policy == FP32_SET_OPT_DTYPE and args and eligible(args[0]) and args[0].dtype in lower:
                    kwargs = _with_float32(op, args, kwargs, torch)
                    args = _args_without_dtype(op, args)
                held = list(args)
                del args
                out = op(*held, **kwargs)
                for index in range(len(held)):  # the casts go first to last, as C++ destroys them
                    held[index] = None
                return out

        return kernel

    def __exit__(self, *exc: object) -> None:
        torch = self._torch
        if self._saved is not None:
            cls = torch.amp.autocast_mode.autocast
            cls.__enter__, cls.__exit__ = self._saved
            self._saved = None
        if self._library is not None:
            self._library._destroy()
            self._library = None
        self._cache.clear()


def _overload(torch: ModuleType, name: str) -> Any:
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    return getattr(packet, overload or "default", None) if packet is not None else None


def _dtype_position(op: Any) -> int | None:
    for index, argument in enumerate(op._schema.arguments):
        if argument.name == "dtype":
            return index
    return None


def _with_float32(op: Any, args: Any, kwargs: Any, torch: ModuleType) -> dict[str, Any]:
    position = _dtype_position(op)
    given = kwargs.get("dtype")
    if position is not None and len(args) > position:
        given = args[position]
    if given is not None or position is None:
        return dict(kwargs)
    return {**kwargs, "dtype": torch.float32}


def _args_without_dtype(op: Any, args: Any) -> Any:
    position = _dtype_position(op)
    if position is not None and len(args) > position and args[position] is None:
        return args[:position]
    return args
