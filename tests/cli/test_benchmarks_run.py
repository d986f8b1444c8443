"""Every CPU benchmark still runs and prints its table (small sizes).

The benchmarks are how speed and fidelity claims in the docs are measured, and nothing
else imports them: two of them (``bench_first_compare.py`` reading a result field that had
been renamed, ``address_model_study.py`` writing to a property that had become read-only)
broke silently after refactors of the package and were found only when someone ran them
for a number. Here each runs in its own process, as a reader of the docs would run it,
with arguments that keep it to seconds; the test fails when it exits non-zero or does not
print the line its reader looks for. The numbers themselves are not checked: timings on a
shared CI machine say nothing (the ratios are read from full runs, docs/testing.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"

pytestmark = pytest.mark.slow

# (script and arguments, a line of its output a reader looks for)
CASES = [
    (["bench_pipeline.py", "--events", "20000", "--workers", "1"], "replay 8 settings"),
    (["bench_pipeline.py", "--events", "20000", "--workers", "2", "--no-stream-frees"], "total"),
    (["bench_replay_shapes.py", "--max", "20000"], "shape"),
    (["bench_simulator.py", "--events", "20000", "--workers", "1"], "events"),
    (["bench_decode.py", "--max", "20000"], "ms per 10k"),
    (["bench_metrics.py", "--repeat", "1"], "ms"),
    (["bench_predict.py"], "budget"),
    (["bench_chart_payload.py"], "SVG"),
    (["fidelity.py", "--workloads", "pipe2,batchfind"], "real peaks inside their range"),
    (["address_model_study.py", "--archives", "cnn,streams"], "peak reserved exact"),
    # the paced runs of the weight-streaming program join its own (fidelity.PACED)
    (["fidelity.py", "--data", str(BENCH / "data" / "heldout"), "--workloads", "offload"],
     "slow:expandable"),
    (["unrecorded_ranges.py"], "unrecorded peaks inside their range"),
    (["bench_engines.py", "--events", "20000", "--repeat", "1", "--recordings", "2"], "median ratio"),
    (["bench_draft.py", "--events", "20000", "--repeat", "1"], "draft / pickle.loads"),
    (["engine_digests.py", "--check", "both", "--archives", "/cnn.tar"],
     "cnn.tar.xz: 98 replays so far, 0 differ"),
]


def _run(args: list[str], tmp_path: Path, timeout: float = 300) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTORCH_", "JPY_"))}
    env["XDG_CONFIG_HOME"] = str(tmp_path)
    proc = subprocess.run([sys.executable, str(BENCH / args[0]), *args[1:]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.parametrize(("args", "expected"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_benchmark_runs_and_prints_its_table(args: list[str], expected: str, tmp_path: Path) -> None:
    out = _run(args, tmp_path)
    assert expected.lower() in out.lower(), f"{args[0]} printed no '{expected}':\n{out[-3000:]}"
