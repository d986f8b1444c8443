"""Valid traces shaped to make the pool attribution (core/sim/pools.py) quadratic.

They are not errors: a snapshot whose final segments show a private pool is attributed
at any length, so the work per entry must stay bounded. Before the free-gap index,
5,000 segments made one after another took 17.7 s (every new segment looked at every
live one) and 100,000 blocks placed from the top of one segment down took 631 s.
The bound is CPU time of the whole decode, far above the linear cost (< 1.5 s here).
"""

from __future__ import annotations

import gc
import time
from typing import Any

import pytest

from allocconf_widget.core.sim.trace.extract import extract_trace

MiB = 1 << 20
BASE = 0x7F00_0000_0000


def _snapshot(entries: list[dict[str, Any]]) -> dict[str, Any]:
    private = {"address": BASE, "total_size": 20 * MiB, "segment_pool_id": (0, 1),
               "segment_type": "large", "blocks": [], "stream": 0, "device": 0,
               "allocated_size": 0, "active_size": 0, "requested_size": 0}
    return {"segments": [private], "device_traces": [entries]}


def _many_segments(n: int) -> dict[str, Any]:
    entries = []
    for i in range(n):
        addr = BASE + i * 64 * MiB
        entries.append({"action": "segment_alloc", "addr": addr, "size": 20 * MiB, "stream": 0})
        entries.append({"action": "alloc", "addr": addr, "size": 2 * MiB, "stream": 0})
    return _snapshot(entries)


def _blocks_top_down(n: int) -> dict[str, Any]:
    entries = [{"action": "segment_alloc", "addr": BASE, "size": 1 << 40, "stream": 0}]
    entries += [{"action": "alloc", "addr": BASE + (n - i) * 4 * MiB, "size": 2 * MiB, "stream": 0}
                for i in range(n)]
    return _snapshot(entries)


@pytest.mark.parametrize("build", [lambda: _many_segments(20_000), lambda: _blocks_top_down(100_000)],
                         ids=["20k-segments", "100k-blocks-top-down"])
def test_pool_attribution_stays_linear(build: Any) -> None:
    snapshot = build()
    started = time.process_time()
    trace = extract_trace(snapshot)
    seconds = time.process_time() - started
    assert trace.num_events > 0
    assert seconds < 15, f"{seconds:.1f} s of CPU to decode a valid trace"


# ---------------------------------------------------------------- the replay itself (issue 22.6)
def _replay_cpu(shape: str, n: int) -> float:
    from allocconf_widget.core.sim.settings import SimSettings
    from allocconf_widget.core.sim.simulator import simulate
    from tests.hostile.replay_shapes import SHAPES

    build, conf = SHAPES[shape]
    trace = extract_trace({"device_traces": [build(n)], "segments": []})
    settings = SimSettings.from_string(conf, (2, 11))
    simulate(trace, settings)  # warm: rounding caches, first-time imports
    best = float("inf")
    for _ in range(2):  # the better of two: a shared machine's hiccups are not the replay's
        # Python's cyclic GC walks every live object of this test process (the whole suite's
        # heap in a full run): its passes grow with what other tests left, not with the replay
        gc.collect()
        gc.disable()
        try:
            started = time.process_time()
            result = simulate(trace, settings)
            best = min(best, time.process_time() - started)
        finally:
            gc.enable()
        assert result.oom is None and result.events == trace.num_events
    return best


@pytest.mark.parametrize("shape", ["freed_segments", "expandable_holes", "many_streams", "many_pools"])
def test_replay_stays_linear_on_adversarial_valid_shapes(shape: str) -> None:
    """Four times the events cost about four times the CPU, not sixteen: many segments
    created and released (the driver address model), holes in expandable segments (the room
    search), a new stream or private pool per cycle with an ``empty_cache()`` each (the
    release walk). Before the fix the 100k-entry replays took 4–30 s and grew quadratically;
    the bound is the ratio, with room for a busy machine, and a ceiling far above linear."""
    small = _replay_cpu(shape, 25_000)
    large = _replay_cpu(shape, 100_000)
    assert large < 10, f"{large:.1f} s of CPU to replay a valid 100k-entry trace"
    assert large < 8 * max(small, 0.05), (
        f"{shape}: 4× the entries cost {large / max(small, 1e-9):.1f}× the CPU "
        f"({small:.2f} s → {large:.2f} s)")


def test_a_limit_read_off_many_ooms_stays_linear() -> None:
    """100,000 caught OOMs, each after a segment event (a batch finder that never gives up):
    the limit they show (``capacity.held_limit``, asked by every what-if without a fraction)
    walked every segment event once per OOM, 10^10 steps; now once in all."""
    from allocconf_widget.core.sim.capacity import replay_room

    entries: list[dict[str, Any]] = []
    for i in range(100_000):
        addr = BASE + i * 32 * MiB
        entries += [{"action": "segment_alloc", "addr": addr, "size": 20 * MiB, "stream": 0},
                    {"action": "alloc", "addr": addr, "size": 20 * MiB, "stream": 0},
                    {"action": "oom", "size": 1 << 30, "device_free": 100 << 30, "stream": 0},
                    {"action": "free_completed", "addr": addr, "size": 20 * MiB, "stream": 0},
                    {"action": "segment_free", "addr": addr, "size": 20 * MiB, "stream": 0}]
    trace = extract_trace(_snapshot(entries))
    started = time.process_time()
    room = replay_room(trace, None, 0, None, read_limit=True)
    seconds = time.process_time() - started
    assert room.fraction is not None and "100,000 OOM(s)" in (room.note or "")
    assert seconds < 10, f"{seconds:.1f} s of CPU to read the limit off 100,000 OOMs"


@pytest.mark.parametrize("key", ["stream", "pool_id"])
def test_a_new_stream_or_pool_per_entry_is_refused_past_the_lane_limit(key: str) -> None:
    """Each (pool, stream) pair costs every replay its own free lists: a crafted file with a new
    stream (or pool id) per allocation cost 14 KiB and 0.5 ms per entry per setting replayed.
    The limit stays far above the valid shapes above (20,000 pools or streams)."""
    from allocconf_widget._errors import SnapshotError
    from allocconf_widget.core.sim.trace.decode import MAX_LANES

    def entry(i: int) -> dict[str, Any]:
        where: dict[str, Any] = {"stream": i + 1} if key == "stream" else {"stream": 0, "pool_id": (i, i)}
        return {"action": "alloc", "addr": BASE + i * 1024, "size": 512, **where}

    extract_trace(_snapshot([entry(i) for i in range(MAX_LANES - 1)]))  # within the limit: replays
    with pytest.raises(SnapshotError, match=r"more than 65,536 \(memory pool, stream\) pairs"):
        extract_trace(_snapshot([entry(i) for i in range(MAX_LANES + 10)]))


def test_telling_whether_the_cpu_ran_ahead_stays_linear() -> None:
    """100,000 frees requested, then all completed, with no allocation between: a search of
    the rows between each request and its completion (the first way of telling whether the
    CPU ran ahead) read 10^10 rows."""
    from allocconf_widget.core.sim.timing import host_ran_ahead

    n = 100_000
    entries = [{"action": "alloc", "addr": BASE + i * 2 * MiB, "size": MiB, "stream": 0} for i in range(n)]
    entries += [{"action": "free_requested", "addr": BASE + i * 2 * MiB, "size": MiB, "stream": 0}
                for i in range(n)]
    entries += [{"action": "free_completed", "addr": BASE + i * 2 * MiB, "size": MiB, "stream": 0}
                for i in range(n)]
    trace = extract_trace({"segments": [], "device_traces": [entries]})
    assert trace.deferred_frees
    started = time.process_time()
    assert host_ran_ahead(trace) is False
    seconds = time.process_time() - started
    assert seconds < 5, f"{seconds:.1f} s of CPU to tell whether the CPU ran ahead"
