"""Who held the memory: live bytes of a snapshot grouped by allocation site.

With Python stacks recorded, every live block carries the frames of the call that
allocated it, and the site is the first frame outside torch (the user's line).
Without stacks a block has no frames; grouping by size class, stream and pool
still tells forty equal activations on the default stream from one large parameter
blob. Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from allocconf_widget.core.memory.metrics import pool_label
from allocconf_widget.core.memory.snapshot import ACTIVE_ALLOCATED
from allocconf_widget.core.units import MIB, format_bytes

BY_FRAME = "Python frame"
BY_CLASS = "size class, stream and pool"
NO_FRAMES = "(no stack: allocated before stacks were recorded)"
_TORCH_DIR = f"{os.sep}torch{os.sep}"
_SIZE_CLASSES = ((1 * MIB, "< 1 MiB"), (10 * MIB, "1–10 MiB"), (100 * MIB, "10–100 MiB"),
                 (1024 * MIB, "100 MiB–1 GiB"))


@dataclass(frozen=True)
class AllocationSite:
    """One group of live blocks."""

    label: str
    live_bytes: int
    blocks: int
    largest: int

    def line(self, total: int) -> str:
        share = f"{self.live_bytes / total:.0%}" if total else "–"
        return (f"{format_bytes(self.live_bytes):>11} {share:>4}  {self.blocks:>6,} blocks "
                f"(largest {format_bytes(self.largest)})  {self.label}")


@dataclass(frozen=True)
class SiteReport:
    """The top sites by live bytes, and what the rest adds up to."""

    by: str
    sites: tuple[AllocationSite, ...]
    live_bytes: int
    live_blocks: int
    rest_bytes: int
    rest_sites: int

    def lines(self) -> list[str]:
        out = [f"Top allocation sites by live bytes at the OOM (by {self.by}):"]
        out += ["  " + site.line(self.live_bytes) for site in self.sites]
        if self.rest_sites:
            out.append(f"  {format_bytes(self.rest_bytes):>11}       in {self.rest_sites} more sites")
        if not self.sites:
            out.append("  no live blocks in the snapshot")
        return out


def _short_path(filename: str) -> str:
    parts = filename.replace("\\", "/").split("/")
    return "/".join(parts[-2:])


def frame_site(frames: Sequence[Mapping[str, Any]]) -> str | None:
    """``file.py:line name`` of the first frame outside torch itself (else the innermost)."""
    usable = [f for f in frames if f.get("filename") and f.get("filename") != "??"]
    if not usable:
        return None
    chosen = next((f for f in usable if _TORCH_DIR not in str(f["filename"])
                   and not str(f["filename"]).startswith("<")), usable[0])
    where = f"{_short_path(str(chosen['filename']))}:{chosen.get('line', '?')}"
    return f"{where} {chosen.get('name', '')}".strip()


def size_class(size: int) -> str:
    """A coarse, stable size bucket."""
    for limit, label in _SIZE_CLASSES:
        if size < limit:
            return label
    return "≥ 1 GiB"


def _frames(block: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    frames = block.get("frames")
    if isinstance(frames, list | tuple):
        return frames
    history = block.get("history")  # torch 2.0 snapshots
    if isinstance(history, list | tuple) and history and isinstance(history[0], Mapping):
        inner = history[0].get("frames")
        return inner if isinstance(inner, list | tuple) else ()
    return ()


def _live_blocks(segments: Iterable[Mapping[str, Any]]) -> Iterable[tuple[Mapping[str, Any],
                                                                           Mapping[str, Any]]]:
    for segment in segments:
        for block in segment.get("blocks") or ():
            if isinstance(block, Mapping) and block.get("state") == ACTIVE_ALLOCATED:
                yield segment, block


def top_sites(snapshot: Mapping[str, Any], *, device: int | None = 0, limit: int = 8) -> SiteReport:
    """Group the live (allocated) blocks of ``device`` and rank the groups by bytes.

    Groups by Python frame when any live block has frames, else by size class,
    stream and pool.
    """
    segments = [s for s in snapshot.get("segments") or () if isinstance(s, Mapping)
                and (device is None or s.get("device", 0) == device)]
    live = list(_live_blocks(segments))
    with_frames = any(_frames(block) for _, block in live)
    groups: dict[str, list[int]] = {}
    for segment, block in live:
        size = int(block.get("size", 0) or 0)
        if with_frames:
            label = frame_site(_frames(block)) or NO_FRAMES
        else:
            label = (f"{size_class(size)} · stream {int(segment.get('stream', 0) or 0):#x} · "
                     f"{pool_label(segment)}")  # type: ignore[arg-type]
        entry = groups.setdefault(label, [0, 0, 0])
        entry[0] += size
        entry[1] += 1
        entry[2] = max(entry[2], size)
    ranked = sorted((AllocationSite(label, b, n, big) for label, (b, n, big) in groups.items()),
                    key=lambda s: (-s.live_bytes, s.label))
    shown, rest = ranked[:limit], ranked[limit:]
    return SiteReport(BY_FRAME if with_frames else BY_CLASS, tuple(shown),
                      sum(s.live_bytes for s in ranked), len(live),
                      sum(s.live_bytes for s in rest), len(rest))
