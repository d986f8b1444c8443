"""The what-if's decode runs in a child beside the load's checks (issue 23 §3): what comes
back is the trace a decode here gives, for every kind of recording, and nothing else."""

from __future__ import annotations

import dataclasses
import pickle
import sys
import warnings
from pathlib import Path

import pytest

from allocconf_widget._errors import SnapshotError
from allocconf_widget.app.simulate import SimulationRequest, simulate
from allocconf_widget.app.sources import file_source
from allocconf_widget.core.memory.snapshot import (
    TRACES_CUT_KEY,
    load_snapshot,
    load_snapshot_deriving,
    trace_cut,
)
from allocconf_widget.core.sim.trace.extract import extract_trace, guess_torch_version, read_pickled_trace
from allocconf_widget.core.sim.trace.model import Trace
from allocconf_widget.views.text.simulate import headline, report_json

DATA = Path(__file__).resolve().parents[1] / "data"
RECORDINGS = sorted(DATA.glob("*.pickle.gz"))
FIELDS = tuple(Trace.__dataclass_fields__)


def _shown(report) -> tuple[object, ...]:
    """What a report says: its rows as ``--json`` writes them (less the seconds each replay
    took), its notes and headline, and the release whose rules it used and why."""
    rows = [{k: v for k, v in row.items() if k != "seconds"} for row in report_json(report)]
    return rows, report.all_notes(), headline(report), report.torch_version, report.version_note


def _same(a: Trace, b: Trace) -> None:
    for name in FIELDS:
        assert getattr(a, name) == getattr(b, name), name


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the decode moves to a child on Linux only")
@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name.split(".")[0])
def test_the_trace_decoded_beside_the_checks_is_the_one_decoded_here(path):
    loaded = load_snapshot_deriving(path, lambda snap: extract_trace(snap, None), read_pickled_trace)
    assert loaded.derived is not None, "the decode did not come back"
    whole = load_snapshot(path)
    _same(loaded.derived, extract_trace(whole, None))
    # this process kept every other key and each trace's first entry, never a copy of the rest
    kept = loaded.snapshot
    assert {k: v for k, v in kept.items() if k not in ("device_traces", TRACES_CUT_KEY)} == \
        {k: v for k, v in whole.items() if k != "device_traces"}
    assert kept["device_traces"] == [t[:1] for t in whole["device_traces"]]
    assert dict(kept)[TRACES_CUT_KEY] == [len(t) for t in whole["device_traces"]]
    assert guess_torch_version(kept) == guess_torch_version(whole)


def test_file_source_hands_the_decoded_trace_to_the_replay():
    path = DATA / "streams__default.pickle.gz"
    source = file_source(str(path))
    if sys.platform.startswith("linux"):
        assert source.decoded is not None
    _same(source.trace(), extract_trace(load_snapshot(path), None))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the decode moves to a child on Linux only")
@pytest.mark.parametrize("name", ["streams__default", "batchfind_raw__frac_default"])
def test_a_report_from_what_the_load_kept_is_the_report_from_the_whole_file(name):
    """What a user reads from ``allocconf simulate FILE``: the same, although this process
    never unpickled the trace entries (the decode and the snapshot's facts came back)."""
    path = DATA / f"{name}.pickle.gz"
    source = file_source(str(path))
    assert source.decoded is not None and trace_cut(source.snapshot, None)
    whole = dataclasses.replace(source, snapshot=load_snapshot(path), decoded=None)
    assert not trace_cut(whole.snapshot, None)
    request = SimulationRequest(confs=("", "expandable_segments:True", "max_split_size_mb:128"),
                                workers=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept = _shown(simulate(source, request))
        again = _shown(simulate(whole, request))
    assert kept == again
    # and with the torch release left to the trace (the snapshot's keys give its floor)
    unknown = SimulationRequest(confs=("",), workers=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _shown(simulate(dataclasses.replace(source, torch_version=None), unknown)) == \
            _shown(simulate(dataclasses.replace(whole, torch_version=None), unknown))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the decode moves to a child on Linux only")
def test_another_device_of_a_file_decoded_for_one_is_refused_with_its_fix(tmp_path):
    whole = load_snapshot(DATA / "streams__default.pickle.gz")
    entries = whole["device_traces"][0]
    two = tmp_path / "two_devices.pickle"
    two.write_bytes(pickle.dumps({**whole, "device_traces": [entries, entries[:500]]}))
    source = file_source(str(two), device=0)
    assert source.decoded is not None and source.decoded.device == 0
    with pytest.raises(SnapshotError, match=r"decoded for device 0 when it was loaded; load it "
                       r"again for device 1"):
        dataclasses.replace(source, device=1).trace()
    _same(file_source(str(two), device=1).trace(), extract_trace(load_snapshot(two), 1))


@pytest.mark.parametrize("beside", [True, False], ids=["decoded beside the checks", "decoded after"])
def test_a_file_that_carries_the_cut_mark_itself_is_read_whole(tmp_path, monkeypatch, beside):
    """The mark is ours: a file with that key is not taken for a cut trace on either path."""
    whole = load_snapshot(DATA / "streams__default.pickle.gz")
    marked = tmp_path / "marked.pickle"
    marked.write_bytes(pickle.dumps({**whole, TRACES_CUT_KEY: [5, 9]}))
    if not beside:  # as for a file over the overlap's size: the caller unpickles after the checks
        monkeypatch.setattr("allocconf_widget.core.memory.unpickle_guard.OVERLAP_MAX_BYTES", 0)
    assert TRACES_CUT_KEY not in load_snapshot(marked)
    source = file_source(str(marked))
    assert (source.decoded is not None) == (beside and sys.platform.startswith("linux"))
    _same(dataclasses.replace(source, decoded=None).trace() if not beside else source.trace(),
          extract_trace(whole, None))
    if not beside:
        assert source.snapshot["device_traces"] == whole["device_traces"]


def test_a_decoded_trace_of_another_device_is_not_used():
    path = DATA / "streams__default.pickle.gz"
    source = file_source(str(path))
    import dataclasses

    other = dataclasses.replace(source, device=1)
    with pytest.raises(Exception, match="device 1 has no trace entries"):
        other.trace()


def test_the_trace_reader_builds_nothing_but_a_trace():
    class Payload:
        def __reduce__(self):
            import os

            return (os.system, ("echo hacked",))

    with pytest.raises(pickle.UnpicklingError, match=r"posix\.system is not part of a decoded trace"):
        read_pickled_trace(pickle.dumps(Payload()))
    with pytest.raises(pickle.UnpicklingError, match="a list, not a decoded trace"):
        read_pickled_trace(pickle.dumps([1, 2]))
