"""Issue 23 §4: does ``garbage_collection_threshold:0.6`` under a fraction replay exactly when the
recording does not start with the process? Each scenario in a fresh process.

Two whole-process recordings of a Lightning bf16 CNN (``workloads.lightning_bf16``) replayed
exactly under GC (docs/fidelity.md), but a user's recording rarely starts with the process:

* ``whole``: the control, recorded from the first allocation;
* ``midrun``: a first ``Trainer.fit`` of 10 steps unrecorded (an earlier notebook cell), then
  ``%%allocconf record``'s recorder around a second one of 20 steps: the recording starts with
  the first run's cached segments, whose GC ages the snapshot does not carry;
* ``partial``: the whole run recorded into a ring buffer too small for it (``max_entries``), so
  the replay starts from a state reconstructed at the buffer's start.

Each prints the real peak reserved and segment counts of its recorded window, and the replay's
(the use case every front end calls, under the recorded settings). The snapshots go to
``--out`` for a replay on the CPU. Usage: ``python benchmarks/gpu/probe_gc_midrun.py --out DIR``.

What to look for: docs/simulator.md, "Garbage collection and a start state's idle segments".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

LIMIT_BYTES = int(4.24 * (1 << 30))  # the fraction of the lightning_bf16 recordings, in bytes
CONF = "garbage_collection_threshold:0.6"

CHILD = """
import json, pickle, sys, types
sys.path.insert(0, {gpu!r})
import torch
from workloads import lightning_bf16
from allocconf_widget.adapters.recorder import record
from allocconf_widget.app.simulate import SimulationRequest, simulate
from allocconf_widget.app.sources import trace_source
scenario, out = sys.argv[1], sys.argv[2]
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction({limit} / total, 0)
steps = []
def stats():
    s = torch.cuda.memory_stats(0)
    return s["num_device_alloc"], s["num_device_free"]
if scenario == "midrun":
    lightning_bf16(torch.device("cuda"), steps.append, steps=10)
max_entries = 4000 if scenario == "partial" else 3_000_000
torch.cuda.reset_peak_memory_stats(0)  # the window's peak, not the unrecorded first fit's
a0, f0 = stats()
with record(max_entries=max_entries) as rec:
    lightning_bf16(torch.device("cuda"), steps.append, steps=20 if scenario == "midrun" else 30)
a1, f1 = stats()
real = torch.cuda.memory_stats(0)
with open(out, "wb") as fh:
    pickle.dump(rec.snapshot, fh, protocol=4)
report = simulate(trace_source(types.SimpleNamespace(recording=rec, dry_run=None)),
                  SimulationRequest(workers=1))
row = report.rows[0].result
fid = report.fidelity
print("RESULT", json.dumps({{
    "scenario": scenario, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
    "fraction": rec.fraction, "events": rec.events,
    "real_peak": real["reserved_bytes.all.peak"], "real_allocs": a1 - a0, "real_frees": f1 - f0,
    "sim_peak": row.peak_reserved_bytes, "sim_allocs": row.num_device_alloc,
    "sim_frees": row.num_device_free, "self_check": fid.summary() if fid else None,
    "exact": bool(fid and fid.exact), "start_state": report.start_state}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scenarios", default="whole,midrun,partial")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    code = CHILD.format(gpu=str(Path(__file__).parent), limit=LIMIT_BYTES)
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": CONF}
    env.pop("PYTORCH_ALLOC_CONF", None)
    for scenario in args.scenarios.split(","):
        proc = subprocess.run([sys.executable, "-c", code, scenario,
                               str(args.out / f"gc_{scenario}.pickle")],
                              capture_output=True, text=True, env=env, check=False, timeout=280)
        line = next((ln[7:] for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        result = json.loads(line) if line else {"scenario": scenario, "rc": proc.returncode,
                                                 "stderr": proc.stderr[-1500:]}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
