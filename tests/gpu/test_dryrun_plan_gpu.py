"""On a GPU: the planner's answer is what a real run confirms, a cell that sets its batch variable
is refused with the fix, the CPU stand-in's error against the real run is measured, and the
attention a T4 would run is what the dry run records for ``--gpu t4``.

* two workloads (a TransformerEncoder LM, ResNet-18) under a memory fraction the size of a T4: the
  largest batch the planner predicts to fit fits for real, the next size runs out for real;
* ``%allocconf plan`` on a cell with ``BATCH = 64`` at its top stops with the fix;
* the stand-in's peak reserved, per setting, against the real run and the fake-CUDA dry run
  (printed; asserted within 15 % of the real run: a coarser estimate);
* an fp16 LM whose attention is restricted to the kernels a T4 has (memory-efficient, math) via
  ``torch.nn.attention.sdpa_kernel``: its real peak within 10 % of the ``--gpu t4`` dry run's
  prediction (replayed on this GPU's capacity).

Every real run is a fresh process (``benchmarks/gpu/bench_dryrun.py``'s children).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ROOT = Path(__file__).resolve().parents[2]
# the children import this checkout first, and what the test's own path holds after it
CHILD_PATH = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
BENCH = ROOT / "benchmarks" / "gpu"
sys.path.insert(0, str(BENCH))
T4_BYTES = 15 << 30


def _bench():
    import importlib

    return importlib.import_module("bench_dryrun")


@pytest.mark.parametrize("workload", ["lm", "resnet18"])
def test_the_largest_batch_planned_fits_for_real_and_the_next_runs_out(workload):
    bench = _bench()
    sizes = list(bench.PLAN[workload])
    plan = bench.spawn(["plan", workload, sizes, T4_BYTES])
    assert "error" not in plan, plan
    best = plan["largest"]
    assert best is not None and best != sizes[-1], plan  # the sizes reach past the T4's memory
    following = sizes[sizes.index(best) + 1]
    fraction = T4_BYTES / torch.cuda.mem_get_info()[1]
    at_best = bench.spawn(["real", workload, best, fraction, None])
    at_next = bench.spawn(["real", workload, following, fraction, None])
    assert at_best.get("oom") is None and "error" not in at_best, at_best
    assert at_next.get("oom") is not None, at_next


def test_plan_refuses_a_cell_that_sets_the_batch_variable(tmp_path):
    script = tmp_path / "notebook.py"
    script.write_text(textwrap.dedent("""
        from IPython.core.error import UsageError
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "allocconf_widget")
        ip.run_cell("import torch; model = torch.nn.Linear(256, 256)")
        ip.run_cell_magic("allocconf", "dryrun --gpu t4",
                          "BATCH = 64\\nout = model.to('cuda')(torch.randn(BATCH, 256, device='cuda'))\\n")
        try:
            ip.run_line_magic("allocconf", "plan BATCH 32 64 256 512 --gpu t4")
        except UsageError as exc:
            print("REFUSED", exc)
        print("CUDA", torch.cuda.is_initialized())
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": CHILD_PATH}, check=False, cwd=tmp_path)
    refused = "REFUSED the dry-run cell sets BATCH itself (line 1: BATCH = 64)"
    assert refused in proc.stdout, proc.stderr[-2000:]
    assert "Fix: move that line to a cell above" in proc.stdout and "CUDA False" in proc.stdout


_STANDIN = """
import json, sys
sys.path.insert(0, {bench!r})
import torch, allocconf_widget
from dryrun_workloads import WORKLOADS
settings = {settings!r}
out = {{}}
for standin in (False, True):
    with allocconf_widget.dry_run(None, standin=standin, progress=False) as run:  # this GPU, by NVML
        WORKLOADS[{workload!r}]("cuda", {batch})
    out["standin" if standin else "fake_cuda"] = {{s: run.predict(s).peak_reserved for s in settings}}
out["cuda_initialized"] = torch.cuda.is_initialized()
print("RESULT", json.dumps(out))
"""


@pytest.mark.parametrize("workload", ["lm", "resnet18", "llama"])
def test_the_standin_error_against_the_real_run_is_measured(workload, tmp_path):
    bench = _bench()
    import importlib

    batch = importlib.import_module("dryrun_workloads").DEFAULT_BATCH[workload]
    script = tmp_path / "dry.py"
    script.write_text(_STANDIN.format(bench=str(BENCH), settings=list(bench.SETTINGS), workload=workload,
                                      batch=batch))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": CHILD_PATH}, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stderr[-3000:]
    dry = json.loads(line[7:])
    assert dry["cuda_initialized"] is False
    for setting in bench.SETTINGS:
        real = bench.spawn(["real", workload, batch, None, None], setting)["peak_reserved"]
        standin, fake = dry["standin"][setting], dry["fake_cuda"][setting]
        print(f"{workload} {setting or '(defaults)'}: real {real / 2**30:.3f} GiB, fake CUDA "
              f"{(fake - real) / real:+.1%}, stand-in {(standin - real) / real:+.1%}")
        assert abs(standin - real) <= 0.15 * real


_T4_REAL = """
import json, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
    {step}
print("RESULT", json.dumps({{"peak_reserved": torch.cuda.max_memory_reserved()}}))
"""
_T4_DRY = """
import json, torch, allocconf_widget
from allocconf_widget.app.dryrun import resolve_gpu
with allocconf_widget.dry_run("t4", progress=False) as run:
    {step}
here = resolve_gpu(None)[0]  # this GPU, by NVML: its capacity, not a T4's
print("RESULT", json.dumps({{"predicted": run.predict("", here).peak_reserved,
                             "notes": list(run.all_notes()), "cuda": torch.cuda.is_initialized()}}))
"""
#: an fp16 LM step: its attention is memory-efficient on a T4 (no flash, no cuDNN attention)
_T4_STEP = ("import sys; sys.path.insert(0, {bench!r}); from dryrun_workloads import run_lm_fp16; "
            "run_lm_fp16('cuda', 8)")


def test_a_t4_like_attention_choice_is_within_10_percent_of_its_real_run():
    step = _T4_STEP.format(bench=str(BENCH))
    results = []
    for template in (_T4_REAL, _T4_DRY):
        env = {**os.environ, "PYTHONPATH": CHILD_PATH}
        proc = subprocess.run([sys.executable, "-c", template.format(step=step)], capture_output=True,
                              text=True, timeout=900, env=env, check=False)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        assert line, proc.stderr[-3000:]
        results.append(json.loads(line[7:]))
    real, dry = results
    assert dry["cuda"] is False
    assert any("memory-efficient attention" in n for n in dry["notes"]), dry["notes"]
    error = (dry["predicted"] - real["peak_reserved"]) / real["peak_reserved"]
    print(f"T4-restricted attention: real {real['peak_reserved'] / 2**30:.3f} GiB, dry run {error:+.1%}")
    assert abs(error) <= 0.10
