"""Run the user's own code on fake CUDA tensors and record the allocations it would make.

Under ``FakeTensorMode`` a tensor on "cuda" has a shape, a dtype and a storage size but no
memory and no values, and dispatch follows the CUDA keys (CUDA autocast policy, the foreach
optimizer default, CUDA meta kernels). A ``TorchDispatchMode`` stacked on it sees every op's
outputs: each untyped storage it has not seen is an allocation of ``nbytes()`` (the size the
caching allocator is asked for), and a ``weakref.finalize`` on the storage's Python object
(which PyTorch keeps alive exactly as long as the storage) is its free. The result is a trace
in ``torch.cuda.memory._snapshot()``'s format, which ``core/sim`` replays like a recording.

What must not happen: CUDA starting, which freezes the allocator settings the user is still
choosing. :class:`DryRun` therefore blocks fake-tensor's GPU-context warm-up
(``torch_private.GpuContextInitBlocked``) and answers the ``torch.cuda`` queries a training
script makes (``is_bf16_supported``, ``get_device_properties`` …) from a
:class:`~allocconf_widget.core.dryrun.profiles.GpuProfile`. docs/dryrun.md lists what a dry run
cannot see and how far its predictions were from real runs.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import sys
import time
import traceback
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, ModuleType, SimpleNamespace, TracebackType
from typing import Any

from allocconf_widget._errors import DryRunError as DryRunError  # noqa: PLC0414  (raised here)
from allocconf_widget.adapters import torch_private as tp
from allocconf_widget.core.dryrun.profiles import Convolution, GpuProfile

#: fake addresses start here and grow by each block's 512-byte-aligned size (never reused,
#: so every free names exactly one allocation)
_BASE_ADDRESS = 0x7F00_0000_0000
_ALIGN = 512
#: the oldest torch 2.x the dry run accepts (older fake-tensor modes lack what it uses)
MIN_TORCH_MINOR = 4
#: what a float the dry run cannot know reads as (``loss.item()``)
PLACEHOLDER = 1.0


@dataclass(frozen=True)
class DryRunTrace:
    """What one dry run recorded: the trace entries and what is known about them."""

    entries: list[dict[str, Any]]
    ops: int  # aten ops dispatched
    seconds: float  # wall time of the user's code under the dry run
    peak_requested: int  # largest sum of live requested bytes
    live_at_end: int  # requested bytes still allocated when the dry run ended
    profile: GpuProfile
    torch_version: str
    conf_text: str  # the allocator settings in the environment when the dry run ran
    notes: tuple[str, ...] = ()
    cuda_was_initialized: bool = False  # CUDA had started before the dry run (settings frozen)

    @property
    def allocations(self) -> int:
        return sum(1 for e in self.entries if e["action"] == "alloc")


#: a dry run's trace ends there (a bounded host memory): one step makes far fewer calls
MAX_ENTRIES = 1_000_000
#: entries past this one carry no call stack (each held ~1.4 KiB with one)
FRAMES_UNTIL = 200_000


@dataclass
class _Log:
    """The recorder's mutable state, shared with the finalizers."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    live: dict[int, tuple[int, int]] = field(default_factory=dict)  # storage id → (addr, size)
    finalizers: dict[int, weakref.finalize[Any, Any]] = field(default_factory=dict)
    next_addr: int = _BASE_ADDRESS
    current: int = 0
    peak: int = 0
    ops: int = 0
    open: bool = True
    frames: bool = True

    def alloc(self, key: int, size: int, synthetic: str | None = None) -> int:
        if len(self.entries) >= MAX_ENTRIES:
            raise DryRunError(f"the step made more than {MAX_ENTRIES:,} allocator calls; a dry run "
                              "is for one step (or a few) of the loop: run one step in the cell")
        addr = self.next_addr
        self.next_addr += (size + _ALIGN - 1) // _ALIGN * _ALIGN
        self.live[key] = (addr, size)
        self.current += size
        self.peak = max(self.peak, self.current)
        entry: dict[str, Any] = {"action": "alloc", "addr": addr, "size": size, "stream": 0,
                                 "time_us": _now_us()}
        frames = _user_frames() if self.frames and len(self.entries) < FRAMES_UNTIL else []
        if synthetic is not None:  # added by a rule, not seen: say so where viewers look
            frames.insert(0, {"filename": "<allocconf dry-run rule>", "line": 0, "name": synthetic})
        entry["frames"] = frames
        self.entries.append(entry)
        return addr

    def free(self, key: int) -> None:
        self.finalizers.pop(key, None)
        held = self.live.pop(key, None)
        if held is None or not self.open:
            return
        addr, size = held
        self.current -= size
        now = _now_us()
        self.entries.append({"action": "free_requested", "addr": addr, "size": size, "stream": 0,
                             "time_us": now, "frames": []})
        self.entries.append({"action": "free_completed", "addr": addr, "size": size, "stream": 0,
                             "time_us": now, "frames": []})


def _now_us() -> int:
    return time.time_ns() // 1000


_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)


_STDLIB_DIR = str(Path(os.__file__).parent)


def _is_library(filename: str, torch_dir: str) -> bool:
    """Frames that are not the user's: torch, installed packages, the standard library, us."""
    return (filename.startswith((torch_dir, _PACKAGE_DIR, _STDLIB_DIR, "<frozen"))
            or "site-packages" in filename or "dist-packages" in filename)


def _user_frames(limit: int = 3) -> list[dict[str, Any]]:
    """The innermost frames outside torch and this package (the user's lines)."""
    torch_dir = _torch_dir()
    frame: FrameType | None = sys._getframe(2)
    out: list[dict[str, Any]] = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        if not _is_library(code.co_filename, torch_dir):
            out.append({"filename": code.co_filename, "line": frame.f_lineno, "name": code.co_name})
        frame = frame.f_back
    return out


def _torch_dir() -> str:
    torch = sys.modules.get("torch")
    where = getattr(torch, "__file__", None)
    return str(Path(where).parent) if where else "\0"


def user_line(tb: TracebackType | None) -> str | None:
    """``file:line: source`` of the innermost traceback frame in the user's code."""
    torch_dir = _torch_dir()
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if not _is_library(code.co_filename, torch_dir):
            found = (code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    if found is None:
        return None
    source = linecache.getline(found[0], found[1]).strip()
    return f"{found[0]}, line {found[1]}" + (f": {source}" if source else "")


def _caller_line() -> str:
    frames = _user_frames(1)
    if not frames:
        return "an unknown line"
    f = frames[0]
    source = linecache.getline(f["filename"], f["line"]).strip()
    return f"{f['filename']}, line {f['line']}" + (f": {source}" if source else "")


def _recorder_class(torch: ModuleType) -> type:
    base = tp.dispatch_mode_base()

    class _Recorder(base):  # type: ignore[misc, valid-type]
        """Gives every new CUDA storage an address and an ``alloc``; its finalizer, the free."""

        def __init__(self, log: _Log, rules: _Rules | None) -> None:
            super().__init__()
            self.log = log
            self.rules = rules

        def __torch_dispatch__(self, func: Any, _types: Any, args: Any = (), kwargs: Any = None) -> Any:
            rules = self.rules
            if rules is not None:
                rules.before(func, args)
            out = func(*args, **(kwargs or {}))
            log = self.log
            log.ops += 1
            # a kernel's workspace is taken once the output it works for exists
            borrowed = rules.after(func, args, out) if rules is not None else {}
            for leaf in tp.tree_leaves(out):
                if isinstance(leaf, torch.Tensor) and leaf.device.type == "cuda":
                    storage = leaf.untyped_storage()
                    key = id(storage)
                    size = int(storage.nbytes())
                    if key not in log.live and size > 0:  # zero bytes: no allocation
                        log.alloc(key, size)
                        log.finalizers[key] = weakref.finalize(storage, log.free, key)
                if rules is not None and borrowed:
                    rules.borrow(borrowed.pop(id(leaf), 0))
            if rules is not None:
                for size in borrowed.values():  # an output that was no new allocation
                    rules.borrow(size)
            return out

    return _Recorder


_MATMULS = frozenset(("mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "addmm_", "addbmm"))
_CONVS = frozenset(("convolution", "convolution_backward", "cudnn_convolution",
                    "cudnn_convolution_transpose"))
_ATTENTION_BACKWARD = "_scaled_dot_product_cudnn_attention_backward"


class _Rules:
    """Allocations the GPU's libraries make that fake tensors do not show (core/dryrun/profiles).

    * a cuBLAS workspace per thread at its first matmul, held to the end (the forward runs on
      the caller's thread, the backward on autograd's device thread: two workspaces);
    * cuDNN's workspaces, each taken once the output it works for exists and freed before the
      next allocation, sized by the measured rule (``core.dryrun.profiles.conv_workspaces``).
    """

    def __init__(self, torch: ModuleType, log: _Log, gpu: GpuProfile) -> None:
        from allocconf_widget.core.dryrun.profiles import cublas_workspace_bytes

        self.torch, self.log = torch, log
        self.cublas = cublas_workspace_bytes(gpu)
        self.threads: set[int] = set()
        self.keys = -1  # synthetic storage keys (negative: never an id())
        self.workspaces = 0
        self.conv_workspaces = 0
        self.attention_workspaces = 0

    def _key(self) -> int:
        self.keys -= 1
        return self.keys

    def before(self, func: Any, args: Any) -> None:
        name = _op_name(func)
        if name in _MATMULS and _on_cuda(self.torch, args):
            import threading

            thread = threading.get_ident()
            if thread not in self.threads:
                self.threads.add(thread)
                self.workspaces += 1
                self.log.alloc(self._key(), self.cublas, synthetic="cuBLAS workspace")

    def after(self, func: Any, args: Any, out: Any) -> dict[int, int]:
        """The workspaces ``func`` borrowed, keyed by ``id()`` of the output each follows (the
        recorder takes each once that output is allocated; keys live only for this op)."""
        name = _op_name(func)
        if name == _ATTENTION_BACKWARD and _on_cuda(self.torch, args):
            return self._attention_backward(args, out)
        if name not in _CONVS or not _on_cuda(self.torch, args):
            return {}
        from allocconf_widget.core.dryrun.profiles import conv_workspaces

        conv = _convolution(self.torch, name, args, out)
        if conv is None:
            return {}
        sizes = conv_workspaces(conv)
        outputs = list(out) if isinstance(out, tuple | list) else [out]
        borrowed: dict[int, int] = {}
        if outputs and isinstance(outputs[0], self.torch.Tensor) and sizes.after_output:
            borrowed[id(outputs[0])] = sizes.after_output  # the output, or the input's gradient
        if (conv.backward and len(outputs) > 1 and isinstance(outputs[1], self.torch.Tensor)
                and sizes.after_weight_grad):
            borrowed[id(outputs[1])] = sizes.after_weight_grad
        if borrowed:
            self.conv_workspaces += 1
        return borrowed

    def _attention_backward(self, args: Any, out: Any) -> dict[int, int]:
        """cuDNN attention's backward: its buffers, taken once its last gradient exists."""
        from allocconf_widget.core.dryrun.profiles import attention_backward_workspace_bytes

        torch = self.torch
        if len(args) < 6 or not all(isinstance(a, torch.Tensor) for a in args[1:3]):
            return {}
        query, key, logsumexp = args[1], args[2], args[5]
        grouped = query.dim() == 4 and key.dim() == 4 and int(key.shape[1]) < int(query.shape[1])
        size = attention_backward_workspace_bytes(int(query.numel()), _nbytes(query), _nbytes(logsumexp),
                                                  grouped)
        outputs = [t for t in tp.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not outputs or size <= 0:
            return {}
        self.attention_workspaces += 1
        return {id(outputs[-1]): size}

    def borrow(self, size: int) -> None:
        """A workspace allocated now and freed before the next allocation."""
        if size > 0:
            key = self._key()
            self.log.alloc(key, size, synthetic="cuDNN workspace (estimate)")
            self.log.free(key)


#: where each convolution op's operands sit in its arguments: (data, weight, stride, groups),
#: with the incoming gradient first for the backward
_CONV_ARGS = {
    "convolution": (0, 1, 3, 8),
    "convolution_backward": (1, 2, 4, 9),
    "cudnn_convolution": (0, 1, 3, 5),
    "cudnn_convolution_transpose": (0, 1, 4, 6),
}


def _convolution(torch: ModuleType, name: str, args: Any, out: Any) -> Convolution | None:
    """The operands of one convolution op, as the workspace rule reads them."""
    data_at, weight_at, stride_at, groups_at = _CONV_ARGS[name]
    if len(args) <= weight_at:
        return None
    data, weight = args[data_at], args[weight_at]
    if not isinstance(data, torch.Tensor) or not isinstance(weight, torch.Tensor) or data.dim() < 3:
        return None
    backward = name == "convolution_backward"
    if backward:
        output_bytes = _nbytes(args[0])
    else:
        output_bytes = sum(_nbytes(t) for t in tp.tree_leaves(out) if isinstance(t, torch.Tensor))
    stride = args[stride_at] if len(args) > stride_at else 1
    groups = args[groups_at] if len(args) > groups_at else 1
    first_stride = stride[0] if isinstance(stride, list | tuple) and stride else stride
    return Convolution(
        input_bytes=_nbytes(data), output_bytes=output_bytes, weight_bytes=_nbytes(weight),
        in_channels=int(data.shape[1]), kernel=int(weight.shape[2]) if weight.dim() > 2 else 1,
        stride=int(first_stride) if isinstance(first_stride, int) else 1,
        groups=int(groups) if isinstance(groups, int) else 1,
        channels_last=int(data.shape[1]) > 1 and int(data.stride(1)) == 1, backward=backward,
        element_size=int(data.element_size()))


def _op_name(func: Any) -> str:
    packet = getattr(func, "overloadpacket", None)
    return str(getattr(packet, "__name__", "")).split(".")[-1]


def _on_cuda(torch: ModuleType, args: Any) -> bool:
    return any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in args[:2])


def _nbytes(value: Any) -> int:
    try:
        return int(value.numel()) * int(value.element_size())
    except (AttributeError, TypeError, RuntimeError):
        return 0


def _values_class(torch: ModuleType, notes: list[str], cpu_only: bool) -> type:
    """A function mode for what fake tensors cannot do by themselves.

    * ``.item()`` / ``float()`` / formatting a float scalar whose value the fake mode does not
      know (printing a loss) gives :data:`PLACEHOLDER` and a note naming the line: memory does
      not depend on a logged value (1.0, not 0.0: code divides by such values, e.g. Adam's
      bias correction ``1 - beta ** step``);
    * on a CPU-only torch, ``.to("cuda")`` makes an empty fake CUDA tensor (that build cannot
      copy to a device it lacks), and an op that would record autograd history on a fake CUDA
      tensor stops with a message (that build aborts the interpreter there, measured 2.13).
    """
    base = tp.function_mode_base(torch)
    floats = {torch.Tensor.item, torch.Tensor.__float__}
    fmt = torch.Tensor.__format__
    moves = {torch.Tensor.to, torch.Tensor.cuda}
    unknown = tp.data_dependent_errors()
    noted: set[str] = set()

    def note_value(what: str) -> None:
        line = _caller_line()
        if line not in noted:
            noted.add(line)
            notes.append(f"{what} at {line} gave {PLACEHOLDER}: a dry run has no values (memory "
                         "does not depend on it unless the code branches on it)")

    class _Values(base):  # type: ignore[misc, valid-type]
        def __torch_function__(self, func: Any, _types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            first = args[0] if args else None
            if (isinstance(first, torch.Tensor) and tp.is_fake_tensor(first)
                    and first.dtype.is_floating_point and first.numel() == 1
                    and (func in floats or func is fmt)):
                try:  # a constant the fake mode tracks (an optimizer's step count) has a value
                    return func(*args, **kwargs)
                except unknown:
                    if func is fmt:
                        note_value("formatting a tensor")
                        return format(PLACEHOLDER, args[1] if len(args) > 1 else "")
                    note_value(".item()" if func is torch.Tensor.item else "float()")
                    return PLACEHOLDER
            if cpu_only:
                moved = _cpu_build_move(torch, func, moves, args, kwargs)
                if moved is not None:
                    return moved
                if torch.is_grad_enabled() and getattr(func, "__name__", "") not in _NO_AUTOGRAD:
                    _refuse_autograd(torch, args, kwargs)
            return func(*args, **kwargs)

    return _Values


#: calls that read or move a tensor without recording autograd history (safe on a CPU build)
_NO_AUTOGRAD = frozenset((
    "__get__", "__set__", "_has_compatible_shallow_copy_type", "to", "cuda", "detach", "detach_",
    "requires_grad_", "size", "dim", "numel", "stride", "storage_offset", "untyped_storage",
    "element_size", "is_contiguous", "is_floating_point", "is_complex", "data_ptr", "__repr__",
    "__format__", "__deepcopy__", "__reduce_ex__", "__setstate__", "__len__", "__hash__", "__eq__",
    "zero_", "fill_", "copy_", "normal_", "uniform_", "kaiming_uniform_", "new_empty",
    "new_zeros", "empty_like", "zeros_like", "ones_like", "type", "float", "half", "bfloat16",
))


def _cpu_build_move(torch: ModuleType, func: Any, moves: set[Any], args: Any, kwargs: Any) -> Any:
    if func not in moves or not args or not isinstance(args[0], torch.Tensor):
        return None
    tensor = args[0]
    if tensor.device.type == "cuda":
        return None
    rest = [*args[1:], *kwargs.values()]
    target = None
    if func is torch.Tensor.cuda:
        target = "cuda"
    for value in rest:
        if isinstance(value, str | torch.device) and torch.device(value).type == "cuda":
            target = "cuda"
    if target is None:
        return None
    dtype = next((v for v in rest if isinstance(v, torch.dtype)), tensor.dtype)
    out = torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=dtype, device="cuda")
    return out.requires_grad_(tensor.requires_grad) if dtype.is_floating_point else out


def _refuse_autograd(torch: ModuleType, args: Any, kwargs: Any) -> None:
    for leaf in tp.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad and leaf.device.type == "cuda":
            raise DryRunError(
                f"this torch ({torch.__version__}) is a CPU-only build: it cannot record "
                f"gradients on fake CUDA tensors (at {_caller_line()}). A dry run of training "
                "needs a CUDA build of torch (a GPU runtime, before CUDA starts); on this "
                "machine it can dry-run inference only: wrap the step in torch.no_grad()")


def _profile_answers(profile: GpuProfile, notes: list[str]) -> dict[str, Any]:
    """``torch.cuda`` functions that would start CUDA, answered from ``profile``."""
    major, minor = profile.capability
    props = SimpleNamespace(name=profile.name, total_memory=profile.total_bytes, major=major,
                            minor=minor, multi_processor_count=profile.multiprocessors,
                            is_integrated=False, is_multi_gpu_board=False,
                            L2_cache_size=50 << 20, gcnArchName="", uuid="dry-run",
                            warp_size=32, max_threads_per_multi_processor=2048)

    def bf16(including_emulation: bool = True) -> bool:
        return True if including_emulation else profile.bf16_native

    def compile_stub(model: Any = None, **_options: Any) -> Any:
        if not any("torch.compile" in n for n in notes):
            notes.append("torch.compile ran uncompiled (eager) in the dry run: compiled kernels "
                         "allocate differently (usually less)")
        return model if model is not None else (lambda fn: fn)

    return {
        "is_bf16_supported": bf16,
        "get_device_properties": lambda *_a, **_k: props,
        "get_device_capability": lambda *_a, **_k: (major, minor),
        "get_device_name": lambda *_a, **_k: profile.name,
        "current_device": lambda *_a: 0,
        "mem_get_info": lambda *_a, **_k: (profile.usable_bytes, profile.total_bytes),
        "synchronize": lambda *_a, **_k: None,
        "empty_cache": lambda *_a: None,
        "compile": compile_stub,
    }


@contextlib.contextmanager
def _patched(torch: ModuleType, answers: dict[str, Any]) -> Iterator[None]:
    saved: list[tuple[Any, str, Any]] = []
    try:
        for name, value in answers.items():
            owner = torch if name == "compile" else torch.cuda
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


class DryRun:
    """``with DryRun(profile) as run: <the user's step>``, then ``run.trace``.

    Not re-entrant. Tensors created inside are fakes: they hold no memory and no values, and
    stay fakes after the block (rebuild the model for the real run).
    """

    def __init__(self, profile: GpuProfile, *, frames: bool = True, rules: bool = True) -> None:
        self.profile = profile
        self.trace: DryRunTrace | None = None
        self._frames = frames
        self._use_rules = rules
        self._rules: _Rules | None = None
        self._stack: contextlib.ExitStack | None = None
        self._log = _Log(frames=frames)
        self._notes: list[str] = []
        self._torch: ModuleType | None = None
        self._start = 0.0
        self._was_initialized = False
        self._conf = ""

    def __enter__(self) -> DryRun:
        import torch  # the user's step needs it anyway; importing it fixes only `backend`

        from allocconf_widget.core.versions import parse_version

        if parse_version(str(torch.__version__)) < (2, MIN_TORCH_MINOR):
            raise DryRunError(f"a dry run needs torch 2.{MIN_TORCH_MINOR} or newer (fake CUDA "
                              f"tensors; verified on 2.11 and 2.13); this is {torch.__version__}")
        self._torch = torch
        self._was_initialized = tp.cuda_initialized(torch)
        self._conf = _env_conf()
        cpu_only = not tp.cuda_built(torch)
        if cpu_only:
            self._notes.append(f"this torch ({torch.__version__}) is a CPU-only build: the dry run "
                               "follows CUDA's dispatch but cannot record a backward pass")
        elif not torch.cuda.is_available():
            self._notes.append("no GPU visible: a backward pass on fake CUDA tensors fails on "
                               "CUDA builds without one")
        if self._was_initialized:
            self._notes.append("CUDA had already started in this process: the allocator settings "
                               "are fixed; the prediction still holds for a fresh process")
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(tp.dispatch_keys_preserved(torch))  # exits last of all
            stack.enter_context(tp.TorchDefaultsRestored(torch))  # after the mode
            stack.enter_context(tp.UserObjectsRestored(torch))
            stack.enter_context(tp.GpuContextInitBlocked())
            stack.enter_context(tp.FakeParameterSwaps(torch))
            stack.enter_context(tp.FakeForeachDefault(torch))
            stack.enter_context(_patched(torch, _profile_answers(self.profile, self._notes)))
            stack.enter_context(tp.fake_cuda_mode())
            self._rules = _Rules(torch, self._log, self.profile) if self._use_rules else None
            stack.enter_context(_recorder_class(torch)(self._log, self._rules))
            stack.enter_context(_values_class(torch, self._notes, cpu_only)())
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        self._start = time.perf_counter()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Stop recording; an error the dry run caused becomes a :class:`DryRunError` that
        names the user's line (other errors pass through unchanged)."""
        torch = self._torch
        assert torch is not None and self._stack is not None
        seconds = time.perf_counter() - self._start
        if isinstance(exc, KeyboardInterrupt) and tb is not None:
            # a Ctrl-C landing as one of torch's context managers had entered but before its
            # ``with`` took hold leaves that generator suspended, its dispatch guards on, and
            # referenced from the traceback the shell keeps (%debug): finalized at some later,
            # random moment, it reset dispatch state under the user's next training step
            # (autograd then failed: "element 0 of tensors does not require grad"). Dropping
            # the frames' locals finalizes it here, before the dispatch keys are put back.
            traceback.clear_frames(tb)
        self._stack.close()
        log = self._log
        log.open = False
        for fin in list(log.finalizers.values()):
            fin.detach()
        self.trace = DryRunTrace(
            entries=log.entries, ops=log.ops, seconds=seconds, peak_requested=log.peak,
            live_at_end=log.current, profile=self.profile, torch_version=str(torch.__version__),
            conf_text=self._conf, notes=tuple(self._notes + self._rule_notes()),
            cuda_was_initialized=self._was_initialized)
        if exc is None or isinstance(exc, DryRunError):
            return
        problem = _explain(torch, exc, tb)
        if problem is not None:
            raise DryRunError(problem) from None


    def _rule_notes(self) -> list[str]:
        rules = self._rules
        if rules is None:
            return ["raw trace: the cuBLAS and cuDNN workspaces the GPU would add are not modelled"]
        from allocconf_widget.core.units import format_bytes

        out = []
        if rules.workspaces:
            out.append(f"added {rules.workspaces} cuBLAS workspace(s) of "
                       f"{format_bytes(rules.cublas)} (one per thread that runs a matmul)")
        if rules.conv_workspaces:
            plural = "s" if rules.conv_workspaces != 1 else ""
            out.append(f"added a cuDNN workspace to {rules.conv_workspaces:,} convolution{plural} (sized "
                       "as measured on an H200; other GPUs' algorithms may borrow more or less)")
        if rules.attention_workspaces:
            out.append(f"added cuDNN attention's backward buffers to {rules.attention_workspaces:,} "
                       "attention call(s) (as measured on an H200)")
        return out


def _env_conf() -> str:
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        value = os.environ.get(name)
        if value is not None:
            return value
    return ""


def _explain(torch: ModuleType, exc: BaseException, tb: TracebackType | None) -> str | None:
    """Why the user's code stopped under the dry run, naming their line; None: not ours."""
    where = user_line(tb) or "a line of your code"
    if isinstance(exc, tp.data_dependent_errors()):
        return (f"the dry run stopped at {where}: this op needs real tensor values "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}), "
                "which a dry run does not have (e.g. nonzero, boolean-mask indexing, .tolist(), "
                "branching on a tensor). Move it out of the dry-run step, or use a fixed-size "
                "equivalent")
    text = str(exc)
    if "not linked with support for cuda" in text:
        return (f"the dry run stopped at {where}: this torch ({torch.__version__}) is a CPU-only "
                "build and cannot run this op on fake CUDA tensors. Dry-run on a GPU runtime "
                "(a CUDA build of torch; CUDA does not start), or build the model on 'meta'/CPU "
                "and run inference under torch.no_grad()")
    if "hasPrimaryContext" in text or "valid device index" in text:
        return (f"the dry run stopped at {where}: the backward pass of fake CUDA tensors needs a "
                "visible GPU (this machine has none). Run the dry run on the GPU runtime; CUDA "
                "will not start")
    return None


def isolated_namespace(user_ns: dict[str, Any]) -> dict[str, Any]:
    """The user's names, with tensors, modules and optimizers deep-copied (one memo, so an
    optimizer still points at its model's copies): ``.to("cuda")`` in a dry-run cell then
    moves the copy, never the user's real model."""
    import copy

    import torch

    ns = dict(user_ns)
    memo: dict[int, Any] = {}
    for name, value in ns.items():
        if not isinstance(value, torch.Tensor | torch.nn.Module | torch.optim.Optimizer):
            continue
        try:
            ns[name] = copy.deepcopy(value, memo)
        except Exception:  # torch refuses some: a loss left by an earlier cell, weight_norm
            # a tensor's view: ops in the dry run's fake mode never write to it; a module or
            # optimizer stays the user's own, which the dry run restores (UserObjectsRestored)
            ns[name] = value.detach() if isinstance(value, torch.Tensor) else value
    return ns
