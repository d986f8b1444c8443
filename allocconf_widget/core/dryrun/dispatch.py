"""What a GPU profile decides about the memory a step allocates, said beside every estimate.

Three things depend on the GPU and not only on the code: the attention kernel SDPA picks
(:mod:`.attention`), whether bfloat16 runs natively, and the library workspaces (cuBLAS's and
cuDNN's, :mod:`.profiles`). For each, what the dry run assumes for a profile and whether it was
measured on that card. docs/dryrun.md ("Dispatch per GPU profile") has the table for every
profile and the measurements.

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from allocconf_widget.core.dryrun.attention import BACKEND_NAMES, BF16, FLOAT, HALF, AttentionCall, choose
from allocconf_widget.core.dryrun.profiles import GpuProfile, cublas_workspace_bytes
from allocconf_widget.core.units import format_bytes

#: the call the summary describes: a training step's causal self-attention, head size 64
TYPICAL = AttentionCall(batch=8, heads=8, kv_heads=8, seq_q=1024, seq_k=1024, head_dim=64, value_dim=64,
                        dtype=HALF, is_causal=True, requires_grad=True)


@dataclass(frozen=True)
class Dispatch:
    """What the dry run takes a profile's GPU to run, each with how it is known."""

    attention: tuple[tuple[str, str], ...]  # (dtype, the kernel and why) for the typical call
    bf16: str
    cublas: str
    convolutions: str

    def lines(self) -> tuple[str, ...]:
        kernels = "; ".join(f"{dtype}: {words}" for dtype, words in self.attention)
        return (f"attention kernel (SDPA, training, head size 64): {kernels} (torch's rules; the dry "
                "run records that kernel's own allocations)", self.bf16, self.cublas, self.convolutions)


def dispatch(gpu: GpuProfile, *, cudnn_preferred: bool = False) -> Dispatch:
    """The kernels and workspaces a dry run for ``gpu`` assumes."""
    from dataclasses import replace

    attention = tuple((dtype, BACKEND_NAMES[choose(gpu.capability, replace(TYPICAL, dtype=dtype),
                                                   cudnn_preferred=cudnn_preferred).backend])
                      for dtype in (HALF, BF16, FLOAT))
    major, minor = gpu.capability
    bf16 = ("bfloat16: native" if gpu.bf16_native else
            f"bfloat16: not native on compute capability {major}.{minor} (autocast still runs it, "
            "emulated; attention kernels that need native bfloat16 are not chosen)")
    how = "measured on Hopper" if gpu.capability >= (9, 0) else "torch's default size, assumed"
    cublas = (f"cuBLAS workspace: {format_bytes(cublas_workspace_bytes(gpu))} per thread that runs a "
              f"matmul ({how})")
    convolutions = ("cuDNN convolution workspaces: the rule measured on this card" if gpu.rules_measured
                    else "cuDNN convolution workspaces: the rule measured on an H200, assumed here "
                    "(this GPU's cuDNN may choose other algorithms)")
    return Dispatch(attention, bf16, cublas, convolutions)


def cudnn_version_number(text: str | None) -> int | None:
    """``9.19.0.56`` (a wheel's version) as cuDNN numbers itself: 91900; None when unreadable."""
    if not text:
        return None
    parts = text.split(".")
    try:
        major, minor = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
        patch = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 0
    except ValueError:
        return None
    return major * 10_000 + minor * 100 + patch

