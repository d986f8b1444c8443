"""``scaled_dot_product_attention`` in a dry run: the kernel the profiled GPU would run.

SDPA picks its kernel from the GPU it runs on; under fake tensors that is this machine's torch
(a CPU build picks the math fallback; another GPU its own kernel), not the profile's. The dry
run decides with the profile's rules (``core/dryrun/attention.choose``) and calls that
kernel's own op (``_scaled_dot_product_flash_attention`` …), whose fake outputs and autograd
backward allocate what the kernel allocates. Under ``autocast("cuda")`` the inputs are cast
first, as the autocast kernel of SDPA does, and the choice is made for the cast dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from types import ModuleType
from typing import Any

from allocconf_widget.adapters.dryrun.ports import Notes
from allocconf_widget.adapters.dryrun.rules import attention_call
from allocconf_widget.core.dryrun.attention import CUDNN, EFFICIENT, FLASH, MATH, choose, cudnn_first
from allocconf_widget.core.dryrun.dispatch import cudnn_version_number
from allocconf_widget.core.dryrun.profiles import GpuProfile

_PARAMETERS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def build_cudnn_preferred(torch: ModuleType) -> tuple[bool | None, str]:
    """Whether this build's SDPA would try cuDNN first on a capability-9.x GPU, and how that is
    known: from the CUDA version and the cuDNN wheel of a CUDA build (read from package
    metadata: asking torch would start CUDA); None on a CPU build, whose later GPU build is
    unknown."""
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    if not cuda:
        return None, "a CPU-only torch: the GPU build's cuDNN is unknown"
    version = None
    for name in ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn-cu11"):
        try:
            version = cudnn_version_number(metadata.version(name))
            break
        except metadata.PackageNotFoundError:
            continue
    try:
        cuda_major = int(str(cuda).split(".")[0])
    except ValueError:
        cuda_major = None
    return (cudnn_first((9, 0), version, cuda_major),
            f"CUDA {cuda}, cuDNN {version if version is not None else 'unknown'}")


def cudnn_preferred_for(gpu: GpuProfile, build: bool | None) -> bool:
    """Whether SDPA tries cuDNN attention first on ``gpu`` with this build. A CPU build is
    taken as a recent CUDA 13 wheel (cuDNN past 9.15), the build the profiles were measured with."""
    if gpu.capability[0] not in (9, 10):
        return False
    return True if build is None else build


def attention_function(torch: ModuleType, gpu: GpuProfile, notes: Notes, counted: Callable[[Any], bool],
                       cudnn_preferred: bool) -> Callable[[Any, Any], Any]:
    """What ``F.scaled_dot_product_attention(*args, **kwargs)`` does in the dry run."""
    original = torch.nn.functional.scaled_dot_product_attention
    aten = torch.ops.aten

    def call(args: Any, kwargs: Any) -> Any:
        bound = dict(zip(_PARAMETERS, args, strict=False))
        bound.update(kwargs)
        query: Any = bound.get("query")
        key: Any = bound.get("key")
        value: Any = bound.get("value")
        if not all(isinstance(t, torch.Tensor) and counted(t) for t in (query, key, value)):
            return original(*args, **kwargs)
        mask = bound.get("attn_mask")
        dropout = float(bound.get("dropout_p", 0.0) or 0.0)
        causal = bool(bound.get("is_causal", False))
        scale = bound.get("scale")
        gqa = bool(bound.get("enable_gqa", False))
        if torch.is_autocast_enabled("cuda"):
            dtype = torch.get_autocast_dtype("cuda")
            query, key, value = (t.to(dtype) if t.is_floating_point() and t.dtype != torch.float64 else t
                                 for t in (query, key, value))
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        shape = attention_call(torch, (query, key, value), has_mask=mask is not None, is_causal=causal,
                               dropout=dropout, requires_grad=grad)
        if shape is None:
            return original(*args, **kwargs)
        choice = choose(gpu.capability, shape, cudnn_preferred=cudnn_preferred, disabled=_disabled(torch))
        notes.add(f"attention ran as {gpu.name} would run it: {choice.describe()}",
                  key=f"sdpa {choice.backend} {shape.dtype}")
        if shape.grouped and gqa and choice.backend in (EFFICIENT, MATH):
            repeats = shape.heads // shape.kv_heads
            key, value = key.repeat_interleave(repeats, -3), value.repeat_interleave(repeats, -3)
        if choice.backend == FLASH:
            return aten._scaled_dot_product_flash_attention(query, key, value, dropout, causal, False,
                                                            scale=scale)[0]
        if choice.backend == CUDNN:
            bias = _bias(torch, mask, query)
            return aten._scaled_dot_product_cudnn_attention(query, key, value, bias, grad, dropout, causal,
                                                            False, scale=scale)[0]
        if choice.backend == EFFICIENT:
            return aten._scaled_dot_product_efficient_attention(query, key, value, _bias(torch, mask, query),
                                                                grad, dropout, causal, scale=scale)[0]
        return aten._scaled_dot_product_attention_math(query, key, value, mask, dropout, causal,
                                                       scale=scale)[0]

    return call


def _disabled(torch: ModuleType) -> frozenset[str]:
    """The SDPA backends the program turned off (global flags; ``sdpa_kernel`` sets them too)."""
    backends = getattr(torch.backends, "cuda", None)
    flags = {FLASH: "flash_sdp_enabled", EFFICIENT: "mem_efficient_sdp_enabled", MATH: "math_sdp_enabled",
             CUDNN: "cudnn_sdp_enabled"}
    return frozenset(name for name, probe in flags.items()
                     if callable(getattr(backends, probe, None)) and not getattr(backends, probe)())


def _bias(torch: ModuleType, mask: Any, query: Any) -> Any:
    """A boolean mask as the additive bias the fused kernels take (SDPA converts it so)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    zero = torch.zeros((), dtype=query.dtype, device=query.device)
    return torch.where(mask, zero, torch.full((), float("-inf"), dtype=query.dtype, device=query.device))


@contextmanager
def attention_inside_functions(torch: ModuleType, attention: Callable[[Any, Any], Any],
                               mode: Any) -> Iterator[None]:
    """While entered, an SDPA call made from inside another torch function runs ``attention``.

    A torch function that calls SDPA itself (``F.multi_head_attention_forward``, which
    ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` use) is handled by the dry run's
    function ``mode`` as one call, run with that mode off, so its SDPA call never reached the
    profile's kernel choice: on the CPU stand-in, CPU rules took the math kernel, whose
    attention matrices and dropout masks are kept for the backward. Such functions look SDPA up
    as a global of ``torch.nn.functional``: that name answers with ``attention`` where ``mode``
    is off, and calls torch's own function (which the mode then sees) where it is on."""
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention
    stack = torch.overrides._get_current_function_mode_stack

    def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> Any:
        if mode in stack():
            return original(*args, **kwargs)
        return attention(args, kwargs)

    functional.scaled_dot_product_attention = scaled_dot_product_attention
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original
