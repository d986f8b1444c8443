"""How much of the device PyTorch's allocator can have: the memory outside it, estimated.

A run that grows its reserved memory to the whole card stops at the device total minus
what is not the caching allocator's (the CUDA context, loaded kernels, library
workspaces, other processes). A what-if that treats the whole device as usable predicts
the device total as the peak where the real run peaked 0.5–1 GiB lower. When the caller
does not know that memory (no ``--non-pytorch``, no recording made by our recorder), it
is estimated here from what the trace itself shows.
"""

from __future__ import annotations

import math
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


@dataclass(frozen=True)
class HeldLimit:
    """A memory limit below the device that the trace's OOMs show the run was held to."""

    usable: int  # the device's room for PyTorch at the first such OOM: reserved + device_free
    low: int  # the limit is at least this: the most the run reserved or allocated (it all fitted)
    high: int  # and below this: reserved at an OOM plus the segment that did not fit
    ooms: int  # the OOM entries that came with room on the device

    @property
    def limit(self) -> int:
        """The middle of what the recording allows, the replay's limit."""
        return (self.low + self.high) // 2

    def note(self) -> str:
        return (f"the recording's {self.ooms:,} OOM(s) came with memory free on the device (at the "
                f"first, {_mib(self.usable)} usable by PyTorch in all): the run was held to a limit "
                f"below the device, a memory fraction, of {_mib(self.low)} to {_mib(self.high)} "
                f"judging by what it reserved and where it failed; every row replays under "
                f"{_mib(self.limit)}. Give --fraction and --device-total to replay the exact one "
                "(a recording made with %%allocconf record keeps both)")


def held_limit(trace: Trace) -> HeldLimit | None:
    """The limit below the device a recorded run was held to, read off its OOM entries.

    torch records ``device_free`` at an OOM. Where that was more than the segment the failed
    request needed, the device had room and ``cudaMalloc`` did not fail: the allocator's own
    limit refused it, which only ``set_per_process_memory_fraction`` sets. Every allocation
    that succeeded fitted under that limit, and each such OOM did not (reserved then, after
    the OOM path released the cache, plus the segment). None where no OOM shows room, where
    the trace is partial or records its fraction calls (then the limits are known), or where
    the bounds contradict each other. The lower bound is the most the run reserved, or had
    allocated where that is more (segments it held before the trace began are not in its
    segment events). On the 21 recordings in ``benchmarks/data`` of runs under a fraction that
    OOMed, every true limit lies inside the bounds.
    """
    from allocconf_widget.core.sim.trace import segment_size_of

    if not trace.ooms or trace.partial or trace.limit_changes:
        return None
    high = None
    reserved = trace.recorded_reserved_before([oom.event_index for oom in trace.ooms])
    for oom, held in zip(trace.ooms, reserved, strict=True):
        segment = segment_size_of(oom.size)
        if oom.device_free < segment:
            return None  # the device itself was full there: no limit below it to read
        high = held + segment if high is None else min(high, held + segment)
    usable, reserved_peak = trace.inferred_usable_bytes(), trace.recorded_reserved_peak()
    if high is None or usable is None or not reserved_peak < high <= usable:
        return None
    low = max(reserved_peak, recorded_allocated_peak(trace))  # the walk of the rows only where it can matter
    if not low < high:
        return None
    return HeldLimit(usable, low, high, len(trace.ooms))


def recorded_allocated_peak(trace: Trace) -> int:
    """The most the recorded run had allocated at once (requested bytes; a free waiting on
    another stream no longer counts, as in torch's ``allocated_bytes``), from the start state."""
    from allocconf_widget.core.sim.trace import OP_ALLOC, OP_FREE, OP_FREE_REQUESTED

    live: dict[int, int] = {}
    now = 0
    if trace.initial_state is not None:  # its live blocks hold the first address ids
        for aid, (_, block) in enumerate(trace.initial_state.live_blocks()):
            live[aid] = block.size
            now += block.size
    peak = now
    for op, aid, size in zip(trace.ops, trace.addr_ids, trace.sizes, strict=True):
        if op == OP_ALLOC:
            now += size - live.get(aid, 0)
            live[aid] = size
            peak = max(peak, now)
        elif op in (OP_FREE, OP_FREE_REQUESTED):
            now -= live.pop(aid, 0)
    return peak


@dataclass(frozen=True)
class ReplayRoom:
    """The memory a replay may use: as the caller said, or as the trace's OOMs tell."""

    device_total: int | None
    non_pytorch_bytes: int
    fraction: float | None
    note: str | None = None  # where a number came from the trace, said for people
    held: HeldLimit | None = None  # the limit read off the OOMs, where the fraction is that


def replay_room(trace: Trace, device_total: int | None, non_pytorch_bytes: int,
                fraction: float | None, *, read_limit: bool) -> ReplayRoom:
    """What a replay of ``trace`` may use, where the caller leaves it open.

    * no fraction given, ``read_limit`` (nobody knows whether the run had one: the what-if of
      a file without its sidecar), and the OOMs show a limit below the device
      (:func:`held_limit`) and below what ``device_total`` less ``non_pytorch_bytes`` leaves:
      that limit, as a fraction of ``device_total`` (or of the device's room for PyTorch the
      first OOM shows, when the total is not known either);
    * neither a device total nor a fraction: the device's room for PyTorch at the first OOM
      (reserved + ``device_free``), so the OOM path replays too;
    * otherwise what was given.

    The what-if decides once (``app/simulate``); the ranking and the self-check it calls then
    get the fraction it chose and only fill in a device total (``read_limit=False``).
    """
    if fraction is None and read_limit:
        held = held_limit(trace)
        if held is not None and (device_total is None or held.limit < device_total - non_pytorch_bytes):
            if device_total is None:
                device_total, non_pytorch_bytes = held.usable, 0
            return ReplayRoom(device_total, non_pytorch_bytes, fraction_for(held.limit, device_total),
                              held.note(), held)
    if device_total is None and fraction is None:
        usable = trace.inferred_usable_bytes()
        if usable is not None:
            return ReplayRoom(usable, 0, None, f"device capacity: {_mib(usable)} usable, inferred "
                              "from the OOM recorded in the trace")
    return ReplayRoom(device_total, non_pytorch_bytes, fraction)


def fraction_for(limit: int, device_total: int) -> float:
    """The fraction of ``device_total`` whose limit (``int(fraction * device_total)``, as the
    replay computes it) is ``limit`` or, by a float's last bit, just above: ``limit /
    device_total`` alone came out a byte below, under a run that reserved exactly that much."""
    fraction = limit / device_total
    while int(fraction * device_total) < limit:
        fraction = math.nextafter(fraction, 2.0)
    return min(fraction, 1.0)


def _mib(n: int) -> str:
    from allocconf_widget.core.units import format_bytes

    return format_bytes(n)
