"""Nothing a user must read is cut off, measured in a real JupyterLab page (issue 24, items 2, 5, 6).

Each test opens a view at the 1400 px window the issue was reported at and measures in the
page (``cut_off_labels``): buttons and labels that clip their text, a button whose icon sits
above its text, chart text outside its chart or over other text, table cells that run
together, and a view wider than its output area. The same scenes run in classic Notebook 6
(Colab's widget generation) in ``test_classic_notebook.py``. Screenshots go to the artifacts
dir (``artifacts/cutoff/``), never into tracked files.
"""

from __future__ import annotations

import re

import pytest

from tests.browser.cutoff import (
    FLIGHT_CELLS,
    SIMULATE_CELLS,
    WHATIF_CELLS,
    WINDOW,
    flight_scene,
    simulate_scene,
    whatif_scene,
)

pytestmark = pytest.mark.browser


@pytest.fixture(autouse=True)
def _clean_saved_settings(no_saved_settings):
    """Each test starts without settings saved by an earlier test's Apply."""


def _open(notebook_page, cells):
    nb = notebook_page(cells, ui="lab")
    nb.page.set_viewport_size(WINDOW)
    nb.run_all(timeout=180)
    return nb


def test_whatif_charts_rows_and_confirmation_are_whole_and_draw_this_kernels_setting(notebook_page):
    seen = whatif_scene(_open(notebook_page, WHATIF_CELLS), "lab")
    assert seen.cut == [], seen.cut
    # every chart label is a row's whole setting (they were cut at 40 and 60 characters)
    whole = {*seen.rows, *(f"{conf} (this kernel)" for conf in seen.rows)}
    labels = [t for t in seen.texts if not re.fullmatch(r"(OOM )?[\d.]+ [KMGT]?i?B", t)]
    assert labels and set(labels) <= whole, (labels, seen.rows)
    assert all(t.removeprefix("— ").removesuffix(" (out of memory)") in whole
               for t in seen.legend if t.startswith("— ")), seen.legend
    # item 6: the kernel's max_split_size_mb:128 ranks 10th of 10; both charts still draw it
    assert "max_split_size_mb:128 (this kernel)" in labels, labels
    assert "— max_split_size_mb:128 (this kernel)" in seen.legend, seen.legend


def test_oom_card_apply_button_confirmation_and_sites_table_are_whole(notebook_page):
    """The card's confirmation has the What if? tab's style (issue 42: "Apply these …" / "Ca…",
    115 px for 136 px of text): question above, buttons under it at their text's width."""
    seen = flight_scene(_open(notebook_page, FLIGHT_CELLS), "lab")
    assert seen.cut == [], seen.cut
    assert seen.texts == ["Apply max_split_size_mb:128", "Apply these settings", "Cancel"]


def test_simulate_table_fits_a_1400px_window(notebook_page):
    seen = simulate_scene(_open(notebook_page, SIMULATE_CELLS), "lab")
    assert seen.cut == [], seen.cut
    assert seen.texts == ["html table"]


def test_oom_card_links_download_the_pickle_and_open_the_viewer_in_a_new_tab(notebook_page):
    """Issue 24, items 1 and 9: the files land in allocconf-exports/, the download link
    serves the very pickle, and the viewer link opens PyTorch's page itself in a new browser
    tab (not Lab's HTML viewer, which showed it blank behind "Trust HTML")."""
    from tests.browser.cutoff import VIEWER_CELLS, viewer_links_scene

    got = viewer_links_scene(_open(notebook_page, VIEWER_CELLS))
    assert got.pickle_bytes == got.pickle_size > 0
    assert got.viewer_url.endswith(".html") and "/files/allocconf-exports/" in got.viewer_url
    assert got.viewer_status == 200
    # the page, the pickle and its replay sidecar (item 8), nothing beside the notebook (other
    # tests of this server session export timelines into the same folder: only the card's count)
    stem = got.viewer_url.rsplit("/", 1)[1].rsplit(".", 1)[0]
    mine = sorted(p.rsplit(".", 1)[1] for p in got.exports if p.rsplit(".", 1)[0] == stem)
    assert mine == ["html", "json", "pickle"], got.exports


def test_monitor_labels_the_moment_of_each_number_and_its_chart_text_is_apart(notebook_page):
    """Issue 24, items 7 and 3: the status line's numbers are the last sample's, the segment
    map's the end-of-run snapshot's, and each says so; no chart text sits on another."""
    from tests.browser.cutoff import MONITOR_CELLS, monitor_scene

    seen = monitor_scene(_open(notebook_page, MONITOR_CELLS), "lab")
    status, segmap = seen.texts
    assert re.search(r"last sample, at [\d.]+ ?s: reserved", status), status
    assert "segments at the end of the run" in segmap and "in the end-of-run snapshot:" in segmap, segmap
    assert seen.cut == [], seen.cut
