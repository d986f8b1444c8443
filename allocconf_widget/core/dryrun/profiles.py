"""Named GPUs a dry run can be predicted for, with the memory PyTorch can really use on each.

A dry run never starts CUDA, so it cannot ask torch what GPU it will run on: what a fake
CUDA run must answer (``torch.cuda.get_device_properties``, ``is_bf16_supported``) and what
the replay needs (the device's capacity, less the CUDA context that no allocator statistic
shows) come from a profile here, or from NVML for the GPU this runtime has
(``adapters/nvml.runtime_profile``). Standard library only.

``total_bytes`` is the capacity torch reports (``cudaMemGetInfo``'s total), which is below
what ``nvidia-smi`` prints. Where it was measured the profile says so (``measured``); the
others take the card's nominal memory and a CUDA context of :data:`ASSUMED_CONTEXT_BYTES`,
so their "usable" is an estimate (docs/dryrun.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from allocconf_widget._errors import AllocConfError
from allocconf_widget.core.units import GIB, MIB

#: CUDA context + cuBLAS/cuDNN handles' device memory outside the caching allocator, where it
#: was not measured for the card (docs/dryrun.md, "Device profiles", has the measured values)
ASSUMED_CONTEXT_BYTES = 512 * MIB


@dataclass(frozen=True)
class GpuProfile:
    """What a fake CUDA run and the replay need to know about one GPU."""

    key: str  # short name a user types: "t4", "a100-80" …
    name: str  # as torch.cuda.get_device_name() would say it
    total_bytes: int  # torch's view of the device's memory
    context_bytes: int  # CUDA context and library handles outside the allocator
    capability: tuple[int, int]
    multiprocessors: int
    measured: bool = False  # total and context measured on the card (else nominal / assumed)
    total_measured: bool = False  # the total as torch reported it on the card, the context assumed
    #: the cuDNN workspace and attention rules were measured on this card (else assumed the same)
    rules_measured: bool = False

    @property
    def usable_bytes(self) -> int:
        """What the caching allocator can reserve before an out-of-memory error."""
        return max(self.total_bytes - self.context_bytes, 0)

    @property
    def bf16_native(self) -> bool:
        """bfloat16 in hardware (Ampere and later): ``is_bf16_supported(False)``."""
        return self.capability >= (8, 0)

    def describe(self) -> str:
        from allocconf_widget.core.units import format_bytes

        how = ("measured" if self.measured else "total measured, context assumed"
               if self.total_measured else "nominal, context assumed")
        return (f"{self.name}: {format_bytes(self.usable_bytes)} usable of "
                f"{format_bytes(self.total_bytes)} ({how})")


PROFILES: dict[str, GpuProfile] = {p.key: p for p in (
    GpuProfile("t4", "Tesla T4", 15 * GIB, ASSUMED_CONTEXT_BYTES, (7, 5), 40),
    GpuProfile("l4", "NVIDIA L4", int(22.5 * GIB), ASSUMED_CONTEXT_BYTES, (8, 9), 58),
    GpuProfile("a100-40", "NVIDIA A100-SXM4-40GB", 40 * GIB, ASSUMED_CONTEXT_BYTES, (8, 0), 108),
    GpuProfile("a100-80", "NVIDIA A100-SXM4-80GB", 80 * GIB, ASSUMED_CONTEXT_BYTES, (8, 0), 108),
    # the total as torch reports it on this card (measured: docs/dryrun.md, "Device profiles");
    # the context is assumed
    GpuProfile("h100", "NVIDIA H100 80GB HBM3", 85_017_493_504, ASSUMED_CONTEXT_BYTES, (9, 0), 132,
               total_measured=True),
    # total and context measured on this card (the bundled recording's sidecar: its
    # device_total_bytes, and device_total_bytes - free_at_start_bytes)
    GpuProfile("h200", "NVIDIA H200", 150_109_880_320, 552_402_944, (9, 0), 132, measured=True,
               rules_measured=True),
)}

_ALIASES = {"a100": "a100-40", "a100-40gb": "a100-40", "a100-80gb": "a100-80", "h100-80": "h100",
            "tesla t4": "t4"}


def profile(name: str) -> GpuProfile:
    """The named profile (``t4``, ``l4``, ``a100-40``, ``a100-80``, ``h100``, ``h200``).

    Raises:
        AllocConfError: no such profile (the message lists them).
    """
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    key = _ALIASES.get(key, key)
    if key not in PROFILES:
        raise AllocConfError(f"no GPU profile named {name!r}",
                             fix=f"pick one of {', '.join(PROFILES)}")
    return PROFILES[key]


def match_name(device_name: str, total_bytes: int) -> GpuProfile:
    """A profile for a GPU the driver names (NVML): the table's figures for a known card,
    with the driver's total; else a generic profile (Ampere-class, context assumed)."""
    lowered = device_name.lower()
    for key, known in (("t4", "t4"), ("l4", "l4"), ("h200", "h200"), ("h100", "h100"),
                       ("a100", "a100-80" if total_bytes > 48 * GIB else "a100-40")):
        if key in lowered:
            base = PROFILES[known]
            return GpuProfile(base.key, device_name, total_bytes, base.context_bytes, base.capability,
                              base.multiprocessors, measured=False)
    return GpuProfile("this-gpu", device_name, total_bytes, ASSUMED_CONTEXT_BYTES, (8, 0), 80)


# ---------------------------------------------------------------- what a fake run cannot see
# Sizes of allocations the GPU's libraries make through the caching allocator and that fake
# tensors never show (docs/dryrun.md has the measurements behind each rule).

def cublas_workspace_bytes(gpu: GpuProfile) -> int:
    """One cuBLAS workspace (torch's default ``CUBLAS_WORKSPACE_CONFIG``) on Hopper, made once
    per thread that runs a matmul and never freed; on older GPUs torch's default
    ``4096:2:16:8`` (two of 4096 KiB and eight of 16 KiB, not measured). docs/dryrun.md has
    the measurement."""
    if gpu.capability >= (9, 0):
        return 32 * MIB
    return 2 * 4 * MIB + 8 * 16 * 1024


@dataclass(frozen=True)
class Convolution:
    """What the cuDNN workspace rule needs to know about one convolution op of a dry run."""

    input_bytes: int
    output_bytes: int  # the forward's output; for a backward, the incoming gradient
    weight_bytes: int
    in_channels: int
    kernel: int  # the first spatial extent of the kernel (1 for a 1×1)
    stride: int  # the first spatial stride
    groups: int
    channels_last: bool  # the input's channel dimension is its innermost (stride 1)
    backward: bool
    element_size: int = 4  # bytes per element of the input (2: bf16/fp16)


@dataclass(frozen=True)
class ConvWorkspaces:
    """What one convolution op borrows from the caching allocator, each freed before the next
    allocation (bytes; 0: nothing)."""

    #: a forward: taken once its output exists; a backward: once the input's gradient exists
    #: (cuDNN's backward-data pass; skipped when the input needs no gradient)
    after_output: int
    #: a backward only: taken once the weight's gradient exists (the backward-filter pass)
    after_weight_grad: int = 0


#: a backward-filter workspace over its operands' bytes (docs/dryrun.md)
WEIGHT_GRAD_WORKSPACE_RATIO = 1.05
#: a channels-last backward's workspace over its operands' bytes (the same page)
CHANNELS_LAST_BACKWARD_RATIO = 0.2
#: a channels-last stem's backward-filter workspace over its operands (the same page)
CHANNELS_LAST_STEM_RATIO = 1.08


def conv_workspaces(conv: Convolution) -> ConvWorkspaces:
    """The cuDNN workspaces one convolution borrows while it runs, by the rule measured on a
    Hopper GPU with cuDNN's heuristic algorithm choice (``benchmarks/gpu/probe_op_transients.py``
    and the allocations of real ResNet-18 traces; docs/dryrun.md has the data).

    cuDNN's kernels there work in NHWC: a contiguous (NCHW) convolution borrows room for
    transposed copies of its operands, the sum of input, output and weight (in 2-byte types
    with the input channels padded to a multiple of 8: a bf16 stem's 3-channel input counts as
    8). The forward borrows it once; the backward twice, one after the other: the
    backward-data pass exactly that sum, the backward-filter pass about that sum again. What
    borrows nothing: a stride-1 1×1 forward (a plain GEMM; the strided ones borrow the sum),
    grouped and depthwise convolutions, a channels-last forward,
    and a first layer (≤ 4 input channels) unless its kernel is large and overlapping (ResNet's
    7×7/2 stem; 3×3 stems and ViT's patch embedding: 0). A channels-last backward borrows
    about a fifth of the sum. Other GPUs and cuDNN releases choose other algorithms: for them
    this is an estimate of the same kind, never a bound. Each is capped at one GiB.
    """
    input_bytes, weight_bytes = conv.input_bytes, conv.weight_bytes
    if conv.element_size == 2 and conv.in_channels % 8:
        padded = -(-conv.in_channels // 8) * 8
        input_bytes = input_bytes * padded // conv.in_channels
        weight_bytes = weight_bytes * padded // conv.in_channels
    operands = input_bytes + conv.output_bytes + weight_bytes

    def share(ratio: float) -> int:
        return min(int(operands * ratio), GIB)

    if conv.groups > 1:
        return ConvWorkspaces(0)
    if conv.in_channels <= 4:
        if not (conv.kernel >= 5 and conv.stride < conv.kernel):
            return ConvWorkspaces(0)
        if conv.channels_last:  # measured: the forward copies its input alone
            return (ConvWorkspaces(0, share(CHANNELS_LAST_STEM_RATIO)) if conv.backward
                    else ConvWorkspaces(min(conv.input_bytes, GIB)))
        return (ConvWorkspaces(0, share(WEIGHT_GRAD_WORKSPACE_RATIO)) if conv.backward
                else ConvWorkspaces(share(1.0)))
    if conv.channels_last:
        return ConvWorkspaces(0, share(CHANNELS_LAST_BACKWARD_RATIO) if conv.backward else 0)
    if conv.backward:
        return ConvWorkspaces(share(1.0), share(WEIGHT_GRAD_WORKSPACE_RATIO))
    if conv.kernel == 1 and conv.stride == 1:
        return ConvWorkspaces(0)
    return ConvWorkspaces(share(1.0))


def attention_backward_workspace_bytes(query_elements: int, query_bytes: int, logsumexp_bytes: int,
                                       grouped: bool) -> int:
    """What cuDNN's fused attention backward (``_scaled_dot_product_cudnn_attention_backward``,
    SDPA's choice on Hopper for bf16) borrows beyond its outputs, as measured there
    (``benchmarks/gpu/probe_op_transients.py``; docs/dryrun.md): a
    float32 accumulator for the query's gradient (4 bytes per query element) and a float32 row
    statistic the size of the log-sum-exp, and with grouped-query attention (fewer key/value
    heads than query heads) two more query-sized buffers, the key and value gradients before
    their heads are summed."""
    extra = 2 * query_bytes if grouped else 0
    return min(4 * query_elements + logsumexp_bytes + extra, GIB)
