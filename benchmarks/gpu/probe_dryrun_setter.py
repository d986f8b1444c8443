"""Does a setting applied after a dry run (before CUDA starts) take effect? Each scenario a fresh process.

A GPU test (tests/gpu/test_dryrun_then_train_gpu.py) found ``%allocconf set
expandable_segments=True`` after a ``%%allocconf dryrun`` reported "applied now (through torch's
runtime setter)" while the real run then made no expandable segment. The scenarios separate
the dry run, the magic and torch's setter. Usage: ``python benchmarks/gpu/probe_dryrun_setter.py``.

Measured on the H200 (torch 2.11, round 11): torch's setter alone, after a tiny dry run and
after a training step's dry run, and ``%allocconf set`` + ``apply`` alone, all read back
``expandable_segments`` True and made expandable segments; the failure was the test's, which
never ran ``apply`` (``set`` only stages once torch is imported). The two magic-with-dry-run
scenarios did not run then (their cell lacked ``torch``).

Round 12, on an H100 (torch 2.11; ``data/probe_dryrun_setter_h100_torch2.11.jsonl``): all six
scenarios ran. In each, CUDA was not started by the dry run, ``expandable_segments`` read back
True afterwards and an expandable segment was made: torch's setter alone, after a tiny dry run
and after a training step's dry run; ``%allocconf set`` + ``apply`` alone, after a tiny dry run
and after a training step's ``%%allocconf dryrun``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

HEAD = """
import json, os, sys
import torch
out = {}
def check(tag):
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    snap = torch.cuda.memory._snapshot()
    out[tag] = {"readback": snap["allocator_settings"].get("expandable_segments"),
                "expandable_segment": any(s.get("is_expandable") for s in snap["segments"])}
"""
DRY = """
import allocconf_widget
with allocconf_widget.dry_run("h200") as run:
{body}
out["initialized_after_dry_run"] = torch.cuda.is_initialized()
"""
TINY = "    x = torch.empty(1 << 20, device='cuda')"
STEP = """    m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.BatchNorm1d(256)).to("cuda")
    opt = torch.optim.AdamW(m.parameters())
    m(torch.randn(32, 256, device="cuda")).sum().backward(); opt.step()"""
SETTER = """
torch._C._accelerator_setAllocatorSettings("expandable_segments:True")
"""
MAGIC = """
from IPython.testing.globalipapp import start_ipython
ip = start_ipython()
ip.run_line_magic("load_ext", "allocconf_widget")
ip.user_ns["torch"] = torch  # the dry-run cell runs in a copy of the notebook's names
"""
MAGIC_DRY = """
ip.run_cell_magic("allocconf", "dryrun", {cell!r})
out["initialized_after_dry_run"] = torch.cuda.is_initialized()
"""
MAGIC_SET = """
ip.run_line_magic("allocconf", "set expandable_segments=True")
ip.run_line_magic("allocconf", "apply")
"""

SCENARIOS = {
    "setter_alone": HEAD + SETTER + "check('after')",
    "tiny_dry_then_setter": HEAD + DRY.format(body=TINY) + SETTER + "check('after')",
    "step_dry_then_setter": HEAD + DRY.format(body=STEP) + SETTER + "check('after')",
    "magic_set_alone": HEAD + MAGIC + MAGIC_SET + "check('after')",
    "magic_tiny_dry_then_set": (HEAD + MAGIC + MAGIC_DRY.format(cell=TINY.strip()) + MAGIC_SET
                                + "check('after')"),
    "magic_step_dry_then_set": HEAD + MAGIC + MAGIC_DRY.format(cell="\n".join(
        line[4:] for line in STEP.splitlines())) + MAGIC_SET + "check('after')",
}


def main() -> None:
    env = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
    env["XDG_CONFIG_HOME"] = tempfile.mkdtemp()
    for name, body in SCENARIOS.items():
        code = body + "\nprint('RESULT', json.dumps(out))\n"
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                              check=False, timeout=300)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        print(json.dumps({"scenario": name, "rc": proc.returncode,
                          "result": json.loads(line[7:]) if line else None,
                          "stderr": None if line else proc.stderr[-1500:]}), flush=True)


if __name__ == "__main__":
    main()
