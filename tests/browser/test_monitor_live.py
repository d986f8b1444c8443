"""The memory monitor updates in a real JupyterLab / Notebook 7 page *while the cell is busy*.

CPU-only CI has no GPU, so the monitor replays the bundled H200 recording (the
same code path as live data: a source thread fills the bounded timeline, the
view redraws at ≤ 2 Hz). We sample what the page shows while the prompt reads
``[*]:`` and require several different chart states, for the inline-SVG chart,
for plotly's FigureWidget, and for the main-thread path (``mon.play()``, the one
meant for Colab).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.browser.conftest import NotebookPageFactory
from tests.browser.jupyter import find_widget, widget_text

pytestmark = [pytest.mark.browser, pytest.mark.slow]

THREAD_CELL = """\
import time
from allocconf_widget.views.widgets.monitor import start_monitor
# real time (skip_idle=False): 8.2 s of recorded run, longer than plotly takes to appear
mon = start_monitor(demo=True, renderer={renderer!r}, interval=0.05, skip_idle=False)
display(mon)
time.sleep(9.5)  # busy: the replay thread updates the chart meanwhile
print("updates", mon.updates, "renderer", mon.renderer)
"""

PLAY_CELL = """\
from allocconf_widget.views.widgets.monitor import start_monitor
mon = start_monitor(demo=True, renderer="svg", interval=0.05, skip_idle=False)
mon.stop()
display(mon)
mon.play()  # the replay runs on this cell's own thread: no background thread at all
print("updates", mon.updates, "renderer", mon.renderer)
"""

_SAMPLES = re.compile(r"([\d,]+) samples")


def _samples_shown(nb) -> int | None:
    try:
        match = _SAMPLES.search(widget_text(nb.page, "monitor-status"))
    except Exception:  # the widget is not rendered yet
        return None
    return int(match.group(1).replace(",", "")) if match else None


def _svg_state(nb) -> str | None:
    chart = find_widget(nb.page, "monitor-svg").locator("path")
    return chart.first.get_attribute("d") if chart.count() else None


def _figure_state(nb) -> int | None:
    return nb.page.evaluate("""() => {
        const gd = document.querySelector('.allocconf-monitor-figure.js-plotly-plot');
        return gd && gd.data && gd.data[0] && gd.data[0].x ? gd.data[0].x.length : null;
    }""")


def _run_and_sample(nb, chart_state) -> tuple[list[tuple[float, int | None, object]], dict]:
    t0 = time.monotonic()

    def sample() -> tuple[float, int | None, object]:
        count, state = _samples_shown(nb), chart_state(nb)
        return round(time.monotonic() - t0, 2), count, state  # time taken after the page answered

    before = nb.start_run_all()
    seen = nb.sample_while_busy(sample, interval=0.25)
    nb.wait_until_done(before, timeout=120)
    drawn = [t for t, _c, state in seen if state]
    timings = {"run_s": round(time.monotonic() - t0, 2),
               "first_chart_s": drawn[0] if drawn else None,
               "busy_samples": len(seen)}
    return seen, timings


@pytest.mark.parametrize("ui", ["lab", "notebook"])
def test_svg_chart_updates_while_the_cell_is_busy(notebook_page: NotebookPageFactory, ui: str) -> None:
    nb = notebook_page([THREAD_CELL.format(renderer="svg")], ui=ui)
    seen, timings = _run_and_sample(nb, _svg_state)
    counts = {c for _t, c, _s in seen if c}
    shapes = {s for _t, _c, s in seen if s}
    print(json.dumps({"test": f"svg-{ui}", **timings, "distinct_counts": len(counts)}))
    assert len(counts) >= 3, f"status did not change while the cell ran: {seen}"
    assert len(shapes) >= 3, "the SVG chart was not redrawn while the cell ran"
    assert "Recording:" in widget_text(nb.page, "monitor-header")
    assert re.search(r"updates \d+ renderer svg", nb.output_text(0))


@pytest.mark.parametrize("ui", ["lab", "notebook"])
def test_figurewidget_updates_while_the_cell_is_busy(notebook_page: NotebookPageFactory, ui: str) -> None:
    nb = notebook_page([THREAD_CELL.format(renderer="figurewidget")], ui=ui)
    seen, timings = _run_and_sample(nb, _figure_state)
    lengths = {n for _t, _c, n in seen if n}
    print(json.dumps({"test": f"figurewidget-{ui}", **timings, "distinct_lengths": len(lengths)}))
    assert len(lengths) >= 3, f"the plotly chart did not change while the cell ran: {seen}"
    assert re.search(r"updates \d+ renderer figurewidget", nb.output_text(0))


def test_main_thread_replay_updates_while_the_cell_is_busy(notebook_page: NotebookPageFactory) -> None:
    nb = notebook_page([PLAY_CELL], ui="lab")
    seen, timings = _run_and_sample(nb, _svg_state)
    counts = {c for _t, c, _s in seen if c}
    print(json.dumps({"test": "play-main-thread-lab", **timings, "distinct_counts": len(counts)}))
    assert len(counts) >= 3, f"main-thread updates were not drawn while the cell ran: {seen}"
    assert "replay finished" in widget_text(nb.page, "monitor-status")
