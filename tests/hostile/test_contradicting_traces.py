"""Traces whose entries contradict each other, and one rare real order, through the replay.

Found by an attack on the replay (round 10); each broke it before the fix:

* a second ``free_requested`` of a pending free, its ``free_completed`` right behind it: the
  block was freed twice (final allocated −8 MiB, fragmentation above 1), and a later
  ``empty_cache()`` put it into a free list twice (``KeyError`` inside the hot loop);
* malloc's sync completes a ``record_stream`` free, its segment is released and the driver
  hands the same address to the next segment: the decoder moves that completion after the
  next ``alloc`` (``decode._Decoder._hold_sync_completions``), which had the same address, so the
  replay freed the *new* block (peak 200 MiB of a real 300);
* two ``segment_alloc`` at one address: ``KeyError`` in the pool attribution;
* a 400-digit ``allocconf_cell_start`` time: ``OverflowError`` in the field check.

What a user notices: the CLI exits 0 with numbers that can be true (never negative, a
fragmentation within [0, 1]), and ``%allocconf simulate FILE`` shows no traceback.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.simulator import simulate
from allocconf_widget.core.sim.trace.decode import decode_entries

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
A = 0x7F00_0000_0000


def _e(action: str, addr: int = 0, size: int = 0) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0}


def _timed(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for i, entry in enumerate(entries):
        entry["time_us"] = i
    return entries


DOUBLE_REQUEST = _timed([_e("segment_alloc", A, 20 * MiB), _e("alloc", A, 8 * MiB),
                         _e("free_requested", A), _e("free_requested", A), _e("free_completed", A),
                         _e("segment_free", A, 20 * MiB), _e("alloc", A, 8 * MiB),
                         _e("alloc", A + 8 * MiB, 8 * MiB)])
SAME_ADDRESS_AGAIN = _timed([
    _e("segment_alloc", A, 100 * MiB), _e("alloc", A, 100 * MiB), _e("free_requested", A),
    _e("segment_alloc", A + (1 << 30), 100 * MiB), _e("alloc", A + (1 << 30), 100 * MiB),
    # the sync completes A, its segment goes, and the next segment gets A's address back
    _e("free_completed", A), _e("segment_free", A, 100 * MiB), _e("segment_alloc", A, 100 * MiB),
    _e("alloc", A, 100 * MiB),
    _e("segment_alloc", A + (2 << 30), 100 * MiB), _e("alloc", A + (2 << 30), 100 * MiB)])
SEGMENT_TWICE = _timed([_e("segment_alloc", A, 20 * MiB), _e("segment_alloc", A, 20 * MiB),
                        _e("segment_free", A, 20 * MiB), _e("alloc", A, 2 * MiB)])


def _replay(entries: list[dict[str, Any]]) -> Any:
    return simulate(decode_entries(entries), SimSettings.from_string("", "2.11"))


def test_a_second_request_of_a_pending_free_frees_it_once() -> None:
    short = _timed([_e("alloc", A, 8 * MiB), _e("free_requested", A), _e("free_requested", A),
                    _e("free_completed", A)])
    result = _replay(short)
    assert result.final_allocated_bytes == 0
    assert all(0.0 <= f <= 1.0 for f in result.to_json()["series"]["fragmentation"])
    result = _replay(DOUBLE_REQUEST)  # raised KeyError in the hot loop
    assert result.final_allocated_bytes == 16 * MiB


def test_a_completion_held_past_a_new_block_at_its_address_frees_the_old_block() -> None:
    trace = decode_entries(SAME_ADDRESS_AGAIN)
    result = simulate(trace, SimSettings.from_string("", "2.11"))
    assert trace.recorded_reserved_peak() == 300 * MiB
    assert result.peak_reserved_bytes == 300 * MiB and result.final_allocated_bytes == 300 * MiB
    assert result.peak_reserved_range == (300 * MiB, 300 * MiB)


def _snapshot_file(tmp_path: Path, entries: list[dict[str, Any]], **extra: Any) -> Path:
    path = tmp_path / "trace.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries], **extra}))
    return path


CASES = {
    "double-request": (DOUBLE_REQUEST, {}),
    "segment-twice": (SEGMENT_TWICE, {}),
    "huge-cell-start": ([_e("segment_alloc", A, 20 * MiB), _e("alloc", A, 2 * MiB)],
                        {"allocconf_cell_start": {"started_us": 10**400, "ended_us": 1}}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_cli_replays_it_with_numbers_that_can_be_true(case: str, tmp_path: Path) -> None:
    entries, extra = CASES[case]
    path = _snapshot_file(tmp_path, entries, **extra)
    proc = subprocess.run([sys.executable, "-m", "allocconf_widget", "simulate", str(path),
                           "--torch-version", "2.11", "--json"], capture_output=True, text=True,
                          timeout=120, check=False, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    for row in json.loads(proc.stdout):
        assert row["final_allocated_bytes"] >= 0 and row["peak_reserved_bytes"] >= 0
        assert 0.0 <= row["fragmentation_at_peak"] <= 1.0


def test_the_magic_replays_them_without_a_traceback(tmp_path: Path, ip) -> None:
    for case in sorted(CASES):
        entries, extra = CASES[case]
        (tmp_path / case).mkdir()
        path = _snapshot_file(tmp_path / case, entries, **extra)
        result = ip.run_cell(f"%allocconf simulate {path}")
        assert result.error_in_exec is None, (case, result.error_in_exec)


def test_a_free_after_a_failed_reallocation_leaves_the_pending_block_alone(tmp_path: Path) -> None:
    """An address allocated again while its free was pending, the new allocation failing in the
    replay (continue-after-oom): the later free was of that failed allocation, and it freed the
    pending block a second time (final allocated −3 MiB)."""
    s0, s1 = A, A + 20 * MiB
    entries = _timed([_e("segment_alloc", s0, 20 * MiB), _e("alloc", s0, 3 * MiB), _e("free_requested", s0),
                      _e("segment_alloc", s1, 20 * MiB), _e("alloc", s1 + 512, 3 * MiB),
                      _e("free_requested", s1 + 512), _e("alloc", s1 + 512, 512),
                      _e("free_completed", s1 + 512)])
    entries[6]["stream"] = 1
    path = _snapshot_file(tmp_path, entries)
    proc = subprocess.run([sys.executable, "-m", "allocconf_widget", "simulate", str(path), "--json",
                           "--workers", "1", "--device-total", "40MiB", "--continue-after-oom", "--no-rank"],
                          capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["final_allocated_bytes"] >= 0
