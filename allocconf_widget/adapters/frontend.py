"""Which front end runs this kernel, and how to restart it there.

Detection follows docs/internals/notebook_facts.md §9: Colab by ``google.colab`` in ``sys.modules``
(or its env vars), VS Code by ``VSCODE_PID``/``VSCODE_CWD`` or the ``__vsc_ipynb_file__`` its
notebooks put in the user namespace (also where the kernel runs in WSL or a container, which
lack the variables), a Jupyter server by
``JPY_SESSION_NAME``/``JPY_PARENT_PID`` with a ZMQ shell, terminal IPython by
its shell class. JupyterLab and Notebook 7 cannot be told apart from the kernel
(one server serves both), and need not be: both restart through the server.

Restarting is never done implicitly: only :func:`restart` does it, and only
the magic's ``restart`` command and the panel's Restart button call it.
"""

from __future__ import annotations

import enum
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REFUSAL_WAIT_S = 1.5
"""How long the server may take to say whether it takes a ``POST`` from this kernel: either
answer comes back in milliseconds."""


class Frontend(enum.Enum):
    """Where the kernel's output is shown."""

    COLAB = "Google Colab"
    JUPYTER = "Jupyter (Lab / Notebook 7)"
    VSCODE = "VS Code"
    HEADLESS = "a headless runner (nbclient / papermill)"
    TERMINAL = "terminal IPython"
    PLAIN = "plain Python"

    @property
    def shows_widgets(self) -> bool:
        """Whether output goes to a page that draws this package's ipywidgets.

        A terminal or a plain interpreter shows a widget as its repr, so the views print text
        there instead of building widgets. So do VS Code's notebooks, which do not draw them
        (:attr:`why_no_widgets`). A headless runner (nbclient, papermill) counts as a
        notebook: it saves the widget state into the notebook it writes.
        """
        return self not in (Frontend.TERMINAL, Frontend.PLAIN, Frontend.VSCODE)

    @property
    def why_no_widgets(self) -> str | None:
        """One line saying why this front end gets text in place of the widgets (None where
        it shows them)."""
        if self is Frontend.VSCODE:
            return ("No widgets in VS Code's notebooks: there ipywidgets 8.1.9 draws nothing "
                    "(microsoft/vscode-jupyter#17504) and 7.7 hangs (#17231); JupyterLab, Jupyter "
                    "Notebook and Colab show the panel")
        if not self.shows_widgets:
            return "No widgets in a terminal"
        return None


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
    if "__vsc_ipynb_file__" in (getattr(shell, "user_ns", None) or {}):
        return Frontend.VSCODE
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


def restart(frontend: Frontend | None = None, *, _kill: Any = os.kill,
            notify: Callable[[str], None] | None = None) -> RestartOutcome:
    """Restart the kernel the way the front end supports; returns what happened.

    Colab: ending the process makes Colab restart the runtime (the usual
    ``os.kill(os.getpid(), 9)``; the notebook stays open). Jupyter server
    (JupyterLab, Notebook 7): the REST call ``POST /api/kernels/<id>/restart`` (a
    clean restart, no "kernel died" dialog), made by a process of its own once the
    cell that asked has been answered (``adapters/restart_helper.py`` says why), when
    the server can be found; else the kernel ends itself and the server's restarter
    starts a new one. A server that refuses our requests (HTTP 403: a server without
    a token checks XSRF, which a request from the kernel cannot pass) is detected
    within :data:`REFUSAL_WAIT_S` and the kernel falls back to ending itself at once,
    saying so. Classic Notebook 6: its page restarts the kernel. VS Code and
    terminal IPython: instructions only, because VS Code does not bring a dead
    kernel back by itself. ``notify`` gets a line before the server is asked.
    """
    frontend = frontend or detect_frontend()
    if frontend in (Frontend.JUPYTER, Frontend.HEADLESS) and _classic_notebook_hosts_this_kernel():
        return _restart_via_page()
    if frontend is Frontend.COLAB:
        threading.Timer(0.5, _kill, args=(os.getpid(), signal.SIGKILL)).start()
        return RestartOutcome(frontend, True, "os.kill", "Restarting the Colab runtime: wait for "
                              "'Connected', then run the notebook from the top.")
    if frontend is Frontend.JUPYTER:
        outcome = _restart_via_server(notify=notify, kill=_kill)
        if outcome is not None:
            return outcome
        return _self_restart(frontend, kill=_kill)
    if frontend is Frontend.HEADLESS:
        return _self_restart(frontend, kill=_kill)
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
    """Running Jupyter servers: jupyter_server's (Lab, Notebook 7) and classic Notebook 6's
    (``notebook.notebookapp``, Colab's generation: its ``nbserver-*.json`` files)."""
    found: list[dict[str, Any]] = []
    for module in ("jupyter_server.serverapp", "notebook.notebookapp"):
        try:
            lister = importlib.import_module(module).list_running_servers
        except (ImportError, AttributeError):
            continue
        try:
            found += [server for server in lister() if server not in found]
        except (OSError, ValueError):
            continue
    return found


def _restart_via_server(*, notify: Callable[[str], None] | None = None,
                        kill: Any = os.kill) -> RestartOutcome | None:
    kernel = _kernel_id()
    if kernel is None:
        return None
    for server in _servers():
        base = str(server.get("url", "")).rstrip("/")
        token = str(server.get("token", ""))
        if not base or not _server_has_kernel(base, token, kernel):
            continue
        if notify is not None:
            notify("Asking the Jupyter server to restart this kernel…")
        refusal = _post_refusal(base, token)
        if refusal is None and _start_restart_helper(f"{base}/api/kernels/{kernel}/restart", token):
            return RestartOutcome(Frontend.JUPYTER, True, "server",
                                  "Restarting the kernel through the Jupyter server as soon as this "
                                  "cell has finished; the page then shows the new kernel idle.")
        fallback = _self_restart(Frontend.JUPYTER, kill=kill)
        if refusal is None:
            return RestartOutcome(Frontend.JUPYTER, fallback.started, "self (no helper process)",
                                  "Could not start the process that restarts the kernel through "
                                  f"the server. Falling back: {fallback.message}")
        return RestartOutcome(
            Frontend.JUPYTER, fallback.started, f"self (server refused: {refusal})",
            f"The Jupyter server refused the restart request ({refusal}; a server started without "
            "a token checks XSRF, which a request from the kernel cannot pass). Falling back: "
            f"{fallback.message}")
    return None


#: a kernel id no server runs: a request for it tells whether the server takes our POSTs
_NO_KERNEL = "00000000-0000-0000-0000-000000000000"


def _post_refusal(base: str, token: str) -> str | None:
    """Why the server would refuse a ``POST`` from this kernel, or ``None`` when it takes one.

    Asks to interrupt a kernel no server runs: a server that takes the request answers 404
    (no such kernel) and does nothing; one that refuses it (a token-less server checks XSRF,
    which a request from the kernel cannot pass) answers 403, in milliseconds either way. So
    the cell can say that the restart will not happen before it ends.
    """
    try:
        urllib.request.urlopen(_request(f"{base}/api/kernels/{_NO_KERNEL}/interrupt", token, "POST"),
                               timeout=REFUSAL_WAIT_S).close()
    except urllib.error.HTTPError as exc:
        return None if exc.code == 404 else f"HTTP {exc.code} {exc.reason}"
    except OSError as exc:
        return f"the request failed: {exc}"
    return None


#: helper processes started by this kernel, kept referenced (they outlive it on purpose)
_HELPERS: list[subprocess.Popen[bytes]] = []


def _start_restart_helper(url: str, token: str, *, ready_wait: float = 20.0) -> bool:
    """Start ``adapters/restart_helper.py``, which restarts this kernel once the request that
    asked has been answered (see its docstring); whether it got ready within ``ready_wait``."""
    try:
        from ipykernel.connect import get_connection_file

        connection_file = get_connection_file()
    except (ImportError, RuntimeError):
        return False
    from allocconf_widget.adapters import restart_helper

    env = dict(os.environ, **{restart_helper.TOKEN_VARIABLE: token})
    try:
        process = subprocess.Popen(
            [sys.executable, restart_helper.__file__, connection_file, url, str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, start_new_session=True)
    except OSError:
        return False
    _HELPERS.append(process)
    line: list[bytes] = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline() if process.stdout
                                                         else b""), daemon=True)
    reader.start()
    reader.join(ready_wait)
    if line and line[0].strip() == b"ready":
        return True
    process.kill()
    return False


#: how long a restart may take before an interrupt counts again (a restart takes seconds)
RESTART_GRACE_S = 30.0


def quiet_interrupts_while_restarting(grace: float = RESTART_GRACE_S) -> bool:
    """Swallow SIGINT for ``grace`` seconds: the kernel is being restarted.

    jupyter_client interrupts a kernel before it restarts it (``shutdown_kernel`` calls
    ``interrupt_kernel`` first). The page of a classic Notebook 6 restarts the kernel while
    the cell that asked for it may still run, so that interrupt ended the cell with a
    KeyboardInterrupt traceback, saved in the notebook, after a restart that worked. After
    ``grace`` seconds the previous handler runs again (ipykernel also restores its own when
    the cell ends).
    Only the main thread can install a handler; returns whether it did.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.getsignal(signal.SIGINT)
    deadline = time.monotonic() + grace

    def handler(signum: int, frame: Any) -> None:
        if time.monotonic() < deadline:
            return
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    return True


def _classic_servers() -> list[dict[str, Any]]:
    """Running classic Notebook 6 servers (``notebook.notebookapp``; Notebook 7 has none)."""
    try:
        from notebook.notebookapp import list_running_servers  # type: ignore[import-not-found]
    except ImportError:
        return []
    try:
        return list(list_running_servers())
    except (OSError, ValueError):
        return []


def _classic_notebook_hosts_this_kernel() -> bool:
    """Whether a classic Notebook 6 server runs this kernel (its page restarts it best)."""
    kernel = _kernel_id()
    if kernel is None:
        return False
    return any(_server_has_kernel(str(s.get("url", "")).rstrip("/"), str(s.get("token", "")), kernel)
               for s in _classic_servers() if s.get("url"))


_PAGE_RESTART_JS = (
    "if (window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel) "
    "{ Jupyter.notebook.kernel.restart(); }")


def _restart_via_page() -> RestartOutcome:
    """Classic Notebook 6: let the page restart its kernel, as Kernel > Restart does.

    A kernel that ends itself there leaves the page with a "kernel died" dialog and a
    "Dead kernel" badge although the server started a new kernel; a REST request from the
    kernel cannot pass the server's XSRF check. The page's own ``kernel.restart()`` passes
    it and walks the page through "restarting" to "idle", so what it shows is the truth.
    """
    from IPython.display import Javascript, display

    quiet_interrupts_while_restarting()
    display(Javascript(_PAGE_RESTART_JS))
    return RestartOutcome(Frontend.JUPYTER, True, "page",
                          "Asked this notebook's page to restart the kernel (as Kernel > Restart "
                          "does); if it has not restarted within a few seconds, use that menu.")


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


def _self_restart(frontend: Frontend, *, kill: Any = os.kill) -> RestartOutcome:
    """End this kernel so the server's restarter starts a fresh one (at once, never later)."""
    shell = _shell()
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return RestartOutcome(frontend, False, "manual", "Restart the kernel from the Kernel menu.")
    if frontend is Frontend.JUPYTER:
        # ipykernel 7's do_shutdown is a coroutine that only the kernel's own loop can run, and
        # shell.ask_exit() waits for the next cell: the kernel then died minutes later, at the
        # user's next action. Ending the process now lets the server's restarter start a new one.
        threading.Timer(0.5, kill, args=(os.getpid(), signal.SIGKILL)).start()
        return RestartOutcome(frontend, True, "self", "this kernel ends now and the server starts "
                              "a new one (Jupyter may say the kernel 'appears to have died' and "
                              "restarts it automatically).")
    result = kernel.do_shutdown(restart=True)  # the server's auto-restarter brings a fresh kernel
    if hasattr(result, "close"):  # a coroutine on kernels where do_shutdown is async
        result.close()
        shell.ask_exit()
    return RestartOutcome(frontend, True, "self", "The kernel is shutting down; the server "
                          "restarts it (you may see a 'kernel restarting' notice).")


# ----------------------------------------------------------------- download links


@dataclass(frozen=True)
class DownloadLink:
    """How the user gets an exported file: a URL to click, or a download already started."""

    url: str | None
    note: str | None = None


def download_link(path: Path, frontend: Frontend | None = None) -> DownloadLink:
    """A link that downloads ``path`` from this front end, when it has one.

    Jupyter: ``<base_url>files/<path relative to the server's root>`` of the server that
    runs this kernel (what IPython's ``FileLink`` points at, but absolute, so it also works
    inside a widget). Colab: ``google.colab.files.download`` starts the browser's download
    (not verifiable outside Colab). Elsewhere: no link, the path is the answer.
    """
    frontend = frontend or detect_frontend()
    if frontend is Frontend.COLAB:
        try:
            from google.colab import files  # type: ignore[import-not-found]

            files.download(os.fspath(path))
        except Exception as exc:  # not in Colab after all, or the browser refused
            return DownloadLink(None, f"download not started ({type(exc).__name__})")
        return DownloadLink(None, "download started in your browser")
    if frontend not in (Frontend.JUPYTER, Frontend.HEADLESS):
        return DownloadLink(None)
    # Classic Notebook 6 sets no JPY_SESSION_NAME, so its kernels look headless: there, only a
    # server that runs this very kernel gets a link (an nbclient run gets none).
    kernel = _kernel_id() if frontend is Frontend.HEADLESS else None
    if frontend is Frontend.HEADLESS and kernel is None:
        return DownloadLink(None)
    resolved = path.resolve()
    for server in _servers():
        root = server.get("root_dir") or server.get("notebook_dir")
        if not root:
            continue
        if kernel is not None and not _server_has_kernel(str(server.get("url", "")).rstrip("/"),
                                                         str(server.get("token", "")), kernel):
            continue
        try:
            relative = resolved.relative_to(Path(str(root)).resolve())
        except ValueError:
            continue
        base = str(server.get("base_url") or "/")
        base = base if base.endswith("/") else base + "/"
        return DownloadLink(f"{base}files/{urllib.parse.quote(relative.as_posix())}")
    return DownloadLink(None)
