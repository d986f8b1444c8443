"""A memory fraction the program changed mid-run (core/sim/limits.py): every setting replays it."""

from __future__ import annotations

import pytest

from allocconf_widget._errors import SnapshotError
from allocconf_widget.core.sim.limits import FRACTION_CHANGES_KEY
from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.simulator import simulate
from allocconf_widget.core.sim.trace.extract import extract_trace
from tests.trace_builder import TraceBuilder

MiB = 1 << 20
GiB = 1 << 30


def _lowered_mid_run() -> tuple[dict, int]:
    """Eight 100 MiB tensors cached, then the fraction lowered to 300 MiB, then 150 MiB tensors
    that no cached block serves. Returns the snapshot (without the call noted) and its time."""
    b = TraceBuilder()
    first = [b.alloc(100 * MiB) for _ in range(8)]
    for a in first:
        b.free(a)
    when = len(b.entries)
    for _ in range(5):
        b.free(b.alloc(150 * MiB))
    return b.snapshot(), when


def _peak_and_end(snapshot: dict, conf: str = "") -> tuple[int, int]:
    result = simulate(extract_trace(snapshot), SimSettings.from_string(conf, "2.11"), device_total=GiB)
    return result.peak_reserved_bytes, result.final_reserved_bytes


def test_a_lowered_fraction_makes_every_setting_release_instead_of_grow() -> None:
    snapshot, when = _lowered_mid_run()
    unaware = _peak_and_end(snapshot)
    assert unaware == (950 * MiB, 950 * MiB)  # without the call the cache keeps growing

    snapshot[FRACTION_CHANGES_KEY] = [{"device": 0, "fraction": 300 * MiB / GiB, "time_us": when}]
    trace = extract_trace(snapshot)
    assert trace.limit_changes == 1 and trace.num_ops == extract_trace(_lowered_mid_run()[0]).num_ops + 1
    # under the new limit the 150 MiB request releases the 800 MiB cache first, as torch does
    assert _peak_and_end(snapshot) == (800 * MiB, 150 * MiB)
    assert _peak_and_end(snapshot, "max_split_size_mb:128")[1] <= 300 * MiB
    # expandable segments: the freed tensors merged into one mapped range that serves 150 MiB
    # without a new mapping, and the limit bounds only new mappings
    assert _peak_and_end(snapshot, "expandable_segments:True") == (800 * MiB, 800 * MiB)


def test_a_fraction_too_low_for_the_next_tensor_is_an_oom_where_a_new_segment_is_needed() -> None:
    snapshot, when = _lowered_mid_run()
    snapshot[FRACTION_CHANGES_KEY] = [{"device": 0, "fraction": 100 * MiB / GiB, "time_us": when}]
    for conf, oom in (("", True), ("max_split_size_mb:128", True), ("expandable_segments:True", False)):
        result = simulate(extract_trace(snapshot), SimSettings.from_string(conf, "2.11"), device_total=GiB)
        assert (result.oom is not None) is oom, conf


def test_calls_on_another_device_or_after_the_trace_change_nothing() -> None:
    snapshot, when = _lowered_mid_run()
    snapshot[FRACTION_CHANGES_KEY] = [{"device": 1, "fraction": 0.1, "time_us": when},
                                      {"device": 0, "fraction": 0.1, "time_us": 10**9}]
    assert extract_trace(snapshot).limit_changes == 0
    assert _peak_and_end(snapshot) == (950 * MiB, 950 * MiB)


def test_a_trace_without_times_says_it_could_not_place_the_call() -> None:
    snapshot, _ = _lowered_mid_run()
    for entry in snapshot["device_traces"][0]:
        entry["time_us"] = 0
    snapshot[FRACTION_CHANGES_KEY] = [{"device": 0, "fraction": 0.3, "time_us": 5}]
    trace = extract_trace(snapshot)
    assert trace.limit_changes == 0
    assert any("memory-fraction change" in c and "could not be placed" in c for c in trace.caveats())


@pytest.mark.parametrize(("value", "named"), [
    ("nope", f"{FRACTION_CHANGES_KEY} must be a list"),
    ([7], f"{FRACTION_CHANGES_KEY}[0] must be a dict"),
    ([{"fraction": 1.5, "time_us": 0}], f"{FRACTION_CHANGES_KEY}[0].fraction"),
    ([{"fraction": float("nan"), "time_us": 0}], f"{FRACTION_CHANGES_KEY}[0].fraction"),
    ([{"fraction": 0.5, "time_us": -1}], f"{FRACTION_CHANGES_KEY}[0].time_us"),
    ([{"fraction": 0.5, "time_us": 1, "device": True}], f"{FRACTION_CHANGES_KEY}[0].device"),
    ([{"fraction": 0.5, "time_us": 1}] * 100_001, "at most 100,000"),
])
def test_a_malformed_record_of_calls_is_named_and_refused(value: object, named: str) -> None:
    snapshot, _ = _lowered_mid_run()
    snapshot[FRACTION_CHANGES_KEY] = value
    with pytest.raises(SnapshotError, match=named.replace("[", r"\[").replace("]", r"\]")):
        extract_trace(snapshot)
