"""A dry run saved on this machine's torch (a CPU-only build) replays in ``allocconf simulate``,
labelled an estimate. The dry run itself: tests/unit/test_dryrun.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.unit.test_dryrun import ROOT, _mlp_step, requires_fake_cuda


@requires_fake_cuda
def test_a_saved_dry_run_replays_in_allocconf_simulate_labelled_an_estimate(tmp_path):
    import allocconf_widget

    with allocconf_widget.dry_run("t4") as run:
        _mlp_step(1024)
    path = run.save(tmp_path / "step.pickle")
    proc = subprocess.run([sys.executable, "-m", "allocconf_widget", "simulate", str(path)],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout + proc.stderr
    assert "dry run (estimate)" in text
    assert "15.00 GiB" in text  # the T4's capacity, from the sidecar
    assert "fake CUDA tensors" in text  # the gaps are said
