"""A snapshot's segments as torch writes them, and nothing else (round 16's second attack pass).

Each shape below passed the loader and printed nonsense: 5 GiB reserved that no block accounted
for, a segment listed twice counted twice, a block state torch never writes counted as active,
a device -3 shown and then refused by ``--device -3``. Each one is made from a real recording by
one change, refused with a message that names the segment, and leaves the other recordings
loading as before (the whole suite loads them).
"""

from __future__ import annotations

import copy
import gzip
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from allocconf_widget._errors import SnapshotError
from allocconf_widget.core.memory.snapshot import load_snapshot

REAL = Path(__file__).resolve().parents[1] / "data" / "cnn__default.pickle.gz"


def _real() -> dict[str, Any]:
    data: dict[str, Any] = pickle.loads(gzip.decompress(REAL.read_bytes()))
    return data


def _segment(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A segment with two blocks or more, where changing one block shows."""
    segment: dict[str, Any] = next(s for s in snapshot["segments"] if len(s["blocks"]) > 1)
    return segment


def _total_too_big(s: dict[str, Any]) -> None:
    _segment(s)["total_size"] += 5 << 30


def _listed_twice(s: dict[str, Any]) -> None:
    s["segments"].append(copy.deepcopy(s["segments"][0]))


def _overlapping(s: dict[str, Any]) -> None:
    first = s["segments"][0]
    other = copy.deepcopy(first)
    other["address"] += first["total_size"] // 2
    for block in other["blocks"]:
        block["address"] += first["total_size"] // 2
    s["segments"].append(other)


def _state(s: dict[str, Any]) -> None:
    _segment(s)["blocks"][0]["state"] = "weird"


def _device(s: dict[str, Any]) -> None:
    _segment(s)["device"] = -3


def _pool(s: dict[str, Any]) -> None:
    _segment(s)["segment_type"] = "medium"


def _pool_a_big_list(s: dict[str, Any]) -> None:
    _segment(s)["segment_type"] = list(range(1_000_000))  # quoted by its length, never by repr


def _block_outside(s: dict[str, Any]) -> None:
    _segment(s)["blocks"][1]["address"] = 1


CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "total_size above its blocks": (_total_too_big, "has blocks adding up to"),
    "a segment listed twice": (_listed_twice, "overlaps segment 0"),
    "two segments sharing memory": (_overlapping, "overlaps segment 0"),
    "a block state torch never writes": (_state, "has the state 'weird'"),
    "a negative device": (_device, "GPU indices start at 0"),
    "a pool torch never writes": (_pool, "has the segment_type 'medium'"),
    "a block outside its segment": (_block_outside, "starts at 0x1, not at"),
    "a pool that is a long list": (_pool_a_big_list, "has the segment_type a list of 1000000 items"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_segment_torch_could_not_have_written_is_refused(tmp_path: Path, case: str) -> None:
    change, said = CASES[case]
    snapshot = _real()
    change(snapshot)
    path = tmp_path / "changed.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    with pytest.raises(SnapshotError, match="segment") as caught:
        load_snapshot(path)
    assert said in str(caught.value), str(caught.value)


def test_the_real_recording_itself_loads() -> None:
    assert load_snapshot(REAL)["segments"]


def test_an_action_with_escape_sequences_reaches_no_view_raw(tmp_path: Path) -> None:
    """A trace entry's action is the file's own string: it was printed raw in the header of
    ``allocconf simulate`` (ESC, CR and BEL included)."""
    from allocconf_widget.app.simulate import SimulationRequest, simulate
    from allocconf_widget.app.sources import file_source
    from allocconf_widget.core.versions import parse_version
    from allocconf_widget.views.text.simulate import render_simulation

    snapshot = _real()
    entry = next(e for e in snapshot["device_traces"][0] if e["action"] == "alloc")
    entry["action"] = "alloc\x1b[31mEVIL\x1b[0m\r\x07"
    path = tmp_path / "action.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    source = file_source(str(path), torch_version=parse_version("2.11"), device_total=80 << 30)
    text = render_simulation(simulate(source, SimulationRequest(confs=(), workers=1)))
    assert "\\x1b[31mEVIL" in text and "\x1b" not in text and "\r" not in text and "\x07" not in text
