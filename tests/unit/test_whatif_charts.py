"""The What-if charts (issue 24, items 2 and 6), without a browser: they always draw this
kernel's own setting, and every label is written whole. The browser tests measure the same
in the page (tests/browser/test_nothing_cut_off_browser.py, test_classic_notebook.py)."""

from __future__ import annotations

import re

import pytest

from allocconf_widget.views.text.forecast import result_peak

pytest.importorskip("ipywidgets")


@pytest.fixture(scope="module")
def recommendation():
    from allocconf_widget.app.session import get_session
    from allocconf_widget.app.simulate import SimulationRequest, simulate
    from allocconf_widget.app.sources import trace_source
    from allocconf_widget.core.config.conf import parse_conf

    # the bundled recording ranks max_split_size_mb:128 last of 10
    return simulate(trace_source(get_session(), demo=True),
                    SimulationRequest(rank=True, kernel=parse_conf("max_split_size_mb:128", warn=False)))


def _texts(svg: str) -> list[str]:
    return re.findall(r"<text[^>]*>([^<]*)</text>", svg)


def test_the_charts_draw_this_kernels_setting_even_when_it_ranks_last(recommendation):
    from allocconf_widget.views.widgets.whatif import _runs, bars_svg, overlay_svg

    assert recommendation.rows[-1].is_current  # the case of the issue
    runs = _runs(recommendation)
    assert len(runs) == 7 and runs[-1][0] == "max_split_size_mb:128 (this kernel)"
    assert "max_split_size_mb:128 (this kernel)" in _texts(bars_svg(runs))
    assert "— max_split_size_mb:128 (this kernel)" in _texts(overlay_svg(runs))
    colors = re.findall(r"stroke='(#[0-9a-f]{6})' stroke-width", overlay_svg(runs))
    assert len(set(colors)) == 7  # a line of its own colour


def test_labels_are_whole_and_the_chart_grows_to_hold_them():
    from allocconf_widget.views.widgets.whatif import bars_svg, overlay_svg

    long = "backend:cudaMallocAsync,expandable_segments:True,garbage_collection_threshold:0.6"
    runs = [(long, [0.0, 1.0], [1.0, 2.0], 2.0, "", 2.0, 2.0),
            ("(torch defaults)", [0.0, 1.0], [1.0, 3.0], 3.0, "OOM", 3.0, 3.0)]
    bars, lines = bars_svg(runs), overlay_svg(runs)
    assert long in _texts(bars) and f"— {long}" in _texts(lines)
    for svg in (bars, lines):
        width = int(re.search(r"width='(\d+)'", svg).group(1))
        assert width >= 7 * len(long)


def test_a_peak_that_depends_on_gpu_timing_is_drawn_as_its_range(tmp_path):
    """A two-stream H200 recording (``streams2``): the rows say "802.00 MiB (662.00 MiB–882.00
    MiB by GPU timing)"; the bars now say the same and draw a whisker over the range, and the
    overlay's axis reaches the range's top (it stopped at the highest point peak)."""
    import tarfile
    from pathlib import Path

    from allocconf_widget.app.simulate import SimulationRequest, simulate
    from allocconf_widget.app.sources import file_source
    from allocconf_widget.core.units import format_bytes
    from allocconf_widget.views.widgets.whatif import _runs, bars_svg, overlay_svg

    archive = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "streams2.tar.xz"
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, members=[m for m in tar.getmembers() if "streams2__default." in m.name],
                       filter="data")
    report = simulate(file_source(str(tmp_path / "streams2__default.pickle")),
                      SimulationRequest(rank=True, workers=1))
    ranged = [row for row in report.rows[:6] if row.result.timing_dependent]
    assert ranged
    runs = _runs(report)
    bars = bars_svg(runs)
    for row in ranged:
        assert result_peak(row.result) in _texts(bars)
    assert bars.count("by GPU timing</title>") == len(ranged)
    top = max(r[6] for r in runs)
    assert _texts(overlay_svg(runs))[0] == format_bytes(int(top))
