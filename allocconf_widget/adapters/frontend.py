"""Which front end runs this kernel, and how to restart it there.

Detection follows docs/internals/notebook_facts.md §9: Colab by ``google.colab`` in ``sys.modules``
(or its env vars), VS Code by ``VSCODE_PID``/``VSCODE_CWD``, a Jupyter server by
``JPY_SESSION_NAME``/``JPY_PARENT_PID`` with a ZMQ shell, terminal IPython by
its shell class. JupyterLab and Notebook 7 cannot be told apart from the kernel
(one server serves both), and need not be: both restart through the server.

Restarting is never done implicitly: only :func:`restart` does it, and only
the magic's ``restart`` command and the panel's Restart button call it.
"""

from __future__ import annotations

import enum
import json
import os
import signal
import sys
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class Frontend(enum.Enum):
    """Where the kernel's output is shown."""

    COLAB = "Google Colab"
    JUPYTER = "Jupyter (Lab / Notebook 7)"
    VSCODE = "VS Code"
    HEADLESS = "a headless runner (nbclient / papermill)"
    TERMINAL = "terminal IPython"
    PLAIN = "plain Python"


def detect_frontend(environ: dict[str, str] | None = None, modules: Any = None) -> Frontend:
    """Best guess at the front end; cheap and side-effect free."""
    env = os.environ if environ is None else environ
    mods = sys.modules if modules is None else modules
    if "google.colab" in mods or "COLAB_RELEASE_TAG" in env or "COLAB_NOTEBOOK_ID" in env:
        return Frontend.COLAB
    if "VSCODE_PID" in env or "VSCODE_CWD" in env:
        return Frontend.VSCODE
    shell = _shell(mods)
    if shell is None:
        return Frontend.PLAIN
    if type(shell).__name__ == "TerminalInteractiveShell":
        return Frontend.TERMINAL
    if "JPY_SESSION_NAME" in env:
        return Frontend.JUPYTER
    if "JPY_PARENT_PID" in env:
        return Frontend.HEADLESS
    return Frontend.JUPYTER if getattr(shell, "kernel", None) is not None else Frontend.TERMINAL


def _shell(modules: Any = None) -> Any:
    ipython = (sys.modules if modules is None else modules).get("IPython")
    if ipython is None:
        return None
    return ipython.get_ipython()


@dataclass(frozen=True)
class RestartOutcome:
    """What a restart request did, and what the user sees or must do."""

    frontend: Frontend
    started: bool
    how: str
    message: str


def restart(frontend: Frontend | None = None, *, _kill: Any = os.kill) -> RestartOutcome:
    """Restart the kernel the way the front end supports; returns what happened.

    Colab: ending the process makes Colab restart the runtime (the usual
    ``os.kill(os.getpid(), 9)``; the notebook stays open). Jupyter server:
    the REST call ``POST /api/kernels/<id>/restart`` (a clean restart, no
    "kernel died" dialog) when the server can be found, else the kernel asks
    to be restarted itself. VS Code and terminal IPython: instructions only,
    because VS Code does not bring a dead kernel back by itself.
    """
    frontend = frontend or detect_frontend()
    if frontend is Frontend.COLAB:
        threading.Timer(0.5, _kill, args=(os.getpid(), signal.SIGKILL)).start()
        return RestartOutcome(frontend, True, "os.kill", "Restarting the Colab runtime: wait for "
                              "'Connected', then run the notebook from the top.")
    if frontend is Frontend.JUPYTER:
        outcome = _restart_via_server()
        if outcome is not None:
            return outcome
        return _self_restart(frontend)
    if frontend is Frontend.HEADLESS:
        return _self_restart(frontend)
    if frontend is Frontend.VSCODE:
        return RestartOutcome(frontend, False, "manual", "Click 'Restart' in the notebook toolbar "
                              "(VS Code does not restart a kernel that exits by itself).")
    return RestartOutcome(frontend, False, "manual",
                          "Quit this IPython/Python session and start a new one; the saved settings "
                          "are applied by %load_ext allocconf_widget.")


def _kernel_id() -> str | None:
    try:
        from ipykernel.connect import get_connection_file
    except ImportError:
        return None
    try:
        name = Path(get_connection_file()).stem
    except RuntimeError:
        return None
    return name[len("kernel-"):] if name.startswith("kernel-") else None


def _servers() -> list[dict[str, Any]]:
    try:
        from jupyter_server.serverapp import list_running_servers
    except ImportError:
        return []
    try:
        return list(list_running_servers())
    except (OSError, ValueError):
        return []


def _restart_via_server() -> RestartOutcome | None:
    kernel = _kernel_id()
    if kernel is None:
        return None
    for server in _servers():
        base = str(server.get("url", "")).rstrip("/")
        token = str(server.get("token", ""))
        if not base or not _server_has_kernel(base, token, kernel):
            continue
        threading.Thread(target=_post_restart, args=(base, token, kernel), daemon=True,
                         name="allocconf-restart").start()
        return RestartOutcome(Frontend.JUPYTER, True, "server",
                              "Restarting the kernel through the Jupyter server…")
    return None


def _request(url: str, token: str, method: str = "GET") -> urllib.request.Request:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if token:
        req.add_header("Authorization", f"token {token}")
    return req


def _server_has_kernel(base: str, token: str, kernel: str) -> bool:
    try:
        with urllib.request.urlopen(_request(f"{base}/api/kernels/{kernel}", token), timeout=2) as r:
            return bool(json.loads(r.read()).get("id") == kernel)
    except (OSError, ValueError):
        return False


def _post_restart(base: str, token: str, kernel: str) -> None:
    try:
        urllib.request.urlopen(_request(f"{base}/api/kernels/{kernel}/restart", token, "POST"),
                               timeout=30).close()
    except OSError:
        _self_restart(Frontend.JUPYTER)


def _self_restart(frontend: Frontend) -> RestartOutcome:
    shell = _shell()
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return RestartOutcome(frontend, False, "manual", "Restart the kernel from the Kernel menu.")
    result = kernel.do_shutdown(restart=True)  # the server's auto-restarter brings a fresh kernel
    if hasattr(result, "close"):  # a coroutine on kernels where do_shutdown is async
        result.close()
        shell.ask_exit()
    return RestartOutcome(frontend, True, "self", "The kernel is shutting down; the server "
                          "restarts it (you may see a 'kernel restarting' notice).")
