"""Loading recorded GPU runs (JSON sidecar + snapshot) for the no-GPU replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocconf_widget._errors import SnapshotError
from allocconf_widget.core.memory.recording import load_demo, recording_from_dict
from tests.recordings import load_recording

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
    assert demo.samples[-1].t == pytest.approx(raw["timeline"][-1][0], abs=0.1)
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
    assert rec.snapshot_path is not None and Path(str(rec.snapshot_path)).name == "cnn__default.pickle.gz"


def test_oom_run_keeps_its_message():
    rec = load_recording(DATA / "growing__frac_default.json")
    assert rec.oom_message is not None and "out of memory" in rec.oom_message
    assert rec.fraction is not None


def test_malformed_recordings_raise_snapshot_error():
    with pytest.raises(SnapshotError, match="t_s"):
        recording_from_dict({"timeline_keys": ["reserved"], "timeline": [[1]]})
    rec = recording_from_dict({"timeline_keys": ["t_s"], "timeline": []}, "x")
    with pytest.raises(SnapshotError, match="no snapshot"):
        rec.snapshot()
