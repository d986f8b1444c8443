"""``allocconf`` is on the PATH of a terminal in the JupyterLab that ``./demo.sh`` starts.

The README's command lines (``allocconf simulate …``) are typed into File > New > Terminal of
that JupyterLab; only ``.venv/bin/allocconf`` worked there, because the script ran the venv's
``jupyter`` without putting the venv on the PATH. Here ``demo.sh`` starts a real JupyterLab
(from a stand-in venv whose programs hand over to this test environment's), a terminal is
opened through the server's API, and a command typed into it over the terminal's websocket,
as the page's terminal does. The test's own PATH holds no venv.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("jupyterlab")
pytest.importorskip("terminado")

pytestmark = [pytest.mark.slow, pytest.mark.jupyterlab]
ROOT = Path(__file__).resolve().parents[2]


def _program(path: Path, command: str) -> None:
    path.write_text(f'#!/bin/sh\nexec {command} "$@"\n', encoding="utf-8")
    path.chmod(0o755)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _type_in_a_terminal(port: int, line: str, until: str, timeout: float = 30.0) -> str:
    from tornado.websocket import websocket_connect

    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/terminals", method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=10) as reply:
        name = json.loads(reply.read())["name"]
    ws = await websocket_connect(f"ws://127.0.0.1:{port}/terminals/websocket/{name}")
    await ws.write_message(json.dumps(["set_size", 24, 200, 600, 800]))
    await ws.write_message(json.dumps(["stdin", line + "\r"]))
    seen = ""
    deadline = time.monotonic() + timeout
    while until not in seen and time.monotonic() < deadline:
        try:
            message = await asyncio.wait_for(ws.read_message(), timeout=deadline - time.monotonic())
        except asyncio.TimeoutError:
            break
        if message is None:
            break
        kind, *payload = json.loads(message)
        if kind == "stdout":
            seen += payload[0]
    ws.close()
    return seen


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_allocconf_runs_in_a_terminal_of_the_demo_jupyterlab(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "notebooks", repo / "notebooks")
    shutil.copy(ROOT / "demo.sh", repo / "demo.sh")
    venv = repo / ".venv"
    (venv / "bin").mkdir(parents=True)
    here = Path(sys.executable)
    _program(venv / "bin" / "python", str(here))
    _program(venv / "bin" / "jupyter", f"{here} -m jupyter")
    _program(venv / "bin" / "allocconf", f"{here} -m allocconf_widget")
    state = tmp_path / "state"
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",  # no venv: only demo.sh may add one
        "HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(ROOT),
        "SHELL": "/bin/bash",
        "JUPYTER_CONFIG_DIR": str(state / "config"), "JUPYTER_DATA_DIR": str(state / "data"),
        "JUPYTER_RUNTIME_DIR": str(state / "runtime"), "JUPYTER_PLATFORM_DIRS": "1",
        "JUPYTERLAB_SETTINGS_DIR": str(state / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(state / "workspaces"),
    }
    (tmp_path / "home").mkdir()
    port = _free_port()
    server = subprocess.Popen(
        ["bash", str(repo / "demo.sh"), f"--port={port}", "--port-retries=0", "--no-browser",
         "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
         "--LabApp.news_url=None"],
        cwd=repo, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, "demo.sh's JupyterLab exited"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "demo.sh's JupyterLab did not start"
                time.sleep(0.2)
        # a loop of its own in a thread of its own: Playwright's sync API, open in a session
        # fixture of the browser tests, keeps an event loop running on this thread, where
        # asyncio.run() refuses to start one
        with ThreadPoolExecutor(1) as pool:
            seen = pool.submit(asyncio.run, _type_in_a_terminal(
                port, "command -v allocconf; allocconf check expandable_segments:True; echo DONE-$((40+2))",
                until="DONE-42")).result()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    assert f"{venv}/bin/allocconf" in seen, seen
    assert "expandable_segments:True" in seen.split("command -v allocconf", 1)[-1], seen
    assert "command not found" not in seen, seen
