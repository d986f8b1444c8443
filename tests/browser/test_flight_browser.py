"""The OOM flight view in a real JupyterLab, on the real OOM recorded on an H200.

``%allocconf flight demo`` shows the bundled recording (``allocconf_widget/data/flight_oom_h200``,
labelled as a recording) the way a kernel's own OOM is shown: breakdown, sites, segment
map, then the verdict filling in from its thread. Clicking Apply must reach the kernel's
environment through the Session. The screenshot is the one docs/flight.md and the README
show (``ALLOCCONF_UPDATE_DOCS_IMAGES=1`` copies it to ``docs/images/oom.png``).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from tests.browser.jupyter import click_button, screenshot, wait_for_text

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]
VAR = "PYTORCH_ALLOC_CONF"  # what torch 2.13 reads when nothing else is set


@pytest.fixture(autouse=True)
def _clean_saved_settings(no_saved_settings):
    """Each test starts without settings saved by an earlier test's Apply."""


def test_the_recorded_oom_shows_sites_map_verdict_and_apply_reaches_the_kernel(notebook_page):
    nb = notebook_page(["%load_ext allocconf_widget", "%allocconf flight demo"], ui="lab")
    nb.run_all(timeout=120)
    view = nb.page.locator(".allocconf-flight")
    view.wait_for(state="visible", timeout=30_000)
    assert "kept_output" in view.locator(".allocconf-flight-sites").first.inner_text()
    assert view.locator("svg.allocconf-segment-map rect").count() > 20
    wait_for_text(view, "flight-verdict", re.compile(r"Verdict: under max_split_size_mb:128 the "
                                                     r"peak would have been 2\.42 GiB of the 4\.00 "
                                                     r"GiB limit \(memory fraction [0-9.]+ of "
                                                     r"139\.80 GiB\): no OOM"), timeout=60)
    assert "How sure: sure" in view.inner_text()
    nb.page.set_viewport_size({"width": 1100, "height": 2200})  # the whole view, unscrolled
    view.scroll_into_view_if_needed()
    shot = screenshot(nb.page, "flight-oom-lab")
    view.screenshot(path=str(shot))
    if os.environ.get("ALLOCCONF_UPDATE_DOCS_IMAGES"):
        (ROOT / "docs" / "images").mkdir(exist_ok=True)
        shutil.copy(shot, ROOT / "docs" / "images" / "oom.png")
    # the card states one recommendation: torch's rules of thumb yield to the replay's verdict
    card = view.locator(".allocconf-oom-report").first.inner_text()
    assert "What to do" not in card and "recommends max_split_size_mb:128" in card
    # a recording of another run: the green button asks first and changes nothing yet
    click_button(view, name="flight-apply")
    question = wait_for_text(view, "flight-question", re.compile(r"not from this kernel's own run"),
                             timeout=15)
    assert "set max_split_size_mb:128" in question
    assert nb.getenv(VAR) is None
    click_button(view, name="flight-confirm")
    wait_for_text(view, "flight-result", re.compile(r"Applied max_split_size_mb:128\..*Next:", re.S),
                  timeout=30)
    nb.wait_for_value(f"os.environ.get({VAR!r})", "max_split_size_mb:128", setup="import os")
