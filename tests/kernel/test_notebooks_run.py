"""Run All on the shipped notebooks, in a fresh real kernel, must be clean.

Each notebook runs top to bottom with ``nbclient`` in a new ``ipykernel`` of this
environment (the one ``pip install -e '.[demo]'`` makes, plus the test tools), on this
CPU-only machine, from a copy in an empty folder, with no saved settings. Any error
output, any stderr stream and any warning or traceback text fails the test: a new
user's first run shows none. Cells that need CUDA say so in a plain line instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from tests.kernel.kernels import clean_kernel_env, write_python3_kernelspec  # noqa: E402
from tests.torch_versions import needs_torch  # noqa: E402

pytestmark = [pytest.mark.kernel, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
_NOISE = re.compile(r"Traceback \(most recent call last\)|\b\w*(Warning|Error):|No module named")
# Both notebooks are a tour of expandable_segments (the quickstart's trap warning is about it):
# on an older torch their `%allocconf set expandable_segments=True` cell rightly says that torch
# rejects it, which is the behaviour tests/shell/test_magic.py checks; the tour is for 2.1+.
needs_expandable = needs_torch((2, 1), "expandable_segments, which the notebooks demonstrate")


def _run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    workdir = tmp_path / "work"
    workdir.mkdir()
    shutil.copy(ROOT / "notebooks" / name, workdir / name)
    write_python3_kernelspec(tmp_path / "jupyter-data")  # the kernel runs this interpreter
    env = clean_kernel_env(tmp_path / "xdg", ipython_dir=tmp_path / "ipython")
    env["JUPYTER_PATH"] = str(tmp_path / "jupyter-data")
    for key in list(os.environ):
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(workdir / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                                     resources={"metadata": {"path": str(workdir)}})
    client.execute()
    return nb


def _problems(nb: object) -> list[str]:
    found = []
    for index, cell in enumerate(nb.cells):  # type: ignore[attr-defined]
        if cell.cell_type != "code":
            continue
        for out in cell.outputs:
            if out.output_type == "error":
                found.append(f"cell {index}: {out.ename}: {out.evalue}")
            elif out.output_type == "stream" and out.name == "stderr":
                found.append(f"cell {index} wrote to stderr: {out.text[:300]!r}")
            elif out.output_type == "stream" and _NOISE.search(out.text):
                line = next(ln for ln in out.text.splitlines() if _NOISE.search(ln))
                found.append(f"cell {index} printed {line[:300]!r}")
    return found


def _shown(nb: object) -> str:
    """Streams, and what displays show as text (%allocconf simulate shows an HTML table)."""
    return "\n".join(out.get("text", "") or out.get("data", {}).get("text/plain", "")
                     for cell in nb.cells if cell.cell_type == "code"  # type: ignore[attr-defined]
                     for out in cell.outputs)


def _widget_text(nb: object) -> str:
    """Everything the notebook's widgets show (nbclient saves their state in the metadata)."""
    state = nb.metadata.get("widgets", {})  # type: ignore[attr-defined]
    return json.dumps(state)


@needs_expandable
def test_quickstart_runs_clean_and_shows_the_oom_view(tmp_path, monkeypatch):
    nb = _run("quickstart.ipynb", tmp_path, monkeypatch)
    assert _problems(nb) == []
    text = _shown(nb)
    assert "No module named" not in text  # `!{sys.executable} -m allocconf_widget` is the kernel's
    # the CLI cell ran, in this environment, and ranked as %allocconf simulate does
    assert re.search(r"expandable_segments:True +5\.29 GiB", text) and "why:" in text
    _dry_run_and_planner_ran(text, "T4")
    assert re.search(r"Tesla T4 \(14\.50 GiB usable\).*NVIDIA A100-SXM4-40GB", text, re.S)
    # %allocconf set predicts the draft on the dry run; simulate ranks it (no recording here)
    assert "Prediction from a dry run (estimate) of your step on Tesla T4" in text
    # the OOM view, on the real out-of-memory error recorded on an H200, labelled as a recording
    assert "Recording (not this kernel): 'fragment' workload on an NVIDIA H200" in text
    widgets = _widget_text(nb)
    assert "CUDA out of memory on GPU 0: tried to allocate" in widgets


@needs_expandable
def test_colab_notebook_runs_clean_without_a_gpu(tmp_path, monkeypatch):
    nb = _run("colab.ipynb", tmp_path, monkeypatch)
    assert _problems(nb) == []
    text = _shown(nb)
    assert "not recording" in text and "needs a CUDA GPU" in text  # the cell ran, and says so
    assert "bundled H200 recording" in text  # the report falls back to the bundled recording …
    _dry_run_and_planner_ran(text, "T4")  # … and the what-if ranks the dry run of the step


def _dry_run_and_planner_ran(text: str, gpu: str) -> None:
    """The dry-run cell predicted its training step on a machine without a GPU (on the CPU
    stand-in, labelled the coarser estimate it is), the planner found a largest batch, and
    %allocconf simulate ranked settings on the dry run."""
    assert f"A dry run (estimate), by the CPU stand-in (a coarser estimate), for Tesla {gpu}" in text
    assert "CUDA was not started" in text
    assert "the step ran on fake CPU tensors counted as the CUDA memory they stand for" in text
    assert re.search(r"largest predicted to fit with \(torch defaults\): batch \d+", text)
    assert f"trace: a dry run (estimate) of your step on Tesla {gpu}" in text
