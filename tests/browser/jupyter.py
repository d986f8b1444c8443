"""Drive a real JupyterLab / Notebook 7 in headless Debian Chromium (library, not tests).

Pieces, bottom-up:

* :func:`start_jupyter_server` -> :class:`JupyterServer`: ``python -m jupyterlab`` on
  127.0.0.1, a free port, a temporary root, no token, no xsrf check, temporary
  config/data/runtime/workspace/IPython/XDG dirs, app exposed as ``window.jupyterapp``.
  The same server also serves Notebook 7 pages (``/notebooks/<path>``).
* :func:`launch_chromium` -> Playwright ``Browser`` (``/usr/bin/chromium``, headless).
* :func:`open_notebook` -> :class:`NotebookUI`: open a notebook in ``ui="lab"`` or
  ``ui="notebook"`` (Notebook 7), wait for an idle kernel, run all cells / one cell,
  wait until no prompt shows ``[*]:``, and run code *in the page's own kernel* from the
  test (:meth:`NotebookUI.execute`, :meth:`NotebookUI.value`).
* Widget helpers keyed on ``widget.add_class("allocconf-<name>")``:
  :func:`find_widget`, :func:`set_slider`, :func:`click_button`, :func:`widget_text`,
  :func:`set_toggle`, :func:`choose_dropdown`, :func:`type_text`.
* :func:`screenshot` into ``artifacts/screenshots/`` (or ``$ALLOCCONF_ARTIFACTS``).

How the test reaches the page's kernel: the server writes ``kernel-<id>.json`` into
its (temporary, known) runtime dir; we look the kernel id up in ``/api/sessions`` by
notebook path and connect a ``jupyter_client`` client to that file. The browser and
the test are then two clients of one kernel: iopub is broadcast, but each side only
reads replies to its own requests. See ``docs/testing.md`` for an example test.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from tests.kernel.kernels import (
    ExecResult,
    KernelConnection,
    clean_kernel_env,
    filter_kernel_stderr,
    write_python3_kernelspec,
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Locator, Page, Playwright

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("ALLOCCONF_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = (
    "--no-sandbox",  # we run as root in CI
    "--disable-gpu",
    "--disable-dev-shm-usage",
    # the machine has no network but the package mirrors: without these Chromium
    # keeps trying (and failing) to reach Google's services
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--disable-default-apps",
    "--disable-extensions",
)
BUSY_PROMPT = "[*]:"
UI = Literal["lab", "notebook"]
T = TypeVar("T")


# ----------------------------------------------------------------- small utilities
def artifacts_dir() -> Path:
    """``$ALLOCCONF_ARTIFACTS`` or ``<repo>/artifacts`` (git-ignored); created on demand."""
    path = Path(os.environ.get("ALLOCCONF_ARTIFACTS") or REPO_ROOT / "artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")[:150] or "unnamed"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until(
    predicate: Callable[[], T], *, timeout: float, interval: float = 0.1, what: str = "condition"
) -> T:
    """Poll ``predicate`` until it returns something truthy; return that, or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:
            last_exc = exc
        if time.monotonic() > deadline:
            msg = f"timed out after {timeout:.0f} s waiting for {what}"
            if last_exc is not None:
                msg += f" (last error: {last_exc!r})"
            raise TimeoutError(msg)
        time.sleep(interval)


def chromium_missing_reason() -> str | None:
    """Why browser tests cannot run here, or ``None`` when they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright (Python) is not installed: pip install -e '.[test]'"
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        return f"{CHROMIUM} not found: apt-get install -y chromium (or set ALLOCCONF_CHROMIUM)"
    return None


def write_notebook(directory: Path, name: str, cells: Sequence[Any]) -> Path:
    """Write ``<directory>/<name>`` as a ``python3`` notebook.

    ``cells``: strings are code cells; a string starting with ``"md:"`` is a markdown
    cell; ``nbformat`` cell objects are used as they are.
    """
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for cell in cells:
        if isinstance(cell, str):
            if cell.startswith("md:"):
                nb.cells.append(nbformat.v4.new_markdown_cell(cell[3:]))
            else:
                nb.cells.append(nbformat.v4.new_code_cell(cell))
        else:
            nb.cells.append(cell)
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


# ----------------------------------------------------------------- the server
@dataclass
class JupyterServer:
    """A running ``jupyter lab`` server (see :func:`start_jupyter_server`)."""

    root_dir: Path  # notebooks live here (server's root_dir)
    state_dir: Path  # config/data/runtime/... dirs, the log
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str]
    startup_s: float = 0.0
    _connections: list[KernelConnection] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def runtime_dir(self) -> Path:
        return self.state_dir / "runtime"

    def url(self, path: str = "") -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    # ------------------------------------------------------------- REST
    def api(self, method: str, path: str, body: Any = None, *, timeout: float = 15.0) -> Any:
        """Call the REST API (``path`` like ``"api/sessions"``); JSON in, JSON out."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url(path), data=data, method=method)
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def sessions(self) -> list[dict[str, Any]]:
        sessions: list[dict[str, Any]] = self.api("GET", "api/sessions")
        return sessions

    def session_for(self, path: str) -> dict[str, Any] | None:
        for s in self.sessions():
            if s.get("path") == path or s.get("notebook", {}).get("path") == path:
                return s
        return None

    def kernel_id_for(self, path: str, *, timeout: float = 60.0) -> str:
        """The id of the kernel the server runs for notebook ``path`` (relative to root)."""
        session = wait_until(lambda: self.session_for(path), timeout=timeout, what=f"a session for {path}")
        assert session is not None
        kernel_id: str = session["kernel"]["id"]
        return kernel_id

    def kernel_model(self, kernel_id: str) -> dict[str, Any]:
        """``/api/kernels/<id>``: ``execution_state``, ``connections``, ..."""
        model: dict[str, Any] = self.api("GET", f"api/kernels/{kernel_id}")
        return model

    def connect_kernel(self, kernel_id: str) -> KernelConnection:
        """A ``jupyter_client`` connection to one of this server's kernels (closed at stop)."""
        cf = self.runtime_dir / f"kernel-{kernel_id}.json"
        wait_until(cf.exists, timeout=30, what=f"connection file {cf}")
        conn = KernelConnection.from_connection_file(cf, name=f"kernel {kernel_id[:8]}")
        self._connections.append(conn)
        return conn

    def close_connections(self) -> None:
        while self._connections:
            self._connections.pop().close()

    def shutdown_all_sessions(self) -> None:
        """Close every notebook session (and its kernel): a clean slate between tests."""
        self.close_connections()
        with contextlib.suppress(Exception):
            for s in self.sessions():
                with contextlib.suppress(Exception):
                    self.api("DELETE", f"api/sessions/{s['id']}", timeout=30)

    # ------------------------------------------------------------- files and logs
    def write_notebook(self, name: str, cells: Sequence[Any]) -> str:
        """Write a notebook under the server root; return its path relative to the root."""
        write_notebook(self.root_dir, name, cells)
        return name

    def log_text(self) -> str:
        """The server's log (kernel stderr included) without the harmless TCP warnings."""
        try:
            return filter_kernel_stderr(self.log_path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            return ""

    def stop(self, *, keep_log_as: str | None = "jupyter-server.log") -> None:
        """SIGTERM the server's process group (its kernels go with it); keep the log."""
        self.close_connections()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        # kernels were children in the same group; make sure none survived
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if keep_log_as:
            logs = artifacts_dir() / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                shutil.copyfile(self.log_path, logs / keep_log_as)


def start_jupyter_server(
    root: Path,
    *,
    timeout: float = 120.0,
    extra_args: Sequence[str] = (),
    extra_env: dict[str, str] | None = None,
    check_xsrf: bool = False,
) -> JupyterServer:
    """Start ``python -m jupyterlab`` for tests under ``root`` and wait for ``/api/status``.

    ``check_xsrf=True``: a token-less server that still checks XSRF (the browser passes,
    a plain request from the kernel gets 403), the set-up that refused ``%allocconf restart``.

    Notebooks go in ``root/"notebooks"``; everything else Jupyter, IPython and XDG
    would read or write goes under ``root/"state"``. Kernels inherit a clean
    environment (no ``PYTORCH_*ALLOC_CONF``, ``XDG_CONFIG_HOME`` under ``state``);
    ``extra_env`` is added on top.
    """
    root = root.resolve()
    root_dir = root / "notebooks"
    state = root / "state"
    dirs = {k: state / k for k in ("config", "data", "runtime", "workspaces", "settings", "ipython", "xdg")}
    for d in (root_dir, *dirs.values()):
        d.mkdir(parents=True, exist_ok=True)
    write_python3_kernelspec(dirs["data"])
    # No news feed or update check: no network here, and their toasts cover widgets.
    (dirs["config"] / "jupyter_server_config.json").write_text(
        json.dumps(
            {
                "LabApp": {
                    "news_url": None,
                    "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
                }
            }
        ),
        encoding="utf-8",
    )
    # ... and the "get notified about Jupyter news?" toast is a front-end setting.
    notif = dirs["settings"] / "@jupyterlab" / "apputils-extension"
    notif.mkdir(parents=True, exist_ok=True)
    (notif / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}), encoding="utf-8"
    )
    env = clean_kernel_env(dirs["xdg"], ipython_dir=dirs["ipython"], extra=extra_env)
    env.update(
        JUPYTER_CONFIG_DIR=os.fspath(dirs["config"]),
        JUPYTER_DATA_DIR=os.fspath(dirs["data"]),
        JUPYTER_RUNTIME_DIR=os.fspath(dirs["runtime"]),
        JUPYTER_PLATFORM_DIRS="1",
        JUPYTERLAB_SETTINGS_DIR=os.fspath(dirs["settings"]),
        JUPYTERLAB_WORKSPACES_DIR=os.fspath(dirs["workspaces"]),
    )
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        "--allow-root",
        "--IdentityProvider.token=",
        "--ServerApp.password=",
        f"--ServerApp.disable_check_xsrf={not check_xsrf}",
        f"--ServerApp.root_dir={root_dir}",
        "--ServerApp.terminals_enabled=False",
        "--LabApp.expose_app_in_browser=True",
        f"--LabApp.workspaces_dir={dirs['workspaces']}",
        f"--LabApp.user_settings_dir={dirs['settings']}",
        *extra_args,
    ]
    log_path = state / "server.log"
    t0 = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=root_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop() signals server + kernels
        )
    server = JupyterServer(root_dir, state, port, proc, log_path, env)

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{server.log_text()[-4000:]}")
        try:
            server.api("GET", "api/status", timeout=2)
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False
        return True

    try:
        wait_until(ready, timeout=timeout, interval=0.1, what="jupyter lab /api/status")
    except BaseException:
        server.stop(keep_log_as="jupyter-server-failed-start.log")
        raise
    server.startup_s = time.monotonic() - t0
    return server


# ----------------------------------------------------------------- the browser
def launch_chromium(
    playwright: Playwright, *, headless: bool = True, extra_args: Sequence[str] = ()
) -> Browser:
    """Debian's Chromium through Playwright (no ``playwright install``: ``executable_path``)."""
    return playwright.chromium.launch(
        executable_path=CHROMIUM,
        headless=headless,
        args=[*CHROMIUM_ARGS, *extra_args],
    )


def new_page(browser: Browser, *, width: int = 1280, height: int = 900) -> Page:
    """A page in a fresh context (own cookies and storage); ``page.context.close()`` ends it."""
    context: BrowserContext = browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(30_000)
    return context.new_page()


def screenshot(page: Page, name: str, *, full_page: bool = False) -> Path:
    """Save a PNG to ``<artifacts>/screenshots/<name>.png`` and return its path."""
    path = artifacts_dir() / "screenshots" / f"{safe_name(name)}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=os.fspath(path), full_page=full_page)
    return path


# ----------------------------------------------------------------- a notebook page
_JS_LAB_PANEL = """
(path) => {
  const app = window.jupyterapp;
  if (!app) return null;
  for (const w of app.shell.widgets('main')) {
    if (w.context && w.context.path === path) return w;
  }
  return null;
}
"""

_JS_LAB_KERNEL_IDLE = f"""
(path) => {{
  const w = ({_JS_LAB_PANEL})(path);
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.status === 'idle' && k.connectionStatus === 'connected';
}}
"""

# Fire and forget: the promise of commands.execute resolves only when the run ends,
# and page.evaluate would wait for it.
_JS_LAB_COMMAND = f"""
([path, command, index]) => {{
  const app = window.jupyterapp;
  const w = ({_JS_LAB_PANEL})(path);
  if (!w) throw new Error('notebook ' + path + ' is not open');
  app.shell.activateById(w.id);
  if (index !== null) {{
    w.content.activeCellIndex = index;
    w.content.deselectAll();
  }}
  app.commands.execute(command);
  return true;
}}
"""

_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^-{20,}\s*$", re.MULTILINE)


@dataclass
class NotebookUI:
    """One notebook open in a page, in JupyterLab (``ui="lab"``) or Notebook 7."""

    page: Page
    server: JupyterServer
    path: str
    ui: UI
    _kernel: KernelConnection | None = field(default=None, repr=False)

    # ------------------------------------------------------------- DOM
    @property
    def notebook(self) -> Locator:
        """The notebook's root element (``.jp-Notebook``)."""
        return self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").first

    def cells(self) -> Locator:
        return self.notebook.locator(".jp-Cell")

    def cell(self, index: int) -> Locator:
        """Cell ``index`` (0-based, all cell types); a scope for the widget helpers."""
        return self.cells().nth(index)

    def code_cell_prompts(self) -> list[str]:
        """Input prompts of the code cells, e.g. ``["[1]:", "[*]:", "[ ]:"]``."""
        texts: list[str] = self.notebook.locator(".jp-CodeCell .jp-InputPrompt").evaluate_all(
            "els => els.map(e => e.textContent.trim())"
        )
        return texts

    def is_busy(self) -> bool:
        """Some code cell shows ``[*]:`` (running or queued)."""
        return BUSY_PROMPT in self.code_cell_prompts()

    def output_text(self, index: int) -> str:
        """The visible text of cell ``index``'s output area."""
        return self.cell(index).locator(".jp-OutputArea").inner_text()

    def errors(self) -> list[str]:
        """Texts of outputs that look like Python tracebacks (empty when all went well)."""
        texts: list[str] = self.notebook.locator(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
        ).evaluate_all("els => els.map(e => e.textContent)")
        return [t for t in texts if _TRACEBACK.search(t)]

    # ------------------------------------------------------------- kernel state
    def kernel_id(self) -> str:
        return self.server.kernel_id_for(self.path)

    def wait_kernel_idle(self, timeout: float = 90.0) -> None:
        """Wait until the page has a connected, idle kernel (and the cells are shown)."""
        t_end = time.monotonic() + timeout
        self.notebook.locator(".jp-Cell").first.wait_for(timeout=timeout * 1000)
        if self.ui == "lab":
            self.page.wait_for_function(
                _JS_LAB_KERNEL_IDLE, arg=self.path, timeout=max(1.0, t_end - time.monotonic()) * 1000
            )

        def idle_and_connected() -> bool:
            model = self.server.kernel_model(self.kernel_id())
            return model.get("execution_state") == "idle" and model.get("connections", 0) >= 1

        wait_until(
            idle_and_connected,
            timeout=max(1.0, t_end - time.monotonic()),
            what=f"an idle kernel with a browser connection for {self.path}",
        )

    def kernel(self) -> KernelConnection:
        """A ``jupyter_client`` connection to *this page's* kernel (cached)."""
        if self._kernel is None:
            self._kernel = self.server.connect_kernel(self.kernel_id())
        return self._kernel

    def restart_kernel(self, *, via: Literal["rest", "ui"] = "rest", timeout: float = 60.0) -> None:
        """Restart the page's kernel and wait until the page is connected to the new one.

        ``via="rest"``: ``POST /api/kernels/<id>/restart`` (no dialog, like a restart
        requested from inside the kernel). ``via="ui"``: the *Kernel > Restart Kernel…*
        menu and its confirmation dialog, as a person would (Lab and Notebook 7).
        """
        kernel_id = self.kernel_id()
        if self._kernel is not None:
            self._kernel.close()
            self._kernel = None
        before = self.server.kernel_model(kernel_id).get("last_activity")
        if via == "rest":
            self.server.api("POST", f"api/kernels/{kernel_id}/restart", timeout=timeout)
        else:
            self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Kernel$")).click()
            self.page.locator(
                ".lm-Menu-itemLabel", has_text=re.compile(r"^Restart Kernel(…|\.\.\.)$")
            ).first.click()
            self.page.locator(".jp-Dialog .jp-mod-accept").click()
            self.page.locator(".jp-Dialog").wait_for(state="detached")
            wait_until(
                lambda: self.server.kernel_model(kernel_id).get("last_activity") != before,
                timeout=timeout,
                what="the kernel restart to begin",
            )
        self.wait_kernel_idle(timeout=timeout)

    def execute(self, code: str, *, timeout: float = 60.0, subshell: bool = False) -> ExecResult:
        """Run ``code`` in the page's kernel from the test (not through the page).

        Queues behind a running cell unless ``subshell=True`` (ipykernel >= 7).
        """
        return self.kernel().execute(code, timeout=timeout, subshell=subshell)

    def value(self, expr: str, *, setup: str = "", timeout: float = 60.0, subshell: bool = False) -> Any:
        """Evaluate ``expr`` in the page's kernel and return it (literals only)."""
        return self.kernel().value(expr, setup=setup, timeout=timeout, subshell=subshell)

    def getenv(self, name: str, *, subshell: bool = False) -> str | None:
        """``os.environ.get(name)`` in the page's kernel."""
        return self.kernel().getenv(name, subshell=subshell)

    def wait_for_value(self, expr: str, expected: Any, *, setup: str = "", timeout: float = 15.0) -> Any:
        """Poll ``expr`` in the kernel until it equals ``expected``; return the last value.

        Use it after a widget interaction before relying on the kernel having seen it:
        JupyterLab sends each widget's comm messages on its own kernel subshell, so
        messages of *different* widgets can be handled out of order.
        """
        seen: list[Any] = []

        def check() -> bool:
            seen.append(self.value(expr, setup=setup))
            return bool(seen[-1] == expected)

        try:
            wait_until(check, timeout=timeout, interval=0.1, what=f"{expr} == {expected!r}")
        except TimeoutError as exc:
            raise AssertionError(
                f"kernel: {expr} stayed {seen[-1] if seen else '?'!r}, expected {expected!r}"
            ) from exc
        return seen[-1]

    # ------------------------------------------------------------- running cells
    def _fire(self, command: str, index: int | None) -> None:
        self.page.evaluate(_JS_LAB_COMMAND, [self.path, command, index])

    def _select_cell_nb7(self, index: int) -> None:
        cell = self.cell(index)
        cell.scroll_into_view_if_needed()
        # the prompt area selects the cell without putting the editor in edit mode
        cell.locator(".jp-InputPrompt").first.click()
        self.page.keyboard.press("Escape")

    def start_run_all(self) -> list[str]:
        """Start running every cell; return the prompts from just before (for waiting)."""
        before = self.code_cell_prompts()
        if self.ui == "lab":
            self._fire("notebook:run-all-cells", None)
        else:
            # Notebook 7 has no window.jupyterapp: use its menu like a person would
            self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
            self.page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
        return before

    def start_run_cell(self, index: int) -> list[str]:
        """Start running cell ``index`` (0-based over all cells); return prompts before."""
        before = self.code_cell_prompts()
        if self.ui == "lab":
            self._fire("notebook:run-cell", index)
        else:
            self._select_cell_nb7(index)
            self.page.keyboard.press("Control+Enter")  # run, keep the selection
        return before

    def wait_until_done(
        self, before: Sequence[str], *, timeout: float = 120.0, raise_on_error: bool = True
    ) -> None:
        """Wait until the run started after ``before`` was taken has finished.

        "Started" = some prompt differs from ``before`` or shows ``[*]:``; "finished" =
        no prompt shows ``[*]:`` (the status bar is not trusted: it can read Idle while
        a widget cell runs).
        """
        before = list(before)

        def started() -> bool:
            now = self.code_cell_prompts()
            return now != before or BUSY_PROMPT in now

        wait_until(started, timeout=min(timeout, 30.0), interval=0.05, what="the run to start")
        wait_until(lambda: not self.is_busy(), timeout=timeout, interval=0.1, what="no [*]: prompts")
        if raise_on_error and (errs := self.errors()):
            raise AssertionError("a cell raised:\n" + "\n\n".join(e[-3000:] for e in errs))

    def run_all(self, *, timeout: float = 120.0, raise_on_error: bool = True) -> None:
        """Run all cells and wait until no prompt shows ``[*]:``."""
        self.wait_until_done(self.start_run_all(), timeout=timeout, raise_on_error=raise_on_error)

    def run_cell(self, index: int, *, timeout: float = 120.0, raise_on_error: bool = True) -> None:
        """Run cell ``index`` and wait until it finished."""
        self.wait_until_done(self.start_run_cell(index), timeout=timeout, raise_on_error=raise_on_error)

    def sample_while_busy(
        self, sample: Callable[[], T], *, interval: float = 0.2, timeout: float = 120.0
    ) -> list[T]:
        """Call ``sample()`` every ``interval`` s while a prompt shows ``[*]:``.

        Waits (up to 30 s) for the busy state to appear first. Returns the samples
        taken while busy, e.g. widget texts seen while a cell was still running.
        """
        wait_until(self.is_busy, timeout=30.0, interval=0.05, what="a [*]: prompt")
        out: list[T] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = sample()
            if not self.is_busy():
                break
            out.append(value)
            time.sleep(interval)
        return out

    def screenshot(self, name: str) -> Path:
        return screenshot(self.page, name)


def open_notebook(
    page: Page, server: JupyterServer, path: str, *, ui: UI = "lab", timeout: float = 90.0
) -> NotebookUI:
    """Open ``path`` (relative to the server root) and wait for an idle kernel.

    ``ui="lab"`` loads ``/lab/tree/<path>?reset`` (no restored workspace);
    ``ui="notebook"`` loads Notebook 7's ``/notebooks/<path>``.
    """
    quoted = urllib.parse.quote(path)
    url = server.url(f"lab/tree/{quoted}?reset" if ui == "lab" else f"notebooks/{quoted}")
    page.goto(url, wait_until="domcontentloaded")
    nb = NotebookUI(page, server, path, ui)
    nb.wait_kernel_idle(timeout=timeout)
    return nb


# ----------------------------------------------------------------- widget helpers
Scope = Any  # a playwright Page or Locator (anything with .locator())


def widget_selector(name: str) -> str:
    """CSS selector for ``widget.add_class("allocconf-<name>")`` (``name`` may include the prefix)."""
    return "." + (name if name.startswith("allocconf-") else f"allocconf-{name}")


def find_widget(scope: Scope, name: str | Locator) -> Locator:
    """The widget's root element, by its ``allocconf-<name>`` class (a Locator passes through)."""
    if isinstance(name, str):
        loc: Locator = scope.locator(widget_selector(name))
        return loc
    return name


def _parse_number(text: str) -> float | None:
    try:
        return float(text.strip().replace("\u2212", "-"))
    except ValueError:
        return None


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=5e-3, abs_tol=1e-9)


def slider_value(scope: Scope, widget: str | Locator) -> float | None:
    """The number a slider's readout shows (``None`` without a readout)."""
    w = find_widget(scope, widget)
    readout = w.locator(".widget-readout")
    if readout.count() == 0 or not readout.first.is_visible():
        return None
    return _parse_number(readout.first.inner_text())


def set_slider(scope: Scope, widget: str | Locator, value: float, *, timeout: float = 10.0) -> None:
    """Set an ``IntSlider`` / ``FloatSlider`` / ``FloatLogSlider`` to ``value`` like a user.

    Types into the editable readout and presses Enter (ipywidgets 7 and 8); without a
    visible readout it drags the handle with the mouse (linear sliders only).
    Waits until the page shows the new value; the kernel gets it a moment later
    (see :meth:`NotebookUI.wait_for_value`).
    """
    w = find_widget(scope, widget)
    w.wait_for(state="visible", timeout=timeout * 1000)
    readout = w.locator(".widget-readout")
    text = str(int(value)) if float(value).is_integer() else repr(float(value))
    if readout.count() and readout.first.is_visible():
        r = readout.first
        r.click()
        r.press("Control+a")
        r.press_sequentially(text)
        r.press("Enter")
        wait_until(
            lambda: (v := _parse_number(r.inner_text())) is not None and _close(v, value),
            timeout=timeout,
            what=f"slider readout to show {text} (shows {r.inner_text()!r})",
        )
        r.blur()
        return
    _set_slider_by_mouse(w, float(value), timeout)


def _set_slider_by_mouse(w: Locator, value: float, timeout: float) -> None:
    """Drag the handle, bisecting on the x position until it shows ``value``.

    Arrow keys would be simpler, but Notebook 7.6 swallows them before they reach a
    focused slider handle (they work in JupyterLab). Reads ``aria-valuenow``, which is
    the value for linear sliders (the exponent for ``FloatLogSlider``: use the readout).
    """
    page = w.page
    handle = w.locator(".noUi-handle").first
    track = w.locator(".noUi-target").first

    def now() -> float:
        v = _parse_number(handle.get_attribute("aria-valuenow") or "")
        if v is None:
            raise AssertionError("slider handle has no aria-valuenow")
        return v

    if _close(now(), value):
        return
    handle.scroll_into_view_if_needed()
    hb, tb = handle.bounding_box(), track.bounding_box()
    if hb is None or tb is None:
        raise AssertionError("slider is not visible")
    y = hb["y"] + hb["height"] / 2
    lo, hi = tb["x"] - hb["width"], tb["x"] + tb["width"] + hb["width"]
    page.mouse.move(hb["x"] + hb["width"] / 2, y)
    page.mouse.down()
    try:
        deadline = time.monotonic() + timeout
        for _ in range(40):
            mid = (lo + hi) / 2
            page.mouse.move(mid, y)
            current = now()
            if _close(current, value) or time.monotonic() > deadline:
                break
            if current < value:
                lo = mid
            else:
                hi = mid
    finally:
        page.mouse.up()
    wait_until(
        lambda: _close(now(), value),
        timeout=2.0,
        what=f"slider handle at {value} (it shows {handle.get_attribute('aria-valuenow')})",
    )


def click_button(
    scope: Scope, text: str | None = None, *, name: str | None = None, timeout: float = 10.0
) -> None:
    """Click an ipywidgets ``Button`` by its description ``text`` and/or ``allocconf-<name>``."""
    if name is not None:
        button = find_widget(scope, name)
        if text is not None:
            button = button.filter(has_text=re.compile(rf"^\s*{re.escape(text)}\s*$"))
    elif text is not None:
        button = scope.locator("button.jupyter-button").filter(
            has_text=re.compile(rf"^\s*{re.escape(text)}\s*$")
        )
    else:
        raise TypeError("click_button needs text= or name=")
    button.click(timeout=timeout * 1000)


def widget_text(scope: Scope, widget: str | Locator) -> str:
    """Visible text of a ``Label`` / ``HTML`` / ``HTMLMath`` / ``Valid`` (or any) widget."""
    w = find_widget(scope, widget)
    content = w.locator(".widget-html-content")
    if content.count():
        return content.first.inner_text().strip()
    return w.inner_text().strip()


def wait_for_text(
    scope: Scope, widget: str | Locator, expected: str | re.Pattern[str], *, timeout: float = 10.0
) -> str:
    """Wait until :func:`widget_text` equals ``expected`` (or matches the pattern)."""

    seen: list[str] = []

    def ok() -> bool:
        seen.append(widget_text(scope, widget))
        if isinstance(expected, str):
            return seen[-1] == expected
        return expected.search(seen[-1]) is not None

    try:
        wait_until(ok, timeout=timeout, what=f"widget text {expected!r}")
    except TimeoutError as exc:
        raise AssertionError(
            f"widget text stayed {seen[-1] if seen else '?'!r}, expected {expected!r}"
        ) from exc
    return seen[-1]


def _toggle_state(w: Locator) -> bool:
    checkbox = w.locator("input[type=checkbox]")
    if checkbox.count():
        return checkbox.first.is_checked()
    classes = w.get_attribute("class") or ""
    return "mod-active" in classes.split()


def set_toggle(scope: Scope, widget: str | Locator, value: bool = True, *, timeout: float = 10.0) -> None:
    """Set a ``Checkbox`` or ``ToggleButton`` to ``value`` (clicks only when needed)."""
    w = find_widget(scope, widget)
    w.wait_for(state="visible", timeout=timeout * 1000)
    if _toggle_state(w) == value:
        return
    checkbox = w.locator("input[type=checkbox]")
    (checkbox.first if checkbox.count() else w).click()
    wait_until(lambda: _toggle_state(w) == value, timeout=timeout, what=f"toggle -> {value}")


def choose_dropdown(scope: Scope, widget: str | Locator, label: str, *, timeout: float = 10.0) -> None:
    """Choose the option shown as ``label`` in a ``Dropdown`` (a ``<select>``)."""
    w = find_widget(scope, widget)
    select = w.locator("select").first
    select.select_option(label=label, timeout=timeout * 1000)
    wait_until(
        lambda: select.evaluate("s => s.options[s.selectedIndex].textContent") == label,
        timeout=timeout,
        what=f"dropdown showing {label!r}",
    )


def type_text(
    scope: Scope,
    widget: str | Locator,
    text: str,
    *,
    submit: bool = True,
    timeout: float = 10.0,
) -> None:
    """Replace the content of a ``Text`` / ``Textarea`` widget; press Enter if ``submit``."""
    w = find_widget(scope, widget)
    box = w.locator("input, textarea").first
    box.fill(text, timeout=timeout * 1000)
    if submit:
        box.press("Enter")
    else:
        box.blur()  # continuous_update=False widgets send on blur


# ----------------------------------------------------------------- is anything cut off?
_JS_CUT_OFF = r"""
(root) => {
  const cut = [];
  const name = (el) => (el.textContent || '').replace(/\s+/g, ' ').trim().slice(0, 80);
  const visible = (el) => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  // 1. buttons and labels that clip their text (ipywidgets ends them with an ellipsis)
  for (const el of root.querySelectorAll('button, .widget-label, .widget-html-content')) {
    if (!visible(el) || !name(el)) continue;
    const style = getComputedStyle(el);
    const clips = style.overflow !== 'visible' || style.textOverflow === 'ellipsis';
    if (clips && el.scrollWidth > el.clientWidth + 1)
      cut.push(`clipped: "${name(el)}" needs ${el.scrollWidth}px, has ${el.clientWidth}px`);
  }
  // 2. a button's icon beside its text, the text on one line
  for (const b of root.querySelectorAll('button')) {
    if (!visible(b)) continue;
    const icon = b.querySelector('i');
    const texts = [...b.childNodes].filter(n => n.nodeType === 3 && n.textContent.trim());
    if (!texts.length) continue;
    const range = document.createRange(); range.selectNodeContents(texts[0]);
    const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
    if (lines.size > 1) cut.push(`wrapped: "${name(b)}" on ${lines.size} lines`);
    if (icon && visible(icon)) {
      const i = icon.getBoundingClientRect(), t = range.getBoundingClientRect();
      if (Math.abs((i.top + i.bottom) / 2 - (t.top + t.bottom) / 2) > 6)
        cut.push(`icon not beside the text of "${name(b)}"`);
    }
  }
  // 3. SVG text inside its chart, and no two texts of a chart over each other
  for (const svg of root.querySelectorAll('svg')) {
    if (!visible(svg)) continue;
    const box = svg.getBoundingClientRect();
    const texts = [...svg.querySelectorAll('text')].filter(t => t.textContent.trim() && visible(t));
    const rects = texts.map(t => t.getBoundingClientRect());
    texts.forEach((t, k) => {
      const r = rects[k];
      if (r.left < box.left - 1 || r.right > box.right + 1
          || r.top < box.top - 1 || r.bottom > box.bottom + 1)
        cut.push(`outside its chart: "${name(t)}"`);
      for (let j = 0; j < k; j++) {
        const o = rects[j];
        const w = Math.min(r.right, o.right) - Math.max(r.left, o.left);
        const h = Math.min(r.bottom, o.bottom) - Math.max(r.top, o.top);
        if (w > 2 && h > 2) cut.push(`over each other: "${name(texts[j])}" and "${name(t)}"`);
      }
    });
  }
  // 4. table cells whose text runs into the next cell's ("shareblockssite")
  for (const tr of root.querySelectorAll('tr')) {
    const cells = [...tr.children].filter(c => visible(c) && c.textContent.trim());
    for (let k = 1; k < cells.length; k++) {
      const a = document.createRange(), b = document.createRange();
      a.selectNodeContents(cells[k - 1]); b.selectNodeContents(cells[k]);
      const gap = b.getBoundingClientRect().left - a.getBoundingClientRect().right;
      if (gap < 3)
        cut.push(`runs together: "${name(cells[k - 1])}" | "${name(cells[k])}" (${gap.toFixed(1)}px)`);
    }
  }
  // 5. the element itself wider than the output area that shows it
  const area = root.closest('.jp-OutputArea-output, .output_subarea, .output_area') || root.parentElement;
  if (area && root.scrollWidth > area.clientWidth + 1)
    cut.push(`wider than the output area: ${root.scrollWidth}px in ${area.clientWidth}px`);
  return cut;
}
"""


def cut_off_labels(locator: Locator) -> list[str]:
    """What a user cannot read in full inside ``locator``'s element (empty: nothing is cut).

    Measured in the page: buttons and labels that clip their text, a button whose text wraps
    or whose icon sits above its text, SVG chart text outside its chart or over another text,
    table cells whose texts touch, and the element wider than its output area.
    """
    found: list[str] = locator.first.evaluate(_JS_CUT_OFF)
    return found
