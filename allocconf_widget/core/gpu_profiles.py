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

#: CUDA context + cuBLAS/cuDNN handles' device memory outside the caching allocator, when not
#: measured for the card (the H200 measured 527 MiB with torch 2.11; other cards are similar)
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

        how = "measured" if self.measured else "nominal, context assumed"
        return (f"{self.name}: {format_bytes(self.usable_bytes)} usable of "
                f"{format_bytes(self.total_bytes)} ({how})")


PROFILES: dict[str, GpuProfile] = {p.key: p for p in (
    GpuProfile("t4", "Tesla T4", 15 * GIB, ASSUMED_CONTEXT_BYTES, (7, 5), 40),
    GpuProfile("l4", "NVIDIA L4", int(22.5 * GIB), ASSUMED_CONTEXT_BYTES, (8, 9), 58),
    GpuProfile("a100-40", "NVIDIA A100-SXM4-40GB", 40 * GIB, ASSUMED_CONTEXT_BYTES, (8, 0), 108),
    GpuProfile("a100-80", "NVIDIA A100-SXM4-80GB", 80 * GIB, ASSUMED_CONTEXT_BYTES, (8, 0), 108),
    GpuProfile("h100", "NVIDIA H100 80GB HBM3", 80 * GIB, ASSUMED_CONTEXT_BYTES, (9, 0), 132),
    # measured: torch 2.11 on an H200 (the bundled recording's sidecar, device_total_bytes and
    # device_total - free_at_start_bytes)
    GpuProfile("h200", "NVIDIA H200", 150_109_880_320, 552_402_944, (9, 0), 132, measured=True),
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
    """One cuBLAS workspace (torch's default ``CUBLAS_WORKSPACE_CONFIG``): 32 MiB on Hopper
    (measured on the H200: 32 MiB, once per thread that runs a matmul, never freed), else
    ``4096:2:16:8`` = 2 × 4 MiB + 8 × 16 KiB (torch's default for older GPUs, not measured)."""
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


#: a backward convolution's workspace over its operands' bytes (H200: median 1.02, upper deciles
#: 1.1–1.4; 1.1 replayed the measured CNNs' peaks best, docs/dryrun.md)
BACKWARD_WORKSPACE_RATIO = 1.1
#: a channels-last backward convolution's workspace over its operands' bytes (H200: 0.02–0.39)
CHANNELS_LAST_BACKWARD_RATIO = 0.2


def conv_workspace_bytes(conv: Convolution) -> int:
    """The cuDNN workspace one convolution borrows while it runs (allocated after its outputs,
    freed when it returns), as measured on the H200 (torch 2.11, cuDNN 9.19, heuristic
    algorithm choice: ``benchmarks/gpu/probe_op_transients.py``; docs/dryrun.md has the data).

    cuDNN's kernels there work in NHWC: a contiguous (NCHW) convolution borrows room for
    transposed copies of its operands, so the workspace is about their sum (input + output +
    weight: a median of 1.00 of it in the forward, 1.02 in the backward). What borrows (mostly)
    nothing: a 1×1 forward (a direct GEMM), grouped and depthwise
    convolutions, a channels-last forward, and a first layer (≤ 4 input channels) unless its
    kernel is large and overlapping (ResNet's 7×7/2 stem: the sum, or in channels-last its
    input alone; 3×3 stems and ViT's patch embedding: 0). Other GPUs and cuDNN releases choose
    other algorithms: for them this is an estimate of the same kind, never a bound. At most 1 GiB.
    """
    operands = conv.input_bytes + conv.output_bytes + conv.weight_bytes
    if conv.groups > 1:
        return 0
    if conv.in_channels <= 4:
        big_stem = conv.kernel >= 5 and conv.stride < conv.kernel
        if not big_stem:
            return 0
        if conv.channels_last and not conv.backward:  # measured: a copy of its input alone
            return min(conv.input_bytes, GIB)
        ratio = BACKWARD_WORKSPACE_RATIO if conv.backward else 1.0
    elif conv.channels_last:
        ratio = CHANNELS_LAST_BACKWARD_RATIO if conv.backward else 0.0
    elif conv.backward:
        ratio = BACKWARD_WORKSPACE_RATIO
    else:
        ratio = 0.0 if conv.kernel == 1 else 1.0
    return min(int(operands * ratio), GIB)
