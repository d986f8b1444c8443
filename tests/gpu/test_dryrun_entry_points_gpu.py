"""Every row of the dry run's ``torch.cuda`` table on a GPU: CUDA stays down, and a setting applied
after the dry run is in effect.

Each row is a fresh interpreter that dry-runs a step calling that entry point the way training
code does (``tests/dryrun_calls.py``), checks ``torch.cuda.is_initialized()``, then sets
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, allocates for real and reads the setting
back from torch's own snapshot. A refused row must stop the dry run (DryRunError), with the same
result afterwards. Rows run eight at a time. Run with ``python -m pytest tests/gpu -m gpu``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from allocconf_widget.core.dryrun.entry_points import REFUSED, TABLE
from tests.dryrun_calls import call

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import json, os
import torch, torch.cuda.memory
import allocconf_widget
from allocconf_widget._errors import DryRunError
out = {{}}
try:
    with allocconf_widget.dry_run(None, progress=False):
        torch.empty(16, device="cuda")
{body}
    out["refused"] = None
except DryRunError as exc:
    out["refused"] = str(exc)
out["initialized_after_dry_run"] = torch.cuda.is_initialized()
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
snap = torch.cuda.memory._snapshot()
out["readback"] = snap["allocator_settings"].get("expandable_segments")
out["expandable_segment"] = any(s.get("is_expandable") for s in snap["segments"])
print("RESULT", json.dumps(out))
"""


def _installed(row) -> bool:
    import importlib

    try:
        return hasattr(importlib.import_module(row.module), row.name)
    except ImportError:
        return False


ROWS = [row for row in TABLE if _installed(row)]


def _run(row) -> dict:
    env = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    script = _SCRIPT.format(body=textwrap.indent(call(row), " " * 8))
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        handle.write(script)
    try:
        proc = subprocess.run([sys.executable, handle.name], capture_output=True, text=True, env=env,
                              check=False, timeout=600)
    finally:
        Path(handle.name).unlink()
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    return json.loads(line[7:]) if line else {"error": proc.stderr[-3000:]}


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    with ThreadPoolExecutor(8) as pool:
        return dict(zip([r.qualified for r in ROWS], pool.map(_run, ROWS), strict=True))


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.qualified)
def test_each_row_leaves_cuda_down_and_a_later_setting_in_effect(results, row):
    out = results[row.qualified]
    assert "error" not in out, out.get("error")
    assert out["initialized_after_dry_run"] is False
    assert out["readback"] is True and out["expandable_segment"] is True, out
    if row.kind == REFUSED:
        assert out["refused"] and row.qualified in out["refused"] and "\n" not in out["refused"]
    else:
        assert out["refused"] is None, out["refused"]
