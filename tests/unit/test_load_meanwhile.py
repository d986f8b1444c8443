"""The trace decoded while the checking child runs: the same trace, and nothing kept from a
file the checks refuse (``load_snapshot_meanwhile``, ``file_source``)."""

from __future__ import annotations

import dataclasses
import gzip
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from allocconf_widget._errors import SnapshotError
from allocconf_widget.app.simulate import file_source
from allocconf_widget.core.memory.recording import load_demo
from allocconf_widget.core.memory.snapshot import load_snapshot, load_snapshot_meanwhile
from allocconf_widget.core.sim.trace import DecodeAbandoned, Trace, extract_trace


def _fields(trace: Trace) -> dict[str, object]:
    return {f.name: getattr(trace, f.name) for f in dataclasses.fields(trace)}


@pytest.fixture(scope="module")
def demo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("meanwhile") / "demo.pickle"
    path.write_bytes(pickle.dumps(load_demo().snapshot(), protocol=4))
    return path


def test_the_early_trace_is_the_trace_decoded_after_the_checks(demo_file: Path) -> None:
    loaded = load_snapshot_meanwhile(str(demo_file), lambda s, _: extract_trace(s))
    assert loaded.early is not None
    assert _fields(loaded.early) == _fields(extract_trace(load_snapshot(str(demo_file))))


def test_file_source_hands_the_early_trace_on(demo_file: Path) -> None:
    source = file_source(str(demo_file))
    assert source.decoded is not None
    assert source.trace() is source.decoded  # the what-if does not decode it again
    assert _fields(source.trace()) == _fields(extract_trace(source.snapshot))


def test_a_file_the_checks_refuse_is_refused_though_its_trace_decoded(tmp_path: Path) -> None:
    snap = load_demo().snapshot()
    bad = {**snap, "segments": [{**snap["segments"][0], "total_size": "many"}]}
    path = tmp_path / "bad.pickle"
    path.write_bytes(pickle.dumps(bad, protocol=4))
    decoded: list[Trace] = []

    def decode(s: object, _: object) -> Trace:
        decoded.append(extract_trace(s))  # type: ignore[arg-type]
        return decoded[-1]

    with pytest.raises(SnapshotError, match="total_size"):
        load_snapshot_meanwhile(str(path), decode)
    assert decoded  # it ran (on the other core) and its result was dropped


def test_work_that_fails_early_is_left_to_the_caller(demo_file: Path) -> None:
    def fail(*_: object) -> int:
        raise KeyError("device_traces")

    loaded = load_snapshot_meanwhile(str(demo_file), fail)
    assert loaded.early is None and loaded.snapshot["segments"]


def test_a_file_too_big_to_hold_twice_is_decoded_after_the_checks(
        demo_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from allocconf_widget.core.memory import unpickle_guard

    monkeypatch.setattr(unpickle_guard, "OVERLAP_MAX_BYTES", 1)
    loaded = load_snapshot_meanwhile(gzip.compress(demo_file.read_bytes()), lambda s, _: extract_trace(s))
    assert loaded.early is None  # one copy at a time: nothing runs beside the checks
    assert file_source(str(demo_file)).trace().num_events == extract_trace(loaded.snapshot).num_events


def test_the_early_decoding_stops_once_the_checks_refuse(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace of millions of references to one entry: the checks refuse it for its expanded
    size, and the decoding running meanwhile gives up then, not after every reference (a
    57 MiB file of 30M references kept the parent busy 16 s after the child's verdict)."""
    entry = {"action": "alloc", "addr": 1, "size": 512, "stream": 0, "time_us": 1}
    path = tmp_path / "fan.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[entry] * 3_000_000]},
                                  protocol=4))
    monkeypatch.setenv("ALLOCCONF_MAX_SNAPSHOT_ITEMS", "100000")
    ended: list[BaseException] = []

    def decode(s: Any, refused: Callable[[], bool]) -> Trace:
        try:
            return extract_trace(s, abandon=refused)
        except BaseException as exc:
            ended.append(exc)
            raise

    with pytest.raises(SnapshotError, match="elements"):
        load_snapshot_meanwhile(str(path), decode)
    assert len(ended) == 1 and isinstance(ended[0], DecodeAbandoned), ended
