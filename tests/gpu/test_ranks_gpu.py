"""Ranks launched with torch.multiprocessing.spawn report to the notebook, on a real GPU.

The test process plays the notebook: it opens the rank channel, then spawns the ranks,
which inherit it. Each rank trains with its own batch size, calls
``allocconf_widget.rank_reporter()``, and writes its own ``memory_stats()`` peaks to a file
at the end; the notebook's figures must match them. A rank run under a small memory
fraction runs out of memory, and the notebook must say so with its numbers.
On a one-GPU machine every rank uses device 0 (the two-GPU variant needs two devices).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() == 0, reason="needs a CUDA device"),
]


def _rank(rank: int, out: str, batches: list[int], fraction: float | None, steps: int = 20) -> None:
    import torch
    from torch import nn

    import allocconf_widget

    device = rank % torch.cuda.device_count()
    torch.cuda.set_device(device)
    with allocconf_widget.rank_reporter(rank=rank, interval=0.1):
        if fraction is not None:
            torch.cuda.set_per_process_memory_fraction(fraction, device)
        error = None
        try:
            model = nn.Sequential(nn.Linear(4096, 8192), nn.ReLU(), nn.Linear(8192, 4096)).cuda()
            opt = torch.optim.AdamW(model.parameters())
            for _ in range(steps):
                x = torch.randn(batches[rank], 4096, device="cuda")
                opt.zero_grad(set_to_none=True)
                model(x).square().mean().backward()
                opt.step()
            torch.cuda.synchronize()
        except torch.OutOfMemoryError as exc:
            error = str(exc).splitlines()[0]
        stats = torch.cuda.memory_stats(device)
        Path(out, f"rank{rank}.json").write_text(json.dumps({
            "reserved_peak": stats["reserved_bytes.all.peak"],
            "allocated_peak": stats["allocated_bytes.all.peak"], "error": error, "device": device}))


@pytest.fixture
def board(tmp_path, monkeypatch):
    from allocconf_widget.app.ranks import RankBoard

    monkeypatch.delenv("ALLOCCONF_RANK_DIR", raising=False)
    b = RankBoard()
    b.open(tmp_path / "runtime")
    yield b
    b.close()


def test_two_ranks_report_their_own_peaks(board, tmp_path):
    from torch.multiprocessing.spawn import spawn

    os.environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"  # applied before launching
    try:
        context = spawn(_rank, args=(str(tmp_path), [256, 2048], None, 300), nprocs=2, join=False)
    finally:
        del os.environ["PYTORCH_ALLOC_CONF"]
    while not context.join(timeout=0.05):  # the notebook polls while the ranks run, as the view does
        board.poll(kernel_settings="expandable_segments:True")
    report = board.poll(kernel_settings="expandable_segments:True")
    views = {v.rank: v for v in report.ranks}
    assert set(views) == {0, 1}, report
    for rank, view in views.items():
        truth = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert view.state == "finished"
        (dev,) = view.devices
        assert dev.reserved_peak == truth["reserved_peak"]
        assert dev.allocated_peak == truth["allocated_peak"]
        assert view.settings_match is True
        assert view.effective is not None and view.effective.get("expandable_segments") is True
    assert views[1].devices[0].reserved_peak > views[0].devices[0].reserved_peak  # bigger batch
    for rank in (0, 1):
        assert board.timelines[views[rank].key].samples(views[rank].devices[0].device) >= 2


def test_a_rank_that_runs_out_of_memory_is_reported_with_its_numbers(board, tmp_path):
    from torch.multiprocessing.spawn import spawn

    spawn(_rank, args=(str(tmp_path), [65536], 0.002), nprocs=1, join=True)
    truth = json.loads((tmp_path / "rank0.json").read_text())
    assert truth["error"] is not None  # it really ran out of memory
    (view,) = board.poll().ranks
    assert view.state == "oom"
    assert view.oom_text is not None and "rank 0 ran out of memory on GPU 0" in view.oom_text
    assert "allowed" in view.oom_text
