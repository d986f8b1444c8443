"""A FIFO (or a link to one) where we expect a file: refused at once with a message, never a hang.

Issue 22 items 8 and 9 (item 7, the rank channel, is in test_rank_channel_hostile.py). Opening
a FIFO for reading blocks until a writer comes; every reader goes through
``core/untrusted.read_regular_file``, which opens without blocking and refuses anything that is
not a regular file. Each case runs in a fresh interpreter with a timeout, so a regression fails
instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostile.bombs import valid_snapshot

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX only (FIFOs)")
TIMEOUT_S = 30


def _run(code: str, *args: str, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False, cwd=cwd,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        pytest.fail(f"blocked for more than {TIMEOUT_S} s on a FIFO")


@pytest.fixture(params=["fifo", "link-to-fifo"])
def fifo_path(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    fifo = tmp_path / "trace.pickle"
    os.mkfifo(fifo)
    if request.param == "fifo":
        return fifo
    link = tmp_path / "link.pickle"
    link.symlink_to(fifo)
    return link


@pytest.mark.parametrize("command", ["report", "simulate"])
def test_the_cli_refuses_a_fifo_given_as_a_snapshot(fifo_path: Path, command: str) -> None:
    done = _run("import sys\nfrom allocconf_widget.views.cli.main import main\n"
                "sys.exit(main(sys.argv[1:]))", command, str(fifo_path))
    assert done.returncode == 2, done.stderr
    assert "FIFO" in done.stderr and "not a regular file" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_magic_refuses_a_fifo_given_as_a_snapshot(fifo_path: Path) -> None:
    code = ("import sys\nfrom IPython.testing.globalipapp import start_ipython\n"
            "ip = start_ipython()\nip.run_line_magic('load_ext', 'allocconf_widget')\n"
            "ip.run_cell('%allocconf simulate ' + sys.argv[1])\nprint('DONE')")
    done = _run(code, str(fifo_path))
    out = done.stdout + done.stderr
    assert "DONE" in done.stdout, out
    assert "FIFO" in out and "Traceback" not in out


def test_a_fifo_at_the_settings_path_does_not_block_load_ext(tmp_path: Path) -> None:
    config = tmp_path / "config"
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("")
    env = {"XDG_CONFIG_HOME": str(config), "ALLOCCONF_PROJECT_DIR": str(project)}
    where = _run("from allocconf_widget.adapters.persist import project_settings_path\n"
                 "print(project_settings_path())", env=env)
    settings = Path(where.stdout.strip())
    settings.parent.mkdir(parents=True)
    os.mkfifo(tmp_path / "fifo")
    settings.symlink_to(tmp_path / "fifo")  # a link to a FIFO; a FIFO itself is the same path
    code = ("from IPython.testing.globalipapp import start_ipython\nip = start_ipython()\n"
            "ip.run_line_magic('load_ext', 'allocconf_widget')\nprint('LOADED')")
    done = _run(code, cwd=project, env=env)
    out = done.stdout + done.stderr
    assert "LOADED" in done.stdout, out
    assert "FIFO" in out and "Traceback" not in out


def test_a_fifo_sidecar_is_ignored_with_a_note(tmp_path: Path) -> None:
    snapshot = tmp_path / "run.pickle"
    snapshot.write_bytes(valid_snapshot())
    os.mkfifo(tmp_path / "run.json")
    done = _run("import sys\nfrom allocconf_widget.views.cli.main import main\n"
                "sys.exit(main(sys.argv[1:]))", "simulate", str(snapshot), "--json")
    assert done.returncode == 0, done.stderr
    assert "run.json" in done.stdout + done.stderr and "FIFO" in done.stdout + done.stderr
    json.loads(done.stdout)
