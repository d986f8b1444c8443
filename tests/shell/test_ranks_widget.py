"""What the ranks widget shows: a row per rank and GPU, a chart per rank and GPU, OOM lines.

Records are written into the channel exactly as a rank's reporter writes them (the same
``RankRecord.to_json``); tests/gpu/test_ranks_gpu.py has real ranks write them on a GPU.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("ipywidgets")

from allocconf_widget.app.ranks import RankBoard
from allocconf_widget.core.memory.ranks import RankDevice, RankOom, RankRecord
from allocconf_widget.views.widgets.ranks import RanksView

GiB = 1 << 30


def _write(board, rank, seq, reserved, *, oom=None, wall=None):
    import time

    rec = RankRecord(rank=rank, pid=os.getpid(), host=os.uname().nodename, seq=seq,
                     wall=wall if wall is not None else time.time(), interval=0.5, status="sampling",
                     devices=(RankDevice(rank, reserved, reserved // 2, reserved // 2, reserved // 2,
                                         reserved, reserved // 2, 0, 0),), oom=oom)
    (board.channel / f"rank-{rank}-{os.getpid()}.json").write_text(rec.to_json())


@pytest.fixture
def board(tmp_path, monkeypatch):
    monkeypatch.delenv("ALLOCCONF_RANK_DIR", raising=False)
    b = RankBoard()
    b.open(tmp_path)
    yield b
    b.close()


def test_the_widget_shows_each_rank_its_figures_and_a_chart_per_gpu(board):
    for seq, size in enumerate((GiB, 2 * GiB, 3 * GiB), 1):
        _write(board, 0, seq, size)
        _write(board, 1, seq, size * 2)
        board.poll()
    view = RanksView(board, interval=1.0)
    assert "2 rank(s)" in view.table.value and "rank 0: reporting" in view.table.value
    assert "3.00 GiB" in view.table.value and "6.00 GiB" in view.table.value
    assert view.charts.value.count("<svg") == 2
    assert "rank 0 · GPU 0" in view.charts.value and "rank 1 · GPU 1" in view.charts.value


def test_an_oom_shows_as_a_line_with_the_rank_and_numbers(board):
    import time

    _write(board, 0, 1, GiB, oom=RankOom(0, 4 * GiB, 8 * GiB, GiB // 2, time.time(),
                                        RankDevice(0, 7 * GiB, 6 * GiB)))
    view = RanksView(board)
    assert "OOM: rank 0 ran out of memory on GPU 0" in view.table.value
    assert "1.00 GiB cached but unallocated" in view.table.value
    timeline = board.timelines[(0, os.getpid())]
    assert [m.kind for m in timeline.markers()] == ["oom"]


def test_watch_caps_its_charts_and_says_what_it_left_out(board):
    """256 ranks × 64 GPUs must not become 16,384 charts per refresh (issue 22, item 15)."""
    import time

    now = time.time()
    for rank in range(40):
        devices = tuple(RankDevice(d, GiB, GiB // 2) for d in range(4))
        rec = RankRecord(rank=rank, pid=os.getpid(), host=os.uname().nodename, seq=1, wall=now,
                         interval=0.5, status="sampling", devices=devices)
        (board.channel / f"rank-{rank}-{os.getpid()}.json").write_text(rec.to_json())
    view = RanksView(board)
    assert view.charts.value.count("<svg") == 32
    assert "160 charts (rank, GPU); showing 32" in view.charts.value
    assert "more rows (rank, GPU) not shown" not in view.table.value  # 160 rows fit
    assert len(view.charts.value) < 2_000_000
