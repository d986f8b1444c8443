"""What the Monitor tab shows, and the restart refusal path, in JupyterLab 4 and Notebook 7.

* The replay's fragmentation line has data (SVG path / plotly trace), the legend shows its
  value, and the 6 s of set-up are cut and labelled on the chart.
* Start after the replay finished begins a new run on the same chart, not an appended one.
* Segments shows the segment map with its legend and figures, readable without hovering.
* Export CSV writes into ``allocconf-exports/`` and shows a link that downloads the file.
* A token-less server with XSRF checks on refuses the kernel's restart request (403): the
  kernel says so at once and is back within seconds (it used to die 28 s later).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from tests.browser.conftest import NotebookPageFactory
from tests.browser.jupyter import (
    JupyterServer,
    artifacts_dir,
    click_button,
    find_widget,
    new_page,
    open_notebook,
    start_jupyter_server,
    wait_until,
    widget_text,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"

MONITOR_CELL = """\
from allocconf_widget.views.widgets.monitor import start_monitor
mon = start_monitor(demo=True, renderer={renderer!r}, interval=0.05)
display(mon)
"""

_JS_FIGURE = """() => {
    const gd = document.querySelector('.allocconf-monitor-figure.js-plotly-plot');
    if (!gd || !gd.data) return null;
    const frag = gd.data.find(t => t.name === 'external fragmentation');
    return {frag: frag ? frag.y.filter(v => v !== null && v !== undefined).length : -1,
            notes: (gd.layout.annotations || []).map(a => a.text)};
}"""


def _status(nb) -> str:
    return widget_text(nb.page, "monitor-status")


def _samples(nb) -> int | None:
    match = re.search(r"([\d,]+) samples", _status(nb))
    return int(match.group(1).replace(",", "")) if match else None


def _wait_finished(nb, timeout: float = 30.0) -> None:
    wait_until(lambda: "replay finished" in _status(nb), timeout=timeout,
               what="the replay to finish on the page")


def _shows_fragmentation(nb, renderer: str) -> None:
    if renderer == "svg":
        chart = find_widget(nb.page, "monitor-svg")
        path = chart.locator("path.allocconf-series-fragmentation")
        assert path.count() == 1 and path.get_attribute("d").count("L") > 50
        text = chart.inner_text()
        assert "external fragmentation 89.1%" in text  # the legend has a value
        assert "idle 6.3 s skipped" in text  # visible, not a tooltip
    else:
        shown = wait_until(lambda: nb.page.evaluate(_JS_FIGURE), timeout=10, what="plotly data")
        assert shown["frag"] > 100, shown  # the trace has points, not only a legend entry
        assert "idle 6.3 s skipped" in shown["notes"]
    assert "fragmentation 89.1%" in _status(nb)


@pytest.mark.parametrize(("ui", "renderer"), [("lab", "figurewidget"), ("lab", "svg"),
                                              ("notebook", "svg"), ("notebook", "figurewidget")])
def test_the_monitor_shows_fragmentation_new_runs_the_segment_map_and_export_links(
        notebook_page: NotebookPageFactory, ui: str, renderer: str) -> None:
    nb = notebook_page([MONITOR_CELL.format(renderer=renderer)], ui=ui)
    nb.run_all()
    _wait_finished(nb)
    _shows_fragmentation(nb, renderer)
    first = _samples(nb)
    assert first == 138  # every recorded sample, once
    assert "Start replays it on a new chart" in _status(nb)

    # Start after the replay finished: a new run on an empty chart, not an appended second pass
    click_button(nb.page, name="monitor-start")
    wait_until(lambda: "replaying" in _status(nb), timeout=15, interval=0.05,
               what="the new run to start")
    seen: list[tuple[str, int | None]] = []

    def replayed_again() -> bool:
        seen.append((_status(nb).split(" · ")[0], _samples(nb)))
        return seen[-1] == ("replay finished (Start replays it on a new chart)", first)

    wait_until(replayed_again, timeout=30, interval=0.1, what="the new run to finish")
    assert max(n or 0 for _s, n in seen) == first, seen  # never 276: nothing appended
    span = nb.value("mon.timeline.render(0).span")
    assert span[0] < 0.1 and span[1] < 3.0  # x starts again at 0, the idle start still cut

    # Segments: legend (block states) and the figures, without hovering
    click_button(nb.page, name="monitor-segments")
    segmap = find_widget(nb.page, "monitor-segmap").locator(".allocconf-segmap")
    segmap.wait_for(timeout=10_000)
    legend = segmap.locator(".allocconf-segmap-legend").inner_text()
    for state in ("allocated", "pending free (other stream)", "free (cached)"):
        assert state in legend
    figures = segmap.locator(".allocconf-segmap-figures").inner_text()
    assert "44 segments" in figures and "largest free block" in figures
    assert "external fragmentation 89%" in figures
    assert "#0 large 1.15 GiB" in segmap.inner_text()

    if ui == "lab" and renderer == "figurewidget":
        # into the artifacts; ALLOCCONF_UPDATE_DOCS_IMAGES=1 also copies it over the README's image
        nb.page.set_viewport_size({"width": 1100, "height": 1500})
        monitor = nb.page.locator(".allocconf-monitor").first
        monitor.scroll_into_view_if_needed()
        time.sleep(1.0)  # let plotly re-layout to the new width
        shot = artifacts_dir() / "screenshots" / "monitor.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        monitor.screenshot(path=str(shot))
        if os.environ.get("ALLOCCONF_UPDATE_DOCS_IMAGES"):
            shutil.copy(shot, DOCS_IMAGES / "monitor.png")

    # Export CSV: one folder, and a link that downloads the file
    click_button(nb.page, name="monitor-csv")
    wait_until(lambda: "allocconf-exports/" in _status(nb), timeout=10, what="the export note")
    link = find_widget(nb.page, "monitor-status").locator("a.allocconf-download")
    href = link.get_attribute("href")
    assert href and "/files/" in href and "allocconf-exports/allocconf-timeline-" in href
    response = nb.page.request.get(nb.server.url(href.lstrip("/")))
    assert response.ok
    header, *rows = response.text().splitlines()
    assert header.endswith(",fragmentation") and len(rows) == 138
    assert all(row.split(",")[-1] for row in rows)


# ----------------------------------------------------------------- restart refused


@pytest.fixture(scope="module")
def xsrf_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterServer]:
    """A token-less server with XSRF checks on: the set-up where the restart request got 403."""
    server = start_jupyter_server(tmp_path_factory.mktemp("jupyter-xsrf"),
                                  check_xsrf=True)
    try:
        yield server
    finally:
        server.stop(keep_log_as="jupyter-server-xsrf.log")


def _pid(nb) -> int | None:
    try:
        return nb.value("os.getpid()", setup="import os", timeout=5)
    except Exception:  # the kernel is restarting
        nb._kernel = None
        return None


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not yet reaped by the server) is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("ui", ["lab", "notebook"])
def test_a_refused_restart_says_so_and_the_kernel_is_back_at_once(chromium, xsrf_server, ui):
    cells = ["%load_ext allocconf_widget\n%allocconf set expandable_segments=True\n%allocconf apply",
             "%allocconf restart"]
    path = xsrf_server.write_notebook(f"restart-refused-{ui}.ipynb",
                                      [nbformat.v4.new_code_cell(c) for c in cells])
    page = new_page(chromium)
    try:
        nb = open_notebook(page, xsrf_server, path, ui=ui)
        nb.run_cell(0)
        pid_before = nb.value("os.getpid()", setup="import os")
        started = time.monotonic()
        nb.start_run_cell(1)
        wait_until(lambda: "refused the restart request" in nb.output_text(1), timeout=15,
                   what="the refusal message in the cell output")
        said = nb.output_text(1)
        assert "HTTP 403" in said and "XSRF" in said and "ends now" in said
        # the old kernel goes away by itself, without waiting for anyone's next cell
        wait_until(lambda: not _alive(pid_before), timeout=10, what="the refused kernel to end")
        gone_s = time.monotonic() - started
        wait_until(lambda: _pid(nb) not in (None, pid_before), timeout=30,
                   what="a new kernel process after the refused restart")
        back_s = time.monotonic() - started
        print(f"refused restart: old kernel gone after {gone_s:.1f} s, new one after {back_s:.1f} s "
              f"({ui})")
        assert back_s < 20  # it used to die only at the next interaction, 28 s later
        nb.wait_kernel_idle()
        out = nb.execute("%load_ext allocconf_widget\nimport os\nprint(os.environ.get('PYTORCH_ALLOC_CONF'))")
        assert "re-applied 'expandable_segments:True'" in out.stdout
        assert out.stdout.strip().endswith("expandable_segments:True")
    finally:
        page.context.close()
        xsrf_server.shutdown_all_sessions()
