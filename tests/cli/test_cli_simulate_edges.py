"""The what-if's edges through the CLI (issue 23): ``allocconf simulate`` on a program that
catches its own OOMs, and on peaks that depend on GPU timing (the range in the text view).
The replay's side of the same cases is in ``tests/unit/test_simulator_edges.py``.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

from allocconf_widget.core.sim.recommend import recommend
from allocconf_widget.core.units import format_bytes
from tests.reasons import candidate_reason
from tests.unit.test_simulator_edges import _extract, one_free_waiting_on_another_stream

ROOT = Path(__file__).resolve().parents[2]


def test_the_batch_finder_recorded_on_the_h200_is_never_called_dead(tmp_path: Path) -> None:
    """``allocconf simulate --json`` on a real batch finder under a 3 GiB fraction: every row
    carries ``oom_fatal: false`` beside the OOM's details (before: ``oom`` on every row and
    nothing saying the run completed)."""
    root = _extract("batchfind.tar.xz", tmp_path)
    meta = json.loads((root / "batchfind__default_f3g.json").read_text())
    cmd = [sys.executable, "-m", "allocconf_widget", "simulate", str(root / "batchfind__default_f3g.pickle"),
           "--fraction", str(meta["fraction"]), "--conf", "expandable_segments:True",
           "--conf", "max_split_size_mb:128", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    assert rows and all(row["oom"] is not None for row in rows)  # the caught OOMs are still shown
    assert all(row["oom_fatal"] is False and row["program_catches_ooms"] for row in rows)
    assert all(row["oom_verdict"] != "yes" for row in rows)
    text = subprocess.run(cmd[:-1], capture_output=True, text=True, check=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}).stdout
    assert "caught at event" in text and "dies" not in text


def test_the_text_view_and_the_reasons_show_the_range(tmp_path: Path) -> None:
    b = one_free_waiting_on_another_stream()
    rec = recommend(b.build(), torch_version=(2, 11), workers=1)
    ranged = [c for c in rec.candidates if c.result.timing_dependent]
    assert ranged and rec.current in ranged
    for c in ranged:
        low, high = c.result.reserved_range
        said = candidate_reason(rec, c)
        assert f"the peak lies between {format_bytes(low)} and {format_bytes(high)}" in said
    path = tmp_path / "two_streams.pickle"
    path.write_bytes(pickle.dumps(b.snapshot({})))
    out = subprocess.run([sys.executable, "-m", "allocconf_widget", "simulate", str(path),
                          "--conf", "expandable_segments:True"], capture_output=True, text=True,
                         check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert "by GPU timing" in out.stdout, out.stdout
