"""The shipped notebooks and the restart flow, for real, in JupyterLab in Chromium.

* ``notebooks/quickstart.ipynb`` runs top to bottom on this CPU-only machine; then the user moves
  a slider in the panel it shows and clicks Apply, and the notebook's own kernel holds the string.
* ``%allocconf restart`` in a JupyterLab kernel restarts it through the server's REST API; in the
  new kernel ``%load_ext allocconf_widget`` re-applies the saved settings before torch is imported.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest

from tests.browser.jupyter import (
    click_button,
    find_widget,
    open_notebook,
    screenshot,
    set_slider,
    set_toggle,
    wait_for_text,
    wait_until,
)

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_saved_settings(no_saved_settings):
    """Each test starts without settings saved by an earlier test's Apply."""


def test_quickstart_runs_and_its_panel_applies(jupyter_server, browser_page):
    shutil.copy(ROOT / "notebooks" / "quickstart.ipynb", jupyter_server.root_dir / "quickstart.ipynb")
    nb = open_notebook(browser_page, jupyter_server, "quickstart.ipynb")
    nb.run_all(timeout=240)
    assert nb.errors() == []
    panel = nb.page.locator(".allocconf-panel").first
    panel.scroll_into_view_if_needed()
    row = find_widget(panel, "opt-max-split-size-mb")
    set_toggle(row, "allocconf-set", True)
    set_slider(row, "allocconf-slider", 10)  # the handle's position is the exponent: 2**10 MiB
    wait_for_text(panel, "allocconf-status", re.compile(r"max_split_size_mb:1024"))
    click_button(panel, name="apply")
    # the notebook staged roundup_power2_divisions:4 after its dry run; the panel keeps it
    nb.wait_for_value("os.environ.get('PYTORCH_ALLOC_CONF')",
                      "expandable_segments:True,max_split_size_mb:1024,roundup_power2_divisions:4",
                      setup="import os")
    nb.screenshot("quickstart-after-apply")
    _dry_run_cells_show_their_answers(nb)


def _dry_run_cells_show_their_answers(nb) -> None:
    """What Run All shows in the dry-run section: the estimate, the planner's table, the ranking.
    The window is made tall enough for every cell: Lab draws only the cells in view."""
    nb.page.set_viewport_size({"width": 1280, "height": 30_000})
    wait_until(lambda: "batch 512" in "\n".join(nb.notebook.locator(".jp-OutputArea").all_inner_texts()),
               timeout=30, what="the planner's answer on the page")
    texts = "\n".join(nb.notebook.locator(".jp-OutputArea").all_inner_texts())
    assert "A dry run (estimate), by the CPU stand-in (a coarser estimate), for Tesla T4" in texts
    assert "CUDA was not started" in texts
    assert "largest predicted to fit with (torch defaults): batch 512" in texts
    assert "a dry run (estimate) of your step on Tesla T4" in texts
    assert "\x1b[K" not in texts and "[K" not in texts  # the CLI's progress line is not left behind
    cell = nb.page.locator(".jp-CodeCell").filter(has_text="%%allocconf dryrun").first
    cell.screenshot(path=str(screenshot(nb.page, "quickstart-dry-run")))


def test_restart_command_restarts_through_the_server_and_settings_come_back(jupyter_server,
                                                                         browser_page):
    cells = ["%load_ext allocconf_widget\n%allocconf set expandable_segments=True\n%allocconf apply",
             "%allocconf restart"]
    path = jupyter_server.write_notebook("restart.ipynb", [nbformat.v4.new_code_cell(c) for c in cells])
    nb = open_notebook(browser_page, jupyter_server, path)
    pid_before = nb.value("os.getpid()", setup="import os")
    nb.run_cell(0)
    nb.start_run_cell(1)
    wait_until(lambda: _pid(nb) not in (None, pid_before), timeout=60,
               what="a new kernel process after %allocconf restart")
    nb.wait_kernel_idle()
    out = nb.execute("%load_ext allocconf_widget\nimport os, sys\n"
                     "print('torch' in sys.modules, os.environ.get('PYTORCH_ALLOC_CONF'))")
    assert "re-applied 'expandable_segments:True'" in out.stdout
    assert out.stdout.strip().endswith("False expandable_segments:True")


def _pid(nb) -> int | None:
    try:
        return nb.value("os.getpid()", setup="import os", timeout=5)
    except Exception:  # the kernel is restarting
        return None
