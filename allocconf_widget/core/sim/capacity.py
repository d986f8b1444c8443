"""How much of the device PyTorch's allocator can have: the memory outside it, estimated.

A run that grows its reserved memory to the whole card stops at the device total minus
what is not the caching allocator's (the CUDA context, loaded kernels, library
workspaces, other processes). A what-if that treats the whole device as usable predicts
the device total as the peak where the real run peaked 0.5–1 GiB lower. When the caller
does not know that memory (no ``--non-pytorch``, no recording made by our recorder), it
is estimated here from what the trace itself shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from allocconf_widget.core.units import MIB

if TYPE_CHECKING:
    from allocconf_widget.core.sim.trace import Trace

#: Device memory in use in a fresh torch 2.11 process on an H200 once CUDA is initialised
#: (``total − free`` right after ``mem_get_info``; the smallest over the recorded runs in
#: ``benchmarks/data``, 526.8 MiB): the CUDA context before any kernel or library loads.
CUDA_CONTEXT_BYTES = 527 * MIB


@dataclass(frozen=True)
class NonPytorchEstimate:
    """Memory outside the allocator, where the number came from, and a line for people."""

    bytes: int
    source: str  # "trace-oom" | "cuda-context" | "recorded-peak"
    note: str


def estimate_non_pytorch(trace: Trace, device_total: int) -> NonPytorchEstimate:
    """Memory outside PyTorch's allocator for a replay on a ``device_total``-byte device.

    In order: an ``oom`` entry in the trace says what was free at that moment (usable =
    reserved + ``device_free``); otherwise the CUDA context of a fresh process
    (:data:`CUDA_CONTEXT_BYTES`), but never so much that the recorded run itself would
    not have fitted (a run that filled the card bounds it by its own peak).
    """
    usable = trace.inferred_usable_bytes()
    if usable is not None and usable <= device_total:
        other = device_total - usable
        return NonPytorchEstimate(other, "trace-oom", (
            f"memory outside PyTorch: {_mib(other)}, from the free memory torch recorded at the "
            "trace's first OOM"))
    room = max(device_total - trace.recorded_reserved_peak(), 0)
    if room < CUDA_CONTEXT_BYTES:
        return NonPytorchEstimate(room, "recorded-peak", (
            f"memory outside PyTorch: at most {_mib(room)}, since the recorded run reserved "
            "that close to the device total"))
    return NonPytorchEstimate(CUDA_CONTEXT_BYTES, "cuda-context", (
        f"memory outside PyTorch: {_mib(CUDA_CONTEXT_BYTES)} assumed (a fresh process's CUDA "
        "context; libraries and other processes add more: pass --non-pytorch to set it)"))


def _mib(n: int) -> str:
    from allocconf_widget.core.units import format_bytes

    return format_bytes(n)
