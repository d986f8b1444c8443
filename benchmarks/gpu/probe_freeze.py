"""Which step of a dry run freezes the allocator settings without starting CUDA? (H200 probe)

A ResNet-18 and a transformers Llama dry run left ``torch.cuda.is_initialized()`` False, yet a
``PYTORCH_CUDA_ALLOC_CONF`` set afterwards was ignored. Each case here is a fresh interpreter
that runs one small step inside ``allocconf_widget.dry_run("h200")`` (or one query outside it),
then sets ``expandable_segments:True``, allocates for real and reads the setting back from
torch's snapshot. Cases run in parallel; one JSON line per case::

    python benchmarks/gpu/probe_freeze.py

Measured on the H200 (torch 2.11), before the fix in ``adapters/dryrun/tensors.fake_mode``: every case
left ``is_initialized()`` False; the settings stayed open after an empty dry run, Linear
backward, Conv2d forward and backward (with and without cuDNN), pooling, cross entropy, SGD with
momentum and bf16 SDPA backward, and were frozen after a BatchNorm2d forward (with and without
cuDNN), the ResNet-18 and the Llama workloads; ``torch.backends.cudnn.version()`` outside a dry
run starts CUDA itself. The cause read off torch's source: FakeTensorMode constant-propagates a
one-element tensor (BatchNorm's ``num_batches_tracked``) moved to "cuda" by running the real
copy on the GPU when one is visible. Measured after the fix (H200, torch 2.11): every dry-run
case leaves the settings open, BatchNorm, ResNet-18 and Llama included; only the query outside
a dry run (``cudnn.version()``) still starts CUDA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_HEAD = """
import os, sys, json
sys.path.insert(0, {bench!r})
import torch
from torch import nn
import allocconf_widget
{before}
def body():
{body}
out = {{}}
try:
    if {dry}:
        with allocconf_widget.dry_run("h200") as run:
            body()
        out["allocations"] = run.trace.allocations
        out["peak_requested_mib"] = round(run.trace.peak_requested / 2**20, 1)
    else:
        body()
except Exception as exc:
    out["error"] = f"{{type(exc).__name__}}: {{str(exc)[:160]}}"
out["initialized"] = torch.cuda.is_initialized()
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
out["open"] = torch.cuda.memory._snapshot()["allocator_settings"].get("expandable_segments") is True
print("RESULT", json.dumps(out))
"""

X = 'x = torch.randn(2, 3, 16, 16, device="cuda")'
CONV = f'{X}; m = nn.Conv2d(3, 8, 3).to("cuda"); y = m(x)'
BN = f'{X}; m = nn.BatchNorm2d(3).to("cuda"); m(x)'
Q = 'q = torch.randn(2, 4, 64, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)'
SDPA = f"{Q}; nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()"
LIN = 'm = nn.Linear(8, 8).to("cuda"); m(torch.randn(4, 8, device="cuda")).sum().backward()'
SGD = ('m = nn.Linear(8, 8).to("cuda"); o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9); '
       'm(torch.randn(4, 8, device="cuda")).sum().backward(); o.step(); o.step()')
CE = ('nn.functional.cross_entropy(torch.randn(4, 10, device="cuda"), '
      'torch.randint(0, 10, (4,), device="cuda"))')
NO_CUDNN = "torch.backends.cudnn.enabled = False"
WORKLOAD = 'from dryrun_workloads import WORKLOADS; WORKLOADS["{}"]("cuda", {})'
CASES: dict[str, tuple[str, str, bool]] = {  # name: (before the dry run, body, inside a dry run)
    "no_dry_run": ("import torchvision", "pass", False),
    "empty": ("", "pass", True),
    "linear_bwd": ("", LIN, True),
    "conv_fwd": ("", CONV, True),
    "conv_fwd_no_cudnn": (NO_CUDNN, CONV, True),
    "conv_bwd": ("", f"{CONV}; y.sum().backward()", True),
    "bn_fwd": ("", BN, True),
    "bn_fwd_no_cudnn": (NO_CUDNN, BN, True),
    "pools": ("", f"{X}; nn.MaxPool2d(2)(x); nn.AdaptiveAvgPool2d(1)(x)", True),
    "cross_entropy": ("", CE, True),
    "sgd_momentum": ("", SGD, True),
    "sdpa_bf16": ("", SDPA, True),
    "sdpa_bf16_no_cudnn": (NO_CUDNN, SDPA, True),
    "cudnn_queries": ("", "torch.backends.cudnn.version(); torch.backends.cudnn.is_available()", False),
    "resnet": ("", WORKLOAD.format("resnet18", 4), True),
    "resnet_no_cudnn": (NO_CUDNN, WORKLOAD.format("resnet18", 4), True),
    "llama": ("", WORKLOAD.format("llama", 2), True),
    "llama_no_cudnn": (NO_CUDNN, WORKLOAD.format("llama", 2), True),
}


def run(name: str) -> dict[str, object]:
    before, body, dry = CASES[name]
    script = _HEAD.format(bench=str(ROOT / "benchmarks" / "gpu"), before=before,
                          body=textwrap.indent(body.replace("; ", "\n"), "    "), dry=dry)
    env = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=240, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    result: dict[str, object] = {"case": name}
    if line is None:
        result["crash"] = proc.stderr[-400:]
    else:
        result.update(json.loads(line[7:]))
    return result


def main() -> None:
    names = sys.argv[1:] or list(CASES)
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        for result in pool.map(run, names):
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
