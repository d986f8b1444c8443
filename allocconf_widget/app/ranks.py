"""The ranks use case: follow the processes this notebook launched, one series per rank and device.

:class:`RankBoard` owns the notebook's rank channel. Each :meth:`RankBoard.poll`
reads every rank's latest record (bounded, untrusted), feeds new reports into one
bounded timeline per rank (keyed by device), and returns a :class:`RanksReport`:
per rank its state (reporting, waiting, silent, died, finished, out of memory),
the latest figures and peaks per device, the allocator settings it runs with as
its own torch reads them back, and whether those match what this kernel applied.
The magic and the widget only render that report.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from allocconf_widget.adapters import rank_channel
from allocconf_widget.core.memory.ranks import (
    STATE_TEXT,
    RankDevice,
    RankRecord,
    rank_state,
    record_age,
)
from allocconf_widget.core.memory.timeline import Timeline
from allocconf_widget.core.units import format_bytes

RANK_SERIES = ("reserved", "allocated", "active", "requested", "cached_share")


@dataclass(frozen=True)
class RankView:
    """One rank as every front end shows it."""

    rank: int
    pid: int
    host: str
    state: str
    state_text: str
    devices: tuple[RankDevice, ...]
    settings_text: str | None
    settings_variable: str | None
    effective: dict[str, object] | None
    settings_match: bool | None  # None: nothing to compare (the kernel applied nothing, or not live)
    oom_text: str | None
    note: str | None
    seconds_since_report: float

    @property
    def key(self) -> tuple[int, int]:
        return (self.rank, self.pid)


@dataclass(frozen=True)
class RanksReport:
    """Every rank this notebook's channel has heard from, and what could not be read."""

    channel: Path | None
    ranks: tuple[RankView, ...]
    problems: tuple[str, ...] = ()
    kernel_settings: str | None = None

    def summary(self) -> str:
        if self.channel is None:
            return "rank channel closed: %allocconf ranks open, then launch the ranks"
        if not self.ranks:
            return ("no rank has reported yet: call allocconf_widget.rank_reporter() at the start of "
                    "each rank's function (ranks launched after the channel opened find it)")
        states: dict[str, int] = {}
        for view in self.ranks:
            states[view.state] = states.get(view.state, 0) + 1
        return f"{len(self.ranks)} rank(s): " + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))


def _oom_text(record: RankRecord) -> str | None:
    oom = record.oom
    if oom is None:
        return None
    parts = [f"rank {record.rank} ran out of memory on GPU {oom.device}: tried to get "
             f"{format_bytes(oom.alloc_bytes)}"]
    if oom.limit_bytes is not None:
        parts.append(f"of {format_bytes(oom.limit_bytes)} allowed")
    if oom.free_bytes is not None:
        parts.append(f"({format_bytes(oom.free_bytes)} free on the device)")
    f = oom.figures
    if f is not None and f.reserved is not None and f.allocated is not None:
        parts.append(f"— PyTorch had {format_bytes(f.reserved)} reserved, {format_bytes(f.allocated)} "
                     f"allocated, {format_bytes(f.reserved - f.allocated)} cached but unallocated")
    return " ".join(parts)


def _settings_match(record: RankRecord, kernel_text: str | None) -> bool | None:
    if kernel_text is None:
        return None
    return (record.settings_text or "") == kernel_text


class RankBoard:
    """This notebook's rank channel and the timelines of what its ranks reported."""

    def __init__(self, *, max_points: int = 1024, clock: Callable[[], float] = time.time) -> None:
        self.channel: Path | None = None
        self.clock = clock
        self.max_points = max_points
        self.timelines: dict[tuple[int, int], Timeline] = {}
        self._seen: dict[tuple[int, int], int] = {}
        self._seen_at: dict[tuple[int, int], float] = {}  # our clock when its seq last changed
        self._oom_marked: set[tuple[int, int]] = set()
        self._t0: float | None = None
        self._lock = threading.RLock()

    def open(self, base: Path | None = None) -> Path:
        """Open (or reuse) the channel; ranks launched from now on inherit it."""
        with self._lock:
            if self.channel is None or not self.channel.is_dir():
                self.channel = rank_channel.open_channel(base)
            return self.channel

    def close(self) -> None:
        with self._lock:
            if self.channel is not None:
                rank_channel.close_channel(self.channel)
            self.channel = None

    def poll(self, kernel_settings: str | None = None) -> RanksReport:
        """Read the channel once, extend the timelines, and describe every rank.

        ``kernel_settings`` (default: the allocator variable in this kernel's environment,
        which ranks launched from now on inherit) is what each rank's settings are compared with.
        """
        if kernel_settings is None:
            kernel_settings = inherited_settings()
        with self._lock:
            channel = self.channel
            if channel is None:
                return RanksReport(None, ())
            read = rank_channel.read_channel(channel)
            now = self.clock()
            views = []
            for record in sorted(read.records, key=lambda r: (r.rank, r.pid)):
                key = (record.rank, record.pid)
                if self._seen.get(key, -1) < record.seq:
                    self._seen_at[key] = now
                self._extend(key, record)
                alive = rank_channel.process_alive(record.pid, record.host)
                seen_at = self._seen_at.get(key)
                state = rank_state(record, now=now, alive=alive, seen_at=seen_at)
                views.append(RankView(
                    rank=record.rank, pid=record.pid, host=record.host, state=state,
                    state_text=STATE_TEXT[state], devices=record.devices,
                    settings_text=record.settings_text, settings_variable=record.settings_variable,
                    effective=dict(record.effective) if record.effective is not None else None,
                    settings_match=_settings_match(record, kernel_settings),
                    oom_text=_oom_text(record), note=record.note,
                    seconds_since_report=record_age(record, now=now, seen_at=seen_at)))
            return RanksReport(channel, tuple(views), read.problems, kernel_settings)

    def _extend(self, key: tuple[int, int], record: RankRecord) -> None:
        if self._seen.get(key, 0) >= record.seq:
            return
        self._seen[key] = record.seq
        if self._t0 is None:
            self._t0 = record.wall
        timeline = self.timelines.get(key)
        if timeline is None:
            timeline = self.timelines[key] = Timeline(RANK_SERIES, max_points=self.max_points)
        x = record.wall - self._t0
        for device in record.devices:
            timeline.add(x, device.series_values(), device=device.device)
        if record.oom is not None and key not in self._oom_marked:
            self._oom_marked.add(key)
            timeline.mark("oom", f"rank {record.rank} OOM", x=record.oom.wall - self._t0,
                          device=record.oom.device)


def inherited_settings() -> str:
    """The allocator settings a process launched now inherits: the first variable set, or ""."""
    import os

    from allocconf_widget.core.config.envvars import ALL_VARS

    return next((os.environ[v] for v in ALL_VARS if v in os.environ), "")


_board: RankBoard | None = None
_board_lock = threading.Lock()


def rank_board() -> RankBoard:
    """The kernel's one rank board."""
    global _board  # noqa: PLW0603  (one channel per kernel)
    with _board_lock:
        if _board is None:
            _board = RankBoard()
        return _board
