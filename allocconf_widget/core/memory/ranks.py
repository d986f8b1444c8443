"""What a rank launched from the notebook reports about its allocator, as plain data.

A rank (a process started by ``torch.multiprocessing.spawn``, accelerate's
``notebook_launcher`` or ``!torchrun`` from the notebook) writes one small JSON
record at a time into the notebook's rank channel (``adapters/rank_channel.py``);
the notebook reads it back here. Records come from another process, so they are
untrusted: :func:`parse_rank_record` bounds their size and checks every field,
and a broken record is an error that names what is wrong, never a crash.

Standard library only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from allocconf_widget._errors import SnapshotError, one_line, printable
from allocconf_widget.core.numbers import int_or_none

RECORD_VERSION = 1
MAX_RECORD_BYTES = 64 * 1024
MAX_DEVICES = 64
MAX_TEXT = 2_000

#: States a rank can be in, as the notebook sees it.
WAITING = "waiting"  # reporting, but its program has not used CUDA yet
REPORTING = "reporting"
SILENT = "silent"  # alive, but no record for several intervals
DIED = "died"  # its process is gone without saying it finished
FINISHED = "finished"
FAILED = "failed"  # it ended with an exception (its reporter said so on the way out)
OOM = "oom"  # it ran out of memory (it may still be alive and retrying)

#: a record's wall clock is seconds since 1970: a value outside this range (1e308, -1e308)
#: is refused at the door instead of putting inf/NaN into the chart's time axis
MIN_WALL = 0.0
MAX_WALL = 1e10  # the year 2286
#: a rank whose liveness cannot be checked (another host) is presumed dead after this long
#: without a new record (and at least this many of its intervals)
PRESUMED_DEAD_S = 120.0
PRESUMED_DEAD_INTERVALS = 60

STATE_TEXT = {
    WAITING: "waiting for CUDA: the rank has not allocated GPU memory yet",
    REPORTING: "reporting",
    SILENT: "silent: no report for a while (stuck, or its reporter thread stopped)",
    DIED: "died: the process is gone and never said it finished",
    FINISHED: "finished",
    FAILED: "failed: it ended with an exception (see the rank's output)",
    OOM: "ran out of memory",
}

#: Figures a rank reports per device (bytes or counts), all from ``memory_stats()``.
DEVICE_FIELDS = ("reserved", "allocated", "active", "requested", "reserved_peak", "allocated_peak",
                 "num_alloc_retries", "num_ooms")


@dataclass(frozen=True)
class RankDevice:
    """One device's allocator figures in one rank (``None``: not reported)."""

    device: int
    reserved: int | None = None
    allocated: int | None = None
    active: int | None = None
    requested: int | None = None
    reserved_peak: int | None = None
    allocated_peak: int | None = None
    num_alloc_retries: int | None = None
    num_ooms: int | None = None

    def series_values(self) -> dict[str, float | None]:
        """The values the monitor's timeline plots."""
        def f(v: int | None) -> float | None:
            return None if v is None else float(v)

        share = None
        if self.reserved and self.allocated is not None:
            share = (self.reserved - self.allocated) / self.reserved
        return {"reserved": f(self.reserved), "allocated": f(self.allocated), "active": f(self.active),
                "requested": f(self.requested), "cached_share": share}


@dataclass(frozen=True)
class RankOom:
    """An out-of-memory error in a rank, as the OOM observer saw it."""

    device: int
    alloc_bytes: int  # the segment that could not be obtained
    limit_bytes: int | None  # device total, or the allowed maximum under a fraction
    free_bytes: int | None
    wall: float
    figures: RankDevice | None = None  # the allocator's figures right at the OOM


@dataclass(frozen=True)
class RankRecord:
    """The latest report of one rank."""

    rank: int
    pid: int
    host: str
    seq: int
    wall: float  # time.time() of the report
    interval: float  # seconds between reports
    status: str  # "waiting", "sampling", "finished" or "failed"
    devices: tuple[RankDevice, ...] = ()
    world_size: int | None = None
    settings_variable: str | None = None  # the allocator variable the rank's environment holds
    settings_text: str | None = None  # its value
    effective: Mapping[str, Any] | None = None  # what the rank's torch reads back, once live
    oom: RankOom | None = None
    note: str | None = None  # why figures are missing (e.g. cudaMallocAsync)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """The record as the reporter writes it."""
        doc: dict[str, Any] = {
            "v": RECORD_VERSION, "rank": self.rank, "pid": self.pid, "host": self.host,
            "seq": self.seq, "wall": self.wall, "interval": self.interval, "status": self.status,
            "world_size": self.world_size,
            "devices": [_device_doc(d) for d in self.devices],
            "settings_variable": self.settings_variable, "settings_text": self.settings_text,
            "effective": dict(self.effective) if self.effective is not None else None,
            "oom": None, "note": self.note,
        }
        if self.oom is not None:
            doc["oom"] = {"device": self.oom.device, "alloc_bytes": self.oom.alloc_bytes,
                          "limit_bytes": self.oom.limit_bytes, "free_bytes": self.oom.free_bytes,
                          "wall": self.oom.wall,
                          "figures": _device_doc(self.oom.figures) if self.oom.figures else None}
        return json.dumps(doc, separators=(",", ":"), default=str)


def _device_doc(d: RankDevice) -> dict[str, Any]:
    return {"device": d.device, **{name: getattr(d, name) for name in DEVICE_FIELDS}}


# ---------------------------------------------------------------- reading (untrusted)

def parse_rank_record(data: bytes | str, where: str = "rank record") -> RankRecord:
    """Parse one record written by a rank; bounded, every field checked.

    Raises:
        SnapshotError: not a record this version writes, with the field that is wrong.
    """
    if len(data) > MAX_RECORD_BYTES:
        raise SnapshotError(f"{where}: {len(data):,} bytes, more than a rank record can hold "
                            f"({MAX_RECORD_BYTES:,})")
    try:
        doc = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise SnapshotError(f"{where}: not JSON ({printable(str(exc), 200)})") from None
    if not isinstance(doc, dict):
        raise SnapshotError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    if doc.get("v") != RECORD_VERSION:
        raise SnapshotError(f"{where}: record version {printable(repr(doc.get('v')), 40)} is not "
                            f"{RECORD_VERSION} (a rank running another allocconf_widget release?)")
    rank = _int(doc, "rank", where, low=0, high=1 << 20)
    devices_doc = doc.get("devices")
    if not isinstance(devices_doc, list) or len(devices_doc) > MAX_DEVICES:
        raise SnapshotError(f"{where}: 'devices' must be a list of at most {MAX_DEVICES} entries")
    devices = tuple(_device(d, f"{where}.devices[{i}]") for i, d in enumerate(devices_doc))
    status = doc.get("status")
    if status not in ("waiting", "sampling", "finished", "failed"):
        raise SnapshotError(f"{where}: 'status' must be waiting, sampling, finished or failed")
    effective = doc.get("effective")
    if effective is not None and not isinstance(effective, dict):
        raise SnapshotError(f"{where}: 'effective' must be an object or null")
    return RankRecord(
        rank=rank,
        pid=_int(doc, "pid", where, low=1, high=1 << 31),
        host=_text(doc.get("host"), "") or "",
        seq=_int(doc, "seq", where, low=0, high=1 << 62),
        wall=_wall(doc, where),
        interval=min(max(_float(doc, "interval", where), 0.01), 3600.0),
        status=str(status),
        devices=devices,
        world_size=int_or_none(doc.get("world_size")),
        settings_variable=_text(doc.get("settings_variable"), None),
        settings_text=_text(doc.get("settings_text"), None),
        effective={one_line(str(k), 100): v for k, v in list(effective.items())[:64]} if effective else None,
        oom=_oom(doc.get("oom"), f"{where}.oom"),
        note=_text(doc.get("note"), None),
    )


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number a rank writes")


def _int(doc: Mapping[str, Any], key: str, where: str, *, low: int, high: int) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SnapshotError(f"{where}: '{key}' must be an integer from {low} to {high}")
    return value


def _float(doc: Mapping[str, Any], key: str, where: str) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SnapshotError(f"{where}: '{key}' must be a finite number")
    return float(value)


def _wall(doc: Mapping[str, Any], where: str) -> float:
    value = _float(doc, "wall", where)
    if not MIN_WALL <= value <= MAX_WALL:
        raise SnapshotError(f"{where}: 'wall' {value!r} is not a time.time() (seconds since "
                            f"1970, {MIN_WALL:g} to {MAX_WALL:g})")
    return value


def _text(value: object, default: str | None) -> str | None:
    return one_line(value, MAX_TEXT) if isinstance(value, str) else default


def _figure(value: object) -> int | None:
    number = int_or_none(value)
    return number if number is not None and 0 <= number < (1 << 62) else None


def _device(doc: object, where: str) -> RankDevice:
    if not isinstance(doc, dict):
        raise SnapshotError(f"{where}: expected an object")
    return RankDevice(_int(doc, "device", where, low=0, high=1 << 16),
                      **{name: _figure(doc.get(name)) for name in DEVICE_FIELDS})


def _oom(doc: object, where: str) -> RankOom | None:
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise SnapshotError(f"{where}: expected an object or null")
    figures = doc.get("figures")
    return RankOom(device=_int(doc, "device", where, low=0, high=1 << 16),
                   alloc_bytes=_int(doc, "alloc_bytes", where, low=0, high=1 << 62),
                   limit_bytes=_figure(doc.get("limit_bytes")), free_bytes=_figure(doc.get("free_bytes")),
                   wall=_wall(doc, where),
                   figures=_device(figures, f"{where}.figures") if figures is not None else None)


# ---------------------------------------------------------------- what the notebook shows

def rank_state(record: RankRecord, *, now: float, alive: bool | None,
               seen_at: float | None = None) -> str:
    """The state a rank is in: from its record, the clock and whether its process lives.

    ``alive`` is None when that cannot be told (a rank on another host). ``seen_at`` is
    when this kernel first saw the record's current ``seq`` (its own clock): a record
    dated in the future (another clock, or a lie) still goes silent when it stops
    changing, and a rank that cannot be checked for liveness is presumed dead after
    :data:`PRESUMED_DEAD_S` (and :data:`PRESUMED_DEAD_INTERVALS` intervals) of silence.
    """
    if record.oom is not None:
        return OOM
    if record.status == "finished":
        return FINISHED
    if record.status == "failed":
        return FAILED
    if alive is False:
        return DIED
    age = record_age(record, now=now, seen_at=seen_at)
    if alive is None and age > max(PRESUMED_DEAD_S, PRESUMED_DEAD_INTERVALS * record.interval):
        return DIED
    if age > max(5 * record.interval, 3.0):
        return SILENT
    return WAITING if record.status == "waiting" else REPORTING


def record_age(record: RankRecord, *, now: float, seen_at: float | None = None) -> float:
    """Seconds since the rank last reported: by its clock, or by ours when its record stopped
    changing while dated ahead of us (never negative)."""
    age = now - record.wall
    if seen_at is not None:
        age = max(age, now - seen_at)
    return max(age, 0.0)
