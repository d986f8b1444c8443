"""The notebook flow on a real GPU, through IPython's own shell: set, import, record, simulate, show.

Fresh interpreter (the allocator settings are per process). The user's order:
``%load_ext`` and ``%allocconf set`` before ``import torch``, a training cell
under ``%%allocconf record`` (the model is built in an earlier cell, so the
recorder must start from the allocator's existing state), ``%allocconf
simulate``, then ``%allocconf show`` reading the settings back from torch.
"""

from __future__ import annotations

import json
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

_SETUP_CELL = "\n".join([
    "import torch",
    "model = torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.GELU(),",
    "                            torch.nn.Linear(8192, 2048)).cuda()",
    "opt = torch.optim.AdamW(model.parameters())",
    "model(torch.randn(64, 2048, device='cuda')).sum().backward(); opt.step(); opt.zero_grad()",
])
_TRAIN_CELL = "\n".join([
    "for batch in [256, 64, 1024, 512, 96, 2048] * 3:",
    "    model(torch.randn(batch, 2048, device='cuda')).square().mean().backward()",
    "    opt.step(); opt.zero_grad()",
])
_CODE = f"""
import json
from IPython.testing.globalipapp import start_ipython
ip = start_ipython()
ip.run_line_magic("load_ext", "allocconf_widget")
ip.run_line_magic("allocconf", "set expandable_segments=True")
ip.run_cell({_SETUP_CELL!r})
rec = ip.run_cell_magic("allocconf", "-r record", {_TRAIN_CELL!r})
result = ip.run_line_magic("allocconf", "-r simulate")
info = ip.run_line_magic("allocconf", "-r show")
current = next(c for c in result.rows if c.is_current)
print("RESULT", json.dumps({{
    "events": rec.events, "real_window_peak": rec.peak_reserved,
    "sim_current_peak": current.result.peak_reserved_bytes,
    "fidelity": result.fidelity.summary() if result.fidelity else None,
    "fidelity_exact": bool(result.fidelity and result.fidelity.exact),
    "readback_ok": info["readback"].ok if info["readback"] else None,
    "phase": info["state"].phase.name,
    "top": [(c.conf, c.result.peak_reserved_bytes) for c in result.rows[:4]],
}}))
"""


def test_notebook_flow_on_the_gpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
    env["XDG_CONFIG_HOME"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, env=env,
                          check=False, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(proc.stdout[-4000:])
    out = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert out["phase"] == "LIVE"
    assert out["readback_ok"] is True  # expandable segments really in effect
    assert out["events"] > 100
    assert out["fidelity_exact"], out["fidelity"]
    assert out["sim_current_peak"] == out["real_window_peak"]  # replay from the recorded start state
