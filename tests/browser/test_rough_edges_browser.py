"""Rough edges a new user met in JupyterLab 4 and Notebook 7 (issue 42), read off the page.

* The panel's flight-recorder line: the checkbox's label and the state line ran together
  ("Python stacks flight recorder off").
* The Settings rows' hints: a ticked row said only its unit ("MiB", "True/False").
* The OOM card: its "open … in a new browser tab" and "download …" links looked like plain
  text, and "Also avoids it" was a list numbered from 2.
"""

from __future__ import annotations

import re

import pytest

from tests.browser.jupyter import find_widget, screenshot, set_toggle, wait_for_text, wait_until

pytestmark = pytest.mark.browser

UIS = ["lab", "notebook"]


@pytest.fixture(autouse=True)
def _clean_saved_settings(no_saved_settings):
    """Each test starts without settings saved by an earlier test's Apply."""


@pytest.mark.parametrize("ui", UIS)
def test_the_flight_line_and_the_row_hints_read_as_sentences(notebook_page, ui):
    nb = notebook_page(["%load_ext allocconf_widget", "import torch\n%allocconf"], ui=ui)
    nb.run_all(timeout=120)
    panel = nb.page.locator(".allocconf-panel").first
    panel.wait_for(state="visible", timeout=30_000)
    flight = find_widget(panel, "flight-panel").first
    shown = " ".join(flight.inner_text().split())
    assert "Python stacks flight recorder" not in shown, shown
    assert "with Python stacks" in shown and "Flight recorder off." in shown, shown
    # a ticked row says what its option does, its unit and torch's default (not just "MiB")
    split = find_widget(panel, "opt-max-split-size-mb")
    set_toggle(split, "allocconf-set", True)
    wait_for_text(split, "hint", re.compile(r"never split.*\(MiB; torch's default: unlimited\)"))
    screenshot(nb.page, f"rows-and-flight-line-{ui}")


_LINKS_AND_LISTS = """(view) => {
  const links = [...view.querySelectorAll('a.allocconf-flight-link')].map(a => {
    const style = getComputedStyle(a), around = getComputedStyle(a.parentElement);
    return {text: a.textContent, underlined: style.textDecorationLine.includes('underline'),
            coloured: style.color !== around.color, pointer: style.cursor === 'pointer'};
  });
  const lists = [...view.querySelectorAll('.allocconf-flight-verdict ol, .allocconf-flight-verdict ul')]
    .map(l => ({tag: l.tagName, start: l.tagName === 'OL' ? l.start : null,
                marker: getComputedStyle(l.querySelector('li')).listStyleType}));
  return {links, lists};
}"""


@pytest.mark.parametrize("ui", UIS)
def test_the_oom_cards_links_look_like_links_and_its_list_is_not_numbered_from_2(notebook_page, ui):
    nb = notebook_page(["%load_ext allocconf_widget\nimport torch", "%allocconf flight demo"], ui=ui)
    nb.run_all(timeout=120)
    view = nb.page.locator(".allocconf-flight").first
    view.wait_for(state="visible", timeout=60_000)
    wait_for_text(view, "flight-verdict", re.compile("Also avoids it"), timeout=60)
    find_widget(view, "flight-viewer").first.click()
    links = view.locator("a.allocconf-flight-link")
    wait_until(lambda: links.count() >= 2, timeout=60, what="the viewer and download links")
    seen = view.evaluate(_LINKS_AND_LISTS)
    for link in seen["links"]:
        assert link["underlined"] and link["coloured"] and link["pointer"], link
    assert seen["lists"], seen
    for shown in seen["lists"]:
        assert shown["start"] in (None, 1) and shown["marker"] != "decimal", shown
    screenshot(nb.page, f"oom-card-links-{ui}")


@pytest.mark.parametrize("ui", UIS)
def test_the_monitors_save_snapshot_writes_what_allocconf_simulate_needs(notebook_page, ui):
    """The monitor (replaying the bundled recording on this CPU-only machine) saves a snapshot
    and, beside it, the replay facts: `allocconf simulate` on the file then knows the torch
    release and the device's memory (it said both were unknown and predicted no OOM)."""
    import subprocess
    import sys

    nb = notebook_page(["%load_ext allocconf_widget", "%allocconf monitor --demo --renderer svg"], ui=ui)
    nb.run_all(timeout=120)
    monitor = nb.page.locator(".allocconf-monitor").first
    monitor.wait_for(state="visible", timeout=60_000)
    find_widget(monitor, "monitor-snapshot").first.click()
    said = wait_for_text(monitor, "monitor-status", re.compile(r"its replay facts"), timeout=30)
    sidecar = re.search(r"replay facts \(torch, device, memory fraction\): (\S+\.json)", said)
    assert sidecar, said
    screenshot(nb.page, f"monitor-snapshot-{ui}")
    folder = nb.server.root_dir / "allocconf-exports"
    pickle = folder / sidecar.group(1).replace(".json", ".pickle")
    assert pickle.is_file() and (folder / sidecar.group(1)).is_file()
    run = subprocess.run([sys.executable, "-m", "allocconf_widget", "simulate", str(pickle),
                          "--no-rank", "--workers", "1"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert "device capacity unknown" not in run.stderr and "LOW CONFIDENCE" not in run.stdout
    assert f"from the recording's sidecar {sidecar.group(1)}: device capacity 139.80 GiB" in run.stderr
    assert "torch 2.11; device: 139.80 GiB" in run.stdout, run.stdout
