"""The what-if's decode runs in a child beside the load's checks (issue 23 §3): what comes
back is the trace a decode here gives, for every kind of recording, and nothing else."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

from allocconf_widget.app.simulate import file_source
from allocconf_widget.core.memory.snapshot import load_snapshot, load_snapshot_deriving
from allocconf_widget.core.sim.trace import Trace, extract_trace, read_pickled_trace

DATA = Path(__file__).resolve().parents[1] / "data"
RECORDINGS = sorted(DATA.glob("*.pickle.gz"))
FIELDS = tuple(Trace.__dataclass_fields__)


def _same(a: Trace, b: Trace) -> None:
    for name in FIELDS:
        assert getattr(a, name) == getattr(b, name), name


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the decode moves to a child on Linux only")
@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name.split(".")[0])
def test_the_trace_decoded_beside_the_checks_is_the_one_decoded_here(path):
    loaded = load_snapshot_deriving(path, lambda snap: extract_trace(snap, None), read_pickled_trace)
    assert loaded.derived is not None, "the decode did not come back"
    _same(loaded.derived, extract_trace(load_snapshot(path), None))


def test_file_source_hands_the_decoded_trace_to_the_replay():
    path = DATA / "streams__default.pickle.gz"
    source = file_source(str(path))
    if sys.platform.startswith("linux"):
        assert source.decoded is not None
    _same(source.trace(), extract_trace(load_snapshot(path), None))


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
