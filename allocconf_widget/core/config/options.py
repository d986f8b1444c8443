"""The allocator option schema: one table drives parsing, validation, controls and help.

Facts come from docs/internals/allocator_facts.md §3 (torch 1.13 … 2.15 release
artifacts and source). Every bound that changed between releases is stored
as version data (:class:`Bound` entries keyed by the first release they apply
to) rather than as branches in the parser, so adding a torch release means
editing this table.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field

from allocconf_widget.core.units import MIB
from allocconf_widget.core.versions import TorchVersion

Release = tuple[int, int]

SIZE_MAX = (1 << 64) - 1
#: Largest *_mb value that still fits in size_t once multiplied by ``MIB``.
MAX_MIB = SIZE_MAX // MIB
#: ``std::stoi`` range: the 2.0–2.9 parser converts most integers with it.
INT_MAX = (1 << 31) - 1


class Kind(enum.Enum):
    """How an option's value is written."""

    SIZE_MB = "size in MiB"
    COUNT = "integer"
    BOOL = "True/False"
    FRACTION = "number"
    ROUNDUP = "divisions"
    BACKEND = "backend name"
    RESERVE = "fraction or size"
    RESERVE_BY_CLASS = "[class:reserve,...]"


class Scope(enum.Enum):
    """Which torch parser owns the key (2.10+); before 2.10 the CUDA parser owns them all."""

    GENERIC = "generic"
    CUDA = "cuda"


class Live(enum.Enum):
    """What a change through torch's runtime setter does once the allocator is running."""

    NEXT_ALLOCATION = "applies to the next allocation"
    NEW_SEGMENTS = "applies to segments created afterwards; existing ones keep their kind"
    CONSTRUCTION = "read when each device's allocator is created; later changes need a call"
    PINNED = "pinned host memory; may only affect pinned blocks allocated afterwards"
    IMPORT = "fixed when torch is imported; changing it needs a restart"


@dataclass(frozen=True)
class Bound:
    """A numeric range. ``low`` may be ``"large_segment_size_mb"``: the string's own value."""

    low: float | str | None = None
    low_inclusive: bool = True
    high: float | None = None
    high_inclusive: bool = True
    power_of_two: bool = False
    allow_zero: bool = False

    def describe(self, unit: str = "") -> str:
        """Human wording such as ``at least 20`` or ``between 0 and 1 (exclusive)``."""
        parts = []
        if self.low is not None:
            low = "large_segment_size_mb (20 unless set)" if isinstance(self.low, str) else _num(self.low)
            parts.append(f"{'at least' if self.low_inclusive else 'greater than'} {low}")
        if self.high == MAX_MIB and unit == "MiB":
            # the number itself (17592186044415) told nobody anything: say what it is
            parts.append("no upper limit in practice (the ceiling, 17592186044415 MiB = 16 EiB, "
                         "is the most a 64-bit byte count holds)")
            unit = ""
        elif self.high is not None:
            word = "at most" if self.high_inclusive else "less than"
            parts.append(f"{word} {_num(self.high)}")
        text = " and ".join(parts)
        if self.power_of_two:
            text = "a power of two" + (f", {text}" if text else "")
            if self.allow_zero:
                text += " (or 0 to switch rounding off)"
        return f"{text}{' ' + unit if unit and text else ''}"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


@dataclass(frozen=True)
class OptionSpec:
    """Everything we know about one allocator option.

    Attributes:
        name: the key as written in the variable.
        kind: value grammar.
        summary: one line for tables and tooltips' first line.
        explanation: what it does and what it trades, in plain words.
        default: torch's default, as a display string.
        since / until: first and last release accepting the key (``until=None``: still current).
        scope: owning parser from 2.10 (before 2.10 everything is parsed by the CUDA class).
        live: effect of a runtime change once the allocator runs.
        native_only: ignored under ``backend:cudaMallocAsync``.
        bounds: (first release, Bound) pairs, latest applicable wins.
        aliases: other spellings torch accepts for the same key (ROCm ``hip`` names).
        slider: (low, high) MiB range for the panel's log slider, for sizes.
    """

    name: str
    kind: Kind
    summary: str
    explanation: str
    default: str
    since: Release
    until: Release | None = None
    scope: Scope = Scope.CUDA
    live: Live = Live.NEXT_ALLOCATION
    native_only: bool = False
    bounds: tuple[tuple[Release, Bound], ...] = ()
    aliases: tuple[str, ...] = ()
    slider: tuple[int, int] | None = None
    unit: str = field(default="")

    def exists_in(self, version: TorchVersion) -> bool:
        """True when torch ``version`` accepts this key."""
        key = version.schema_key
        return self.since <= key and (self.until is None or key <= self.until)

    def scope_in(self, version: TorchVersion) -> Scope:
        """Which parser reads the key in ``version``."""
        return self.scope if version.new_parser else Scope.CUDA

    def bound_in(self, version: TorchVersion) -> Bound | None:
        """The range rule torch ``version`` enforces, if any."""
        chosen = None
        for first, bound in self.bounds:
            if version.schema_key >= first:
                chosen = bound
        return chosen

    def releases_text(self) -> str:
        """``2.1+`` or ``1.13 only`` or ``2.6–2.9``."""
        start = f"{self.since[0]}.{self.since[1]}"
        if self.until is None:
            return f"{start}+"
        end = f"{self.until[0]}.{self.until[1]}"
        return f"{start} only" if end == start else f"{start}–{end}"


_SIZE_HIGH_OLD = Bound(high=INT_MAX)


def _split_bounds() -> tuple[tuple[Release, Bound], ...]:
    return (
        ((1, 13), Bound(low=20, low_inclusive=False, high=INT_MAX)),
        ((2, 10), Bound(low=20, high=MAX_MIB)),
        ((2, 11), Bound(low="large_segment_size_mb", high=MAX_MIB)),
    )


OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(
        name="backend",
        kind=Kind.BACKEND,
        summary="Allocator implementation: native caching allocator or cudaMallocAsync.",
        explanation=(
            "native is PyTorch's caching allocator, which every other option here tunes. "
            "cudaMallocAsync hands memory management to CUDA's stream-ordered pool allocator: "
            "it ignores the native options and offers no memory snapshots. Read once when torch "
            "is imported, so changing it needs a restart."
        ),
        default="native",
        since=(2, 0),
        live=Live.IMPORT,
    ),
    OptionSpec(
        name="expandable_segments",
        kind=Kind.BOOL,
        summary="Grow segments page by page instead of carving fixed-size segments.",
        explanation=(
            "The allocator reserves a large virtual address range and maps physical pages into "
            "it on demand, so one segment can grow and shrink with tensors of changing size "
            "instead of leaving gaps between fixed segments. Usually the biggest cut in "
            "fragmentation (a CNN with varying image sizes on an H200: 10.69 GiB reserved by "
            "default, 5.29 GiB with this on). Costs: not supported on every platform (torch then "
            "warns and ignores it), and older releases cannot share such memory through CUDA IPC."
        ),
        default="False",
        since=(2, 1),
        scope=Scope.GENERIC,
        live=Live.NEW_SEGMENTS,
        native_only=True,
    ),
    OptionSpec(
        name="max_split_size_mb",
        kind=Kind.SIZE_MB,
        unit="MiB",
        summary="Cached blocks this large or larger are never split for smaller requests.",
        explanation=(
            "Meant to stop big free blocks from being cut up by small requests. But blocks at or "
            "above the limit are reused only for requests within max_non_split_rounding_mb of "
            "their size, and go back to the driver only when memory runs out, so on a large GPU "
            "reserved memory can grow well beyond what is allocated (a CNN on an H200: 10.69 GiB "
            "by default, 24.80 GiB with 128). Unset means any block may be split. Try "
            "expandable_segments first."
        ),
        default="unlimited",
        since=(1, 13),
        scope=Scope.GENERIC,
        native_only=True,
        bounds=_split_bounds(),
        slider=(20, 65536),
    ),
    OptionSpec(
        name="max_non_split_rounding_mb",
        kind=Kind.SIZE_MB,
        unit="MiB",
        summary="How much larger than a request an unsplittable cached block may be and still be used.",
        explanation=(
            "Only matters with max_split_size_mb: an oversize cached block is handed out whole if "
            "it is at most this much larger than the request. Larger values reuse big blocks more "
            "often but waste the difference inside them."
        ),
        default="20 (large_segment_size_mb from 2.11)",
        since=(2, 6),
        scope=Scope.GENERIC,
        native_only=True,
        bounds=(
            ((2, 6), Bound(low=20, low_inclusive=False, high=INT_MAX)),
            ((2, 10), Bound(low=20, high=MAX_MIB)),
            ((2, 11), Bound(low="large_segment_size_mb", high=MAX_MIB)),
        ),
        slider=(20, 65536),
    ),
    OptionSpec(
        name="garbage_collection_threshold",
        kind=Kind.FRACTION,
        summary="Free old cached blocks once reserved memory passes this share of the memory limit.",
        explanation=(
            "With a memory-fraction limit (per_process_memory_fraction, or "
            "torch.cuda.set_per_process_memory_fraction) below 1, the allocator frees the oldest "
            "unused cached segments before asking the driver for more whenever reserved memory "
            "exceeds this share of the limit. Without such a limit it does nothing. Lower values "
            "hold less memory but cost more cudaMalloc/cudaFree calls."
        ),
        default="off",
        since=(1, 13),
        scope=Scope.GENERIC,
        native_only=True,
        bounds=(((1, 13), Bound(low=0.0, low_inclusive=False, high=1.0, high_inclusive=False)),),
    ),
    OptionSpec(
        name="roundup_power2_divisions",
        kind=Kind.ROUNDUP,
        summary="Round request sizes up to one of N steps between powers of two.",
        explanation=(
            "Slightly different tensor sizes then land on the same rounded size and reuse the same "
            "cached blocks (with 4 divisions, 1300 MiB becomes 1536 MiB). One number applies to "
            "every size; a list such as [256:1,512:2,>:8] sets it per size band (band start in "
            "MiB : divisions; > means all larger sizes; 0 switches rounding off for a band). "
            "Trades some memory per allocation for fewer distinct block sizes."
        ),
        default="off (0)",
        since=(1, 13),
        scope=Scope.GENERIC,
        native_only=True,
        bounds=(((1, 13), Bound(low=1, high=INT_MAX, power_of_two=True)),
                ((2, 10), Bound(low=1, high=SIZE_MAX, power_of_two=True))),
    ),
    OptionSpec(
        name="roundup_bypass_threshold_mb",
        kind=Kind.SIZE_MB,
        unit="MiB",
        summary="Requests above this size skip power-of-two rounding (torch 1.13 only).",
        explanation=(
            "Existed only in torch 1.13. From 2.4 the list form of roundup_power2_divisions with a "
            "0 for the large bands does the same job."
        ),
        default="unlimited",
        since=(1, 13),
        until=(1, 13),
        native_only=True,
        bounds=(((1, 13), Bound(low=0, high=INT_MAX)),),
        slider=(1, 65536),
    ),
    OptionSpec(
        name="large_segment_size_mb",
        kind=Kind.SIZE_MB,
        unit="MiB",
        summary="Segment size for 1–10 MiB requests (and the expandable-segment page).",
        explanation=(
            "Requests between 1 and 10 MiB are served from segments of this size; with expandable "
            "segments it is also the page size of the large pool. Larger means fewer cudaMalloc "
            "calls but more memory held per segment. It is also the minimum for "
            "max_split_size_mb and max_non_split_rounding_mb."
        ),
        default="20",
        since=(2, 11),
        scope=Scope.GENERIC,
        live=Live.NEW_SEGMENTS,
        native_only=True,
        bounds=(((2, 11), Bound(low=10, low_inclusive=False, high=MAX_MIB)),),
        slider=(11, 4096),
    ),
    OptionSpec(
        name="per_process_memory_fraction",
        kind=Kind.FRACTION,
        summary="Cap this process at a fraction of the GPU's memory.",
        explanation=(
            "Like torch.cuda.set_per_process_memory_fraction, from the environment: allocations "
            "beyond the cap raise out-of-memory instead of growing. Also what makes "
            "garbage_collection_threshold act. Read when each device's allocator is created."
        ),
        default="1.0 (no cap)",
        since=(2, 10),
        live=Live.CONSTRUCTION,
        native_only=True,
        bounds=(((2, 10), Bound(low=0.0, high=1.0)),),
    ),
    OptionSpec(
        name="throw_on_cudamalloc_oom",
        kind=Kind.BOOL,
        summary="Refuse to grow past the memory fraction without calling cudaMalloc.",
        explanation=(
            "With a memory fraction set, a new segment that would exceed it raises out-of-memory "
            "right away, protecting other processes that share the GPU."
        ),
        default="False",
        since=(2, 12),
        native_only=True,
    ),
    OptionSpec(
        name="release_lock_on_cudamalloc",
        kind=Kind.BOOL,
        summary="Let other threads allocate while one waits in cudaMalloc.",
        explanation=(
            "Drops the allocator's lock around the driver call. Helps multi-threaded programs "
            "that allocate concurrently; does not change memory use."
        ),
        default="False",
        since=(2, 2),
        native_only=True,
        aliases=("release_lock_on_hipmalloc",),
    ),
    OptionSpec(
        name="graph_capture_record_stream_reuse",
        kind=Kind.BOOL,
        summary="Reuse record_stream'd blocks inside a CUDA graph capture once safe.",
        explanation=(
            "During graph capture, blocks freed with record_stream are normally held until the "
            "capture ends; with this on they are reused as soon as the graph proves it is safe, "
            "saving memory in captured graphs."
        ),
        default="False",
        since=(2, 9),
        native_only=True,
    ),
    OptionSpec(
        name="pinned_use_cuda_host_register",
        kind=Kind.BOOL,
        summary="Allocate pinned host memory with malloc + cudaHostRegister.",
        explanation=(
            "Instead of cudaHostAlloc. Can be faster for large pinned buffers, especially with "
            "pinned_num_register_threads above 1. Affects host memory only."
        ),
        default="False",
        since=(2, 2),
        live=Live.PINNED,
        aliases=("pinned_use_hip_host_register",),
    ),
    OptionSpec(
        name="pinned_num_register_threads",
        kind=Kind.COUNT,
        summary="Threads that page-lock large pinned buffers (with pinned_use_cuda_host_register).",
        explanation="More threads register big pinned buffers faster. A power of two, at most 128.",
        default="1",
        since=(2, 2),
        live=Live.PINNED,
        bounds=(((2, 2), Bound(low=1, high=128, power_of_two=True)),),
    ),
    OptionSpec(
        name="pinned_use_background_threads",
        kind=Kind.BOOL,
        summary="Process pinned-memory events on a background thread.",
        explanation=(
            "Frees of pinned host memory wait on CUDA events; with this on a background thread "
            "handles them instead of the allocating thread."
        ),
        default="False",
        since=(2, 6),
        scope=Scope.GENERIC,
        live=Live.PINNED,
    ),
    OptionSpec(
        name="pinned_reserve_segment_size_mb",
        kind=Kind.SIZE_MB,
        unit="MiB",
        summary="Reserve one pinned host segment of this size up front.",
        explanation="Small pinned allocations are then served from it without new host registrations.",
        default="0 (none)",
        since=(2, 10),
        live=Live.PINNED,
        bounds=(((2, 10), Bound(low=0, low_inclusive=False, high=MAX_MIB)),),
        slider=(1, 65536),
    ),
    OptionSpec(
        name="pinned_free_catch_all",
        kind=Kind.BOOL,
        summary="Swallow errors while freeing pinned memory instead of terminating.",
        explanation=(
            "Exceptions thrown while a pinned block is freed from a destructor would otherwise "
            "end the process."
        ),
        default="False",
        since=(2, 12),
        live=Live.PINNED,
    ),
    OptionSpec(
        name="pinned_max_round_threshold_mb",
        kind=Kind.SIZE_MB,
        unit="MiB",
        summary="Pinned host allocations above this size are not rounded to a power of two.",
        explanation="Less host memory lost to rounding for big pinned buffers.",
        default="unlimited",
        since=(2, 13),
        scope=Scope.GENERIC,
        live=Live.PINNED,
        bounds=(((2, 13), Bound(low=0, high=MAX_MIB)),),
        slider=(1, 65536),
    ),
    OptionSpec(
        name="pinned_max_cached_size_mb",
        kind=Kind.SIZE_MB,
        unit="MiB",
        summary="Pinned host blocks above this size are freed rather than cached.",
        explanation="Caps how much pinned host memory big, one-off buffers keep after use.",
        default="unlimited",
        since=(2, 13),
        scope=Scope.GENERIC,
        live=Live.PINNED,
        bounds=(((2, 13), Bound(low=0, high=MAX_MIB)),),
        slider=(1, 65536),
    ),
    OptionSpec(
        name="expandable_segments_reserve",
        kind=Kind.RESERVE,
        summary="Address space each expandable segment reserves: a fraction (0.5) or a size (40G).",
        explanation=(
            "By default each expandable segment reserves 9/8 of device memory as virtual address "
            "space. Lower it when many processes or pools share a GPU and run out of address space. "
            "A segment never grows past its reserve and one allocation cannot span two segments, "
            "so a request larger than the reserve fails with an out-of-memory error however much "
            "memory is free."
        ),
        default="9/8 of device memory",
        since=(2, 15),
        live=Live.NEW_SEGMENTS,
        native_only=True,
    ),
    OptionSpec(
        name="expandable_segments_reserve_by_class",
        kind=Kind.RESERVE_BY_CLASS,
        summary="Per reserve-class address-space reservations for expandable segments.",
        explanation=(
            "Advanced: [name:reserve,...] with each reserve written as for "
            "expandable_segments_reserve; streams tagged with a class (a C++ call, "
            "setExpandableSegmentReserveClassForStream) use its reserve, others the global one."
        ),
        default="none",
        since=(2, 15),
        live=Live.NEW_SEGMENTS,
        native_only=True,
    ),
)

_BY_NAME: dict[str, OptionSpec] = {spec.name: spec for spec in OPTIONS}
_ALIASES: dict[str, str] = {alias: spec.name for spec in OPTIONS for alias in spec.aliases}

#: Names people write that torch never accepted (or stopped accepting), with what to write instead.
KNOWN_MISTAKES: dict[str, str] = {
    "garbage_collect_threshold": "garbage_collection_threshold",
    "max_split_mb": "max_split_size_mb",
    "max_split_size": "max_split_size_mb",
    "max_split": "max_split_size_mb",
    "expandable_segment": "expandable_segments",
    "expandeable_segments": "expandable_segments",
    "expandable": "expandable_segments",
    "roundup_power2_division": "roundup_power2_divisions",
    "roundup_power_2_divisions": "roundup_power2_divisions",
    "cudaMallocAsync": "backend",
}
#: Keys that appear in torch error texts or blog posts but in no release's key list through 2.15.
NEVER_KEYS: dict[str, str] = {
    "expandable_segments_handle_type": (
        "appears only in torch 2.14/2.15 error messages, in no release's list of keys"
    ),
    "expandable_segments_page_size": "is not a key in any torch release up to 2.15",
}


def spec_for(name: str) -> OptionSpec | None:
    """The spec for a canonical name or an alias (ROCm spelling), else None."""
    return _BY_NAME.get(name) or _BY_NAME.get(_ALIASES.get(name, ""))


def canonical_name(name: str) -> str:
    """Map an alias (``release_lock_on_hipmalloc``) to its canonical key."""
    return _ALIASES.get(name, name)


def options_for(version: TorchVersion) -> Iterator[OptionSpec]:
    """The options torch ``version`` accepts, in canonical order."""
    return (spec for spec in OPTIONS if spec.exists_in(version))


def canonical_index(name: str) -> int:
    """Position of an option in the canonical order, the order of AllocConf entries."""
    return list(_BY_NAME).index(canonical_name(name))
