"""External fragmentation over time, rebuilt from a snapshot's recorded allocation history.

A recording keeps ``memory_stats()`` counters at 20 Hz but only one snapshot, at
the end; fragmentation needs the *layout* of free space, which counters do not
give. The snapshot's ``device_traces`` do: every ``segment_alloc`` /
``segment_free`` (``segment_map`` / ``segment_unmap`` for expandable segments)
and every ``alloc`` / ``free_completed`` with its address. Walking them in
order rebuilds which bytes of which segment are in use at any moment, so the
figure of docs/metrics.md (``1 − largest free block / inactive bytes``, over
the device's segments, pools mixed as in the report's total) can be computed
at each sample time of the recorded timeline.

A block is inactive only after ``free_completed`` (``free_requested`` blocks
are still pending, as in the snapshot). A history that does not start at the
beginning of the run (the ring buffer wrapped) or does not add up (a free of a
block never allocated) gives no figure at all rather than a wrong one. So does
a history of expandable segments: its ``segment_map`` entries do not say how
mapped pages join into the runs the snapshot reports (checked against the
recordings in tests/data, which disagree by whole pages).

Standard library only; linear in the number of trace entries plus, per sample,
the blocks of the segments that changed since the previous sample.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_SEGMENT_ADD = frozenset({"segment_alloc"})
_SEGMENT_REMOVE = frozenset({"segment_free"})
_EXPANDABLE = frozenset({"segment_map", "segment_unmap"})


class HistoryMismatchError(ValueError):
    """The recorded history cannot be replayed (it started mid-run, or does not add up)."""


@dataclass
class _Segment:
    size: int
    blocks: dict[int, int] = field(default_factory=dict)  # offset -> size of active blocks
    largest_free: int = 0
    free: int = 0
    dirty: bool = True

    def measure(self) -> None:
        """Largest gap between active blocks, and all free bytes, of this segment."""
        cursor = largest = used = 0
        for offset in sorted(self.blocks):
            size = self.blocks[offset]
            largest = max(largest, offset - cursor)
            cursor = max(cursor, offset + size)
            used += size
        self.largest_free = max(largest, self.size - cursor)
        self.free = max(0, self.size - used)
        self.dirty = False


@dataclass(frozen=True, slots=True)
class FragmentationPoint:
    """The free-space layout at one moment: docs/metrics.md's ``external_fragmentation`` and its parts."""

    time_us: float
    inactive_bytes: int
    largest_free_block_bytes: int

    @property
    def external_fragmentation(self) -> float:
        if not self.inactive_bytes:
            return 0.0
        return 1.0 - self.largest_free_block_bytes / self.inactive_bytes


class _Layout:
    """Segments of one device and their active blocks, updated one trace entry at a time."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.segments: dict[int, _Segment] = {}

    def _owner(self, addr: int) -> tuple[int, _Segment]:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0:
            start = self.starts[i]
            segment = self.segments[start]
            if addr < start + segment.size:
                return start, segment
        raise HistoryMismatchError(f"a block at {addr:#x} lies in no recorded segment")

    def apply(self, entry: Mapping[str, Any]) -> None:
        action = entry.get("action")
        addr, size = entry.get("addr"), entry.get("size")
        if not isinstance(addr, int) or not isinstance(size, int):
            return
        if action in _EXPANDABLE:
            raise HistoryMismatchError("expandable segments: the history does not say how mapped "
                                       "pages join into segments")
        if action in _SEGMENT_ADD:
            if addr not in self.segments:
                bisect.insort(self.starts, addr)
            self.segments[addr] = _Segment(size)
        elif action in _SEGMENT_REMOVE:
            if self.segments.pop(addr, None) is not None:
                self.starts.remove(addr)
        elif action == "alloc":
            start, segment = self._owner(addr)
            segment.blocks[addr - start] = size
            segment.dirty = True
        elif action == "free_completed":
            start, segment = self._owner(addr)
            if segment.blocks.pop(addr - start, None) is None:
                raise HistoryMismatchError(f"a free of {addr:#x}, which was never allocated")
            segment.dirty = True

    def point(self, time_us: float) -> FragmentationPoint:
        inactive = largest = 0
        for segment in self.segments.values():
            if segment.dirty:
                segment.measure()
            inactive += segment.free
            largest = max(largest, segment.largest_free)
        return FragmentationPoint(time_us, inactive, largest)


def _private_pool(segment: object) -> bool:
    pool = segment.get("segment_pool_id") if isinstance(segment, Mapping) else None
    return isinstance(pool, Sequence) and not isinstance(pool, str) and any(
        isinstance(part, int) and part != 0 for part in pool)


def fragmentation_at(
    snapshot: Mapping[str, Any], times_us: Sequence[float], device: int = 0
) -> list[FragmentationPoint]:
    """The layout after every trace entry up to each time in ``times_us`` (ascending, µs epoch).

    Raises:
        HistoryMismatchError: no history for ``device``, or one that cannot be replayed.
    """
    traces = snapshot.get("device_traces")
    if not isinstance(traces, Sequence) or device >= len(traces) or not traces[device]:
        raise HistoryMismatchError("the snapshot has no allocation history for this device")
    entries = traces[device]
    first = entries[0] if isinstance(entries[0], Mapping) else {}
    if first.get("action") in _EXPANDABLE:
        raise HistoryMismatchError("expandable segments: the history does not say how mapped "
                                   "pages join into segments")
    if any(_private_pool(seg) for seg in snapshot.get("segments") or ()):
        raise HistoryMismatchError("private memory pools (CUDA graphs, torch.cuda.MemPool): the "
                                   "history does not say which pool each block went to")
    if first.get("action") not in _SEGMENT_ADD:
        raise HistoryMismatchError("the allocation history does not start with the first segment "
                              "(it was cut by max_entries)")
    layout = _Layout()
    out: list[FragmentationPoint] = []
    i = 0
    for when in times_us:
        while i < len(entries):
            entry = entries[i]
            at = entry.get("time_us") if isinstance(entry, Mapping) else None
            if not isinstance(at, int | float):
                raise HistoryMismatchError(f"trace entry {i} has no time_us")
            if at > when:
                break
            layout.apply(entry)
            i += 1
        out.append(layout.point(when))
    return out
