"""How much of the device PyTorch's allocator can have: the memory outside it, estimated.

A run that grows its reserved memory to the whole card stops at the device total minus
what is not the caching allocator's (the CUDA context, loaded kernels, library
workspaces, other processes). A what-if that treats the whole device as usable predicts
the device total as the peak where the real run peaked lower. When the caller
does not know that memory (no ``--non-pytorch``, no recording made by our recorder), it
is estimated here from what the trace itself shows.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from allocconf_widget._errors import AllocConfError
from allocconf_widget.core.sim.notes import Note, NoteKind
from allocconf_widget.core.units import MIB, format_bytes

if TYPE_CHECKING:
    from allocconf_widget.core.sim.trace.model import Trace

#: Device memory in use in a fresh process once CUDA is initialised (``total − free`` right
#: after ``mem_get_info``; the smallest over the recorded runs in ``benchmarks/data``): the CUDA
#: context before any kernel or library loads.
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
    from allocconf_widget.core.sim.trace.decode import segment_size_of

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
    low = max(reserved_peak, recorded_allocated_peak(trace))  # the rows walked only where it matters
    if not low < high:
        return None
    return HeldLimit(usable, low, high, len(trace.ooms))


def recorded_allocated_peak(trace: Trace) -> int:
    """The most the recorded run had allocated at once (requested bytes; a free waiting on
    another stream no longer counts, as in torch's ``allocated_bytes``), from the start state."""
    from allocconf_widget.core.sim.trace.codes import OP_ALLOC, OP_FREE, OP_FREE_REQUESTED

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
    return format_bytes(n)


# ---------------------------------------------------------------- the one capacity decision


@dataclass(frozen=True)
class KnownCapacity:
    """What the caller knows of the memory a replay may use, before the trace is read."""

    device_total: int | None = None
    #: memory outside PyTorch's allocator; None: estimate it from the trace
    non_pytorch_bytes: int | None = 0
    #: a fraction the caller asks every row to run under (a what-if, ``--fraction``)
    fraction_given: float | None = None
    #: the fraction the run was made under, where the source knows it
    source_fraction: float | None = None
    #: whether the source knows the run's fraction (None included): a sidecar, the session
    limit_known: bool = False
    #: a fraction the run's own settings string set (``per_process_memory_fraction``)
    settings_fraction: float | None = None


@dataclass(frozen=True)
class Limit:
    """The memory one row may reserve: a memory fraction's share, or the device's room."""

    bytes: int
    fraction: float | None  # the memory fraction that sets it; None: the device's usable memory
    device_total: int


@dataclass(frozen=True)
class Capacity:
    """The memory every row of a replay runs under, and why (typed notes)."""

    device_total: int | None
    non_pytorch_bytes: int
    fraction: float | None  # every row's limit, unless a row's settings set their own
    recording_fraction: float | None  # the fraction the recorded run was made under
    held: HeldLimit | None = None  # the limit read off the trace's OOMs, where it is that
    notes: tuple[Note, ...] = ()

    @property
    def usable_bytes(self) -> int | None:
        """The device memory left to PyTorch; None where the device's size is unknown."""
        return None if self.device_total is None else self.device_total - self.non_pytorch_bytes

    @property
    def recorded_limit(self) -> int | None:
        """The limit the recorded run was held to (its fraction's, else the usable device)."""
        if self.device_total is None:
            return None
        return _limit_of(self.recording_fraction, self.device_total, self.non_pytorch_bytes)

    @property
    def limit_bytes(self) -> int | None:
        """The memory fraction's cap on every row, where it is tighter than the usable memory."""
        limit = self.limit_for(None)
        return limit.bytes if limit is not None and limit.fraction is not None else None

    @property
    def limit_range(self) -> tuple[int, int] | None:
        """Where the limit was read off the trace's OOMs: the range they allow."""
        return None if self.held is None else (self.held.low, self.held.high)

    def limit_for(self, fraction: float | None) -> Limit | None:
        """The limit a row runs under: its own memory fraction (``fraction``) or every row's,
        within the usable memory. None where the device's size is unknown."""
        if self.device_total is None:
            return None
        usable = self.device_total - self.non_pytorch_bytes
        share = fraction if fraction is not None else self.fraction
        if share is not None and int(share * self.device_total) < usable:
            return Limit(int(share * self.device_total), share, self.device_total)
        return Limit(usable, None, self.device_total)


def decide_capacity(trace: Trace, known: KnownCapacity) -> Capacity:
    """The memory every row of a replay of ``trace`` runs under, decided once.

    The fraction in force is the one asked for, else the source's, else the run's settings
    string's; where nobody knows the run's limit, one the trace's OOMs show is read off them
    (:func:`replay_room`). Memory outside PyTorch not given is estimated
    (:func:`estimate_non_pytorch`). The recording's own fraction is kept apart for the
    self-check: a run that reserved more than the fraction in force allows was made without it.

    Raises:
        AllocConfError: a fraction outside (0, 1], or under 1 MiB of the device; memory
            outside PyTorch that leaves nothing; a fraction of a device of unknown size.
    """
    notes: list[Note] = []
    device_total = known.device_total
    non_pytorch = _non_pytorch(trace, known, notes)
    fraction = known.fraction_given if known.fraction_given is not None else known.source_fraction
    _check_fraction(fraction, device_total)
    if fraction is None and device_total is not None:
        fraction = known.settings_fraction
    room = replay_room(trace, device_total, non_pytorch, fraction, read_limit=not known.limit_known)
    device_total, non_pytorch, fraction = room.device_total, room.non_pytorch_bytes, room.fraction
    if room.note is not None:
        notes.append(Note(NoteKind.CAPACITY, room.note))
    if known.device_total is None and known.non_pytorch_bytes:
        notes.append(_unused_non_pytorch(known.non_pytorch_bytes, device_total))
    if device_total is not None and non_pytorch >= device_total:
        raise AllocConfError(f"the memory outside PyTorch ({format_bytes(non_pytorch)}) leaves nothing "
                             f"of the device's {format_bytes(device_total)} for PyTorch",
                             fix="--non-pytorch is the memory outside the allocator (CUDA context, "
                             "libraries), e.g. 600MiB")
    if fraction is not None and device_total is None:
        raise AllocConfError("a memory fraction is a share of the device's memory, which is not known "
                             "for this trace", fix="give the device's total memory (--device-total)")
    if device_total is None:
        notes.append(Note(NoteKind.CAPACITY, "device capacity unknown: the device is treated as "
                          "unlimited, so no OOM can be predicted (give --device-total)"))
    known_fraction = fraction
    if known.limit_known:
        known_fraction = (known.source_fraction if known.source_fraction is not None
                          else known.settings_fraction)
    recording_fraction = _recording_fraction(trace, known_fraction, device_total, notes)
    capacity = Capacity(device_total, non_pytorch, fraction, recording_fraction, room.held)
    if not (known.limit_known or known.fraction_given is not None or known.settings_fraction is not None
            or room.held is not None):  # nothing says what limit the run had
        undecided = trace.releases_a_limit_decides(up_to=capacity.recorded_limit)
        if undecided:
            notes.append(_undecided_releases_note(undecided, device_known=device_total is not None))
    return dataclasses.replace(capacity, notes=tuple(notes))


def _check_fraction(fraction: float | None, device_total: int | None) -> None:
    if fraction is None:
        return
    if not 0.0 <= fraction <= 1.0:
        raise AllocConfError(f"a memory fraction must be between 0 and 1, not {fraction}",
                             fix="pass e.g. 0.5 for half of the device")
    if fraction == 0.0 or (device_total is not None and fraction * device_total < MIB):
        raise AllocConfError(f"a memory fraction of {fraction:g} leaves less than 1 MiB of the device: "
                             "every allocation would fail", fix="pass e.g. 0.5 for half of the device")


def _non_pytorch(trace: Trace, known: KnownCapacity, notes: list[Note]) -> int:
    """Memory outside the allocator: as given, else estimated when the device total is known
    (a run that fills the card must stop below the device total, as the real one does)."""
    if known.non_pytorch_bytes is not None:
        return known.non_pytorch_bytes
    if known.device_total is None:
        return 0
    estimate = estimate_non_pytorch(trace, known.device_total)
    notes.append(Note(NoteKind.CAPACITY, estimate.note))
    return estimate.bytes


def _unused_non_pytorch(given: int, device_total: int | None) -> Note:
    why = ("it is a share of the device's memory, which is not known" if device_total is None
           else f"the room PyTorch had ({format_bytes(device_total)}) is read off the trace's OOM, "
           "which leaves it out already")
    return Note(NoteKind.CAPACITY, f"the memory outside PyTorch ({format_bytes(given)}) is not used: "
                f"{why} (give the device's total, --device-total)")


def _limit_of(fraction: float | None, device_total: int, non_pytorch: int) -> int:
    """The memory a run could reserve: its fraction's share of the device, within what is
    usable beside the memory outside PyTorch (as the replay's rules take it)."""
    usable = max(device_total - non_pytorch, 0)
    return usable if fraction is None else min(int(fraction * device_total), usable)


def _recording_fraction(trace: Trace, fraction: float | None, device_total: int | None,
                        notes: list[Note]) -> float | None:
    """The memory fraction the recorded run was made under, as far as the trace can tell: the
    one in force, unless the run reserved more than that fraction allows. Then the limit is a
    what-if (``--fraction`` on a run made without one), and the self-check replays the run as
    it was: under the limit it would measure the limit's effect, not the model. A trace whose
    program changed its fraction mid-run keeps the one in force."""
    if fraction is None or device_total is None or trace.limit_changes:
        return fraction
    allowed, peak = int(fraction * device_total), trace.recorded_reserved_peak()
    if peak <= allowed:
        return fraction
    notes.append(Note(NoteKind.CAPACITY, (
        f"the recording reserved up to {format_bytes(peak)}, more than a memory fraction of "
        f"{fraction:g} allows ({format_bytes(allowed)}): it ran without that limit, so the "
        "self-check replays it as it was, and every row applies the limit")))
    return None


def _undecided_releases_note(count: int, *, device_known: bool) -> Note:
    """What a replay does with release bursts only the run's unknown limit could decide."""
    bursts = "release burst" if count == 1 else "release bursts"
    verb, pronoun = ("was", "it is") if count == 1 else ("were", "they are")
    full = ("the run was at a memory fraction this snapshot does not record" if device_known
            else "the device was full there")
    give = ("give --fraction if the run had one" if device_known
            else "give --device-total, and --fraction if the run had one")
    return Note(NoteKind.EMPTY_CACHE, (
        f"{count:,} {bursts} right before a new segment {verb} either malloc's out-of-memory path "
        f"({full}) or a call of empty_cache(); {pronoun} replayed as empty_cache() under every "
        "setting, which frees the cache there, so a setting that would not have reached that "
        f"limit can be predicted low ({give})"))
