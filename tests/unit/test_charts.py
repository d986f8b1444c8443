"""Charts built from real H200 snapshots and recordings (and one synthetic giant): the segment
map's data, the plotly timeline and the what-if figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("plotly")

from allocconf_widget.core.memory.metrics import snapshot_metrics
from allocconf_widget.core.memory.recording import load_demo
from allocconf_widget.core.memory.snapshot import load_snapshot
from allocconf_widget.core.memory.timeline import Timeline
from allocconf_widget.views.charts.figures import (
    TIMELINE_TRACES,
    ConfigRun,
    peak_bar_chart,
    reserved_overlay_chart,
    timeline_figure,
    update_timeline_figure,
)
from allocconf_widget.views.charts.segment_map import allocation_site, build_segment_map
from allocconf_widget.views.charts.segment_map_svg import segment_map_svg
from tests.recordings import load_recording, timeline_of
from tests.snapshot_builders import MIB, block, segment

DATA = Path(__file__).resolve().parents[1] / "data"
NAMES = ["cnn__default", "cnn__expandable", "cnn__frames", "transformer__default", "streams__default",
         "growing__default"]


def _snap(name: str):
    return load_snapshot(DATA / f"{name}.pickle.gz")


# ----------------------------------------------------------------- segment map


@pytest.mark.parametrize("name", NAMES)
def test_segment_map_has_one_row_per_segment_and_exact_byte_totals(name):
    snap = _snap(name)
    smap = build_segment_map(snap)
    segments = [s for s in snap["segments"] if s.get("device", 0) == 0]
    assert len({p.row for p in smap.pieces}) == len(segments) == len(smap.rows)
    # the bars add up to the reserved bytes the metrics module computes
    assert sum(p.size for p in smap.pieces) == snapshot_metrics(snap)[0].total.reserved_bytes
    allocated = sum(p.size for p in smap.pieces if p.state == "active_allocated")
    assert allocated == pytest.approx(snapshot_metrics(snap)[0].total.allocated_bytes, rel=1e-3, abs=2048)


def test_hover_shows_the_allocating_frame_when_stacks_were_recorded():
    snap = _snap("cnn__frames")
    texts = [p.hover for p in build_segment_map(snap).pieces if p.state == "active_allocated"]
    with_frames = sum(1 for seg in snap["segments"] for b in seg["blocks"]
                      if b["state"] == "active_allocated" and b.get("frames"))
    assert with_frames >= 1
    assert sum("allocated at" in t for t in texts) == with_frames
    # the first frame outside torch is the user's code: benchmarks/gpu/workloads.py
    assert any("gpu/workloads.py:" in t for t in texts), texts
    # without recorded stacks there is nothing to show, and nothing is invented
    plain = build_segment_map(_snap("cnn__default"))
    assert not any("allocated at" in p.hover for p in plain.pieces)


def test_allocation_site_skips_torch_frames():
    frames = [
        {"filename": "/x/site-packages/torch/nn/modules/conv.py", "line": 548, "name": "_conv_forward"},
        {"filename": "/home/me/train.py", "line": 12, "name": "step"},
    ]
    assert allocation_site(frames) == "me/train.py:12 step"
    assert allocation_site(frames[:1]) == "modules/conv.py:548 _conv_forward"
    assert allocation_site([]) is None


def test_huge_snapshot_is_aggregated_into_a_small_map():
    # 2,000 segments, ~24,000 blocks (allocator_facts.md §8's large case), one segment with 4,000 blocks
    segments = [
        segment(*[block(2 * MIB, "active_allocated" if i % 2 else "inactive") for i in range(10)])
        for _ in range(1_999)
    ] + [segment(*[block(64 * 1024, "active_allocated" if i % 2 else "inactive") for i in range(4000)])]
    snap = {"segments": segments}
    smap = build_segment_map(snap, max_rows=60, max_pieces=1500)
    assert len(smap.pieces) <= 1500 + 3
    assert len({p.row for p in smap.pieces}) == 60  # 59 largest + a summary row
    assert any(p.row.startswith("+1941 smaller segments") for p in smap.pieces)
    assert len(segment_map_svg(smap)) < 400_000
    reserved = sum(s["total_size"] for s in segments)
    assert sum(smap.totals.values()) == reserved  # aggregation never loses bytes


# ----------------------------------------------------------------- timeline


def _demo_timeline() -> Timeline:
    tl = timeline_of(load_demo())
    tl.cell_started("cell [2]", x=0.2)
    tl.cell_finished(x=8.0)
    tl.mark("oom", "CUDA out of memory. Tried to allocate 20.00 GiB", x=7.5, device=0)
    return tl


def test_timeline_traces_carry_the_recorded_values_and_markers():
    tl = _demo_timeline()
    fig = timeline_figure(tl.render(0), title=load_demo().label)
    names = [t.name for t in fig.data]
    assert names == ["reserved", "allocated", "active", "non-PyTorch",
                     "cached, unallocated (% of reserved)", "external fragmentation"]
    reserved = fig.data[0]
    peak = load_demo().peak("reserved_bytes.all.peak")
    assert max(reserved.y) == pytest.approx(peak / (1 << 30), rel=1e-3)  # GiB axis
    assert fig.layout.yaxis.title.text == "GiB"
    assert fig.data[4].yaxis == "y2"
    kinds = sorted(s.type for s in fig.layout.shapes)
    assert kinds == ["line", "rect"]  # the OOM line and the cell's shaded run
    assert [a.text for a in fig.layout.annotations] == ["OOM"]
    assert fig.layout.title.text.startswith("Recording: ")


def test_shares_near_100_percent_stay_under_the_100_percent_gridline_and_active_shows():
    """Issue 24, item 3 (plotly chart): the demo's cached share reaches 99 %; the right axis
    leaves room above 100 % and draws its gridlines, and active (equal to allocated here) is
    a wider, translucent band that allocated's line cannot hide."""
    fig = timeline_figure(_demo_timeline().render(0))
    shares = [v for v in fig.data[4].y if v is not None]
    top = fig.layout.yaxis2.range[1]
    assert max(shares) > 95 and top > 100 >= max(shares)
    assert fig.layout.yaxis2.showgrid and 100 % fig.layout.yaxis2.dtick == 0
    allocated, active = fig.data[1], fig.data[2]
    assert active.line.width >= 3 * allocated.line.width and active.opacity < 1


def test_timeline_over_steps_uses_the_step_axis():
    tl = Timeline(x_label="training step")
    for step in range(1, 50):
        tl.add(step, {"reserved": step * MIB, "allocated": step * MIB // 2})
    fig = timeline_figure(tl.render(0))
    assert fig.layout.xaxis.title.text == "training step"
    assert fig.layout.yaxis.title.text == "MiB"
    assert list(fig.data[0].x) == list(range(1, 50))


def test_device_picker_on_a_multi_gpu_figure():
    tl = Timeline()
    for i in range(10):
        tl.add(i, {"reserved": 1 << 30}, device=0)
        tl.add(i, {"reserved": 3 << 30}, device=1)
    fig = timeline_figure({0: tl.render(0), 1: tl.render(1)}, device=1)
    assert len(fig.data) == 2 * len(TIMELINE_TRACES)
    assert [t.visible for t in fig.data[:: len(TIMELINE_TRACES)]] == [False, True]
    menu = fig.layout.updatemenus[0]
    assert [b.label for b in menu.buttons] == ["GPU 0", "GPU 1"]
    assert menu.buttons[0].args[0]["visible"][: len(TIMELINE_TRACES)] == [True] * len(TIMELINE_TRACES)


def test_update_replaces_data_in_place():
    go = pytest.importorskip("plotly.graph_objects")
    tl = Timeline()
    tl.add(0, {"reserved": 1 << 30})
    fig = go.Figure(timeline_figure(tl.render(0)))
    for i in range(1, 100):
        tl.add(i, {"reserved": (1 + i % 3) << 30, "allocated": 1 << 29})
    tl.mark("oom", "boom", x=50)
    update_timeline_figure(fig, tl.render(0, max_points=40))
    assert len(fig.data[0].x) <= 40
    assert max(fig.data[0].y) == 3.0
    assert [a.text for a in fig.layout.annotations] == ["OOM"]


def test_recorded_transformer_timeline_round_trips_through_json():
    rec = load_recording(DATA / "transformer__default.json")
    fig = timeline_figure(timeline_of(rec).render(0))
    doc = json.loads(fig.to_json())
    assert len(doc["data"]) == len(TIMELINE_TRACES)
    assert len(fig.to_json()) < 64_000


# ----------------------------------------------------------------- what-if helpers


def test_peak_bars_and_overlay_from_plain_tuples():
    runs = [
        ("default", [0, 1, 2], [1 << 30, 5 << 30, 4 << 30], 5 << 30, ""),
        ConfigRun("max_split_size_mb:128", [0, 1], [1 << 30, 9 << 30], 9 << 30, "OOM"),
    ]
    bars = peak_bar_chart(runs, device_total=8 << 30)
    assert list(bars.data[0].x) == ["default", "max_split_size_mb:128"]
    assert list(bars.data[0].y) == [5.0, 9.0]
    assert bars.data[0].marker.color[1] != bars.data[0].marker.color[0]  # the OOM run stands out
    assert bars.data[0].text[1].startswith("OOM")
    overlay = reserved_overlay_chart(runs)
    assert [t.name for t in overlay.data] == ["default", "max_split_size_mb:128", "max_split_size_mb:128 OOM"]
    assert list(overlay.data[2].x) == [1]
