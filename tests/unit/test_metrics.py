"""Memory and fragmentation figures: hand-checked values, agreement with torch, identities."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocconf_widget.core.memory.metrics import (
    Metrics,
    metrics_json,
    segment_metrics,
    snapshot_metrics,
)
from allocconf_widget.core.memory.snapshot import load_snapshot
from allocconf_widget.core.units import format_bytes
from tests.snapshot_builders import GIB, MIB, block, legacy_segment, segment, snapshot

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
RECORDED = sorted(DATA_DIR.glob("*.pickle.gz"))

METRIC_KEYS = [
    "reserved_bytes", "allocated_bytes", "active_bytes", "requested_bytes", "inactive_bytes",
    "largest_free_block_bytes", "external_fragmentation", "internal_fragmentation_bytes",
    "internal_fragmentation", "segment_count", "block_count", "segsum_allocated_bytes",
    "segsum_internal_free_bytes", "segsum_external_free_bytes",
]


def _mixed_snapshot() -> Any:
    """Large, small and private-pool segments with rounding waste and a pending free."""
    large = segment(
        block(20 * MIB, requested=20 * MIB - 1000),
        block(10 * MIB, "inactive", requested=123),  # stale requested size on a free block
        block(10 * MIB, "active_pending_free", requested=9 * MIB),
        block(20 * MIB, requested=19 * MIB + MIB // 2),
    )
    small = segment(block(512, requested=100), block(2 * MIB - 512, "inactive"), kind="small")
    graph = segment(block(40 * MIB, "inactive"), pool=(1, 7), expandable=True, stream=7)
    return snapshot(large, small, graph)


# ----------------------------------------------------------------- hand-checked values


def test_figures_of_one_segment_match_the_definitions() -> None:
    # GIVEN a 60 MiB segment: 2 allocated blocks (40 MiB), 10 MiB free, 10 MiB pending free
    seg = _mixed_snapshot()["segments"][0]
    m = segment_metrics([seg])
    # THEN (numbers worked out by hand from docs/metrics.md)
    assert m.reserved_bytes == 60 * MIB
    assert m.allocated_bytes == 40 * MIB
    assert m.active_bytes == 50 * MIB
    assert m.requested_bytes == (20 * MIB - 1000) + 9 * MIB + (19 * MIB + MIB // 2)
    assert m.inactive_bytes == 10 * MIB
    assert m.largest_free_block_bytes == 10 * MIB
    assert m.external_fragmentation == 0.0  # one free block: nothing scattered
    assert m.internal_fragmentation_bytes == 1000 + MIB // 2
    assert m.internal_fragmentation == pytest.approx((1000 + MIB // 2) / (40 * MIB))
    assert (m.segment_count, m.block_count) == (1, 4)
    # segsum view: allocated counts requested bytes; pending-free counts as external free
    assert m.segsum_allocated_bytes == (20 * MIB - 1000) + (19 * MIB + MIB // 2)
    assert m.segsum_internal_free_bytes == 1000 + MIB // 2
    assert m.segsum_external_free_bytes == 20 * MIB


def test_external_fragmentation_grows_as_free_space_scatters() -> None:
    one_hole = segment(block(30 * MIB, "inactive"), block(10 * MIB))
    two_holes = segment(block(15 * MIB, "inactive"), block(10 * MIB), block(15 * MIB, "inactive"))
    many = segment(*[b for _ in range(6) for b in (block(5 * MIB, "inactive"), block(MIB))])
    values = [segment_metrics([s]).external_fragmentation for s in (one_hole, two_holes, many)]
    assert values == [0.0, 0.5, pytest.approx(1 - 1 / 6)]


def test_no_free_memory_means_no_fragmentation() -> None:
    m = segment_metrics([segment(block(20 * MIB))])
    assert (m.inactive_bytes, m.largest_free_block_bytes, m.external_fragmentation) == (0, 0, 0.0)
    empty = segment_metrics([])
    assert empty.internal_fragmentation == 0.0 and empty.reserved_bytes == 0


def test_pools_are_reported_separately_and_add_up_to_the_total() -> None:
    result = snapshot_metrics(_mixed_snapshot())
    assert list(result) == [0]
    dev = result[0]
    assert sorted(dev.pools) == ["default/large", "default/small", "pool(1,7)/large"]
    # The graph pool's 40 MiB free block is the device's largest, but default/large's is 10 MiB:
    # a normal allocation cannot use the private pool's cache.
    assert dev.pools["default/large"].largest_free_block_bytes == 10 * MIB
    assert dev.pools["pool(1,7)/large"].largest_free_block_bytes == 40 * MIB
    assert dev.total.largest_free_block_bytes == 40 * MIB
    for key in ("reserved_bytes", "allocated_bytes", "inactive_bytes", "block_count"):
        assert getattr(dev.total, key) == sum(getattr(p, key) for p in dev.pools.values())
    assert dev.total.reserved_bytes == 60 * MIB + 2 * MIB + 40 * MIB


def test_devices_are_separated_and_can_be_filtered() -> None:
    snap = snapshot(segment(block(20 * MIB)), segment(block(4 * MIB), device=1),
                    segment(block(2 * MIB, "inactive"), device=1, kind="small"))
    result = snapshot_metrics(snap)
    assert {d: r.total.reserved_bytes for d, r in result.items()} == {0: 20 * MIB, 1: 6 * MIB}
    only = snapshot_metrics(snap, 1)
    assert list(only) == [1] and only[1].total.segment_count == 2
    assert snapshot_metrics(snap, 5) == {}
    assert snapshot_metrics(snapshot()) == {}


def test_legacy_2_0_snapshot_uses_history_sizes_and_inferred_pools() -> None:
    snap: Any = {"segments": [
        legacy_segment(block(20 * MIB, requested=15 * MIB, legacy=True),
                       block(4 * MIB, "inactive", legacy=True)),
        legacy_segment(block(512, requested=8, legacy=True), block(2 * MIB - 512, "inactive")),
    ]}
    dev = snapshot_metrics(snap)[0]
    assert sorted(dev.pools) == ["default/large", "default/small"]
    assert dev.total.requested_bytes == 15 * MIB + 8
    assert dev.total.internal_fragmentation_bytes == 5 * MIB + 504
    assert dev.pools["default/small"].inactive_bytes == 2 * MIB - 512


def test_segment_detail_is_off_by_default_and_lists_fill_when_asked() -> None:
    snap = _mixed_snapshot()
    plain = snapshot_metrics(snap)[0]
    assert plain.total.segments == ()
    assert "segments" not in plain.total.to_dict()
    detailed = snapshot_metrics(snap, include_segments=True)[0]
    fills = {s.pool: s for s in detailed.total.segments}
    assert fills["default/large"].fill == pytest.approx(40 / 60)
    assert fills["default/small"].allocated == 512
    assert fills["pool(1,7)/large"].fill == 0.0
    assert fills["pool(1,7)/large"].is_expandable and fills["pool(1,7)/large"].stream == 7
    addresses = [s.address for s in detailed.total.segments]
    assert addresses == sorted(addresses)
    assert [s.pool for s in detailed.pools["default/small"].segments] == ["default/small"]


def test_segment_metrics_can_label_segments_of_a_plain_list() -> None:
    segs = _mixed_snapshot()["segments"]
    m = segment_metrics(segs, include_segments=True)
    assert sorted(s.pool for s in m.segments) == [
        "default/large", "default/small", "pool(1,7)/large"]


def test_json_document_has_exactly_the_documented_keys() -> None:
    doc: Any = metrics_json(snapshot_metrics(_mixed_snapshot()))
    device = doc["devices"]["0"]
    assert list(device) == ["total", "pools"]
    assert list(device["total"]) == METRIC_KEYS
    assert all(list(p) == METRIC_KEYS for p in device["pools"].values())
    with_segments: Any = metrics_json(snapshot_metrics(_mixed_snapshot(), include_segments=True),
                                 include_segments=True)
    seg = with_segments["devices"]["0"]["total"]["segments"][0]
    assert set(seg) >= {"address", "total_size", "allocated", "fill", "is_expandable", "stream"}


@pytest.mark.parametrize(
    ("size", "text"),
    [(0, "0 bytes"), (1023, "1023 bytes"), (1536, "1.50 KiB"), (3 * MIB, "3.00 MiB"),
     (GIB + GIB // 4, "1.25 GiB")],
)
def test_format_bytes(size: int, text: str) -> None:
    assert format_bytes(size) == text


# ----------------------------------------------------------------- agreement with torch segsum

_SEG_UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50}
_SEG_NUM = r"(-?\d+\.\d)(Ki|Mi|Gi|Ti|Pi|)B"


def _bytes(number: str, unit: str) -> tuple[float, int]:
    return float(number) * _SEG_UNITS[unit], _SEG_UNITS[unit]


def _near(printed: tuple[float, int], ours: int) -> bool:
    value, unit = printed
    return abs(value - ours) <= 0.05 * unit + 1e-6  # segsum prints one decimal


def _search(pattern: str, text: str) -> re.Match[str]:
    match = re.search(pattern, text, re.M)
    assert match is not None, f"segsum printed no line matching {pattern!r}:\n{text}"
    return match


def _parse_segsum(text: str) -> dict[str, Any]:
    totals: dict[str, Any] = {
        "segments": int(_search(r"^segments: (\d+)$", text).group(1)),
        "total_reserved": _bytes(*_search(rf"^total_reserved: {_SEG_NUM}$", text).groups()),
        "total_allocated": _bytes(*_search(rf"^total_allocated: {_SEG_NUM}$", text).groups()),
    }
    free = _search(rf"^total_free: {_SEG_NUM}(?: \((\d+\.\d)% internal\))?$", text)
    totals["total_free"] = _bytes(free.group(1), free.group(2))
    totals["pct_internal"] = None if free.group(3) is None else float(free.group(3))
    line = re.compile(rf"^\[.*\] {_SEG_NUM} allocated, {_SEG_NUM}(?: \((\d+\.\d)% internal\))? free")
    totals["lines"] = [
        (_bytes(m.group(1), m.group(2)), _bytes(m.group(3), m.group(4)),
         None if m.group(5) is None else float(m.group(5)))
        for m in map(line.match, text.splitlines()) if m
    ]
    return totals


def _internal_pct(m: Metrics) -> float | None:
    free = m.segsum_internal_free_bytes + m.segsum_external_free_bytes
    return None if free == 0 else 100 * m.segsum_internal_free_bytes / free


def _pct_near(printed: float | None, ours: float | None) -> bool:
    if printed is None or ours is None:
        return printed is ours
    return abs(printed - ours) <= 0.05 + 1e-9


def _assert_agrees_with_segsum(segments: list[Any]) -> None:
    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    if not hasattr(memory_viz, "segsum"):
        pytest.skip("this torch's _memory_viz has no segsum (1.13 has none): no oracle to compare with")
    printed = _parse_segsum(memory_viz.segsum({"segments": segments}))
    ours = segment_metrics(segments)
    assert printed["segments"] == ours.segment_count
    assert _near(printed["total_reserved"], ours.reserved_bytes)
    assert _near(printed["total_allocated"], ours.segsum_allocated_bytes)
    free = ours.segsum_internal_free_bytes + ours.segsum_external_free_bytes
    assert _near(printed["total_free"], free)
    assert _pct_near(printed["pct_internal"], _internal_pct(ours))
    # Per segment (segsum prints segments >= 20 MiB, in its own order): match each line.
    per_segment = [segment_metrics([s]) for s in segments if s["total_size"] >= 20 * MIB]
    assert len(printed["lines"]) == len(per_segment)
    for size, seg_free, pct in printed["lines"]:
        match = next(
            (m for m in per_segment
             if _near(size, m.reserved_bytes)
             and _near(seg_free, m.segsum_internal_free_bytes + m.segsum_external_free_bytes)
             and _pct_near(pct, _internal_pct(m))),
            None,
        )
        assert match is not None, f"segsum line {size, seg_free, pct} has no counterpart"
        per_segment.remove(match)


def _hand_built() -> Iterator[Any]:
    yield pytest.param(_mixed_snapshot(), id="mixed-pools")
    yield pytest.param(snapshot(segment(block(64 * MIB, "inactive"))), id="all-free")
    yield pytest.param(snapshot(
        segment(block(30 * MIB, requested=29 * MIB), stream=3),
        segment(*[block(2 * MIB, s, requested=MIB + 7) for s in
                  ("active_allocated", "active_pending_free", "inactive") * 10], stream=5),
    ), id="streams-and-pending")
    yield pytest.param({"segments": [
        legacy_segment(block(40 * MIB, requested=33 * MIB, legacy=True),
                       block(20 * MIB, "inactive", legacy=True)),
        legacy_segment(block(512, requested=1, legacy=True), block(2 * MIB - 512, "inactive")),
    ]}, id="legacy-2.0")


@pytest.mark.parametrize("snap", list(_hand_built()))
def test_hand_built_snapshots_agree_with_torch_segsum(snap: Any) -> None:
    _assert_agrees_with_segsum(snap["segments"])


def _recorded() -> list[Any]:
    if not RECORDED:
        return [pytest.param(None, marks=pytest.mark.skip(
            reason=f"no recorded GPU snapshots in {DATA_DIR} (tests/data/*.pickle.gz) yet"))]
    return [pytest.param(path, id=path.name) for path in RECORDED]


@pytest.mark.parametrize("path", _recorded())
def test_recorded_gpu_snapshots_agree_with_torch_segsum(path: Path) -> None:
    snap = load_snapshot(path)
    for device in sorted({s.get("device", 0) for s in snap["segments"]}):
        _assert_agrees_with_segsum([s for s in snap["segments"] if s.get("device", 0) == device])


@pytest.mark.parametrize("path", _recorded())
def test_recorded_snapshots_match_torchs_own_segment_fields(path: Path) -> None:
    # torch writes allocated_size / active_size / requested_size per segment; ours, computed
    # from the blocks, must agree with what the allocator itself accounted.
    snap = load_snapshot(path)
    for seg in snap["segments"]:
        m = segment_metrics([seg])
        assert m.reserved_bytes == sum(b["size"] for b in seg["blocks"])
        assert m.allocated_bytes == seg.get("allocated_size")
        assert m.active_bytes == seg.get("active_size")
        assert m.requested_bytes == seg.get("requested_size")


# ----------------------------------------------------------------- properties

_STATES = ("active_allocated", "active_pending_free", "inactive")


@st.composite
def _blocks(draw: st.DrawFn, legacy: bool) -> Any:
    size = 512 * draw(st.integers(1, 1 << 17))
    state = draw(st.sampled_from(_STATES))
    requested = draw(st.integers(1, size))
    return block(size, state, requested, legacy=legacy)


@st.composite
def _snapshots(draw: st.DrawFn) -> Any:
    legacy = draw(st.booleans())
    segs = []
    for _ in range(draw(st.integers(0, 6))):
        blocks = draw(st.lists(_blocks(legacy), min_size=1, max_size=12))
        device = draw(st.integers(0, 1))
        if legacy:
            segs.append(legacy_segment(*blocks, device=device))
        else:
            segs.append(segment(*blocks, device=device,
                                pool=draw(st.sampled_from([(0, 0), (1, 2)])),
                                kind=draw(st.sampled_from(["large", "small"]))))
    return snapshot(*segs)


@given(_snapshots())
@settings(max_examples=200, deadline=None)
def test_identities_hold_for_any_well_formed_snapshot(snap: Any) -> None:
    for seg in snap["segments"]:
        m = segment_metrics([seg])
        pending = m.active_bytes - m.allocated_bytes
        assert m.allocated_bytes + m.inactive_bytes + pending == m.reserved_bytes == seg["total_size"]
    for dev in snapshot_metrics(snap).values():
        for m in (dev.total, *dev.pools.values()):
            assert (m.segsum_allocated_bytes + m.segsum_internal_free_bytes
                    + m.segsum_external_free_bytes) == m.reserved_bytes
            assert 0.0 <= m.external_fragmentation <= 1.0
            assert 0.0 <= m.internal_fragmentation <= 1.0
            assert m.largest_free_block_bytes <= m.inactive_bytes
        assert dev.total.reserved_bytes == sum(p.reserved_bytes for p in dev.pools.values())


@given(_snapshots())
@settings(max_examples=40, deadline=None)
def test_random_snapshots_agree_with_torch_segsum(snap: Any) -> None:
    _assert_agrees_with_segsum(snap["segments"])
