"""Memory and fragmentation figures from a snapshot's segments, or from ``memory_stats()``.

Every figure is defined in docs/metrics.md. Figures are kept per device and per
pool, because a free block in one pool cannot serve a request routed to
another: the small pool (requests up to torch's ``kSmallSize``), the large pool, and each private
pool (CUDA graphs, ``torch.cuda.MemPool``) have their own caches.

Performance matters: the notebook panel recomputes these from a live
``memory_snapshot()`` on demand, and a snapshot can hold tens of thousands of
blocks. The per-block loop is therefore a single pass over tuples fetched by
``operator.itemgetter``, with a tolerant slow path for legacy or unusual blocks.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from allocconf_widget.core.memory.snapshot import (
    ACTIVE_ALLOCATED,
    INACTIVE,
    Segment,
    Snapshot,
    SnapshotBlock,
    pool_id_of,
    requested_size_of,
    segment_type_of,
)

# itemgetter raises KeyError when a block lacks one of these; that sends the
# segment to the tolerant path. Requiring "frames" keeps the fast path exactly
# equivalent to torch's _block_extra (blocks without frames use the legacy rule).
_FAST_FIELDS = operator.itemgetter("state", "size", "requested_size", "frames")
_STATE_SIZE = operator.itemgetter("state", "size")
_SCOPE_KEY = operator.itemgetter("device", "segment_pool_id", "segment_type")


@dataclass(frozen=True, slots=True)
class SegmentFill:
    """How full one segment is: the strip the panel draws per segment."""

    address: int
    total_size: int
    allocated: int
    fill: float
    is_expandable: bool
    stream: int
    pool: str

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form, keys as documented in docs/metrics.md."""
        return {
            "address": self.address,
            "total_size": self.total_size,
            "allocated": self.allocated,
            "fill": self.fill,
            "is_expandable": self.is_expandable,
            "stream": self.stream,
            "pool": self.pool,
        }


@dataclass(frozen=True, slots=True)
class Metrics:
    """Figures for one scope (one pool of one device, or a device's total).

    Field names are the JSON keys of ``allocconf report --json``.
    """

    reserved_bytes: int
    allocated_bytes: int
    active_bytes: int
    requested_bytes: int
    inactive_bytes: int
    largest_free_block_bytes: int
    external_fragmentation: float
    internal_fragmentation_bytes: int
    internal_fragmentation: float
    segment_count: int
    block_count: int
    segsum_allocated_bytes: int
    segsum_internal_free_bytes: int
    segsum_external_free_bytes: int
    segments: tuple[SegmentFill, ...] = ()

    def to_dict(self, include_segments: bool = False) -> dict[str, object]:
        """JSON-ready form; the per-segment list only when asked (it can be long)."""
        out: dict[str, object] = {
            name: getattr(self, name) for name in _SCALAR_FIELDS
        }
        if include_segments:
            out["segments"] = [seg.to_dict() for seg in self.segments]
        return out


_SCALAR_FIELDS = tuple(name for name in Metrics.__dataclass_fields__ if name != "segments")


@dataclass(frozen=True, slots=True)
class DeviceMetrics:
    """A device's total plus one :class:`Metrics` per pool label (``default/large`` ...)."""

    device: int
    total: Metrics
    pools: Mapping[str, Metrics] = field(default_factory=dict)

    def to_dict(self, include_segments: bool = False) -> dict[str, object]:
        """``{"total": {...}, "pools": {label: {...}}}``."""
        return {
            "total": self.total.to_dict(include_segments),
            "pools": {
                label: pool.to_dict(include_segments) for label, pool in self.pools.items()
            },
        }


def cached_share(reserved: int | None, allocated: int | None) -> float | None:
    """``(reserved − allocated) / reserved``: memory PyTorch holds but no tensor uses.

    ``None`` when either figure is missing or nothing is reserved; never negative
    (live samples read the two counters a moment apart).
    """
    if not reserved or allocated is None:
        return None
    return max(0.0, (reserved - allocated) / reserved)


# ----------------------------------------------------------------- tallies


@dataclass(slots=True)
class _Tally:
    """Running sums for one scope (a pool, or a device total merged from its pools)."""

    reserved: int = 0
    allocated: int = 0
    requested_allocated: int = 0
    pending: int = 0
    requested_pending: int = 0
    inactive: int = 0
    largest_free: int = 0
    segments: int = 0
    blocks: int = 0
    fills: list[SegmentFill] = field(default_factory=list)

    def absorb(self, other: _Tally) -> None:
        self.reserved += other.reserved
        self.allocated += other.allocated
        self.requested_allocated += other.requested_allocated
        self.pending += other.pending
        self.requested_pending += other.requested_pending
        self.inactive += other.inactive
        self.largest_free = max(self.largest_free, other.largest_free)
        self.segments += other.segments
        self.blocks += other.blocks
        self.fills.extend(other.fills)

    def finish(self) -> Metrics:
        internal = self.allocated - self.requested_allocated
        external = 1.0 - self.largest_free / self.inactive if self.inactive else 0.0
        return Metrics(
            reserved_bytes=self.reserved,
            allocated_bytes=self.allocated,
            active_bytes=self.allocated + self.pending,
            requested_bytes=self.requested_allocated + self.requested_pending,
            inactive_bytes=self.inactive,
            largest_free_block_bytes=self.largest_free,
            external_fragmentation=external,
            internal_fragmentation_bytes=internal,
            internal_fragmentation=internal / self.allocated if self.allocated else 0.0,
            segment_count=self.segments,
            block_count=self.blocks,
            segsum_allocated_bytes=self.requested_allocated,
            segsum_internal_free_bytes=internal,
            segsum_external_free_bytes=self.inactive + self.pending,
            segments=tuple(sorted(self.fills, key=operator.attrgetter("address"))),
        )


def _scan_fast(blocks: Iterable[SnapshotBlock], tally: _Tally) -> None:
    """One pass over well-formed (2.1+) blocks. Raises KeyError on any other block."""
    allocated = requested_allocated = pending = requested_pending = inactive = largest = 0
    for state, size, requested, _frames in map(_FAST_FIELDS, blocks):
        if state == ACTIVE_ALLOCATED:
            allocated += size
            requested_allocated += requested
        elif state == INACTIVE:
            inactive += size
            if size > largest:  # noqa: PLR1730  (hot loop: cheaper than calling max)
                largest = size
        else:  # active_pending_free (and any future "active" state)
            pending += size
            requested_pending += requested
    tally.allocated = allocated
    tally.requested_allocated = requested_allocated
    tally.pending = pending
    tally.requested_pending = requested_pending
    tally.inactive = inactive
    tally.largest_free = largest


def _scan_tolerant(blocks: Iterable[SnapshotBlock], tally: _Tally) -> None:
    """Same sums for legacy 2.0 blocks (``history``) or blocks missing optional keys."""
    allocated = requested_allocated = pending = requested_pending = inactive = largest = 0
    for block in blocks:
        state, size = block["state"], block["size"]
        if state == ACTIVE_ALLOCATED:
            allocated += size
            requested_allocated += requested_size_of(block)
        elif state == INACTIVE:
            inactive += size
            if size > largest:  # noqa: PLR1730  (hot loop: cheaper than calling max)
                largest = size
        else:
            pending += size
            requested_pending += requested_size_of(block)
    tally.allocated = allocated
    tally.requested_allocated = requested_allocated
    tally.pending = pending
    tally.requested_pending = requested_pending
    tally.inactive = inactive
    tally.largest_free = largest


def _tally_pool(segments: list[Segment], pool: str, with_fills: bool) -> _Tally:
    """Sums over all blocks of a pool's segments in one pass (no per-segment bookkeeping)."""
    reserved = 0
    blocks: list[SnapshotBlock] = []
    extend = blocks.extend
    for segment in segments:
        reserved += segment["total_size"]
        extend(segment["blocks"])
    tally = _Tally(reserved=reserved, segments=len(segments), blocks=len(blocks))
    try:
        _scan_fast(blocks, tally)
    except KeyError:
        _scan_tolerant(blocks, tally)
    if with_fills:
        tally.fills = [_fill_of(segment, pool) for segment in segments]
    return tally


def _fill_of(segment: Segment, pool: str) -> SegmentFill:
    total = segment["total_size"]
    allocated = 0
    for state, size in map(_STATE_SIZE, segment["blocks"]):
        if state == ACTIVE_ALLOCATED:
            allocated += size
    return SegmentFill(
        address=segment.get("address", 0),
        total_size=total,
        allocated=allocated,
        fill=allocated / total if total else 0.0,
        is_expandable=bool(segment.get("is_expandable", False)),
        stream=segment.get("stream", 0),
        pool=pool,
    )


# ----------------------------------------------------------------- grouping


def pool_label(segment: Segment) -> str:
    """Name the cache a segment belongs to: ``default/large``, ``pool(1,2)/small`` and so on.

    Memory freed in one of these can only be reused by requests routed to the same one.
    """
    first, second = pool_id_of(segment)
    owner = "default" if (first, second) == (0, 0) else f"pool({first},{second})"
    return f"{owner}/{segment_type_of(segment)}"


def _group_tolerant(segments: list[Segment]) -> dict[tuple[int, str], list[Segment]]:
    groups: dict[tuple[int, str], list[Segment]] = {}
    for segment in segments:
        groups.setdefault((segment.get("device", 0), pool_label(segment)), []).append(segment)
    return groups


def _group(segments: list[Segment]) -> dict[tuple[int, str], list[Segment]]:
    """Segments by (device, pool label), keeping snapshot order inside each group.

    The fast path buckets by the raw key tuple and labels each bucket once;
    2.0 segments (no type or pool id) or unhashable pool ids take the tolerant path.
    """
    buckets: dict[object, list[Segment]] = {}
    try:
        for segment in segments:
            key = _SCOPE_KEY(segment)
            bucket = buckets.get(key)
            if bucket is None:
                buckets[key] = [segment]
            else:
                bucket.append(segment)
    except (KeyError, TypeError):
        return _group_tolerant(segments)
    groups: dict[tuple[int, str], list[Segment]] = {}
    for bucket in buckets.values():
        first = bucket[0]
        groups.setdefault((first.get("device", 0), pool_label(first)), []).extend(bucket)
    return groups


def _device_result(
    device: int, pools: dict[str, list[Segment]], include_segments: bool
) -> DeviceMetrics:
    total = _Tally()
    finished: dict[str, Metrics] = {}
    for label in sorted(pools):
        tally = _tally_pool(pools[label], label, include_segments)
        total.absorb(tally)
        finished[label] = tally.finish()
    return DeviceMetrics(device=device, total=total.finish(), pools=finished)


# ----------------------------------------------------------------- public API


def segment_metrics(segments: Iterable[Segment], *, include_segments: bool = False) -> Metrics:
    """Figures over any collection of segments as one scope (e.g. ``memory_snapshot()``'s list)."""
    segments = list(segments)
    labels = (
        {id(seg): label for (_dev, label), segs in _group(segments).items() for seg in segs}
        if include_segments
        else {}
    )
    tally = _tally_pool(segments, "", with_fills=False)
    if include_segments:
        tally.fills = [_fill_of(seg, labels[id(seg)]) for seg in segments]
    return tally.finish()


def snapshot_metrics(
    snapshot: Snapshot, device: int | None = None, *, include_segments: bool = False
) -> dict[int, DeviceMetrics]:
    """Figures for every device with segments (or only ``device``), keyed by device index.

    A device that appears only in ``device_traces`` has no segments and is left out.
    """
    by_device: dict[int, dict[str, list[Segment]]] = {}
    for (index, label), segs in _group(snapshot["segments"]).items():
        if device is None or index == device:
            by_device.setdefault(index, {})[label] = segs
    return {
        index: _device_result(index, by_device[index], include_segments)
        for index in sorted(by_device)
    }


def metrics_json(
    per_device: Mapping[int, DeviceMetrics], *, include_segments: bool = False
) -> dict[str, object]:
    """The ``report --json`` document: ``{"devices": {"0": {"total": ..., "pools": ...}}}``."""
    return {
        "devices": {
            str(index): dm.to_dict(include_segments) for index, dm in sorted(per_device.items())
        }
    }
