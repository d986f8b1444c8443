"""The one text rendering of a :class:`~allocconf_widget.app.report.MemoryReport`.

``allocconf report`` and ``%allocconf report`` both print this, so one file gives one table.
"""

from __future__ import annotations

from typing import Any

from allocconf_widget._errors import one_line
from allocconf_widget.app.report import MemoryReport
from allocconf_widget.core.memory.metrics import DeviceMetrics, Metrics
from allocconf_widget.core.memory.snapshot import Snapshot, allocator_settings, devices_in, has_trace
from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.text.table import aligned_table


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
    return aligned_table([header, *cells], indent="  ")


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
    # values from the file: a crafted string carried escape sequences to the terminal
    return "allocator settings: " + ", ".join(f"{one_line(str(k), 60)}={one_line(str(v), 300)}"
                                              for k, v in shown.items())


def _devices_line(devices: Any) -> str:
    """"device 0" (a count of 0 would read as "no devices"), "devices 0, 1", or none."""
    names = [str(d) for d in devices]
    if not names:
        return "no device held memory"
    return ("device " if len(names) == 1 else "devices ") + ", ".join(names)


def render_report(report: MemoryReport, show_segments: bool = False) -> str:
    """The human-readable report: the same table for a file (CLI) and the live allocator (magic)."""
    snapshot, per_device = report.snapshot, report.per_device
    history = "recorded" if has_trace(snapshot) else "not recorded"
    lines = [
        one_line(report.label, 400),  # a path from the command line: --json keeps it exact
        f"{_devices_line(devices_in(snapshot))}; "
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
