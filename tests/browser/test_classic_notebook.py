"""The closest thing to Colab here: classic Notebook 6.5.7 + widgetsnbextension 3.6.10 in Chromium.

Colab's own front end cannot run here. What can: the widget generation Colab ships
(ipywidgets 7.7.1, its classic-notebook front end widgetsnbextension 3.6.10) on Colab's
kernel stack (ipykernel 6.17.1, jupyter_client 7.4.9, IPython 7.34.0, traitlets 5.7.1,
tornado 6.5, plotly 5.24.1), in a real page. CI's ``colab`` cell installs exactly those
and runs this module; with another stack (Notebook 7, ipywidgets 8) it skips, and with
``ALLOCCONF_REQUIRE_CLASSIC=1`` (set by that CI cell) a skip is an error instead.

What is checked, each in the page: the panel renders; a slider + Apply reaches the
kernel's environment; the monitor's SVG chart is redrawn while the cell is still busy,
from the replay thread and in step-synchronous mode (the Colab mode: redraws happen on
the training loop's own thread after each optimizer step); the What-if chart draws.
Still unverified: Colab's own widget manager (the custom one loaded from Google's CDN).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.browser.jupyter import (
    JupyterServer,
    NotebookUI,
    click_button,
    find_widget,
    free_port,
    screenshot,
    set_slider,
    set_toggle,
    type_text,
    wait_for_text,
    wait_until,
    widget_text,
)
from tests.kernel.kernels import clean_kernel_env, write_python3_kernelspec

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _classic_missing_reason() -> str | None:
    try:
        import notebook
        import widgetsnbextension
    except ImportError as exc:
        return f"classic Notebook 6 + widgetsnbextension not installed ({exc.name})"
    version = getattr(notebook, "__version__", "")
    if not str(version).startswith("6."):
        return f"notebook {version} is not the classic Notebook 6 (Colab's generation)"
    if not str(widgetsnbextension.__version__).startswith("3."):
        return f"widgetsnbextension {widgetsnbextension.__version__} is not the ipywidgets-7 front end"
    return None


_REASON = _classic_missing_reason()
if _REASON:
    if os.environ.get("ALLOCCONF_REQUIRE_CLASSIC"):
        raise RuntimeError(f"ALLOCCONF_REQUIRE_CLASSIC is set but: {_REASON}")
    pytest.skip(_REASON, allow_module_level=True)

VAR_BY_TORCH = "PYTORCH_ALLOC_CONF"  # what torch 2.13 (this cell's torch) reads

# Found by these tests, open: in this page ipywidgets 7's Output model cannot be created
# ("Could not create a model", "_deserialize_state is not a function"; a bare W.Output() too),
# and since the Settings / What-if rework the panel holds Output widgets, so it does not render.
# Before that rework both tests below passed here. Whether Colab's own widget manager has the
# same problem is unverified (it renders Output widgets natively).

# ----------------------------------------------------------------- the classic server
def _start_classic_server(root: Path, timeout: float = 120.0) -> JupyterServer:
    """``python -m notebook`` (6.5.7) on 127.0.0.1, no token/xsrf, temporary dirs (as for Lab)."""
    root = root.resolve()
    root_dir, state = root / "notebooks", root / "state"
    dirs = {k: state / k for k in ("config", "data", "runtime", "ipython", "xdg")}
    for d in (root_dir, *dirs.values()):
        d.mkdir(parents=True, exist_ok=True)
    write_python3_kernelspec(dirs["data"])
    env = clean_kernel_env(dirs["xdg"], ipython_dir=dirs["ipython"])
    env.update(JUPYTER_CONFIG_DIR=os.fspath(dirs["config"]), JUPYTER_DATA_DIR=os.fspath(dirs["data"]),
               JUPYTER_RUNTIME_DIR=os.fspath(dirs["runtime"]))
    port = free_port()
    cmd = [sys.executable, "-m", "notebook", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--port-retries=0", "--allow-root", "--NotebookApp.token=", "--NotebookApp.password=",
           "--NotebookApp.disable_check_xsrf=True", f"--NotebookApp.notebook_dir={root_dir}",
           "--NotebookApp.terminals_enabled=False"]
    log_path = state / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=root_dir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    server = JupyterServer(root_dir, state, port, proc, log_path, env)

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"notebook exited with {proc.returncode}:\n{server.log_text()[-4000:]}")
        try:
            server.api("GET", "api/status", timeout=2)
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False
        return True

    try:
        wait_until(ready, timeout=timeout, what="classic notebook /api/status")
    except BaseException:
        server.stop(keep_log_as="classic-notebook-failed-start.log")
        raise
    return server


#: Run in the page before its own scripts: notes the msg_id of every comm_info request sent on
#: any websocket (the widget manager's load from the kernel).
_NOTE_COMM_INFO_REQUESTS = """
(() => {
  const sent = window.__allocconfCommInfoRequests = [];
  const send = WebSocket.prototype.send;
  WebSocket.prototype.send = function (data) {
    if (typeof data === 'string' && data.indexOf('"comm_info_request"') >= 0) {
      try { sent.push(JSON.parse(data).header.msg_id); } catch (e) { /* not Notebook 6's JSON */ }
    }
    return send.call(this, data);
  };
})();
"""


class ClassicNotebook(NotebookUI):
    """A notebook open in classic Notebook 6: its DOM (``#notebook .cell``) and its JS API."""

    @property
    def notebook(self) -> Any:
        return self.page.locator("#notebook-container").first

    def cells(self) -> Any:
        return self.notebook.locator(".cell")

    def code_cell_prompts(self) -> list[str]:
        """As Lab shows them (``[*]:``): Notebook 6 writes ``In [*]:``."""
        texts: list[str] = self.notebook.locator(".code_cell .input_prompt").evaluate_all(
            "els => els.map(e => e.textContent.replace(/\\u00a0/g, ' ').trim())")
        return [t.removeprefix("In").strip() for t in texts]

    def output_text(self, index: int) -> str:
        return str(self.cell(index).locator(".output_wrapper").inner_text())

    def errors(self) -> list[str]:
        texts: list[str] = self.notebook.locator(".output_error, .output_stderr").evaluate_all(
            "els => els.map(e => e.textContent)")
        return [t for t in texts if "Traceback" in t or "Error" in t]

    def wait_kernel_idle(self, timeout: float = 90.0) -> None:
        # loaded, connected, and the kernel answered kernel_info: an execute sent earlier
        # can sit queued forever ("In [*]" with an idle kernel) in Notebook 6
        self.page.wait_for_function(
            "() => window.Jupyter && Jupyter.notebook && Jupyter.notebook._fully_loaded"
            " && Jupyter.notebook.kernel && Jupyter.notebook.kernel.is_connected()"
            " && Jupyter.notebook.kernel.info_reply && Jupyter.notebook.kernel.info_reply.status === 'ok'"
            " && document.querySelectorAll('#notebook-container .code_cell').length > 0",
            timeout=timeout * 1000)

        # Notebook 6's server learns the kernel's state from its status messages; when it began
        # listening after the kernel's first "idle", it reports "starting" until the kernel next
        # says anything (seen in CI: 3.5 minutes of "starting" for an idle kernel). A kernel_info
        # request from the page makes the kernel publish busy/idle again.
        nudged = [time.monotonic()]

        def idle() -> bool:
            state = self.server.kernel_model(self.kernel_id()).get("execution_state")
            if state == "starting" and time.monotonic() - nudged[0] > 3.0:
                nudged[0] = time.monotonic()
                self.page.evaluate("() => { Jupyter.notebook.kernel.kernel_info(); return true; }")
            return state == "idle"

        wait_until(idle, timeout=timeout, what=f"an idle kernel for {self.path}")
        self.wait_widget_manager_loaded(timeout=timeout)

    def wait_widget_manager_loaded(self, timeout: float = 90.0) -> None:
        """Wait until the page's widget manager has finished loading the kernel's widgets.

        widgetsnbextension 3 asks the kernel for its widgets when the page opens (with
        ipywidgets 7 in the kernel: a control comm the kernel refuses, then a comm_info
        request), and when that ends it re-renders every cell output holding a widget; that
        re-render empties the output (the view's removal sets the output's model_id to ""),
        so a widget displayed before the load ended vanishes. Seen in CI on a loaded machine:
        the slider under test disappeared after the test had found it. A person opening a
        notebook waits a moment before running it; the test waits for the reply to be handled:
        the page sent a comm_info request (noted by :data:`_NOTE_COMM_INFO_REQUESTS`) and its
        callbacks are gone, which the page does once the reply and the kernel's idle came.
        The check runs in the page (``wait_for_function``): Playwright hands a Python
        ``websocket`` listener its events only while the test is inside a Playwright call.
        """
        self.page.wait_for_function(
            "() => { const k = window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel;"
            " const sent = window.__allocconfCommInfoRequests || [];"
            " return !!k && sent.some(id => !(id in (k._msg_callbacks || {}))); }",
            timeout=timeout * 1000)

    def start_run_all(self) -> list[str]:
        before = self.code_cell_prompts()
        self.page.evaluate("() => { Jupyter.notebook.execute_all_cells(); return true; }")
        return before


@pytest.fixture(scope="module")
def classic_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterServer]:
    server = _start_classic_server(tmp_path_factory.mktemp("classic"))
    try:
        yield server
    finally:
        server.stop(keep_log_as="classic-notebook-server.log")


@pytest.fixture
def classic_page(chromium: Any, classic_server: JupyterServer, request: pytest.FixtureRequest,
                 ) -> Iterator[Any]:
    from tests.browser.jupyter import new_page, safe_name

    _forget_saved_settings(classic_server)  # an earlier test's Apply must not reach this kernel
    page = new_page(chromium)
    console: list[str] = []
    page.on("console", lambda msg: console.append(f"[{msg.type}] {msg.text}"))
    page.on("pageerror", lambda exc: console.append(f"[pageerror] {exc}"))
    opened: list[ClassicNotebook] = []
    page.add_init_script(_NOTE_COMM_INFO_REQUESTS)

    def open_cells(cells: Sequence[str]) -> ClassicNotebook:
        name = f"{safe_name(request.node.name)}-{len(opened)}.ipynb"
        path = classic_server.write_notebook(name, cells)
        page.goto(classic_server.url(f"notebooks/{urllib.parse.quote(path)}"), wait_until="domcontentloaded")
        nb = ClassicNotebook(page, classic_server, path, "notebook")
        from playwright.sync_api import TimeoutError as PageTimeout

        try:
            nb.wait_kernel_idle()
        except (TimeoutError, PageTimeout) as exc:
            # Not idle in 90 s even when asked (wait_kernel_idle nudges a kernel the server
            # still calls "starting"). Reloading the page here (the earlier fallback) loaded it
            # twice, and two monitor tests then lost their widget (CI, twice): restart the
            # kernel through the server instead, which the open page follows. Said out loud:
            # a wait that never ends (round 14's first widget-manager wait) passed silently
            # here, 90 s a test, until the module's time gave it away.
            warnings.warn(f"{request.node.name}: the classic page's kernel was not ready in 90 s "
                          f"({str(exc).splitlines()[0][:200]}); restarted it", UserWarning, stacklevel=1)
            classic_server.api("POST", f"api/kernels/{nb.kernel_id()}/restart", timeout=60)
            nb.wait_kernel_idle(timeout=120.0)
        opened.append(nb)
        return nb

    try:
        yield open_cells
    finally:
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            screenshot(page, f"FAILED-classic-{safe_name(request.node.nodeid)}", full_page=True)
            print("browser console:\n" + "\n".join(console[-60:]))
            print("--- server log (tail) ---\n" + classic_server.log_text()[-3000:])
        page.context.close()
        classic_server.shutdown_all_sessions()
        _forget_saved_settings(classic_server)


def _forget_saved_settings(server: JupyterServer) -> None:
    """Remove what an Apply saved: the global default and every project's settings. The project
    files were left behind once, and `%load_ext` in the next test's kernel re-applied an earlier
    test's max_split_size_mb:1024 (two tests failed on the state they started from)."""
    import shutil

    folder = Path(server.env["XDG_CONFIG_HOME"]) / "allocconf_widget"
    (folder / "settings.json").unlink(missing_ok=True)
    shutil.rmtree(folder / "projects", ignore_errors=True)


# ----------------------------------------------------------------- the tests
def test_core_widgets_render_and_sync_on_the_ipywidgets_7_front_end(classic_page) -> None:
    """The widgets the panel is built from, without the panel: a slider typed into in the page
    reaches the kernel, and an HTML widget updated from the kernel changes in the page."""
    nb = classic_page(["import ipywidgets as W\n"
                       "s = W.IntSlider(value=3, max=2000); s.add_class('allocconf-probe-slider')\n"
                       "h = W.HTML('before'); h.add_class('allocconf-probe-html')\n"
                       "display(W.VBox([s, h, W.Checkbox(), W.Dropdown(options=['a', 'b']),\n"
                       "                W.Button(description='b')]))"])
    nb.run_all()
    set_slider(nb.page, "probe-slider", 1024)
    nb.wait_for_value("s.value", 1024)
    nb.execute("h.value = 'after: ' + str(s.value)").check()
    wait_for_text(nb.page, "probe-html", "after: 1024")


def test_the_stack_is_colabs_widget_generation(classic_page) -> None:
    nb = classic_page(["import ipywidgets, ipykernel, IPython\n"
                       "print('VERSIONS', ipywidgets.__version__, ipykernel.__version__,\n"
                       "      IPython.__version__)"])
    nb.run_all()
    # the output can hold more than the line (it failed once in a full run): find the line
    line = wait_until(lambda: re.search(r"VERSIONS (\S+) (\S+) (\S+)", nb.output_text(0)), timeout=30,
                      what="the versions line")
    versions = line.groups()
    assert versions[0].startswith("7.") and versions[1].startswith("6.") and versions[2].startswith("7.")
    # the page's widget manager is widgetsnbextension 3 (the classic ipywidgets-7 front end)
    assert nb.page.evaluate("() => !!(window.require && require.defined"
                            " && require.defined('nbextensions/jupyter-js-widgets/extension'))")


def test_panel_renders_and_slider_apply_reaches_the_kernel(classic_page) -> None:
    nb = classic_page(["%load_ext allocconf_widget", "import torch\n%allocconf"])
    nb.run_all(timeout=120)
    panel = nb.page.locator(".allocconf-panel")
    panel.wait_for(state="visible", timeout=30_000)
    row = find_widget(panel, "opt-max-split-size-mb")
    assert "default (unset)" in row.inner_text()
    set_toggle(row, "allocconf-set", True)
    # as a user sees the tick take (the box shows the staged 512) before typing: typed sooner,
    # the kernel's echo of the tick could land after the keys and replace them (seen once in CI)
    wait_for_text(panel, "allocconf-status", re.compile(r"max_split_size_mb:512"))
    # the size slider moves in powers of two and its number box is its readout; ipywidgets 7
    # draws jQuery UI sliders (no noUi handle to drag), so type the value as a user may
    type_text(row, "allocconf-exact", "1024", submit=False)  # ipywidgets 7 sends on blur
    wait_for_text(panel, "allocconf-status", re.compile(r"max_split_size_mb:1024"))
    assert nb.getenv(VAR_BY_TORCH) is None  # editing stages only
    screenshot(nb.page, "panel-classic-notebook6")
    click_button(panel, name="apply")
    nb.wait_for_value(f"os.environ.get({VAR_BY_TORCH!r})", "max_split_size_mb:1024", setup="import os")
    wait_for_text(panel, "allocconf-result", re.compile(r"Applied"))


_SVG_PATH = "() => { const p = document.querySelector('.allocconf-monitor-svg path');" \
            " return p ? p.getAttribute('d') : null; }"

THREAD_CELL = """\
import time
from allocconf_widget.views.widgets.monitor import start_monitor
mon = start_monitor(demo=True, renderer="svg", interval=0.05)
display(mon)
time.sleep(9.5)  # busy: the replay thread updates the chart meanwhile
print("updates", mon.updates, "renderer", mon.renderer)
"""

# No GPU here: the sampler's CUDA reads are replaced by a counter that grows with each
# step (a stand-in for what cannot exist on this machine; everything from the optimizer
# step hook to the page is the real code path).
STEP_CELL = """\
import time, torch
from allocconf_widget.adapters import probe as probe_mod, torch_private
state = {"n": 0}
def _stats(_torch, _device):
    state["n"] += 1
    gib = 1 << 30
    return {"reserved_bytes.all.current": gib * (1 + state["n"] % 7), "allocated_bytes.all.current": gib,
            "active_bytes.all.current": gib, "requested_bytes.all.current": gib,
            "inactive_split_bytes.all.current": 0, "num_ooms": 0, "num_alloc_retries": 0}
torch_private.cuda_built = lambda _t: True
torch_private.cuda_initialized = lambda _t: True
torch_private.device_count = lambda _t: 1
torch_private.load_time_backend = lambda _t: "native"
torch_private.memory_stats = _stats
torch_private.trace_free_snapshot = lambda _t: []
torch_private.mem_get_info = lambda _t, _d: (40 << 30, 80 << 30)
probe_mod._read_nvml = lambda _i: (None, None, None)
from allocconf_widget.views.widgets.monitor import start_monitor
mon = start_monitor(demo=False, renderer="svg", step_sync=True)
display(mon)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(45):  # a training loop: each step samples and (at most 2 Hz) redraws, on this thread
    opt.zero_grad(); model(torch.randn(4, 8)).sum().backward(); opt.step()
    time.sleep(0.2)
mon.stop()
print("steps", mon.source.steps, "updates", mon.updates)
"""


def _chart_states_while_busy(nb: ClassicNotebook) -> list[tuple[float, str | None]]:
    t0 = time.monotonic()
    before = nb.start_run_all()
    seen = nb.sample_while_busy(lambda: (round(time.monotonic() - t0, 2), nb.page.evaluate(_SVG_PATH)),
                                interval=0.25)
    nb.wait_until_done(before, timeout=120)
    return seen


def test_monitor_svg_updates_while_the_cell_is_busy_thread_mode(classic_page) -> None:
    nb = classic_page([THREAD_CELL])
    seen = _chart_states_while_busy(nb)
    shapes = {d for _t, d in seen if d}
    print(json.dumps({"test": "classic-thread", "busy_samples": len(seen), "distinct_shapes": len(shapes)}))
    assert len(shapes) >= 3, f"the SVG chart was not redrawn while the cell ran: {seen}"
    assert "Recording:" in widget_text(nb.page, "monitor-header")
    assert re.search(r"updates \d+ renderer svg", nb.output_text(0))


def test_monitor_svg_updates_while_the_cell_is_busy_step_sync_mode(classic_page) -> None:
    nb = classic_page([STEP_CELL])
    seen = _chart_states_while_busy(nb)
    shapes = {d for _t, d in seen if d}
    print(json.dumps({"test": "classic-step-sync", "busy_samples": len(seen),
                      "distinct_shapes": len(shapes)}))
    assert len(shapes) >= 3, f"the SVG chart was not redrawn while the training loop ran: {seen}"
    assert re.search(r"steps 45 updates \d+", nb.output_text(0))


def test_whatif_chart_draws(classic_page) -> None:
    nb = classic_page(["%load_ext allocconf_widget", "import torch\n%allocconf"])
    nb.run_all(timeout=120)
    panel = nb.page.locator(".allocconf-panel")
    panel.wait_for(state="visible", timeout=30_000)
    panel.locator(".lm-TabBar-tab, .p-TabBar-tab").filter(has_text="What if?").first.click()
    click_button(panel, name="whatif-run", timeout=20)
    chart = panel.locator(".allocconf-whatif svg").first
    chart.wait_for(state="visible", timeout=90_000)
    assert chart.locator("path, polyline, rect").count() > 0
    wait_until(lambda: panel.locator(".allocconf-whatif-apply:not([disabled])").count() > 0,
               timeout=30, what="ranked rows with an Apply button")
    screenshot(nb.page, "whatif-classic-notebook6")


def test_views_follow_the_session(classic_page) -> None:
    """The snippet box, the What-if rows and the saved line after each action (session_follow.py)."""
    from tests.browser.session_follow import CELLS, views_follow_the_session

    views_follow_the_session(classic_page(CELLS))


def _page_kernel_state(nb: ClassicNotebook) -> dict[str, Any]:
    state: dict[str, Any] = nb.page.evaluate("""() => {
        const badge = document.querySelector('#notification_kernel');
        const dialogs = Array.from(document.querySelectorAll('.modal-dialog'))
            .filter(d => d.offsetParent !== null).map(d => d.textContent);
        const k = Jupyter.notebook.kernel;
        return {badge: badge && badge.offsetParent !== null ? badge.textContent : '',
                dialogs: dialogs, connected: !!(k && k.is_connected()),
                indicator: document.querySelector('#kernel_indicator_icon').className};
    }""")
    return state


def test_restart_leaves_the_page_showing_a_live_kernel(classic_page) -> None:
    """Issue 22, item 16: the restart must not leave a "kernel died" dialog or a "Dead kernel"
    badge on a page whose kernel was restarted and runs; the cell ends without a traceback."""
    nb = classic_page(["%load_ext allocconf_widget", "import os\nos.getpid()", "%allocconf restart"])
    first = nb.value("os.getpid()", setup="import os")
    nb.start_run_all()

    def restarted() -> bool:
        try:
            pid = nb.value("os.getpid()", setup="import os", timeout=5)
        except Exception:  # restarting
            nb._kernel = None
            return False
        return pid != first

    wait_until(restarted, timeout=60, what="a new kernel process")
    time.sleep(3)  # the page's own reaction to the restart (dialogs, badge) settles
    state = _page_kernel_state(nb)
    screenshot(nb.page, "classic-after-restart")
    assert not any("died" in d.lower() or "dead" in d.lower() for d in state["dialogs"]), state
    assert "dead" not in state["badge"].lower(), state
    assert state["connected"], state
    assert not nb.errors(), nb.errors()


# ----------------------------------------------------------------- nothing cut off (issue 24)
# The scenes of tests/browser/test_nothing_cut_off_browser.py, in Colab's widget generation, where
# ipywidgets 7 cut the confirmation buttons ("Apply these setti…", "Can…") and classic table
# cells had no padding ("shareblockssite").
def _open_classic(classic_page, cells):
    from tests.browser.cutoff import WINDOW

    nb = classic_page(cells)
    nb.page.set_viewport_size(WINDOW)
    nb.run_all(timeout=180)
    return nb


def test_whatif_confirmation_and_chart_labels_are_whole_in_classic(classic_page) -> None:
    from tests.browser.cutoff import WHATIF_CELLS, whatif_scene

    seen = whatif_scene(_open_classic(classic_page, WHATIF_CELLS), "classic")
    assert seen.cut == [], seen.cut
    whole = {*seen.rows, *(f"{conf} (this kernel)" for conf in seen.rows)}
    labels = [t for t in seen.texts if not re.fullmatch(r"(OOM )?[\d.]+ [KMGT]?i?B", t)]
    assert labels and set(labels) <= whole, (labels, seen.rows)
    assert "max_split_size_mb:128 (this kernel)" in labels, labels  # item 6


def test_oom_card_apply_and_sites_table_are_whole_in_classic(classic_page) -> None:
    from tests.browser.cutoff import FLIGHT_CELLS, flight_scene

    seen = flight_scene(_open_classic(classic_page, FLIGHT_CELLS), "classic")
    assert seen.cut == [], seen.cut  # its confirmation included, in the What if? tab's style
    assert seen.texts == ["Apply max_split_size_mb:128", "Apply these settings", "Cancel"]


def test_simulate_table_fits_a_1400px_window_in_classic(classic_page) -> None:
    from tests.browser.cutoff import SIMULATE_CELLS, simulate_scene

    seen = simulate_scene(_open_classic(classic_page, SIMULATE_CELLS), "classic")
    assert seen.cut == [], seen.cut
    assert seen.texts == ["html table"]


def test_oom_card_links_work_through_classic_notebooks_file_handler(classic_page) -> None:
    """Issue 24, item 1: classic Notebook 6 showed no link at all (the links sat in an Output
    widget its ipywidgets 7 could not create, and its server was not looked up)."""
    from tests.browser.cutoff import VIEWER_CELLS, viewer_links_scene

    got = viewer_links_scene(_open_classic(classic_page, VIEWER_CELLS))
    assert got.pickle_bytes == got.pickle_size > 0
    assert got.viewer_url.endswith(".html") and "/files/allocconf-exports/" in got.viewer_url
    assert got.viewer_status == 200


def test_monitor_labels_the_moment_of_each_number_in_classic(classic_page) -> None:
    from tests.browser.cutoff import MONITOR_CELLS, monitor_scene

    seen = monitor_scene(_open_classic(classic_page, MONITOR_CELLS), "classic")
    status, segmap = seen.texts
    assert re.search(r"last sample, at [\d.]+ ?s: reserved", status), status
    assert "in the end-of-run snapshot:" in segmap, segmap
    assert seen.cut == [], seen.cut  # item 3: "idle … skipped" drawn over "peak reserved"
