"""Do runs nobody records peak where recorded ones do (issue 23 §2, round 20)?

Every real peak the timing ranges were checked against came from a recorded run, and
recording costs the CPU a little at each allocator call: a run nobody records may get further
ahead of its GPU and peak higher. For each two-stream workload this records the default run
(``record.py``'s child, as every archived run: the recording the ranges come from, and its
``expandable_segments:True`` run), then runs each setting ``--repeats`` times with nothing
recorded and no sampler, only ``torch.cuda.memory_stats()`` read at the end, one process at a
time. ``unrecorded.json`` lists the unrecorded peaks; ``benchmarks/fidelity.py``'s ranges of
the recorded default run say whether they lie inside.

Usage (on a CUDA machine): ``python benchmarks/gpu/unrecorded_peaks.py --out DIR
[--workloads offload,streams2,buckets,prefetch] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from record import _spawn

SETTINGS = {"default": "", "expandable": "expandable_segments:True"}
_CHILD = """
import json, sys, torch
sys.path.insert(0, sys.argv[2])
from workloads import WORKLOADS
WORKLOADS[sys.argv[1]](torch.device("cuda", 0), lambda step: None)
torch.cuda.synchronize()
stats = torch.cuda.memory_stats(0)
print("RESULT", json.dumps({"peak_reserved": stats["reserved_bytes.all.peak"],
                            "peak_allocated": stats["allocated_bytes.all.peak"],
                            "num_alloc_retries": stats["num_alloc_retries"]}))
"""


def _unrecorded(workload: str, conf: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    proc = subprocess.run([sys.executable, "-c", _CHILD, workload, str(Path(__file__).parent)],
                          capture_output=True, text=True, env=env, check=False, timeout=600)
    if proc.returncode != 0:
        return {"rc": proc.returncode, "stderr": proc.stderr[-2000:]}
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return {"rc": 0, **json.loads(line[len("RESULT "):])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="unrecorded")
    parser.add_argument("--workloads", default="offload,streams2,buckets,prefetch")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, object]] = []
    for workload in args.workloads.split(","):
        for name, conf in SETTINGS.items():
            _spawn(workload, name, conf, None, out)
        for k in range(args.repeats):
            for name, conf in SETTINGS.items():
                result = {"workload": workload, "setting": name, "conf": conf, "repeat": k + 1,
                          **_unrecorded(workload, conf)}
                print(json.dumps(result), flush=True)
                runs.append(result)
    (out / "unrecorded.json").write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
