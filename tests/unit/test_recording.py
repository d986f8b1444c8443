"""Loading recorded GPU runs (JSON sidecar + snapshot) for the no-GPU replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocconf_widget._errors import SnapshotError
from allocconf_widget.core.memory.recording import load_demo, load_recording, recording_from_dict
from allocconf_widget.core.memory.timeline import Timeline

DATA = Path(__file__).resolve().parents[1] / "data"


def test_demo_is_the_real_h200_cnn_run_and_says_so():
    demo = load_demo()
    raw = json.loads((Path(__file__).resolve().parents[2] / "allocconf_widget/data/demo_cnn_h200.json")
                     .read_text())
    assert demo.label.startswith("Recording: ")
    assert "H200" in demo.label
    assert len(demo.samples) == len(raw["timeline"])
    assert len(demo.steps) == len(raw["steps"])
    # the recorded peak is the real memory_stats() peak, and the timeline reaches it
    assert demo.peak("reserved_bytes.all.peak") == raw["stats"]["reserved_bytes.all.peak"]
    assert max(s.reserved for s in demo.samples) == raw["stats"]["reserved_bytes.all.peak"]
    assert demo.duration == pytest.approx(raw["timeline"][-1][0], abs=0.1)
    assert demo.device_total_bytes == raw["device_total_bytes"]


def test_demo_snapshot_loads_lazily_with_the_trace_and_frames():
    demo = load_demo()
    snap = demo.snapshot()
    assert snap is demo.snapshot()  # cached
    assert len(snap["segments"]) > 0
    trace = snap["device_traces"][0]
    assert any(entry.get("frames") for entry in trace)


def test_samples_are_time_ordered_and_cached_share_is_derived():
    rec = load_recording(DATA / "cnn__default.json")
    ts = [s.t for s in rec.samples]
    assert ts == sorted(ts)
    s = next(s for s in rec.samples if s.reserved and s.allocated is not None)
    assert s.cached_share == pytest.approx((s.reserved - s.allocated) / s.reserved)
    assert rec.snapshot_path is not None and rec.snapshot_path.name == "cnn__default.pickle.gz"


def test_to_timeline_replays_up_to_a_time():
    rec = load_demo()
    half = rec.duration / 2
    partial = rec.to_timeline(until=half)
    full = rec.to_timeline(Timeline())
    assert partial.samples(0) == len(rec.samples_until(half)) < full.samples(0) == len(rec.samples)
    assert full.peaks(0)["reserved"] == rec.peak("reserved_bytes.all.peak")
    assert full.render(0).steps  # optimizer steps come along for the x axis


def test_oom_run_keeps_its_message():
    rec = load_recording(DATA / "growing__frac_default.json")
    assert rec.oom_message is not None and "out of memory" in rec.oom_message
    assert rec.fraction is not None


def test_missing_and_malformed_recordings_raise_snapshot_error(tmp_path):
    with pytest.raises(SnapshotError, match="does not exist"):
        load_recording(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SnapshotError, match="cannot read"):
        load_recording(bad)
    with pytest.raises(SnapshotError, match="t_s"):
        recording_from_dict({"timeline_keys": ["reserved"], "timeline": [[1]]})
    rec = recording_from_dict({"timeline_keys": ["t_s"], "timeline": []}, "x")
    with pytest.raises(SnapshotError, match="no snapshot"):
        rec.snapshot()
