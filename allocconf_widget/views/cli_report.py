"""``allocconf report SNAPSHOT``: memory and fragmentation figures of a snapshot, no GPU needed.

Prints a table per device (one column per pool plus the total) or, with
``--json``, the document described in docs/metrics.md::

    {"devices": {"0": {"total": {...}, "pools": {"default/large": {...}, ...}}}}

Exit codes: 0 ok, 2 unreadable snapshot or unknown device.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from allocconf_widget._errors import SnapshotError
from allocconf_widget.core.metrics import (
    DeviceMetrics,
    Metrics,
    format_bytes,
    metrics_json,
    snapshot_metrics,
)
from allocconf_widget.core.snapshot import (
    Snapshot,
    allocator_settings,
    devices_in,
    has_trace,
    large_snapshot_note,
    load_snapshot,
)

_PROG = "allocconf report"


def register(subparsers: Any) -> None:
    """Add the ``report`` subcommand to the top-level parser."""
    parser = subparsers.add_parser(
        "report",
        help="memory and fragmentation figures from a saved memory snapshot",
        description=(
            "Read a snapshot written by torch.cuda.memory._dump_snapshot() (plain or .gz) "
            "without running anything in it, and report reserved/allocated memory and "
            "fragmentation per device and per pool. Figures are defined in docs/metrics.md."
        ),
    )
    parser.add_argument("snapshot", metavar="SNAPSHOT", help="snapshot .pickle (or .pickle.gz)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--device", type=int, metavar="N", help="only this CUDA device")
    parser.add_argument(
        "--segments", action="store_true", help="also list every segment and how full it is"
    )
    parser.set_defaults(handler=run)


def _fail(message: str) -> int:
    print(f"{_PROG}: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Load the snapshot, compute the figures, print them; returns the exit code."""
    path = Path(args.snapshot)
    try:
        snapshot = load_snapshot(path)
    except SnapshotError as exc:
        return _fail(str(exc))
    note = large_snapshot_note(path.stat().st_size)
    if note:
        print(f"{_PROG}: note: {note}", file=sys.stderr)
    with_segments = {seg.get("device", 0) for seg in snapshot["segments"]}
    if args.device is not None and args.device not in with_segments:
        listed = ", ".join(str(d) for d in sorted(with_segments)) or "none"
        return _fail(
            f"device {args.device} has no segments in {path.name} "
            f"(devices with segments: {listed}); pick one of those with --device"
        )
    per_device = snapshot_metrics(snapshot, args.device, include_segments=args.segments)
    if args.json:
        json.dump(metrics_json(per_device, include_segments=args.segments), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(path, snapshot, per_device, show_segments=args.segments))
    return 0


# ----------------------------------------------------------------- text rendering


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"


_ROWS: tuple[tuple[str, Any], ...] = (
    ("reserved", lambda m: format_bytes(m.reserved_bytes)),
    ("allocated", lambda m: format_bytes(m.allocated_bytes)),
    ("active (allocated + pending free)", lambda m: format_bytes(m.active_bytes)),
    ("requested", lambda m: format_bytes(m.requested_bytes)),
    ("inactive (cached, free)", lambda m: format_bytes(m.inactive_bytes)),
    ("largest free block", lambda m: format_bytes(m.largest_free_block_bytes)),
    ("external fragmentation", lambda m: _pct(m.external_fragmentation)),
    ("internal fragmentation", lambda m: format_bytes(m.internal_fragmentation_bytes)),
    ("internal fragmentation (of allocated)", lambda m: _pct(m.internal_fragmentation)),
    ("segments", lambda m: f"{m.segment_count:,}"),
    ("blocks", lambda m: f"{m.block_count:,}"),
    ("segsum: allocated (requested)", lambda m: format_bytes(m.segsum_allocated_bytes)),
    ("segsum: internal free", lambda m: format_bytes(m.segsum_internal_free_bytes)),
    ("segsum: external free", lambda m: format_bytes(m.segsum_external_free_bytes)),
)


def _table(columns: list[tuple[str, Metrics]]) -> list[str]:
    cells = [[label] + [fmt(m) for _name, m in columns] for label, fmt in _ROWS]
    header = ["", *(name for name, _m in columns)]
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        first = row[0].ljust(widths[0])
        rest = "  ".join(cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True))
        return f"  {first}  {rest}".rstrip()

    return [line(header), *(line(row) for row in cells)]


def _segment_lines(dm: DeviceMetrics) -> list[str]:
    lines = ["", "  segments (address order):",
             f"  {'address':>16}  {'pool':<18} {'size':>12} {'allocated':>12} {'fill':>6}  "
             "expandable  stream"]
    for seg in dm.total.segments:
        lines.append(
            f"  {seg.address:#16x}  {seg.pool:<18} {format_bytes(seg.total_size):>12} "
            f"{format_bytes(seg.allocated):>12} {_pct(seg.fill):>6}  "
            f"{'yes' if seg.is_expandable else 'no':<10}  "
            f"{f'{seg.stream:#x}' if seg.stream else 'default'}"
        )
    return lines


def _settings_line(snapshot: Snapshot) -> str:
    settings = allocator_settings(snapshot)
    if settings is None:
        return "allocator settings: not recorded (snapshots from torch < 2.3)"
    shown = {k: v for k, v in settings.items() if k != "roundup_power2_divisions"}
    if shown.get("max_split_size") == -1:
        shown["max_split_size"] = "unlimited"
    return "allocator settings: " + ", ".join(f"{k}={v}" for k, v in shown.items())


def render_text(
    path: Path, snapshot: Snapshot, per_device: dict[int, DeviceMetrics], show_segments: bool
) -> str:
    """The human-readable report."""
    history = "recorded" if has_trace(snapshot) else "not recorded"
    lines = [
        f"snapshot: {path}",
        f"devices: {', '.join(map(str, devices_in(snapshot))) or 'none'}; "
        f"allocation history: {history}",
        _settings_line(snapshot),
    ]
    if not per_device:
        lines.append("no segments: the allocator held no memory when the snapshot was taken")
    for index, dm in per_device.items():
        lines += ["", f"device {index}"]
        lines += _table([("total", dm.total), *dm.pools.items()])
        if show_segments:
            lines += _segment_lines(dm)
    lines += [
        "",
        "external fragmentation = 1 - largest free block / inactive; internal = rounding "
        "waste in allocated blocks.",
        "segsum rows match `python -m torch.cuda._memory_viz stats`; see docs/metrics.md.",
    ]
    return "\n".join(lines) + "\n"
