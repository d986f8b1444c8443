"""``%allocconf plan`` plans what it says, and dry runs show progress, stop cleanly and copy only
what the cell reads; in IPython's real shell on this machine's CPU-only torch.

* a cell that sets the batch variable itself (a script's ``BATCH = 64`` at its top), or reads it
  only as a function's own parameter, is refused with the fix: it ran its own value at every
  size and called the largest "predicted to fit";
* sizes that all give one trace say so instead of naming a largest batch;
* the chart shows settings whose lines coincide;
* a dry run and a plan show progress (a text line here: tqdm is not installed; tqdm.auto where
  it is), and a Ctrl-C in a plan prints the sizes done and leaves everything as it was;
* a one-line cell in a kernel holding a 1 GiB tensor it never reads grows the process's peak
  memory by less than 256 MiB (every tensor was deep-copied: +1 GiB).
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from tests.torch_versions import cuda_build, needs_fake_cuda, needs_torch

torch = pytest.importorskip("torch")
pytestmark = needs_torch((2, 4), "the dry run")
ROOT = Path(__file__).resolve().parents[2]

CELL = """
moved = model.to("cuda")
out = moved(torch.randn(BATCH, 256, device="cuda"))
out.float().pow(2).mean().backward()
"""


@pytest.fixture(autouse=True)
def _fresh_session(ip):
    import allocconf_widget

    ip.user_ns["allocconf_widget"] = allocconf_widget
    ip.user_ns["torch"] = torch
    ip.user_ns["model"] = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                              torch.nn.Linear(1024, 256))
    ip.user_ns["BATCH"] = 512
    yield
    for name in ("moved", "out", "run", "n"):
        ip.user_ns.pop(name, None)


def test_plan_refuses_a_cell_that_sets_the_batch_variable_and_says_the_fix(ip, capsys):
    """`plan BATCH 32 64 256 512 --gpu t4` ran the cell's own BATCH = 64 at every size: one peak
    for all, and 512 "predicted to fit"."""
    ip.run_cell_magic("allocconf", "dryrun --gpu t4", "BATCH = 64\n" + CELL)
    capsys.readouterr()
    with pytest.raises(UsageError) as caught:
        ip.run_line_magic("allocconf", "plan BATCH 32 64 256 512 --gpu t4")
    message = str(caught.value)
    assert "the dry-run cell sets BATCH itself (line 1: BATCH = 64)" in message
    assert "Fix: move that line to a cell above the dry-run cell" in message
    assert "largest predicted to fit" not in capsys.readouterr().out


def test_plan_refuses_a_batch_variable_the_cell_reads_only_as_a_parameter(ip, capsys):
    cell = ("def run(BATCH=64):\n"
            "    return model.to('cuda')(torch.randn(BATCH, 256, device='cuda'))\n"
            "run()\n")
    ip.run_cell_magic("allocconf", "dryrun --gpu t4", cell)
    capsys.readouterr()
    with pytest.raises(UsageError, match=r"reads BATCH only as run\(\)'s own parameter or variable.*Fix: let "
                                         r"run\(\) read the notebook's BATCH"):
        ip.run_line_magic("allocconf", "plan BATCH 32 64 --gpu t4")


def test_a_plan_whose_sizes_all_give_one_trace_says_so_instead_of_a_largest(ip, capsys):
    cell = "n = BATCH\nmoved = model.to('cuda')\nout = moved(torch.randn(8, 256, device='cuda'))\n"
    ip.run_cell_magic("allocconf", "dryrun --gpu t4", cell)
    capsys.readouterr()
    plan = ip.run_line_magic("allocconf", "-r plan BATCH 32 64 128 --gpu t4")
    out = capsys.readouterr().out
    assert plan.same_trace == ("Tesla T4",)
    assert "every size gave the same allocations: the step does not size its tensors by BATCH" in out
    assert "largest predicted to fit" not in out and "every size tried fits" not in out


def test_the_chart_shows_settings_whose_lines_coincide():
    from allocconf_widget.app.dryrun import BatchPlan, PlanCell, Prediction
    from allocconf_widget.views.charts.dryrun import plan_figure

    def cell(size: int, conf: str) -> PlanCell:
        return PlanCell(size, conf, "Tesla T4", Prediction(conf, "Tesla T4", size << 20, size << 20, 14 << 30,
                                                             fits=True))

    confs = ("", "expandable_segments:True", "max_split_size_mb:128")
    plan = BatchPlan((32, 64), confs, ("Tesla T4",), tuple(cell(s, c) for s in (32, 64) for c in confs))
    fig = plan_figure(plan)
    assert [t.name for t in fig.data] == ["(torch defaults)",
                                          "expandable_segments:True (same as (torch defaults))",
                                          "max_split_size_mb:128 (same as (torch defaults))"]
    styles = [(t.line.dash, t.marker.symbol) for t in fig.data]
    assert len(set(styles)) == 3  # three lines on one path, each drawn so it can be seen


def test_a_dry_run_and_a_plan_show_progress_as_a_text_line_without_tqdm(ip, capsys, monkeypatch):
    from allocconf_widget.views.text import progress

    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # not installed
    ip.run_cell_magic("allocconf", "dryrun --gpu t4", "\n".join(
        ["xs = [torch.empty(BATCH, device='cuda') for _ in range(300)]", "ys = [x * 2 for x in xs]"]))
    out = capsys.readouterr().out
    assert "\rdry run: 512 ops" in out
    ip.run_line_magic("allocconf", "plan BATCH 32 64 --gpu t4")
    out = capsys.readouterr().out
    assert "\rplan BATCH: 0/2 dry runs (BATCH=32 on Tesla T4)" in out
    assert "\rplan BATCH: 1/2 dry runs (BATCH=64 on Tesla T4)" in out


def test_progress_uses_tqdm_auto_where_it_is_installed(monkeypatch):
    from allocconf_widget.views.text import progress

    made: list[dict] = []

    class Bar:
        monitor_interval = 10

        def __init__(self, **kwargs: object) -> None:
            made.append(dict(kwargs))
            self.n = 0

        def set_postfix_str(self, text: str, refresh: bool = True) -> None:  # noqa: ARG002
            made[-1]["postfix"] = text

        def refresh(self) -> None:
            made[-1]["n"] = self.n

        def close(self) -> None:
            made[-1]["closed"] = True

    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.setitem(sys.modules, "tqdm.auto", types.SimpleNamespace(tqdm=Bar))
    line = progress.ProgressLine("plan BATCH", total=4, unit="dry runs")
    line.update(2, "BATCH=64 on Tesla T4")
    line.close()
    assert made == [{"total": 4, "desc": "plan BATCH", "unit": "dry runs", "leave": False, "file": None,
                     "postfix": "BATCH=64 on Tesla T4", "n": 2, "closed": True}]
    assert Bar.monitor_interval == 0  # tqdm's monitor thread would start inside the dry run


def test_ctrl_c_in_a_plan_prints_the_sizes_done_and_leaves_everything_as_it_was(ip, capsys):
    weight = ip.user_ns["model"][0].weight.detach().clone()
    cell = "if BATCH == 4096:\n    raise KeyboardInterrupt\n" + CELL
    ip.run_cell_magic("allocconf", "dryrun --gpu t4", cell)
    capsys.readouterr()
    plan = ip.run_line_magic("allocconf", "-r plan BATCH 32 4096 65536 --gpu t4")
    out = capsys.readouterr().out
    assert plan.sizes == (32,) and plan.interrupted == 4096
    assert "interrupted at batch 4096: the sizes above were dry-run; nothing was left changed" in out
    assert "largest predicted to fit" not in out and "every size tried fits" not in out
    model = ip.user_ns["model"]
    assert type(model[0].weight) is torch.nn.Parameter and torch.equal(model[0].weight.detach(), weight)
    assert torch.equal(torch.ones(2) + 1, torch.full((2,), 2.0)) and torch.cuda.is_initialized() is False


def test_the_dry_run_copies_only_what_the_cell_reads_and_says_what_it_cost(ip, capsys):
    ip.user_ns["unread"] = torch.ones(1 << 20)
    try:
        ip.run_cell_magic("allocconf", "dryrun --gpu t4", CELL)
    finally:
        ip.user_ns.pop("unread")
    out = capsys.readouterr().out
    assert "Copied what the cell reads (model): 2.00 MiB of host memory, " in out
    assert "unread" not in out


def test_a_one_line_cell_beside_a_1_gib_tensor_it_never_reads_grows_peak_memory_under_256_mib(tmp_path):
    """Each dry run deep-copied every tensor in the notebook: +1.1 GiB and 3.9 s for a one-line cell."""
    script = tmp_path / "kernel.py"
    script.write_text(
        "import resource\n"
        "from IPython.testing.globalipapp import start_ipython\n"
        "ip = start_ipython()\n"
        "ip.run_line_magic('load_ext', 'allocconf_widget')\n"
        "ip.run_cell('import torch')\n"
        "ip.run_cell_magic('allocconf', 'dryrun --gpu t4', \"w = torch.zeros(16, device='cuda')\\n\")\n"
        "ip.run_cell('data = torch.ones(256 << 20)')  # 1 GiB\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "ip.run_cell_magic('allocconf', 'dryrun --gpu t4', \"x = torch.zeros(1024, device='cuda')\\n\")\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print('GROWTH_KIB', after - before)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "IPYTHONDIR": str(tmp_path / "ipython")}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300,
                          check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    growth = int(next(line for line in proc.stdout.splitlines() if line.startswith("GROWTH_KIB")).split()[1])
    assert growth < 256 * 1024, f"peak memory grew by {growth / 1024:.0f} MiB"
    assert "nothing was copied" in proc.stdout


@needs_fake_cuda
@pytest.mark.skipif(cuda_build(), reason="a CUDA build runs this step on fake CUDA tensors without a GPU; "
                                         "only a CPU-only build refuses it")
def test_a_refused_with_dry_run_block_shows_one_line_naming_the_cells_line(ip, capsys):
    """The ``with dry_run()`` form of a refused step showed a 79-line traceback through torch's and
    our frames, naming the kernel's temporary file."""
    result = ip.run_cell('with allocconf_widget.dry_run("t4", standin=False, progress=False):\n'
                         '    model = torch.nn.Linear(16, 16).to("cuda")\n'
                         '    loss = model(torch.randn(4, 16, device="cuda")).sum()\n',
                         store_history=True)
    out = capsys.readouterr()
    shown = (out.out + out.err).strip().splitlines()
    assert result.error_in_exec is not None
    assert len(shown) == 1, shown
    assert shown[0].startswith("DryRunError: this torch") and "the cell's line 3: loss = model(" in shown[0]
