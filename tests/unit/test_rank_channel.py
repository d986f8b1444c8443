"""Ranks launched from the notebook report through the channel: real child processes, real files.

The children are real processes started the way ``torch.multiprocessing.spawn`` starts them
(the ``spawn`` start method, inheriting the environment). Without a GPU they cannot have CUDA
figures, so here they report "waiting" and their lifecycle (finished, died, silent) and OOM
path are what is checked; tests/gpu/test_ranks_gpu.py checks the figures on a real GPU.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest

from allocconf_widget.adapters import rank_channel
from allocconf_widget.app.ranks import RankBoard

GiB = 1 << 30


def _rank_main(rank: int, mode: str, ready: Path) -> None:
    import allocconf_widget

    reporter = allocconf_widget.rank_reporter(rank=rank, interval=0.1)
    assert reporter is not None
    if mode == "oom":
        # torch's OOM observer cannot fire without CUDA: call the observer as torch would
        reporter._on_oom(0, 20 * GiB, 16 * GiB, GiB)
    ready.write_text("ready")
    if mode in ("finish", "oom"):
        time.sleep(0.3)
        return
    time.sleep(60)  # "hang" and "kill" modes: the test ends this process


def _wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out")


@pytest.fixture
def board(tmp_path, monkeypatch):
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(rank_channel.CHANNEL_VARIABLE, raising=False)
    b = RankBoard()
    b.open(tmp_path / "runtime")
    yield b
    b.close()


def _launch(rank: int, mode: str, tmp_path: Path):
    ready = tmp_path / f"ready-{rank}"
    proc = mp.get_context("spawn").Process(target=_rank_main, args=(rank, mode, ready))
    proc.start()
    _wait_for(ready.exists)
    return proc


def _state(board, rank):
    report = board.poll()
    return next((v for v in report.ranks if v.rank == rank), None)


def test_channel_is_private_and_exported_only_to_processes_launched_after(board):
    assert board.channel is not None and board.channel.is_dir()
    assert os.environ[rank_channel.CHANNEL_VARIABLE] == str(board.channel)
    assert (board.channel.stat().st_mode & 0o777) == 0o700


def test_a_rank_is_on_the_board_as_soon_as_its_reporter_started(board):
    """The first record is written before ``rank_reporter`` returns, not by its thread a moment
    later: the notebook sees every rank it launched (CI once saw two of three, the third's
    thread not yet run on a busy machine)."""
    reporter = rank_channel.start_reporter(rank=7, interval=60.0)
    try:
        assert reporter is not None and _state(board, 7) is not None
    finally:
        assert reporter is not None
        reporter.close()


def test_ranks_report_finish_and_die_and_the_notebook_tells_them_apart(board, tmp_path):
    finishing = _launch(0, "finish", tmp_path)
    killed = _launch(1, "kill", tmp_path)
    hanging = _launch(2, "hang", tmp_path)
    try:
        first = board.poll()
        assert {v.rank for v in first.ranks} == {0, 1, 2}
        assert all(v.state in ("waiting", "finished") for v in first.ranks), first
        finishing.join(10)
        assert _wait_for(lambda: (_state(board, 0) or None) and _state(board, 0).state == "finished")
        killed.kill()
        killed.join(10)
        assert _wait_for(lambda: _state(board, 1).state == "died")
        os.kill(hanging.pid, signal.SIGSTOP)  # alive, but its reporter thread cannot run
        assert _wait_for(lambda: _state(board, 2).state == "silent", timeout=15)
        from allocconf_widget.views.text.ranks import render_ranks

        text = render_ranks(board.poll())
        assert "rank 1: died" in text and "rank 2: silent" in text
    finally:
        for proc in (finishing, killed, hanging):
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.join(5)


def test_a_rank_oom_reaches_the_notebook_with_its_numbers(board, tmp_path):
    proc = _launch(3, "oom", tmp_path)
    proc.join(10)
    view = _wait_for(lambda: _state(board, 3))
    assert view.state == "oom"
    assert view.oom_text is not None
    assert "rank 3 ran out of memory on GPU 0" in view.oom_text
    assert "20.00 GiB" in view.oom_text and "16.00 GiB allowed" in view.oom_text


def test_settings_applied_in_the_kernel_reach_ranks_launched_afterwards(board, tmp_path, monkeypatch):
    before = _launch(4, "hang", tmp_path)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")  # what Apply writes
    after = _launch(5, "hang", tmp_path)
    try:
        report = board.poll()
        views = {v.rank: v for v in report.ranks}
        assert views[5].settings_text == "expandable_segments:True" and views[5].settings_match is True
        assert views[4].settings_text is None and views[4].settings_match is False
        from allocconf_widget.views.text.ranks import render_ranks

        assert "≠ kernel" in render_ranks(report)
    finally:
        for proc in (before, after):
            proc.kill()
            proc.join(5)


def test_garbage_in_the_channel_is_reported_and_skipped(board):
    assert board.channel is not None
    (board.channel / "rank-9-1.json").write_text('{"v": 1, "rank": "nine"}')
    (board.channel / "rank-8-1.json").write_bytes(b"\x00" * 100)
    (board.channel / "notes.txt").write_text("ignored")
    report = board.poll()
    assert report.ranks == ()
    assert len(report.problems) == 2 and any("rank-9-1.json" in p for p in report.problems)


def test_without_a_channel_rank_reporter_does_nothing(monkeypatch):
    import allocconf_widget

    monkeypatch.delenv(rank_channel.CHANNEL_VARIABLE, raising=False)
    assert allocconf_widget.rank_reporter() is None
