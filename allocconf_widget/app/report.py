"""The report use case: memory and fragmentation figures of one snapshot, for every front end.

``allocconf report FILE``, ``%allocconf report`` and anything else that shows these
figures get a :class:`MemoryReport` from here and render it with
:func:`allocconf_widget.views.text.report.render_report`, so the same file gives the
same table everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocconf_widget._errors import SnapshotError, one_line
from allocconf_widget.core.memory.metrics import DeviceMetrics, metrics_json, snapshot_metrics
from allocconf_widget.core.memory.snapshot import Snapshot, large_snapshot_note, load_snapshot


@dataclass(frozen=True)
class MemoryReport:
    """Figures per device (total and per pool) of one snapshot, and where it came from."""

    source: str  # "file", "live" or "recording"
    label: str
    snapshot: Snapshot
    per_device: dict[int, DeviceMetrics]
    notes: tuple[str, ...] = ()

    def to_json(self, include_segments: bool = False) -> dict[str, Any]:
        """The document of docs/metrics.md, with ``source`` and ``label``."""
        return {"source": self.source, "label": self.label,
                **metrics_json(self.per_device, include_segments=include_segments)}


def build_report(snapshot: Snapshot, *, source: str, label: str, device: int | None = None,
                 include_segments: bool = False, notes: tuple[str, ...] = ()) -> MemoryReport:
    """Compute the figures; ``device`` must be one that has segments.

    Raises:
        SnapshotError: ``device`` has no segments in this snapshot (the message lists those that do).
    """
    with_segments = sorted({seg.get("device", 0) for seg in snapshot["segments"]})
    if device is not None and device < 0:  # said as the monitor says it, before the long label
        raise SnapshotError(f"device {device}: GPU indices start at 0")
    if device is not None and device not in with_segments:
        listed = ", ".join(map(str, with_segments)) or "none"
        raise SnapshotError(f"device {device} has no segments in {one_line(label, 300)} "
                            f"(devices with segments: {listed}); pick one of those")
    per_device = snapshot_metrics(snapshot, device, include_segments=include_segments)
    return MemoryReport(source, label, snapshot, per_device, notes)


def report_file(path: Path, *, device: int | None = None,
                include_segments: bool = False) -> MemoryReport:
    """The report of a snapshot file (any file: the loader's limits apply, docs/limits.md)."""
    snapshot = load_snapshot(path)
    note = large_snapshot_note(path.stat().st_size)
    return build_report(snapshot, source="file", label=f"snapshot: {path}", device=device,
                        include_segments=include_segments, notes=(note,) if note else ())


def report_live(*, device: int | None = None) -> MemoryReport:
    """This process's allocator now; the bundled recording, labelled as such, when none is up."""
    from allocconf_widget.adapters.live import live_snapshot

    live = live_snapshot()
    if live.snapshot is not None:
        return build_report(live.snapshot,  # type: ignore[arg-type]
                            source="live", label="this process, now (memory_snapshot without trace)",
                            device=device)
    from allocconf_widget.core.memory.recording import load_demo

    demo = load_demo()
    return build_report(dict(demo.snapshot()),  # type: ignore[arg-type]
                        source="recording",
                        label=f"{demo.label} (no live CUDA allocator here: {live.why_not})",
                        device=device)
