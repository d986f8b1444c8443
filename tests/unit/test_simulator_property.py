"""Property tests: self-consistency of replay, and allocator invariants at every step."""

from __future__ import annotations

import dataclasses
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from allocconf_widget.core.sim import sorted_keys
from allocconf_widget.core.sim.blocks import Block
from allocconf_widget.core.sim.engine import Engine
from allocconf_widget.core.sim.settings import SimSettings, round_size
from allocconf_widget.core.sim.simulator import self_check, simulate
from allocconf_widget.core.sim.trace.codes import SEG_NAMES
from allocconf_widget.core.sim.trace.decode import decode_entries
from allocconf_widget.core.versions import TorchVersion
from tests.trace_builder import TraceBuilder

MiB = 1 << 20

sizes = st.one_of(
    st.integers(1, MiB),
    st.integers(MiB + 1, 10 * MiB),
    st.integers(10 * MiB, 90 * MiB),
    st.sampled_from([512, 4096, MiB, 2 * MiB, 20 * MiB, 64 * MiB]),
)
action = st.one_of(
    st.tuples(st.just("alloc"), sizes, st.sampled_from([0, 0, 0, 5])),
    st.tuples(st.just("free"), st.integers(0, 10_000), st.just(0)),
)
actions = st.lists(action, min_size=4, max_size=80)
versions = st.sampled_from([TorchVersion(2, minor) for minor in (0, 3, 5, 6, 9, 10, 11, 12, 13, 15)])


@st.composite
def sim_settings(draw: st.DrawFn) -> tuple[SimSettings, int | None]:
    device = draw(st.sampled_from([None, 48 * MiB, 96 * MiB, 160 * MiB, 320 * MiB]))
    fraction = draw(st.sampled_from([None, None, 0.5, 0.9])) if device else None
    s = SimSettings(
        max_split_bytes=draw(st.sampled_from([None, None, 64 * MiB, 128 * MiB])),
        roundup_slots=(draw(st.sampled_from([0, 0, 2, 4, 8])),) * 16,
        gc_threshold=draw(st.sampled_from([0.0, 0.5, 0.8])) if fraction else 0.0,
        expandable_segments=draw(st.booleans()),
        large_segment_bytes=draw(st.sampled_from([20 * MiB, 20 * MiB, 40 * MiB])),
        per_process_memory_fraction=fraction,
        throw_on_cudamalloc_oom=draw(st.booleans()) if device else False,
        torch_version=draw(versions),
    )
    if s.max_split_bytes is not None and s.max_split_bytes < s.large_segment_bytes:
        s = SimSettings(**{**s.__dict__, "max_split_bytes": None})
    return s, device


def build(steps: list[tuple[str, int, int]]) -> TraceBuilder:
    b = TraceBuilder(reuse_addresses=True)
    live: list[tuple[int, int]] = []
    for kind, value, stream in steps:
        if kind == "alloc":
            live.append((b.alloc(value, stream=stream), stream))
        elif live:
            addr, s = live.pop(value % len(live))
            b.free(addr, stream=s)
    return b


def with_own_segment_events(entries: list[dict[str, Any]], result: Any, s: SimSettings,
                            trace: Any) -> list[dict[str, Any]]:
    """The trace torch would have written: segment events before the event that caused
    them and, when the replay stopped at an OOM, an ``oom`` entry instead of that alloc."""
    by_index: dict[int, list[dict[str, Any]]] = {}
    for idx, kind, addr, size in result.segment_events:
        by_index.setdefault(idx, []).append(
            {"action": SEG_NAMES[kind], "addr": addr, "size": size, "stream": 0}
        )
    stop = result.oom.event_index if result.stopped_early else None
    out: list[dict[str, Any]] = []
    for idx, entry in enumerate(entries):
        out.extend(by_index.get(idx, ()))
        if idx == stop:
            rounded = round_size(entry["size"], s.roundup_slots, s.torch_version >= (2, 4))
            out.append({"action": "oom", "size": rounded, "device_free": 0,
                        "stream": entry["stream"]})
            break
        out.append(entry)
    del trace
    return out


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=actions, config=sim_settings())
def test_replaying_its_own_segment_events_reproduces_them(
    steps: list[tuple[str, int, int]], config: tuple[SimSettings, int | None]
) -> None:
    s, device = config
    b = build(steps)
    trace = b.build()
    first = simulate(trace, s, device_total=device, record_segments=True)
    event(f"stopped at OOM: {first.stopped_early}")
    event(f"segments released: {first.num_device_free > 0}")
    event(f"retries: {first.num_alloc_retries > 0}")
    rewritten = decode_entries(with_own_segment_events(b.entries, first, s, trace),
                               recorded_gc=s.gc_threshold > 0)  # GC releases are malloc's own
    fidelity = self_check(rewritten, s, device_total=device)
    assert fidelity.exact, fidelity.summary()
    assert fidelity.peak_matches
    assert fidelity.recorded_peak_reserved_bytes == first.peak_reserved_bytes


def _all_blocks(eng: Engine) -> list[Block]:
    blocks: list[Block] = [b for b in eng.live if b is not None]
    for fl in eng.small_lists + eng.large_lists:
        blocks.extend(fl.blocks.values())
        blocks.extend(fl.unmapped)
    return blocks


def check_invariants(eng: Engine) -> None:
    """Structural and statistical invariants of the allocator state."""
    assert eng.reserved >= eng.active >= eng.allocated >= 0
    assert eng.allocated >= eng.requested >= 0  # no record_stream frees in these traces
    heads = set()
    for start in _all_blocks(eng):
        first = start
        while first.prev is not None:
            assert first.prev.next is first
            first = first.prev
        heads.add(first)
    mapped_total = 0
    for head in heads:
        blk: Block | None = head
        while blk is not None:
            nxt = blk.next
            if blk.mapped:
                mapped_total += blk.size
            if nxt is not None:
                assert nxt.prev is blk
                assert blk.ptr + blk.size == nxt.ptr, "blocks of a segment are contiguous"
                idle = not blk.busy and not nxt.busy and blk.mapped == nxt.mapped
                assert not idle, "two idle neighbours in the same state should have merged"
            blk = nxt
    assert mapped_total == eng.reserved
    for fl in eng.small_lists + eng.large_lists:
        keys = list(fl.keys)
        assert keys == sorted(fl.blocks)
        for key, blk in fl.blocks.items():
            assert key == (blk.size << 64) | blk.tb and blk.key == key
            assert not blk.busy and blk.mapped and blk.fl is fl
        assert fl.unmapped_ptrs == sorted(fl.unmapped_ptrs)
        assert [u.ptr for u in fl.unmapped] == fl.unmapped_ptrs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=actions, config=sim_settings())
def test_invariants_hold_after_every_event(
    steps: list[tuple[str, int, int]], config: tuple[SimSettings, int | None]
) -> None:
    s, device = config
    trace = build(steps).build()
    eng = Engine(trace, s, device_total=device, stop_at_oom=False)
    for i in range(trace.num_ops):
        eng.run_ops(i, i + 1)
        check_invariants(eng)
        if device is not None:
            assert eng.reserved <= device


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(action, min_size=40, max_size=200), config=sim_settings(),
       load=st.sampled_from([1, 1, 4]))
def test_free_lists_in_many_chunks_replay_the_same(
    steps: list[tuple[str, int, int]], config: tuple[SimSettings, int | None], load: int
) -> None:
    """A free list's keys split into chunks (SortedKeys, as a free list of thousands of
    cached blocks is; here chunks of a few keys) replay exactly as in one sorted list."""
    s, device = config
    trace = build(steps).build()

    def outcome() -> dict[str, Any]:
        result = simulate(trace, s, device_total=device, stop_at_oom=False, record_segments=True)
        fields = dataclasses.asdict(result)
        del fields["seconds"]
        return fields

    plain = outcome()
    with mock.patch.object(sorted_keys, "LOAD", load):
        assert outcome() == plain
        eng = Engine(trace, s, device_total=device, stop_at_oom=False)
        for i in range(trace.num_ops):
            eng.run_ops(i, i + 1)
            check_invariants(eng)


@settings(max_examples=100, deadline=None)
@given(steps=actions, version=versions, expandable=st.booleans())
def test_default_settings_never_oom_without_a_device_limit(
    steps: list[tuple[str, int, int]], version: TorchVersion, expandable: bool
) -> None:
    s = SimSettings(torch_version=version, expandable_segments=expandable)
    result = simulate(build(steps).build(), s)
    assert result.oom is None and result.num_ooms == 0
    assert result.peak_reserved_bytes >= result.peak_allocated_bytes
