"""Fragmentation over time from a recording's history, idle stretches, new runs, the segment map.

Every figure is checked against what the real snapshots say (the bundled H200
recording and the recorded traces in tests/data), not against numbers typed here.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from allocconf_widget.adapters.replay import IDLE_KEEP, ReplaySampler, idle_cuts
from allocconf_widget.core.memory.metrics import segment_metrics
from allocconf_widget.core.memory.recording import RecordedSample, load_demo
from allocconf_widget.core.memory.snapshot import load_snapshot
from allocconf_widget.core.memory.timeline import Timeline
from allocconf_widget.core.memory.trace_fragmentation import HistoryMismatchError, fragmentation_at
from allocconf_widget.views.charts.segment_svg import segment_panel_html

DATA = Path(__file__).resolve().parents[1] / "data"
RECORDED = sorted(DATA.glob("*.pickle.gz"))


@pytest.mark.parametrize("path", [*RECORDED, None], ids=lambda p: p.name if p else "demo")
def test_the_rebuilt_layout_at_the_end_equals_the_snapshot_taken_then(path):
    snapshot = load_snapshot(path) if path is not None else load_demo().snapshot()
    try:
        (end,) = fragmentation_at(snapshot, [math.inf])
    except HistoryMismatchError as exc:
        pytest.skip(f"this recording's history cannot be replayed: {exc}")
    segments = [s for s in snapshot["segments"] if s.get("device", 0) == 0]
    truth = segment_metrics(segments)
    assert end.inactive_bytes == truth.inactive_bytes
    assert end.largest_free_block_bytes == truth.largest_free_block_bytes
    assert end.external_fragmentation == pytest.approx(truth.external_fragmentation)


def test_the_demo_has_a_fragmentation_figure_for_every_sample():
    demo = load_demo()
    values = demo.fragmentation()
    assert len(values) == len(demo.samples)
    assert all(v is not None and 0 <= v <= 1 for v in values)
    assert len(set(values)) > 10  # it moves with the run
    end = segment_metrics(demo.snapshot()["segments"]).external_fragmentation
    assert values[-1] == pytest.approx(end, abs=0.01)


def test_a_history_cut_by_max_entries_gives_no_figure_rather_than_a_wrong_one():
    snapshot = dict(load_demo().snapshot())
    entries = snapshot["device_traces"][0]
    first_alloc = next(i for i, e in enumerate(entries) if e["action"] == "alloc")
    snapshot["device_traces"] = [entries[first_alloc:]]
    with pytest.raises(HistoryMismatchError, match="does not start"):
        fragmentation_at(snapshot, [math.inf])
    snapshot["device_traces"] = [[entries[0], {**entries[5], "action": "free_completed",
                                               "addr": entries[0]["addr"] + 4096}]]
    with pytest.raises(HistoryMismatchError, match="never allocated"):
        fragmentation_at(snapshot, [math.inf])
    with pytest.raises(HistoryMismatchError, match="no allocation history"):
        fragmentation_at({"segments": []}, [0.0])
    expandable = load_snapshot(DATA / "cnn__expandable.pickle.gz")
    with pytest.raises(HistoryMismatchError, match="expandable segments"):
        fragmentation_at(expandable, [math.inf])


# ----------------------------------------------------------------- timeline


def test_a_sparse_series_keeps_its_last_measurement_as_the_latest_value():
    tl = Timeline()
    tl.add(0, {"reserved": 10.0, "fragmentation": 0.4})
    tl.add(1, {"reserved": 12.0, "fragmentation": None})
    assert tl.latest(0) == {**tl.latest(0), "reserved": 12.0, "fragmentation": 0.4}
    assert tl.render(0).series["fragmentation"] == [0.4, None]  # the data itself is not filled in


def test_clear_starts_an_empty_run():
    tl = Timeline()
    tl.add(5, {"reserved": 1.0})
    tl.mark("idle", "idle", x=1, x_end=2)
    tl.step(5, 1)
    version = tl.version
    tl.clear()
    assert tl.version > version and tl.devices == [] and tl.markers() == []
    tl.add(0.1, {"reserved": 2.0})
    assert tl.render(0).span == (0.1, 0.1)  # x may start again from 0


# ----------------------------------------------------------------- idle stretches


def _row(t: float, reserved: int) -> RecordedSample:
    return RecordedSample(t, reserved, reserved // 2, reserved // 2, reserved // 2, 0)


def test_only_unchanged_stretches_without_steps_longer_than_the_threshold_are_idle():
    rows = [_row(t / 10, 100) for t in range(0, 31)] + [_row(3.1, 200), _row(3.2, 300)]
    (cut,) = idle_cuts(rows, [], 1.0)
    assert (cut.first, cut.last, cut.start) == (0, 30, 0.0) and cut.seconds == pytest.approx(3.0)
    assert cut.removed == pytest.approx(3.0 - IDLE_KEEP)
    assert idle_cuts(rows, [1.5], 1.0) == []  # an optimizer step inside: not idle
    assert idle_cuts(rows, [], None) == []
    assert idle_cuts(rows, [], 5.0) == []


def test_the_demo_replay_cuts_its_set_up_and_keeps_every_sample_in_order():
    demo = load_demo()
    replay = ReplaySampler(demo)
    (cut,) = replay.cuts
    assert cut.seconds > 6  # model set-up before the first optimizer step
    xs = [replay.played_x(s.t) for s in demo.samples]
    assert xs == sorted(xs) and xs[0] == demo.samples[0].t
    assert xs[-1] == pytest.approx(demo.samples[-1].t - cut.removed)
    assert xs[cut.last] == pytest.approx(cut.start + IDLE_KEEP)
    steps = [replay.played_x(s.t) for s in demo.steps]
    assert steps[0] > xs[cut.last]  # the steps stay after the cut
    keep_real_time = ReplaySampler(demo, skip_idle=None)
    assert keep_real_time.cuts == [] and keep_real_time.played_x(6.0) == 6.0


# ----------------------------------------------------------------- segment map


def test_the_segment_map_prints_its_legend_and_figures():
    snapshot = load_demo().snapshot()
    html = segment_panel_html(snapshot["segments"], title="end of run")
    truth = segment_metrics(snapshot["segments"])
    assert "allocconf-segmap-legend" in html
    for label in ("allocated", "pending free (other stream)", "free (cached)"):
        assert label in html
    assert f"{truth.segment_count} segments" in html
    assert f"external fragmentation {truth.external_fragmentation:.0%}" in html
    assert "largest free block 1.15 GiB" in html
    assert html.count("text-anchor='end'") == 16  # 15 largest segments + one summed row
    assert "#0 large 1.15 GiB · 0% allocated" in html and "+29 smaller, summed · 4% allocated" in html
    assert segment_panel_html([], title="x").endswith("no segments</div>")
