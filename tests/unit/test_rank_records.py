"""Rank records come from other processes: bounded, checked, and never a crash."""

from __future__ import annotations

import json

import pytest

from allocconf_widget._errors import SnapshotError
from allocconf_widget.core.memory.ranks import (
    DIED,
    FINISHED,
    MAX_RECORD_BYTES,
    OOM,
    REPORTING,
    SILENT,
    WAITING,
    RankDevice,
    RankOom,
    RankRecord,
    parse_rank_record,
    rank_state,
)

GiB = 1 << 30


def _record(**changes):
    base = RankRecord(rank=1, pid=4242, host="h", seq=3, wall=100.0, interval=0.5, status="sampling",
                      devices=(RankDevice(0, 2 * GiB, GiB, GiB, GiB, 3 * GiB, 2 * GiB, 0, 0),),
                      world_size=2, settings_variable="PYTORCH_ALLOC_CONF",
                      settings_text="expandable_segments:True", effective={"expandable_segments": True})
    return RankRecord(**{**base.__dict__, **changes})


def test_a_record_survives_the_round_trip():
    rec = _record(oom=RankOom(0, 20 * GiB, 70 * GiB, GiB, 101.0, RankDevice(0, 60 * GiB, 50 * GiB)))
    back = parse_rank_record(rec.to_json())
    assert back == rec


@pytest.mark.parametrize(("text", "message"), [
    ("not json", "not JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"v": 2}', "record version 2"),
    (json.dumps({"v": 1, "rank": -1}), "'rank' must be an integer"),
    (json.dumps({"v": 1, "rank": True}), "'rank' must be an integer"),
    (json.dumps({"v": 1, "rank": 0, "devices": "x"}), "'devices' must be a list"),
    (json.dumps({"v": 1, "rank": 0, "devices": [{}] * 65}), "'devices' must be a list"),
    (json.dumps({"v": 1, "rank": 0, "devices": [], "status": "exploded"}), "'status'"),
    ('{"v": 1, "rank": 0, "devices": [], "status": "waiting", "pid": 5, "seq": 1, "wall": NaN}',
     "NaN is not a number"),
    (json.dumps({"v": 1, "rank": 0, "devices": [], "status": "waiting", "pid": 5, "seq": 1,
                 "wall": 1.0, "interval": "fast"}), "'interval' must be a finite"),
    ("[" * 60_000, "not JSON"),  # deep nesting: a RecursionError inside json, caught
])
def test_a_broken_record_is_an_error_that_names_the_problem(text, message):
    with pytest.raises(SnapshotError, match=message):
        parse_rank_record(text, "rank-0-5.json")


def test_an_oversized_record_is_refused_before_parsing():
    with pytest.raises(SnapshotError, match="more than a rank record can hold"):
        parse_rank_record(" " * (MAX_RECORD_BYTES + 1))


def test_figures_out_of_range_become_unknown_not_wrong():
    doc = json.loads(_record().to_json())
    doc["devices"][0]["reserved"] = -5
    doc["devices"][0]["allocated"] = "12"
    back = parse_rank_record(json.dumps(doc))
    assert back.devices[0].reserved is None and back.devices[0].allocated is None


def test_control_characters_in_text_fields_are_made_printable():
    doc = json.loads(_record().to_json())
    doc["settings_text"] = "expandable_segments:True\x1b[2J"
    assert "\x1b" not in (parse_rank_record(json.dumps(doc)).settings_text or "")


@pytest.mark.parametrize(("record", "now", "alive", "state"), [
    (_record(), 100.2, True, REPORTING),
    (_record(status="waiting"), 100.2, True, WAITING),
    (_record(), 110.0, True, SILENT),
    (_record(), 100.2, False, DIED),
    (_record(status="finished"), 200.0, False, FINISHED),
    (_record(oom=RankOom(0, GiB, None, None, 100.0)), 200.0, False, OOM),
    (_record(), 110.0, None, SILENT),  # another host: liveness unknown, the clock decides
])
def test_state_comes_from_the_record_the_clock_and_the_process(record, now, alive, state):
    assert rank_state(record, now=now, alive=alive) == state
