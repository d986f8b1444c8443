"""A ``%%allocconf record`` replays exactly its cell, whatever history came before (issue 22, item 2).

With the flight recorder on, torch's one ring buffer holds every event since CUDA started,
and a live monitor leaves ``snapshot`` entries of its own in it; the recorder's start
snapshot can be thousands of entries in, behind the monitor's. The snapshots here are built
like the recorder's (``tests/snapshot_builders.py``): the cell's trace, the segments at its
start, the start time; each is replayed once alone and once behind such history, and the
two replays must be the same.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.simulator import simulate
from allocconf_widget.core.sim.state import INITIAL_SEGMENTS_KEY
from allocconf_widget.core.sim.trace.extract import extract_trace
from allocconf_widget.core.versions import parse_version
from tests.snapshot_builders import block, segment, snapshot

MiB = 1 << 20
T0 = 1_796_213_266_000_000  # epoch µs, as torch stamps entries
BIG = 0x7F10_0000_0000
SMALL = 0x7F20_0000_0000
NEW = 0x7F30_0000_0000
S = SimSettings(torch_version=parse_version("2.11"))
CELL_START_KEY = "allocconf_cell_start"  # core/sim/trace.CELL_START_KEY, as the recorder writes it


class Clock:
    def __init__(self, start: int) -> None:
        self.t = start

    def __call__(self) -> int:
        self.t += 7
        return self.t


def _e(clock: Clock, action: str, addr: int = 0, size: int = 0) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": clock(),
            "compile_context": "N/A", "user_metadata": ""}


def _history(clock: Clock, pairs: int, *, monitor: bool) -> list[dict[str, Any]]:
    """Earlier cells under the flight recorder: a big segment keeps an 8 MiB tensor, a small
    segment churns, the monitor snapshots every so often. Ends with A held, the rest cached."""
    out = [_e(clock, "segment_alloc", BIG, 20 * MiB), _e(clock, "alloc", BIG, 8 * MiB),
           _e(clock, "alloc", BIG + 8 * MiB, 4 * MiB),
           _e(clock, "free_requested", BIG + 8 * MiB, 4 * MiB),
           _e(clock, "free_completed", BIG + 8 * MiB, 4 * MiB),
           _e(clock, "segment_alloc", SMALL, 2 * MiB)]
    for i in range(pairs):
        if monitor and i % 50 == 0:
            out.append(_e(clock, "snapshot", 0, 8 * MiB + (512 if i % 100 else 0)))
        out += [_e(clock, "alloc", SMALL, 512), _e(clock, "free_requested", SMALL, 512),
                _e(clock, "free_completed", SMALL, 512)]
    if monitor:
        out.append(_e(clock, "snapshot", 0, 8 * MiB))  # the monitor, moments before the cell
    return out


def _cell(clock: Clock) -> list[dict[str, Any]]:
    """The recorder's start snapshot, then the cell: 10 MiB fits the cached room, 30 MiB needs
    a new segment, a monitor snapshot in the middle, everything the cell made is freed."""
    return [_e(clock, "snapshot", 0, 8 * MiB),
            _e(clock, "alloc", BIG + 8 * MiB, 10 * MiB),
            _e(clock, "segment_alloc", NEW, 30 * MiB), _e(clock, "alloc", NEW, 30 * MiB),
            _e(clock, "snapshot", 0, 48 * MiB),
            _e(clock, "free_requested", NEW, 30 * MiB), _e(clock, "free_completed", NEW, 30 * MiB),
            _e(clock, "alloc", SMALL, 1024), _e(clock, "free_requested", SMALL, 1024),
            _e(clock, "free_completed", SMALL, 1024),
            _e(clock, "free_requested", BIG + 8 * MiB, 10 * MiB),
            _e(clock, "free_completed", BIG + 8 * MiB, 10 * MiB)]


def _start_segments() -> list[dict[str, Any]]:
    return [segment(block(8 * MiB), block(12 * MiB, "inactive"), address=BIG),
            segment(block(2 * MiB, "inactive"), address=SMALL, kind="small")]


def _recording(history_pairs: int | None, *, monitor: bool = True) -> dict[str, Any]:
    """A recorder-style snapshot: ``None`` = the buffer held only the cell (no flight recorder)."""
    clock = Clock(T0)
    before = _history(clock, history_pairs, monitor=monitor) if history_pairs is not None else []
    started = clock.t + 3
    cell = _cell(clock)
    ended = cell[0]["time_us"] + 2  # the recorder's call returned just after its snapshot entry
    final = [segment(block(20 * MiB - 8 * MiB, "inactive"), address=BIG)]  # not used for a start
    snap = snapshot(*final, traces=[before + cell], settings={"PYTORCH_CUDA_ALLOC_CONF": ""})
    snap[INITIAL_SEGMENTS_KEY] = _start_segments()
    snap[CELL_START_KEY] = {"started_us": started, "ended_us": ended, "token": None}
    return snap


def _replay(snap: dict[str, Any]) -> tuple[int, int, int, int]:
    trace = extract_trace(snap)
    result = simulate(trace, S, device_total=80 << 30)
    return trace.num_ops, result.peak_reserved_bytes, result.num_device_alloc, trace.unknown_frees


@pytest.mark.parametrize("pairs", [20, 300, 3000], ids=["short", "past-256", "long"])
@pytest.mark.parametrize("monitor", [True, False], ids=["monitor", "no-monitor"])
def test_a_cell_replays_the_same_behind_any_history(pairs: int, monitor: bool) -> None:
    alone = _replay(_recording(None))
    assert alone[0] == 6 and alone[2] == 1 and alone[3] == 0  # 3 allocs, 3 frees, 1 new segment
    assert _replay(_recording(pairs, monitor=monitor)) == alone


def test_an_empty_allocator_at_the_cell_start_ignores_earlier_cells() -> None:
    """CUDA up but nothing held (earlier cells freed everything): the start state is empty, and
    the history must still not be replayed."""
    clock = Clock(T0)
    before = [_e(clock, "segment_alloc", BIG, 64 * MiB), _e(clock, "alloc", BIG, 64 * MiB),
              _e(clock, "free_requested", BIG, 64 * MiB), _e(clock, "free_completed", BIG, 64 * MiB),
              _e(clock, "segment_free", BIG, 64 * MiB)]
    started = clock.t + 1
    cell = [_e(clock, "snapshot", 0, 0), _e(clock, "segment_alloc", NEW, 2 * MiB),
            _e(clock, "alloc", NEW, 2 * MiB), _e(clock, "free_requested", NEW, 2 * MiB),
            _e(clock, "free_completed", NEW, 2 * MiB)]
    snap = snapshot(traces=[before + cell])
    snap[INITIAL_SEGMENTS_KEY] = []
    snap[CELL_START_KEY] = {"started_us": started, "ended_us": cell[0]["time_us"] + 1}
    trace = extract_trace(snap)
    assert trace.num_ops == 2
    assert simulate(trace, S).peak_reserved_bytes == 20 * MiB  # one large segment, not the 64 MiB


def test_the_key_is_the_recorders() -> None:
    from allocconf_widget.core.sim.trace import cells as trace

    assert trace.CELL_START_KEY == CELL_START_KEY


def test_the_recorder_keeps_only_the_cells_entries() -> None:
    """What the magic prints ("Recorded N allocator events") counts the cell, not the buffer."""
    snap = _recording(3000)
    from allocconf_widget.core.sim.trace.cells import CellStart, cell_traces

    mark = snap[CELL_START_KEY]
    trimmed = cell_traces(snap["device_traces"], snap[INITIAL_SEGMENTS_KEY],
                          CellStart(mark["started_us"], mark["ended_us"]))
    assert len(trimmed[0]) == len(_cell(Clock(T0)))
    assert trimmed[0][0]["action"] == "snapshot" and trimmed[0][0]["size"] == 8 * MiB
    cut = copy.deepcopy(snap)
    cut["device_traces"] = trimmed
    assert _replay(cut) == _replay(_recording(None))


def test_the_token_torch_stamps_on_the_start_snapshot_wins_over_the_clock() -> None:
    """torch 2.11+ stamps ``user_metadata`` on entries: the recorder's token marks its snapshot
    even when the clock says nothing useful (a skewed or missing start time)."""
    snap = _recording(300)
    entries = snap["device_traces"][0]
    start = len(entries) - len(_cell(Clock(T0)))  # the recorder's own snapshot entry
    assert entries[start]["action"] == "snapshot"
    entries[start]["user_metadata"] = "allocconf-cell-0123456789abcdef"
    snap[CELL_START_KEY] = {"started_us": 0, "ended_us": 0, "token": "allocconf-cell-0123456789abcdef"}
    assert _replay(snap) == _replay(_recording(None))


def test_a_recording_without_the_start_time_still_finds_its_snapshot_past_256_entries() -> None:
    """Saved by an older release: no start time; the matching snapshot entry is searched for."""
    snap = _recording(300, monitor=False)
    del snap[CELL_START_KEY]
    assert _replay(snap) == _replay(_recording(None))
