"""The browser test infrastructure works, on throwaway notebooks (not our panel).

Each test drives real JupyterLab / Notebook 7 pages in headless Chromium against a
real kernel, and asserts inside that same kernel.
"""

from __future__ import annotations

import re

import pytest

from tests.browser.conftest import NotebookPageFactory
from tests.browser.jupyter import (
    choose_dropdown,
    click_button,
    set_slider,
    set_toggle,
    slider_value,
    type_text,
    wait_for_text,
    widget_text,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PANEL_CELL = """\
import os, ipywidgets as W
slider = W.IntSlider(value=3, min=0, max=64, description="n").add_class("allocconf-test-slider")
apply = W.Button(description="Apply").add_class("allocconf-test-apply")
status = W.Label("not applied").add_class("allocconf-test-status")

def on_click(_):
    os.environ["ALLOCCONF_E2E"] = str(slider.value)
    status.value = f"applied {slider.value} in pid {os.getpid()}"

apply.on_click(on_click)
display(W.VBox([slider, apply, status]))
"""

LIVE_CELL = """\
import threading, time, ipywidgets as W
ticker = W.IntSlider(value=0, max=100, description="tick").add_class("allocconf-test-ticker")
display(ticker)

def bump():
    for i in range(1, 16):
        ticker.value = i
        time.sleep(0.2)

threading.Thread(target=bump, daemon=True).start()
time.sleep(3.5)  # the cell stays busy ([*]) while the thread updates the widget
print("cell done at", ticker.value)
"""


CONTROLS_CELL = """\
import ipywidgets as W
ctl = dict(
    log=W.FloatLogSlider(value=1e3, base=2, min=0, max=20),
    bare=W.IntSlider(value=4, min=0, max=40, step=2, readout=False),
    check=W.Checkbox(description="check"),
    toggle=W.ToggleButton(description="toggle"),
    choice=W.Dropdown(options=[("native", 1), ("cudaMallocAsync", 2)], value=1),
    text=W.Text(),
    html=W.HTML("<b>bold</b> and plain"),
)
for name, w in ctl.items():
    w.add_class(f"allocconf-test-{name}")
submitted = []
def on_text(change):
    submitted.append(change["new"])
ctl["text"].observe(on_text, "value")
display(W.VBox(list(ctl.values())))
"""


@pytest.mark.parametrize("ui", ["lab", "notebook"])
def test_slider_and_button_change_the_kernel_environment(notebook_page: NotebookPageFactory, ui: str) -> None:
    nb = notebook_page([PANEL_CELL, "print('pid', os.getpid())"], ui=ui)
    nb.run_all()
    assert nb.getenv("ALLOCCONF_E2E") is None
    assert slider_value(nb.page, "test-slider") == 3

    set_slider(nb.page, "test-slider", 37)
    click_button(nb.page, "Apply")

    text = wait_for_text(nb.page, "test-status", re.compile(r"^applied \d+ in pid"))
    pid = nb.value("os.getpid()")
    # the button ran in the very kernel the test is asking
    assert text == f"applied 37 in pid {pid}"
    assert nb.getenv("ALLOCCONF_E2E") == "37"
    assert nb.value("slider.value") == 37

    nb.run_cell(1)
    assert nb.output_text(1).strip() == f"pid {pid}"
    assert nb.screenshot(f"infrastructure-{ui}").stat().st_size > 0

    # A kernel restart (REST in Lab, the Kernel menu in Notebook 7) loses the variable.
    nb.restart_kernel(via="rest" if ui == "lab" else "ui")
    assert nb.value("__import__('os').getpid()") != pid
    assert nb.getenv("ALLOCCONF_E2E") is None


@pytest.mark.parametrize("ui", ["lab", "notebook"])
def test_thread_updates_show_while_the_cell_is_busy(notebook_page: NotebookPageFactory, ui: str) -> None:
    nb = notebook_page([LIVE_CELL], ui=ui)
    before = nb.start_run_all()

    def sample() -> tuple[float | None, int]:
        # what the page shows, and (on a kernel subshell) what the kernel holds
        # ([*] shows as soon as the cell is queued, before `ticker` exists)
        in_kernel = nb.value("ticker.value if 'ticker' in globals() else 0", subshell=True)
        return slider_value(nb.page, "test-ticker"), in_kernel

    samples = nb.sample_while_busy(sample, interval=0.2)
    nb.wait_until_done(before)

    shown = {v for v, _ in samples if v}
    in_kernel = {k for _, k in samples if k}
    assert len(shown) >= 3, f"page did not update while the cell ran: {samples}"
    assert len(in_kernel) >= 3, f"subshell did not see progress while busy: {samples}"
    assert slider_value(nb.page, "test-ticker") == 15
    assert "cell done at 15" in nb.output_text(0)


def test_helpers_fail_loudly(notebook_page: NotebookPageFactory) -> None:
    nb = notebook_page(["x = 1", "1 / 0", "y = 2"])
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        nb.run_all()
    assert nb.value("x") == 1
    with pytest.raises(AssertionError, match="expected 2"):
        nb.wait_for_value("x", 2, timeout=1.0)
    assert nb.execute("undefined_name").error == "NameError: name 'undefined_name' is not defined"


def test_widget_helpers_reach_the_kernel(notebook_page: NotebookPageFactory) -> None:
    nb = notebook_page([CONTROLS_CELL])
    nb.run_all()
    page = nb.page
    assert widget_text(page, "test-html") == "bold and plain"

    set_slider(page, "test-log", 4096)  # FloatLogSlider, through its readout
    set_slider(page, "test-bare", 26)  # no readout: dragged with the mouse
    set_toggle(page, "test-check", True)
    set_toggle(page, "test-toggle", True)
    choose_dropdown(page, "test-choice", "cudaMallocAsync")
    type_text(page, "test-text", "expandable_segments:True")

    nb.wait_for_value("round(ctl['log'].value)", 4096)
    nb.wait_for_value("ctl['bare'].value", 26)
    nb.wait_for_value("(ctl['check'].value, ctl['toggle'].value)", (True, True))
    nb.wait_for_value("ctl['choice'].value", 2)
    nb.wait_for_value("ctl['text'].value", "expandable_segments:True")
    assert nb.value("submitted[-1]") == "expandable_segments:True"

    set_toggle(page, "test-toggle", False)
    nb.wait_for_value("ctl['toggle'].value", False)
