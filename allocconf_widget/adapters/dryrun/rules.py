"""Allocations the GPU's libraries make that fake tensors do not show, added by rule.

* a cuBLAS workspace per thread at its first matmul, held to the end (the forward runs on the
  caller's thread, the backward on autograd's device thread: two workspaces);
* cuDNN's convolution workspaces, each taken once the output it works for exists and freed
  before the next allocation (``core/dryrun/profiles.conv_workspaces``);
* the attention kernels' backward buffers (``core/dryrun/attention.backward_workspace_bytes``).

Sizes come from the core; this module reads the ops' operands. docs/dryrun.md has the
measurements behind each rule.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from allocconf_widget.adapters.dryrun.ports import TraceLog
from allocconf_widget.core.dryrun.attention import (
    CUDNN,
    EFFICIENT,
    FLASH,
    AttentionCall,
    backward_workspace_bytes,
)
from allocconf_widget.core.dryrun.profiles import (
    Convolution,
    GpuProfile,
    conv_workspaces,
    cublas_workspace_bytes,
)

_MATMULS = frozenset(("mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "addmm_", "addbmm"))
_CONVS = frozenset(("convolution", "convolution_backward", "cudnn_convolution",
                    "cudnn_convolution_transpose"))
_CUDNN = "cuDNN workspace (estimate)"
#: each attention kernel's backward op
ATTENTION_BACKWARDS = {
    "_scaled_dot_product_cudnn_attention_backward": CUDNN,
    "_scaled_dot_product_flash_attention_backward": FLASH,
    "_scaled_dot_product_efficient_attention_backward": EFFICIENT,
}
#: where each convolution op's operands sit in its arguments: (data, weight, stride, groups),
#: with the incoming gradient first for the backward
_CONV_ARGS = {
    "convolution": (0, 1, 3, 8),
    "convolution_backward": (1, 2, 4, 9),
    "cudnn_convolution": (0, 1, 3, 5),
    "cudnn_convolution_transpose": (0, 1, 4, 6),
}


def op_name(func: Any) -> str:
    """``mm`` for ``aten.mm.default``."""
    packet = getattr(func, "overloadpacket", None)
    return str(getattr(packet, "__name__", "")).split(".")[-1]


def nbytes(value: Any) -> int:
    try:
        return int(value.numel()) * int(value.element_size())
    except (AttributeError, TypeError, RuntimeError):
        return 0


class Rules:
    """The workspaces one dry run adds, and how many of each (for its notes).

    ``counted(tensor)``: the tensor stands for GPU memory (a fake CUDA tensor, or in the CPU
    stand-in a fake CPU tensor standing for one)."""

    def __init__(self, torch: ModuleType, log: TraceLog, gpu: GpuProfile,
                 counted: Callable[[Any], bool], *, backward_thread: bool = False) -> None:
        self.torch, self.log, self.counted = torch, log, counted
        self.cublas = cublas_workspace_bytes(gpu)
        #: the backward runs on the caller's thread here (the CPU stand-in), where CUDA's runs on
        #: autograd's device thread: count it as a thread of its own
        self.backward_thread = backward_thread
        self.threads: set[tuple[int, bool]] = set()
        self.workspaces = 0
        self.conv_workspaces = 0
        self.attention_workspaces = 0

    def _on_gpu(self, args: Any) -> bool:
        return any(isinstance(a, self.torch.Tensor) and self.counted(a) for a in args[:2])

    def before(self, func: Any, args: Any) -> None:
        if op_name(func) in _MATMULS and self._on_gpu(args):
            backward = self.backward_thread and self.torch._C._current_autograd_node() is not None
            thread = (threading.get_ident(), backward)
            if thread not in self.threads:
                self.threads.add(thread)
                self.workspaces += 1
                self.log.alloc(self.log.synthetic_key(), self.cublas, synthetic="cuBLAS workspace")

    def after(self, func: Any, args: Any, out: Any) -> dict[int, tuple[int, str]]:
        """The workspaces ``func`` borrowed, keyed by ``id()`` of the output each follows (the
        recorder takes each once that output is allocated; keys live only for this op)."""
        name = op_name(func)
        backend = ATTENTION_BACKWARDS.get(name)
        if backend is not None and self._on_gpu(args[1:]):
            return self._attention_backward(backend, args, out)
        if name not in _CONVS or not self._on_gpu(args):
            return {}
        conv = _convolution(self.torch, name, args, out)
        if conv is None:
            return {}
        sizes = conv_workspaces(conv)
        outputs = list(out) if isinstance(out, tuple | list) else [out]
        borrowed: dict[int, tuple[int, str]] = {}
        if outputs and isinstance(outputs[0], self.torch.Tensor) and sizes.after_output:
            borrowed[id(outputs[0])] = (sizes.after_output, _CUDNN)  # the output, or the input's gradient
        if (conv.backward and len(outputs) > 1 and isinstance(outputs[1], self.torch.Tensor)
                and sizes.after_weight_grad):
            borrowed[id(outputs[1])] = (sizes.after_weight_grad, _CUDNN)
        if borrowed:
            self.conv_workspaces += 1
        return borrowed

    def _attention_backward(self, backend: str, args: Any, out: Any) -> dict[int, tuple[int, str]]:
        """An attention kernel's backward: its buffers, taken once its last gradient exists."""
        from allocconf_widget.adapters.dryrun.tensors import tree_leaves

        torch = self.torch
        call = attention_call(torch, args[1:4])
        if call is None:
            return {}
        size = backward_workspace_bytes(backend, call)
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not outputs or size <= 0:
            return {}
        self.attention_workspaces += 1
        return {id(outputs[-1]): (size, "attention workspace (estimate)")}

    def borrow(self, workspace: tuple[int, str]) -> None:
        """A workspace allocated now and freed before the next allocation."""
        size, what = workspace
        if size > 0:
            key = self.log.synthetic_key()
            self.log.alloc(key, size, synthetic=what)
            self.log.free(key)


def attention_call(torch: ModuleType, qkv: Any, *, has_mask: bool = False, is_causal: bool = False,
                   dropout: float = 0.0, requires_grad: bool = False) -> AttentionCall | None:
    """The kernel choice's view of query, key and value (None: not three 4-D tensors)."""
    if len(qkv) < 3 or not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in qkv[:3]):
        return None
    query, key, value = qkv[:3]
    dtype = str(query.dtype).removeprefix("torch.")
    contiguous = all(int(t.stride(-1)) == 1 or int(t.shape[-1]) == 1 for t in (query, key, value))
    return AttentionCall(batch=int(query.shape[0]), heads=int(query.shape[1]), kv_heads=int(key.shape[1]),
                         seq_q=int(query.shape[2]), seq_k=int(key.shape[2]), head_dim=int(query.shape[3]),
                         value_dim=int(value.shape[3]), dtype=dtype, has_mask=has_mask,
                         is_causal=is_causal, dropout=dropout, requires_grad=requires_grad,
                         last_dim_contiguous=contiguous)


def _convolution(torch: ModuleType, name: str, args: Any, out: Any) -> Convolution | None:
    """The operands of one convolution op, as the workspace rule reads them."""
    from allocconf_widget.adapters.dryrun.tensors import tree_leaves

    data_at, weight_at, stride_at, groups_at = _CONV_ARGS[name]
    if len(args) <= weight_at:
        return None
    data, weight = args[data_at], args[weight_at]
    if not isinstance(data, torch.Tensor) or not isinstance(weight, torch.Tensor) or data.dim() < 3:
        return None
    backward = name == "convolution_backward"
    if backward:
        output_bytes = nbytes(args[0])
    else:
        output_bytes = sum(nbytes(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
    stride = args[stride_at] if len(args) > stride_at else 1
    groups = args[groups_at] if len(args) > groups_at else 1
    first_stride = stride[0] if isinstance(stride, list | tuple) and stride else stride
    return Convolution(
        input_bytes=nbytes(data), output_bytes=output_bytes, weight_bytes=nbytes(weight),
        in_channels=int(data.shape[1]), kernel=int(weight.shape[2]) if weight.dim() > 2 else 1,
        stride=int(first_stride) if isinstance(first_stride, int) else 1,
        groups=int(groups) if isinstance(groups, int) else 1,
        channels_last=int(data.shape[1]) > 1 and int(data.stride(1)) == 1, backward=backward,
        element_size=int(data.element_size()))


def rule_notes(rules: Rules | None) -> list[str]:
    """What the rules added, for the dry run's notes."""
    if rules is None:
        return ["raw trace: the cuBLAS and cuDNN workspaces the GPU would add are not modelled"]
    from allocconf_widget.core.units import format_bytes

    out = []
    if rules.workspaces:
        out.append(f"added {rules.workspaces} cuBLAS workspace(s) of {format_bytes(rules.cublas)} "
                   "(one per thread that runs a matmul)")
    if rules.conv_workspaces:
        plural = "s" if rules.conv_workspaces != 1 else ""
        out.append(f"added a cuDNN workspace to {rules.conv_workspaces:,} convolution{plural} (sized "
                   "as measured on an H200; other GPUs' algorithms may borrow more or less)")
    if rules.attention_workspaces:
        out.append(f"added the attention kernel's backward buffers to {rules.attention_workspaces:,} "
                   "attention call(s) (cuDNN's as measured on an H200; flash and memory-efficient "
                   "attention's read from their source)")
    return out
