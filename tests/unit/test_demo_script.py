"""``./demo.sh`` opens copies of the notebooks, never the tracked files (issue 24, item 15).

JupyterLab marks a notebook modified once its kernel reports its Python version, and Run All
autosaves the outputs: on the tracked ``notebooks/*.ipynb`` that left ``git status`` dirty.
The script runs here for real, with a stand-in ``jupyter`` (and ``python``) in a fake venv
that only records how it was called: no server starts.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _stub(path: Path, body: str) -> None:
    path.write_text(f"#!/usr/bin/env bash\n{body}\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_demo_opens_an_ignored_copy_and_leaves_the_tracked_notebooks_alone(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "notebooks", repo / "notebooks")
    shutil.copy(ROOT / "demo.sh", repo / "demo.sh")
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    _stub(bin_dir / "python", "exit 0")  # "torch and jupyterlab are installed"
    calls = tmp_path / "jupyter-args.txt"
    _stub(bin_dir / "jupyter", f'printf "%s\\n" "$@" > {calls}')
    before = {p.name: p.read_bytes() for p in (repo / "notebooks").glob("*.ipynb")}
    run = subprocess.run(["bash", str(repo / "demo.sh")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, check=False,
                         env={**os.environ, "VENV": str(tmp_path / "venv")})
    assert run.returncode == 0, run.stderr
    args = calls.read_text(encoding="utf-8").splitlines()
    assert "demo-notebooks/quickstart.ipynb" in args
    assert "--LabApp.default_url=/lab/tree/demo-notebooks/quickstart.ipynb" in args
    assert not any(a.startswith("notebooks/") for a in args)
    copies = {p.name: p.read_bytes() for p in (repo / "demo-notebooks").glob("*.ipynb")}
    assert copies == before  # the copies start as the tracked notebooks …
    assert {p.name: p.read_bytes() for p in (repo / "notebooks").glob("*.ipynb")} == before
    # … and a second start keeps the user's copy (their outputs and edits)
    (repo / "demo-notebooks" / "quickstart.ipynb").write_text("{}", encoding="utf-8")
    subprocess.run(["bash", str(repo / "demo.sh")], cwd=tmp_path, capture_output=True, timeout=60,
                   check=True, env={**os.environ, "VENV": str(tmp_path / "venv")})
    assert (repo / "demo-notebooks" / "quickstart.ipynb").read_text(encoding="utf-8") == "{}"


def test_the_copies_are_ignored_by_git():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    run = subprocess.run(["git", "check-ignore", "-q", "demo-notebooks/quickstart.ipynb"], cwd=ROOT,
                         capture_output=True, timeout=30, check=False)
    assert run.returncode == 0


def test_the_last_quickstart_cell_says_why_it_forgets():
    import json

    cells = json.loads((ROOT / "notebooks" / "quickstart.ipynb").read_text(encoding="utf-8"))["cells"]
    explained = "".join(cells[-2]["source"])
    assert cells[-2]["cell_type"] == "markdown" and "%allocconf forget" in "".join(cells[-1]["source"])
    assert "saved" in explained and "Skip this cell to keep them" in explained
