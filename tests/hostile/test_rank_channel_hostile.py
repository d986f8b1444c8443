"""The rank channel under attack: shared folders, planted links, FIFOs, floods and lying records.

Issue 22 items 1, 7, 15 and 17. Real files, real FIFOs, real child processes started the
way ``torch.multiprocessing.spawn`` starts them.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from allocconf_widget.adapters import rank_channel
from allocconf_widget.app.ranks import RankBoard
from allocconf_widget.core.memory.ranks import (
    DIED,
    REPORTING,
    SILENT,
    RankDevice,
    RankRecord,
    parse_rank_record,
    rank_state,
)

GiB = 1 << 30
pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX only (FIFOs, modes)")


def _record(rank: int = 0, *, pid: int | None = None, wall: float | None = None,
            host: str | None = None, seq: int = 1) -> RankRecord:
    return RankRecord(rank=rank, pid=pid or os.getpid(), host=host or os.uname().nodename, seq=seq,
                      wall=time.time() if wall is None else wall, interval=0.5, status="sampling",
                      devices=(RankDevice(0, GiB, GiB // 2),))


def _finishes(fn: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Run ``fn`` on a thread; fail (instead of hanging the suite) if it blocks."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # reported below
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"blocked for more than {timeout} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _unblock(fifo: Path) -> None:
    """Let a reader stuck in open() on the old code go (so the test process can end)."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.fixture
def board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv(rank_channel.CHANNEL_VARIABLE, raising=False)
    b = RankBoard()
    b.open(tmp_path / "runtime")
    yield b
    b.close()


# ---------------------------------------------------------------- 1: ownership, mode, links

@pytest.mark.parametrize("mode", [0o777, 0o755, 0o701])
def test_the_reporter_refuses_a_folder_others_can_reach(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        mode: int) -> None:
    shared = tmp_path / "team"
    shared.mkdir()
    shared.chmod(mode)
    monkeypatch.setenv(rank_channel.CHANNEL_VARIABLE, str(shared))
    monkeypatch.setattr(rank_channel, "_reporter", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reporter = rank_channel.start_reporter(rank=0, interval=0.1)
    try:
        assert reporter is None
        assert list(shared.iterdir()) == []
        assert any(f"{mode:04o}" in str(w.message) and "0700" in str(w.message) for w in caught)
    finally:
        if reporter is not None:
            reporter.close()
        monkeypatch.setattr(rank_channel, "_reporter", None)


def test_the_reporter_refuses_a_link_to_a_private_folder(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "private"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv(rank_channel.CHANNEL_VARIABLE, str(link))
    monkeypatch.setattr(rank_channel, "_reporter", None)
    with pytest.warns(UserWarning, match="symbolic link"):
        assert rank_channel.start_reporter(rank=0) is None
    monkeypatch.setattr(rank_channel, "_reporter", None)


def test_a_planted_link_never_makes_the_reporter_overwrite_its_target(board: RankBoard,
                                                                       tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    reporter = rank_channel.RankReporter(board.channel, rank=0, interval=0.1)  # type: ignore[arg-type]
    # every name the reporter writes or has ever written, linked to the victim
    for name in (f".{reporter.path.name}.tmp", reporter.path.name):
        (reporter.path.parent / name).symlink_to(victim)
    reporter._write()
    assert reporter.write_errors == 0
    assert victim.read_text() == "precious"
    assert not reporter.path.is_symlink()
    assert parse_rank_record(reporter.path.read_bytes()).rank == 0


def test_the_notebook_does_not_read_records_through_a_link(board: RankBoard, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(_record(rank=7).to_json())
    (board.channel / "rank-7-1.json").symlink_to(elsewhere)
    report = board.poll()
    assert report.ranks == ()
    assert any("rank-7-1.json" in p and "symbolic link" in p for p in report.problems)


# ---------------------------------------------------------------- 7: a FIFO named like a record

def test_a_fifo_in_the_channel_neither_blocks_status_nor_close(board: RankBoard) -> None:
    assert board.channel is not None
    (board.channel / "rank-0-1.json").write_text(_record(rank=0).to_json())
    fifo = board.channel / "rank-3-1.json"
    os.mkfifo(fifo)
    try:
        report = _finishes(board.poll)
        assert [v.rank for v in report.ranks] == [0]
        assert any("rank-3-1.json" in p and "FIFO" in p for p in report.problems)
        _finishes(board.close)  # under a running watch, close takes the board's lock too
        assert not fifo.exists()
    finally:
        _unblock(fifo)


# ---------------------------------------------------------------- 15: close removes everything

def test_close_removes_every_record_and_a_killed_ranks_temporary_file(board: RankBoard) -> None:
    folder = board.channel
    assert folder is not None
    for rank in range(300):
        (folder / f"rank-{rank}-1.json").write_text("{}")
    (folder / ".rank-5-99.json.tmp").write_text('{"v": 1, "ra')  # killed mid-write
    (folder / ".rank-6-98.json.0a1b2c.tmp").write_text("")
    board.close()
    assert not folder.exists()


# ---------------------------------------------------------------- 17: lies and unhandled errors

def _raise_in_rank(rank: int) -> None:
    import allocconf_widget

    reporter = allocconf_widget.rank_reporter(rank=rank, interval=0.1)
    assert reporter is not None
    raise RuntimeError("boom in the training loop")


def _raise_in_rank_via_torch_wrap(rank: int) -> None:
    # what torch.multiprocessing.spawn's wrapper does with the function's exception
    import sys

    try:
        _raise_in_rank(rank)
    except Exception:
        sys.exit(1)


@pytest.mark.parametrize("target", [_raise_in_rank, _raise_in_rank_via_torch_wrap],
                         ids=["multiprocessing", "torch-spawn-wrapper"])
def test_a_rank_that_dies_of_an_exception_is_failed_not_finished(board: RankBoard, target: Any) -> None:
    proc = mp.get_context("spawn").Process(target=target, args=(4,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 1
    view = next(v for v in board.poll().ranks if v.rank == 4)
    assert view.state == "failed", view
    assert "exception" in view.state_text


def test_a_with_block_that_raises_marks_the_rank_failed(board: RankBoard) -> None:
    reporter = rank_channel.RankReporter(board.channel, rank=2, interval=0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError), reporter:
        raise ValueError("x")
    view = next(v for v in board.poll().ranks if v.rank == 2)
    assert view.state == "failed"


@pytest.mark.parametrize("wall", [1e308, -1e308, -1.0, 1e11])
def test_an_absurd_wall_clock_is_refused_at_the_door(board: RankBoard, wall: float) -> None:
    assert board.channel is not None
    (board.channel / "rank-0-1.json").write_text(_record(rank=0, wall=time.time()).to_json())
    (board.channel / "rank-1-1.json").write_text(_record(rank=1, wall=wall).to_json())
    report = board.poll()
    assert [v.rank for v in report.ranks] == [0]
    assert any("rank-1-1.json" in p and "'wall'" in p for p in report.problems)
    for timeline in board.timelines.values():
        for device in timeline.devices:
            payload = timeline.render(device, max_points=300)
            assert "nan" not in repr(payload).lower() and "inf" not in repr(payload).lower()


def test_a_record_dated_in_the_future_still_goes_silent() -> None:
    now = 1_800_000_000.0
    record = _record(wall=now + 3600)
    assert rank_state(record, now=now, alive=True, seen_at=now) == REPORTING
    assert rank_state(record, now=now + 30, alive=True, seen_at=now) == SILENT


def test_a_board_sees_a_future_dated_rank_stop(board: RankBoard) -> None:
    assert board.channel is not None
    clock = [time.time()]
    board.clock = lambda: clock[0]
    (board.channel / "rank-0-1.json").write_text(_record(wall=clock[0] + 86_400).to_json())
    assert board.poll().ranks[0].state == REPORTING
    clock[0] += 60
    assert board.poll().ranks[0].state == SILENT


def test_a_rank_claiming_another_host_is_presumed_dead_after_a_long_silence() -> None:
    now = 1_800_000_000.0
    record = _record(host="elsewhere.example", wall=now - 10)
    assert rank_state(record, now=now, alive=None) == SILENT
    assert rank_state(record, now=now + 600, alive=None) == DIED
