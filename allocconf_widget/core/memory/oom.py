"""Reading torch's CUDA out-of-memory message, and advice grounded in its numbers.

torch's own hint ("try setting expandable_segments:True") is printed on every
OOM, even when expandable segments are already on (pytorch/pytorch#173049) and
even when the memory is simply all allocated. We parse the numbers instead and
say which lever, if any, can help: an allocator setting, the per-process
fraction limit, memory held outside PyTorch, or using less memory.

Message formats handled (docs/internals/allocator_facts.md §9), whitespace and line wrapping ignored:

* 2.1+: ``Tried to allocate X. GPU d has a total capacity of T of which F is free.
  [Process p has Y memory in use.]* [Including non-PyTorch memory, this process has
  P memory in use.] [L allowed; ]Of the allocated memory A is allocated by PyTorch,
  [with Q allocated in private pools (e.g., CUDA Graphs), ]and R is reserved by
  PyTorch but unallocated.`` (2.1 spells "capacty" and ends with a max_split_size_mb hint.)
* 2.0 and older: ``Tried to allocate X (GPU d; T total capacity; A already allocated;
  F free; [L allowed; ]R reserved in total by PyTorch)``.
* 2.15, with expandable segments, a request no segment can hold (larger than the
  expandable-segment reserve, up to the device's total) has, after "reserved by PyTorch but
  unallocated.", ``This allocation exceeds the expandable-segment reserve of V for this
  stream, and a single allocation cannot span expandable segments. Raise
  PYTORCH_CUDA_ALLOC_CONF expandable_segments_reserve or expandable_segments_reserve_by_class
  (or unset it) so that a segment is at least S.``, with ``for stream reserve class 'c'`` in
  place of ``for this stream`` on a stream tagged with a reserve class
  (``DeviceCachingAllocator::malloc`` in c10/cuda/CUDACachingAllocator.cpp). Nothing about
  fragmentation applies then: one segment cannot grow past its reserve.

torch stays out of this module: callers pass the message text, settings and version.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from allocconf_widget.core.units import GIB, MIB, format_bytes
from allocconf_widget.core.versions import TorchVersion, parse_version

FRAGMENTATION_MIN_BYTES = 256 * MIB
"""Reserved-but-unallocated below this is not worth a setting change."""
FRAGMENTATION_MIN_SHARE = 0.10
"""...nor when it is under this share of the memory the process has in use."""
NON_PYTORCH_LARGE_BYTES = 2 * GIB
"""A CUDA context takes about 0.3-0.6 GiB; well above that, something else holds memory."""
OTHER_PROCESSES_LARGE_BYTES = 512 * MIB
"""Memory other processes hold on the same GPU worth pointing out."""
_ROUNDING_SLACK = 16 * MIB  # the message prints 2 decimals: up to ~5 MiB error per GiB figure

_UNIT = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": MIB, "GiB": GIB, "TiB": 1 << 40}
_SIZE = r"(\d+(?:\.\d+)?) ?(bytes|B|KiB|MiB|GiB|TiB)\b"


@dataclass(frozen=True, slots=True)
class OomInfo:
    """The numbers of one OOM message, in bytes (as precise as the message's 2 decimals).

    ``process_in_use`` is ``None`` when torch could not query NVML for it (and in
    the 2.0 format, which never printed it). ``other_processes`` lists
    ``(pid, bytes)`` for the "Process N has ... memory in use" lines.
    """

    tried_to_allocate: int
    total_capacity: int
    free: int
    process_in_use: int | None
    allocated_by_pytorch: int
    reserved_unallocated: int
    allowed: int | None = None
    private_pools: int | None = None
    device: int | None = None
    other_processes: tuple[tuple[int, int], ...] = ()
    message_format: str = "2.1+"
    suggests_expandable: bool = False
    #: torch 2.15: the expandable-segment reserve the request did not fit into (the stream's
    #: or its reserve class's), the segment size the request needs, and that class's name
    segment_reserve: int | None = None
    segment_needed: int | None = None
    reserve_class: str | None = None

    @property
    def reserved_by_pytorch(self) -> int:
        """Everything PyTorch's caching allocator holds (allocated + cached)."""
        return self.allocated_by_pytorch + self.reserved_unallocated

    @property
    def this_process(self) -> int | None:
        """GPU memory of the failing process, from NVML, when the message says it.

        In a container NVML reports host pids, so the process appears as
        "Process N" instead; a single listed process holding at least what
        PyTorch reserved is taken to be this one.
        """
        if self.process_in_use is not None:
            return self.process_in_use
        if len(self.other_processes) == 1:
            usage = self.other_processes[0][1]
            if usage + _ROUNDING_SLACK >= self.reserved_by_pytorch:
                return usage
        return None

    @property
    def other_processes_bytes(self) -> int | None:
        """Memory held by other processes on this GPU, or ``None`` when it cannot be told."""
        this = self.this_process
        if this is None:
            return None
        if self.process_in_use is None:  # the one listed process was this one
            return max(0, self.total_capacity - self.free - this)
        listed = sum(usage for _pid, usage in self.other_processes)
        return max(listed, self.total_capacity - self.free - this)

    @property
    def non_pytorch_in_process(self) -> int | None:
        """This process's memory outside PyTorch's allocator (CUDA context, other libraries)."""
        this = self.this_process
        return None if this is None else max(0, this - self.reserved_by_pytorch)


# ----------------------------------------------------------------- parsing


def _bytes(number: str, unit: str) -> int:
    return round(float(number) * _UNIT[unit])


def _find_size(pattern: str, text: str) -> int | None:
    match = re.search(pattern.replace("SIZE", _SIZE), text)
    return None if match is None else _bytes(match.group(1), match.group(2))


def _other_processes(text: str) -> tuple[tuple[int, int], ...]:
    pattern = r"Process (\d+) has SIZE memory in use".replace("SIZE", _SIZE)
    return tuple(
        (int(m.group(1)), _bytes(m.group(2), m.group(3))) for m in re.finditer(pattern, text)
    )


_RESERVE_HINT = re.compile(
    r"This allocation exceeds the expandable-segment reserve of SIZE"
    r"(?: for stream reserve class '(.*?)'| for this stream)?, and a single allocation cannot "
    r"span expandable segments\..*?so that a segment is at least SIZE".replace("SIZE", _SIZE))


def _reserve_hint(text: str) -> tuple[int, int, str | None] | None:
    """(reserve, needed segment, reserve class) from torch 2.15's reserve sentence, if any."""
    match = _RESERVE_HINT.search(text)
    if match is None:
        return None
    return (_bytes(match.group(1), match.group(2)), _bytes(match.group(4), match.group(5)),
            match.group(3))


def _parse_new(text: str, tried: int) -> OomInfo | None:
    header = re.search(
        r"GPU (\d+) has a total capac(?:i)?ty of SIZE of which SIZE is free".replace(
            "SIZE", _SIZE
        ),
        text,
    )
    allocated = _find_size(r"Of the allocated memory SIZE is allocated by PyTorch", text)
    unallocated = _find_size(r"and SIZE is reserved by PyTorch but unallocated", text)
    if header is None or allocated is None or unallocated is None:
        return None
    reserve = _reserve_hint(text)
    return OomInfo(
        tried_to_allocate=tried,
        total_capacity=_bytes(header.group(2), header.group(3)),
        free=_bytes(header.group(4), header.group(5)),
        process_in_use=_find_size(
            r"Including non-PyTorch memory, this process has SIZE memory in use", text
        ),
        allocated_by_pytorch=allocated,
        reserved_unallocated=unallocated,
        allowed=_find_size(r"SIZE allowed;", text),
        private_pools=_find_size(r"with SIZE allocated in private pools", text),
        device=int(header.group(1)),
        other_processes=_other_processes(text),
        message_format=("2.1" if "max_split_size_mb" in text else
                        "2.15 reserve" if reserve is not None else "2.2+"),
        suggests_expandable="expandable_segments:True" in text,
        segment_reserve=reserve[0] if reserve else None,
        segment_needed=reserve[1] if reserve else None,
        reserve_class=reserve[2] if reserve else None,
    )


def _parse_old(text: str, tried: int) -> OomInfo | None:
    match = re.search(r"\((?:GPU|device) (\d+); ([^)]*)\)", text)
    if match is None:
        return None
    fields: dict[str, int] = {}
    for part in match.group(2).split(";"):
        item = re.fullmatch(_SIZE + r" (.+)", part.strip())
        if item is not None:
            fields[item.group(3).strip()] = _bytes(item.group(1), item.group(2))
    needed = ("total capacity", "already allocated", "free", "reserved in total by PyTorch")
    if any(name not in fields for name in needed):
        return None
    allocated = fields["already allocated"]
    return OomInfo(
        tried_to_allocate=tried,
        total_capacity=fields["total capacity"],
        free=fields["free"],
        process_in_use=None,
        allocated_by_pytorch=allocated,
        reserved_unallocated=max(0, fields["reserved in total by PyTorch"] - allocated),
        allowed=fields.get("allowed"),
        device=int(match.group(1)),
        message_format="2.0",
    )


def parse_oom_message(text: str) -> OomInfo | None:
    """Parse torch's CUDA OOM message; ``None`` if the text is not one (or lacks its numbers).

    Accepts the whole exception text, a traceback around it, or a copy wrapped
    over several lines.

    >>> info = parse_oom_message(
    ...     "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 4.00 GiB total capacity; "
    ...     "3.40 GiB already allocated; 0 bytes free; 3.46 GiB reserved in total by PyTorch)")
    >>> info.tried_to_allocate, info.reserved_unallocated
    (20971520, 64424509)
    """
    flat = " ".join(text.split())
    if "out of memory" not in flat:
        return None
    tried = _find_size(r"Tried to allocate SIZE", flat)
    if tried is None:
        return None
    return _parse_new(flat, tried) or _parse_old(flat, tried)


# ----------------------------------------------------------------- breakdown


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Where the GPU's memory is, for the OOM assistant's stacked bar (bytes).

    ``allocated + reserved_unallocated + non_pytorch + other_processes + free +
    unknown == total`` up to the message's rounding. A part that cannot be told
    apart is ``None`` and its bytes are in ``unknown`` ("outside PyTorch, this
    process or others").
    """

    total: int
    allocated: int
    reserved_unallocated: int
    non_pytorch: int | None
    other_processes: int | None
    free: int | None
    unknown: int = 0
    allowed: int | None = None

    def parts(self) -> list[tuple[str, int]]:
        """Labelled, known, non-zero parts in drawing order."""
        named = [
            ("allocated by PyTorch", self.allocated),
            ("reserved by PyTorch, unallocated", self.reserved_unallocated),
            ("this process, outside PyTorch", self.non_pytorch),
            ("other processes", self.other_processes),
            ("outside PyTorch (this process or others)", self.unknown),
            ("free", self.free),
        ]
        return [(label, size) for label, size in named if size]


def breakdown_from_oom(info: OomInfo) -> MemoryBreakdown:
    """Split the GPU as the OOM message describes it."""
    reserved = info.reserved_by_pytorch
    non_pytorch, others = info.non_pytorch_in_process, info.other_processes_bytes
    known = reserved + info.free + (non_pytorch or 0) + (others or 0)
    return MemoryBreakdown(
        total=info.total_capacity,
        allocated=info.allocated_by_pytorch,
        reserved_unallocated=info.reserved_unallocated,
        non_pytorch=non_pytorch,
        other_processes=others,
        free=info.free,
        unknown=max(0, info.total_capacity - known) if non_pytorch is None else 0,
        allowed=info.allowed,
    )


def _stat(stats: Mapping[str, object], key: str) -> int:
    value = stats.get(key)
    return int(value) if isinstance(value, int | float) else 0


def breakdown_from_stats(
    stats: Mapping[str, object],
    device_total: int,
    device_free: int | None = None,
    process_in_use: int | None = None,
    allowed: int | None = None,
) -> MemoryBreakdown:
    """Split the GPU from ``memory_stats()`` plus ``mem_get_info()`` (and NVML, if known).

    Empty stats (CUDA not initialised yet) mean PyTorch holds nothing. Without
    ``device_free`` everything not reserved by PyTorch is ``unknown``.
    """
    allocated = _stat(stats, "allocated_bytes.all.current")
    reserved = max(allocated, _stat(stats, "reserved_bytes.all.current"))
    if device_free is None:
        return MemoryBreakdown(
            device_total, allocated, reserved - allocated, None, None, None,
            unknown=max(0, device_total - reserved), allowed=allowed,
        )
    outside = max(0, device_total - device_free - reserved)
    if process_in_use is None:
        return MemoryBreakdown(
            device_total, allocated, reserved - allocated, None, None, device_free,
            unknown=outside, allowed=allowed,
        )
    non_pytorch = min(outside, max(0, process_in_use - reserved))
    return MemoryBreakdown(
        device_total, allocated, reserved - allocated, non_pytorch, outside - non_pytorch,
        device_free, allowed=allowed,
    )


# ----------------------------------------------------------------- advice


@dataclass(frozen=True, slots=True)
class Advice:
    """One suggestion for the OOM assistant.

    Attributes:
        rule: stable identifier of the rule that fired (for the UI and tests).
        conf_change: a fragment to add to ``PYTORCH_CUDA_ALLOC_CONF`` (e.g.
            ``expandable_segments:True``), or ``None`` when no setting is added.
        reason: one line, quoting the numbers that triggered it.
        unset: options to remove from the configuration.
    """

    rule: str
    conf_change: str | None
    reason: str
    unset: tuple[str, ...] = ()

    @property
    def changes_settings(self) -> bool:
        """Whether following the advice means editing the allocator configuration."""
        return self.conf_change is not None or bool(self.unset)


def _truthy(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes", "on")
    return bool(value)


def _max_split_is_set(settings: Mapping[str, object]) -> bool:
    """``max_split_size_mb`` from a parsed conf, or ``max_split_size`` (bytes; -1 = unlimited)."""
    mib = settings.get("max_split_size_mb")
    if mib is not None and mib != "":
        return True
    raw = settings.get("max_split_size")
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        return False
    try:
        value = int(raw)
    except ValueError:
        return False
    return 0 < value < (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class _Situation:
    """Figures the rules share, derived once from the message."""

    info: OomInfo
    in_use: int
    fragmented: bool
    fits_if_packed: bool
    fraction_binding: bool
    expandable_on: bool
    max_split_set: bool
    async_backend: bool

    @property
    def share(self) -> float:
        return self.info.reserved_unallocated / self.in_use if self.in_use else 0.0


def _situation(info: OomInfo, settings: Mapping[str, object]) -> _Situation:
    in_use = info.this_process or info.reserved_by_pytorch
    unallocated = info.reserved_unallocated
    headroom = info.free + unallocated
    if info.allowed is not None:
        headroom = min(headroom, max(0, info.allowed - info.allocated_by_pytorch))
    binding = (
        info.allowed is not None
        and info.reserved_by_pytorch + info.tried_to_allocate > info.allowed
        and info.free >= info.tried_to_allocate
    )
    return _Situation(
        info=info,
        in_use=in_use,
        fragmented=unallocated >= FRAGMENTATION_MIN_BYTES
        and unallocated >= FRAGMENTATION_MIN_SHARE * in_use,
        fits_if_packed=info.tried_to_allocate <= headroom,
        fraction_binding=binding,
        expandable_on=_truthy(settings.get("expandable_segments", False)),
        max_split_set=_max_split_is_set(settings),
        async_backend=str(settings.get("backend", "native")) == "cudaMallocAsync",
    )


def _reserve_rule(info: OomInfo, settings: Mapping[str, object]) -> list[Advice]:
    """torch 2.15 said the request needs a segment larger than the expandable-segment reserve:
    raise that reserve (the stream's class's, or the global one) to at least the size."""
    if info.segment_reserve is None or info.segment_needed is None:
        return []
    needed, reserve = info.segment_needed, info.segment_reserve
    gib = max(1, math.ceil((needed + _ROUNDING_SLACK) / GIB))  # the message's 2 decimals
    why = (f"the request needs one expandable segment of at least {format_bytes(needed)}, and a "
           f"segment may reserve only {format_bytes(reserve)} of address space")
    tail = ("; a single allocation cannot span segments, so this is neither fragmentation nor a "
            "full GPU")
    name = info.reserve_class
    if name is None:
        return [Advice("expandable_segments_reserve", f"expandable_segments_reserve:{gib}G",
                       f"{why} (expandable_segments_reserve){tail}: raise the reserve to at "
                       f"least {format_bytes(needed)}, or unset it (the default is 9/8 of the "
                       "device's memory)")]
    classes = settings.get("expandable_segments_reserve_by_class")
    change = None
    if isinstance(classes, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in classes):
        kept = [f"{k}:{v}" for k, v in classes if k != name]
        change = f"expandable_segments_reserve_by_class:[{','.join([*kept, f'{name}:{gib}G'])}]"
    return [Advice("expandable_segments_reserve", change,
                   f"{why} for streams of the reserve class '{name}' "
                   f"(expandable_segments_reserve_by_class){tail}: raise that class's reserve to "
                   f"at least {format_bytes(needed)} (e.g. [{name}:{gib}G]), or remove it")]


def _fraction_rule(s: _Situation) -> list[Advice]:
    i = s.info
    if not s.fraction_binding or i.allowed is None:
        return []
    return [Advice("fraction_limit", None, (
        f"the per-process memory fraction is the binding limit: PyTorch may hold at most "
        f"{format_bytes(i.allowed)} and already holds {format_bytes(i.reserved_by_pytorch)}, "
        f"so {format_bytes(i.tried_to_allocate)} more is refused although the GPU has "
        f"{format_bytes(i.free)} free; raise it with torch.cuda.set_per_process_memory_fraction()"
    ))]


def _outside_is_large(s: _Situation) -> bool:
    i = s.info
    outside = i.total_capacity - i.free - i.reserved_by_pytorch
    return outside >= NON_PYTORCH_LARGE_BYTES or (i.other_processes_bytes or 0) >= (
        OTHER_PROCESSES_LARGE_BYTES
    )


def _no_fix_rule(s: _Situation) -> list[Advice]:
    if s.fraction_binding or (s.fragmented and s.fits_if_packed):
        return []
    i = s.info
    remedies = "use less memory: a smaller batch, activation checkpointing, mixed precision"
    if _outside_is_large(s):
        remedies = "free the memory held outside PyTorch (below), or " + remedies
    if not s.fits_if_packed:
        why = (
            f"even a perfectly packed cache cannot fit it: the request is "
            f"{format_bytes(i.tried_to_allocate)}, and only {format_bytes(i.free)} is free plus "
            f"{format_bytes(i.reserved_unallocated)} cached by PyTorch"
        )
    else:
        why = (
            f"PyTorch has {format_bytes(i.allocated_by_pytorch)} allocated and only "
            f"{format_bytes(i.reserved_unallocated)} ({s.share:.0%} of memory in use) reserved "
            "but unallocated: the memory is in use, not fragmented"
        )
    return [Advice("no_allocator_fix", None, f"no allocator setting will help; {why}. "
                   f"Instead {remedies}")]


def _max_split_rule(s: _Situation) -> list[Advice]:
    if not (s.max_split_set and s.fragmented) or s.async_backend:
        return []
    cached = format_bytes(s.info.reserved_unallocated)
    if s.expandable_on:
        why = (
            f"{cached} is reserved but unallocated, and max_split_size_mb together with "
            "expandable_segments:True can grow reserved memory without bound "
            "(pytorch/pytorch#123548)"
        )
    else:
        why = (
            f"{cached} is reserved but unallocated while max_split_size_mb is set: blocks above "
            "it are reused only for requests of nearly the same size and are returned to the "
            "driver only on the OOM path, which can multiply reserved memory on a large GPU"
        )
    return [Advice("remove_max_split_size", None, f"remove max_split_size_mb: {why}",
                   unset=("max_split_size_mb",))]


def _expandable_reason(s: _Situation) -> str:
    i = s.info
    text = (
        f"{format_bytes(i.reserved_unallocated)} ({s.share:.0%} of the "
        f"{format_bytes(s.in_use)} in use) is reserved by PyTorch but unallocated, i.e. free "
        "space scattered over cached segments; expandable segments grow segments in place "
        "instead, which keeps that gap small"
    )
    if not s.fits_if_packed:
        text += ", though on its own it would not have made this request fit"
    return text


def _expandable_rule(s: _Situation, torch_version: TorchVersion) -> list[Advice]:
    if s.async_backend:
        return []
    if s.expandable_on:
        if not (s.fragmented or s.info.suggests_expandable):
            return []
        return [Advice("expandable_already_on", None, (
            "expandable segments are already on, so torch's hint to set them does not apply "
            "(pytorch/pytorch#173049); memory still cached then usually sits in CUDA-graph "
            "private pools, on other streams, or in partly used pages"
        ))]
    if not s.fragmented:
        return []
    if torch_version < (2, 1):
        return [Advice("upgrade_for_expandable", None, (
            f"{format_bytes(s.info.reserved_unallocated)} is reserved but unallocated; "
            f"expandable segments, the usual fix, need torch 2.1 or newer "
            f"(this is {torch_version})"
        ))]
    return [Advice("expandable_segments", "expandable_segments:True", _expandable_reason(s))]


def _outside_rules(s: _Situation) -> list[Advice]:
    i = s.info
    advice: list[Advice] = []
    non_pytorch, others = i.non_pytorch_in_process, i.other_processes_bytes
    if non_pytorch is not None and non_pytorch >= NON_PYTORCH_LARGE_BYTES:
        advice.append(Advice("non_pytorch_memory", None, (
            f"this process holds {format_bytes(non_pytorch)} outside PyTorch's allocator "
            "(a CUDA context is about 0.5 GiB; the rest is other libraries: cuBLAS/cuDNN "
            "workspaces, NCCL buffers, or JAX/TensorFlow/CuPy pools); allocator settings "
            "cannot reclaim it"
        )))
    if others is not None and others >= OTHER_PROCESSES_LARGE_BYTES:
        listed = ", ".join(
            f"process {pid}: {format_bytes(usage)}"
            for pid, usage in i.other_processes
            if usage != i.this_process or i.process_in_use is not None
        )
        advice.append(Advice("other_processes", None, (
            f"other processes hold {format_bytes(others)} of this GPU"
            + (f" ({listed})" if listed else "")
            + "; stop them (another notebook kernel?) or use another GPU; see nvidia-smi"
        )))
    if non_pytorch is None and others is None:
        outside = i.total_capacity - i.free - i.reserved_by_pytorch
        if outside >= NON_PYTORCH_LARGE_BYTES:
            advice.append(Advice("memory_outside_pytorch", None, (
                f"{format_bytes(outside)} of the GPU is used outside PyTorch's allocator "
                "(this process's CUDA context and libraries, or other processes; "
                "see nvidia-smi); allocator settings cannot reclaim it"
            )))
    return advice


def advise(
    info: OomInfo, effective_settings: Mapping[str, object],
    torch_version: TorchVersion | tuple[int, int] | str,
) -> list[Advice]:
    """Suggestions for one OOM, most decisive first.

    Args:
        info: the parsed message (:func:`parse_oom_message`).
        effective_settings: the allocator settings in force. Keys read:
            ``expandable_segments`` (bool or "True"/"False"), ``max_split_size_mb``
            (MiB, from a parsed conf) or ``max_split_size`` (bytes, -1 = unlimited,
            as in a snapshot's ``allocator_settings``), and ``backend``.
        torch_version: the torch that raised the error (a version, ``(major, minor)`` or text).

    Expandable segments are never suggested when already on (pytorch/pytorch#173049). Where
    torch 2.15 says the request is larger than the expandable-segment reserve, raising that
    reserve comes first and nothing is blamed on fragmentation.
    """
    situation = _situation(info, effective_settings)
    reserve = _reserve_rule(info, effective_settings)
    if reserve:  # the reserve decided it: what the numbers say about fragmentation does not apply
        return [*reserve, *_fraction_rule(situation), *_outside_rules(situation)]
    return [
        *_fraction_rule(situation),
        *_no_fix_rule(situation),
        *_max_split_rule(situation),
        *_expandable_rule(situation, parse_version(torch_version)),
        *_outside_rules(situation),
    ]
