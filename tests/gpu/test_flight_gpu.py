"""The OOM flight recorder on a real GPU: a verdict that holds, and one that refuses to promise.

Each scenario is ``benchmarks/gpu/flight_oom.py`` in a fresh interpreter (an empty
allocator; the recorder turned on before CUDA starts, so it must arm and start
itself), under a 4 GiB per-process memory fraction:

* ``fragment`` runs out of memory with torch's defaults; the flight recorder
  captures it at the OOM; the verdict picks a setting; the same workload then
  reruns *in another fresh process* under that setting and must not run out of
  memory. Once more with the live monitor's sampler running.
* ``nofix`` fills the limit with live tensors: the verdict must say that no
  setting avoids it, with the allocated bytes, instead of promising one.
* under ``backend:cudaMallocAsync`` the recorder says it cannot record, and the
  OOM still surfaces as the user's own error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "flight_oom.py"


def _run(*args: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    out: dict[str, object] = json.loads(line[7:])
    print("\n", args, json.dumps(out, indent=1)[:3000])
    return out


@pytest.mark.parametrize("monitor", [False, True], ids=["plain", "monitor-running"])
def test_the_verdicts_pick_avoids_the_oom_in_a_fresh_process(monitor):
    first = _run("--workload", "fragment", *(["--monitor"] if monitor else []))
    assert "armed" in str(first["status_before_torch"])
    assert str(first["status_live"]).startswith("flight recorder on")
    assert first["oom"], "the workload should run out of memory with torch's defaults"
    assert first["captured"], first["capture_errors"]
    assert first["events"] > 0
    # the script's set_per_process_memory_fraction call, made while recording, is in the
    # capture, so a replay of it applies the limit where the program set it
    calls = first["fraction_calls"]
    assert isinstance(calls, list) and len(calls) == 1, calls
    assert calls[0]["device"] == 0 and abs(calls[0]["fraction"] - first["fraction"]) < 1e-6
    winner = first["winner"]
    assert winner, first["verdict"]
    assert "no OOM" in str(first["verdict"])
    assert first["sure"], first["sureness"]
    again = _run("--workload", "fragment", "--rerun-conf", str(winner))
    assert not again["oom"], again["oom_message"]


def test_no_setting_is_promised_when_everything_is_allocated():
    out = _run("--workload", "nofix")
    assert out["oom"] and out["captured"]
    assert str(out["verdict"]).startswith("no setting avoids this: ")
    assert "is allocated, not cached" in str(out["verdict"])
    assert out["winner"] is None


def test_cuda_malloc_async_degrades_with_a_clear_line():
    out = _run("--workload", "nofix", "--conf", "backend:cudaMallocAsync")
    assert "cudaMallocAsync keeps no allocation history" in str(out["status_before_torch"])
    assert out["captured"] is False
