"""After ``%%allocconf dryrun``, the user's real step on the GPU still works and the settings are open.

The flow a user follows in a notebook, in IPython's own shell on a real GPU (fresh interpreter:
the allocator settings are per process). The model and its optimizer are built on the CPU, one
held by a trainer object, the other by a plain name; the dry run moves both to "cuda", runs a
step and an LR scheduler step on fake tensors. Afterwards CUDA must be untouched, ``%allocconf
set`` + ``apply`` must still apply before the config freezes (read back from torch's own
snapshot), and the *real* step must train: parameters on the GPU, optimizer state real CUDA
tensors, and the same losses as the same notebook without a dry run (the CPU generator the
model's initial weights came from is restored). The dry run's estimate is printed beside the
real peak.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("IPython")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

_BUILD = "\n".join([
    "import torch",
    "torch.manual_seed(0)",
    "class Trainer:",
    "    def __init__(self):",
    "        self.model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.BatchNorm1d(4096),",
    "                                         torch.nn.GELU(), torch.nn.Linear(4096, 1024))",
    "        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)",
    "        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, 1, gamma=0.9)",
    "trainer = Trainer()",
    "head = torch.nn.Linear(1024, 1)",
    "head_opt = torch.optim.SGD(head.parameters(), lr=1e-3)",
    "x_cpu, y_cpu = torch.randn(256, 1024), torch.randn(256, 1)",
])
_STEP = "\n".join([
    "trainer.model.to('cuda'); head.to('cuda')",
    "x, y = x_cpu.to('cuda'), y_cpu.to('cuda')",
    "loss = torch.nn.functional.mse_loss(head(trainer.model(x)), y)",
    "loss.backward()",
    "trainer.opt.step(); head_opt.step(); trainer.sched.step()",
    "trainer.opt.zero_grad(); head_opt.zero_grad()",
])
_CODE = f"""
import json
import math
from IPython.testing.globalipapp import start_ipython
ip = start_ipython()
ip.run_line_magic("load_ext", "allocconf_widget")
ip.run_cell({_BUILD!r})
ns = ip.user_ns
import sys, torch
out = {{}}
if sys.argv[1] == "dry":
    before = ns["trainer"].model[0].weight.detach().clone()
    dry = ip.run_cell_magic("allocconf", "-r dryrun", {_STEP!r})
    out.update({{"initialized_after_dry_run": torch.cuda.is_initialized(),
           "dry_peak": dry.trace.peak_requested,
           "weights_unchanged": bool(torch.equal(ns["trainer"].model[0].weight.detach(), before)),
           "device_after_dry_run": str(ns["trainer"].model[0].weight.device),
           "lr_after_dry_run": ns["trainer"].opt.param_groups[0]["lr"],
           "state_after_dry_run": len(ns["trainer"].opt.state)}})
ip.run_line_magic("allocconf", "set expandable_segments=True")
ip.run_line_magic("allocconf", "apply")
losses = []
for _ in range(5):
    ip.run_cell({_STEP!r})
    losses.append(float(ns["loss"]))
snap = torch.cuda.memory._snapshot()
state = next(iter(ns["trainer"].opt.state.values()))
out.update({{
    "losses": losses,
    "readback": snap["allocator_settings"].get("expandable_segments"),
    "expandable_segment": any(s.get("is_expandable") for s in snap["segments"]),
    "param_device": str(ns["trainer"].model[0].weight.device),
    "state_kind": type(state["exp_avg"]).__name__,
    "state_device": str(state["exp_avg"].device),
    "state_is_plain": type(state["exp_avg"]) is torch.Tensor,
    "real_peak_allocated": torch.cuda.max_memory_allocated(),
}})
print("RESULT", json.dumps(out))
"""


def _run(tmp_path, mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
    env["XDG_CONFIG_HOME"] = str(tmp_path / mode)
    proc = subprocess.run([sys.executable, "-c", _CODE, mode], capture_output=True, text=True, env=env,
                          check=False, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(proc.stdout[-3000:])
    return json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])


def test_the_real_step_trains_after_a_dry_run_and_the_setting_applies(tmp_path):
    out = _run(tmp_path, "dry")
    control = _run(tmp_path, "plain")  # the same notebook without the dry run
    assert out["initialized_after_dry_run"] is False
    # the dry run gave everything back: CPU weights, untouched values, no optimizer state, no LR step
    assert out["device_after_dry_run"] == "cpu" and out["weights_unchanged"], out
    assert out["state_after_dry_run"] == 0 and out["lr_after_dry_run"] == pytest.approx(1e-4), out
    # the setting staged after the dry run is in effect for the real run
    assert out["readback"] is True and out["expandable_segment"] is True, out
    # and the real step trains on real CUDA tensors
    assert out["param_device"].startswith("cuda") and out["state_device"].startswith("cuda"), out
    assert out["state_is_plain"], out
    assert all(math.isfinite(v) for v in out["losses"]), out
    # the same numbers as without a dry run: same initial weights, same random draws
    assert out["losses"] == pytest.approx(control["losses"], rel=1e-4), (out["losses"], control["losses"])
