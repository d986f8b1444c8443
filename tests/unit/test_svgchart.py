"""The inline-SVG renderer: valid markup, the data in it, bounded size, escaping."""

from __future__ import annotations

import math
import re
import xml.dom.minidom

from allocconf_widget.core.memory.recording import load_demo
from allocconf_widget.core.memory.timeline import Timeline
from allocconf_widget.views.charts.svg import timeline_svg
from tests.recordings import timeline_of


def _parse(html: str) -> xml.dom.minidom.Document:
    return xml.dom.minidom.parseString(html)  # well-formed, or this raises


def test_demo_timeline_renders_lines_legend_and_peak():
    demo = load_demo()
    html = timeline_svg(timeline_of(demo).render(0), title=demo.label)
    doc = _parse(html)
    assert "Recording: " in html
    paths = doc.getElementsByTagName("path")
    assert len(paths) >= 4  # reserved, allocated, active, non-PyTorch (+ ratio lines)
    assert "peak reserved 10.69 GiB" in html  # the real peak of that run
    assert "GiB" in html and "% " not in html.split("<svg")[0]


def test_path_points_follow_the_data():
    tl = Timeline()
    for i in range(11):
        tl.add(i, {"reserved": 1 << 30 if i < 10 else 2 << 30})
    html = timeline_svg(tl.render(0), width=500, height=200)
    d = next(p.getAttribute("d") for p in _parse(html).getElementsByTagName("path")
             if "reserved" in p.toxml())
    points = [tuple(map(float, m.groups())) for m in re.finditer(r"[ML]([\d.]+) ([\d.]+)", d)]
    assert len(points) == 11
    xs = [x for x, _y in points]
    assert xs == sorted(xs)
    ys = [y for _x, y in points]
    assert ys[-1] < ys[0]  # higher value = higher on screen
    assert len(set(ys[:10])) == 1


def test_gaps_in_a_series_break_the_line():
    tl = Timeline()
    for i in range(6):
        tl.add(i, {"reserved": 1 << 30, "allocated": None if i in (2, 3) else 1 << 29})
    html = timeline_svg(tl.render(0))
    line = next(p.getAttribute("d") for p in _parse(html).getElementsByTagName("path")
                if "allocconf-series-allocated" in p.getAttribute("class"))
    assert line.count("M") == 2


def test_fragmentation_measured_on_few_samples_is_one_line_with_a_dot_per_measurement():
    tl = Timeline()
    for i in range(40):  # a snapshot (and so a fragmentation figure) on every tenth sample only
        tl.add(i, {"reserved": 1 << 30, "fragmentation": 0.25 + i / 100 if i % 10 == 0 else None})
    html = timeline_svg(tl.render(0))
    doc = _parse(html)
    frag = next(p.getAttribute("d") for p in doc.getElementsByTagName("path")
                if "allocconf-series-fragmentation" in p.getAttribute("class"))
    assert frag.count("M") == 1 and frag.count("L") == 3  # four measurements, joined
    assert len(doc.getElementsByTagName("circle")) == 4
    assert "external fragmentation <b>55.0%</b>" in html  # the legend: the last measurement


def test_markers_are_drawn_and_labels_escaped():
    tl = Timeline()
    tl.add(0, {"reserved": 1})
    tl.cell_started("<script>alert(1)</script>", x=0)
    tl.add(5, {"reserved": 2})
    tl.cell_finished(x=4)
    tl.mark("oom", "OOM & friends", x=3)
    html = timeline_svg(tl.render(0))
    _parse(html)
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "OOM &amp; friends" in html
    assert ">OOM<" in html


def test_one_hour_at_10_hz_stays_under_64_kb():
    tl = Timeline()
    for i in range(36_000):
        tl.add(i / 10, {"reserved": 20e9 + 5e9 * math.sin(i / 100), "allocated": 9e9 + 4e9 * math.sin(i / 3),
                        "active": 9e9, "non_pytorch": 6e8, "cached_share": 0.4 + 0.2 * math.sin(i / 5),
                        "fragmentation": 0.3 if i % 10 == 0 else None})
        tl.step(i / 10, i)
        if i % 600 == 0:
            tl.cell_started(f"cell [{i // 600}]", x=i / 10)
        if i % 600 == 599:
            tl.cell_finished(x=i / 10)
    html = timeline_svg(tl.render(0, max_points=400))
    _parse(html)
    assert len(html.encode()) < 64 * 1024


def test_empty_payload_says_so():
    html = timeline_svg(Timeline().render(0), empty_text="waiting for CUDA")
    assert "waiting for CUDA" in html and "<svg" not in html
