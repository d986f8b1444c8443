"""Release differences (§6.14), rounding (§6.2) and building SimSettings."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from allocconf_widget._errors import AllocConfError
from allocconf_widget.core.sim.settings import (
    LARGE_BUFFER,
    EngineRules,
    SimSettings,
    round_size,
)
from allocconf_widget.core.sim.simulator import infer_torch_version, simulate
from allocconf_widget.core.sim.trace.decode import decode_entries
from allocconf_widget.core.versions import TorchVersion, simulated_release
from tests.trace_builder import TraceBuilder
from tests.unit.test_simulator import MiB, run, segs, settings

Z = (0,) * 16


# ---------------------------------------------------------------- rounding
@pytest.mark.parametrize(
    ("n", "slots", "expected"),
    [
        (1, Z, 512),
        (1025, Z, 1536),
        (1200, (4,) * 16, 1536),  # division needs n > 512 * d = 2048
        (15 * MiB + 1, Z, 15 * MiB + 512),
        (1300 * MiB, (4,) * 16, 1536 * MiB),
        (1024 * MiB, (4,) * 16, 1024 * MiB),  # powers of two unchanged
        (1025 * MiB, (8,) * 16, 1152 * MiB),
        (3 * MiB, (0,) * 16, 3 * MiB),
        (514 * MiB, (1,) * 16, 514 * MiB),  # d = 1: plain 512 rounding (2.4+)
    ],
)
def test_round_size(n: int, slots: tuple[int, ...], expected: int) -> None:
    assert round_size(n, slots, division_needs_two=True) == expected


def test_to_division_worked_value() -> None:
    # docs/internals/allocator_facts.md §6: divisions apply only above 512·d bytes, so with d=4
    # a 1200 B request is rounded to a multiple of 512 (1536), not to the division step (1280)
    assert round_size(1200, (4,) * 16, True) == 1536
    assert round_size(2049 * 1024, (4,) * 16, True) == 2560 * 1024


def test_divisions_of_one_before_2_4_return_the_size_unrounded() -> None:
    assert round_size(1000 * 1000 + 1, (1,) * 16, division_needs_two=False) == 1000 * 1000 + 1
    assert EngineRules.derive(settings(torch_version=(2, 3)), None).division_needs_two is False
    assert EngineRules.derive(settings(torch_version=(2, 4)), None).division_needs_two is True


def test_slot_selection_by_size() -> None:
    slots = tuple([0] * 9 + [8] + [0] * 6)  # only the 512 MiB – 1 GiB band rounds
    assert round_size(600 * MiB, slots, True) == 640 * MiB
    assert round_size(300 * MiB, slots, True) == 300 * MiB


# ---------------------------------------------------------------- rules
def test_oversize_slack_per_release() -> None:
    s = {"max_split_bytes": 256 * MiB, "max_non_split_rounding_bytes": 512 * MiB}
    assert EngineRules.derive(settings(**s, torch_version=(2, 5)), None).oversize_slack == 20 * MiB
    assert EngineRules.derive(settings(**s, torch_version=(2, 6)), None).oversize_slack == 512 * MiB
    big_seg = settings(large_segment_bytes=64 * MiB, torch_version=(2, 11))
    assert EngineRules.derive(big_seg, None).oversize_slack == 64 * MiB
    old = settings(large_segment_bytes=64 * MiB, torch_version=(2, 10))
    assert EngineRules.derive(old, None).oversize_slack == LARGE_BUFFER
    assert EngineRules.derive(old, None).large_segment == LARGE_BUFFER


def test_oversize_slack_changes_reuse_from_2_6() -> None:
    b = TraceBuilder()
    b.free(b.alloc(300 * MiB))
    b.alloc(200 * MiB)
    s = {"max_split_bytes": 128 * MiB, "max_non_split_rounding_bytes": 128 * MiB}
    assert segs(run(b, settings(**s, torch_version=(2, 6)))) == [("segment_alloc", 300 * MiB)]
    assert len(segs(run(b, settings(**s, torch_version=(2, 5))))) == 2


def test_large_segment_size_from_2_11() -> None:
    b = TraceBuilder()
    b.alloc(3 * MiB)
    assert segs(run(b, settings(large_segment_bytes=32 * MiB, torch_version=(2, 11)))) == [
        ("segment_alloc", 32 * MiB)
    ]
    assert segs(run(b, settings(large_segment_bytes=32 * MiB, torch_version=(2, 10)))) == [
        ("segment_alloc", 20 * MiB)
    ]


def _tie_break_trace() -> TraceBuilder:
    """Two cached 12 MiB blocks: F (a front piece: low address, new counter) in S1 and
    the whole segment S2 (higher address, older counter). Then a 12 MiB request, then a
    30 MiB request that fits only if a whole segment can be released.

    Simulated addresses, like the driver's, go down: S2, made first, lies above S1."""
    b = TraceBuilder()
    a2 = b.alloc(12 * MiB)  # S2 (12 MiB)
    a1 = b.alloc(24 * MiB)  # S1 (24 MiB), below S2
    b.free(a1)
    a3 = b.alloc(12 * MiB)  # front of S1 (new Block object), remainder keeps S1's counter
    b.alloc(12 * MiB)  # the remainder, exact fit: S1 fully used
    b.free(a2)  # S2 whole and cached
    b.free(a3)  # F cached; its neighbour is in use, so S1 stays split
    b.alloc(12 * MiB)  # tie: address picks F (2.11), counter picks S2 (2.12)
    b.alloc(30 * MiB)  # 36 + 30 > 54: needs S2 released
    return b


def test_equal_size_tie_break_by_address_until_2_11_then_by_counter() -> None:
    b = _tie_break_trace()
    by_address = run(b, settings(torch_version=(2, 11)), device_total=54 * MiB)
    by_counter = run(b, settings(torch_version=(2, 12)), device_total=54 * MiB)
    # 2.11 took F, so the whole S2 could be released for the 30 MiB request
    assert by_address.oom is None
    assert segs(by_address)[-2:] == [("segment_free", 12 * MiB), ("segment_alloc", 30 * MiB)]
    # 2.12 took S2, so nothing whole is cached and the request fails
    assert by_counter.oom is not None
    assert by_counter.num_device_free == 0
    # 2.13+ is assumed to order by counter as well
    assert run(b, settings(torch_version=(2, 14)), device_total=54 * MiB).oom is not None


def test_simulated_release() -> None:
    assert simulated_release("2.11.0+cu130") == (2, 11)
    assert simulated_release((2, 3)) == (2, 3)
    with pytest.raises(ValueError, match="outside"):
        simulated_release("1.13")
    with pytest.raises(ValueError, match=r"MAJOR\.MINOR"):
        simulated_release("latest")


# ---------------------------------------------------------------- settings
def test_settings_validation() -> None:
    with pytest.raises(ValueError):
        SimSettings(roundup_slots=(1, 2))
    with pytest.raises(ValueError):
        SimSettings(gc_threshold=1.0)
    with pytest.raises(ValueError):
        SimSettings(per_process_memory_fraction=1.5)
    assert SimSettings(torch_version="2.7").torch_version == (2, 7)  # type: ignore[arg-type]


def test_from_allocator_settings_reads_the_snapshot_readback() -> None:
    readback = {
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,large_segment_size_mb:32,"
        "roundup_power2_divisions:[256:1,>:8],expandable_segments:False",
        "max_split_size": 128 * MiB,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": False,
        "roundup_power2_divisions": {str(1 << i): (1 if i <= 8 else 8) for i in range(16)},
        "release_lock_on_cudamalloc": False,
    }
    s = SimSettings.from_allocator_settings(readback, "2.11")
    assert s.max_split_bytes == 128 * MiB
    assert s.large_segment_bytes == 32 * MiB
    assert s.roundup_slots == (1,) * 9 + (8,) * 7
    assert not s.expandable_segments
    assert s.torch_version == (2, 11)
    unlimited = SimSettings.from_allocator_settings({"max_split_size": -1}, (2, 5))
    assert unlimited.max_split_bytes is None
    assert SimSettings.from_allocator_settings(None, (2, 2)) == SimSettings(torch_version=TorchVersion(2, 2))


def test_from_allocator_settings_is_tolerant() -> None:
    s = SimSettings.from_allocator_settings(
        {"max_split_size": "junk", "garbage_collection_threshold": "x",
         "roundup_power2_divisions": {"1": "bad", "abc": 4}, "PYTORCH_CUDA_ALLOC_CONF": 5},
        (2, 12),
    )
    assert s == SimSettings(torch_version=TorchVersion(2, 12))


def test_from_conf_uses_the_configuration_model() -> None:
    from allocconf_widget.core.config.conf import parse_conf

    conf = parse_conf(
        "max_split_size_mb:128,roundup_power2_divisions:[256:1,>:8]", torch_version="2.11"
    )
    s = SimSettings.from_conf(conf)
    assert s.max_split_bytes == 128 * MiB
    assert s.roundup_slots == (1,) * 9 + (8,) * 7
    assert s.torch_version == (2, 11)
    # the old parser (2.9) lets '>' overwrite the last band's slot
    old = SimSettings.from_conf(parse_conf("roundup_power2_divisions:[256:1,>:8]", "2.9"))
    assert old.roundup_slots == (1,) * 8 + (8,) * 8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gc = SimSettings.from_string("garbage_collection_threshold:0.6", "2.11")
    assert gc.gc_threshold == 0.6
    es = SimSettings.from_string("expandable_segments:True,large_segment_size_mb:64", "2.12")
    assert es.expandable_segments and es.large_segment_bytes == 64 * MiB


def test_from_conf_refuses_cuda_malloc_async() -> None:
    with pytest.raises(AllocConfError, match="native caching allocator"):
        SimSettings.from_string("backend:cudaMallocAsync", "2.11")


def test_describe() -> None:
    assert SimSettings().describe() == "(defaults)"
    s = SimSettings(max_split_bytes=128 * MiB, expandable_segments=True)
    assert s.describe() == "max_split_size_mb:128,expandable_segments:True"
    assert SimSettings(label="expandable_segments:True").describe() == "expandable_segments:True"


def _recorded_by(version: tuple[int, int]) -> tuple[Any, dict[str, Any]]:
    """The tie-break trace with the segment events torch ``version`` would record."""
    b = _tie_break_trace()
    result = simulate(b.build(), settings(torch_version=version), device_total=54 * MiB,
                      record_segments=True, stop_at_oom=False)
    names = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")
    by_index: dict[int, list[dict[str, Any]]] = {}
    for idx, kind, addr, size in result.segment_events:
        by_index.setdefault(idx, []).append({"action": names[kind], "addr": addr, "size": size})
    entries: list[dict[str, Any]] = []
    for idx, entry in enumerate(b.entries):
        entries.extend(by_index.get(idx, ()))
        entries.append(entry)
    return decode_entries(entries), {"max_split_size": -1}


def test_infer_torch_version_from_the_trace() -> None:
    trace, readback = _recorded_by((2, 11))
    version, fidelity = infer_torch_version(trace, readback, floor=(2, 3), device_total=54 * MiB)
    assert version == (2, 11)  # the newest release with the address tie-break
    assert fidelity is not None and fidelity.exact
    trace, readback = _recorded_by((2, 12))
    assert infer_torch_version(trace, readback, device_total=54 * MiB)[0] == (2, 12)
    # equally good rule sets: the preferred (installed) release wins
    best = infer_torch_version(trace, readback, prefer=TorchVersion(2, 14), device_total=54 * MiB)
    assert best[0] == (2, 14)


def test_infer_torch_version_without_segment_events_falls_back() -> None:
    trace = _tie_break_trace().build()
    assert infer_torch_version(trace, None, floor=(2, 3)) == (TorchVersion(2, 3), None)
    preferred = infer_torch_version(trace, None, floor=(2, 3), prefer=TorchVersion(2, 9))
    assert preferred == (TorchVersion(2, 9), None)
