"""Valid traces shaped to make the replay itself quadratic (issue 22, item 6).

Each builder returns the entries of one device's trace with about ``n`` entries; the
replay of every shape used to cost time proportional to the events times something that
grows with them:

* ``freed_segments``: every cycle keeps a new 42 or 100 MiB segment (the driver model puts
  it in fresh 32 MiB units, leaving a free range of 22 or 28 MiB beside it) and makes,
  frees and releases (``empty_cache()``) a 30 MiB one. Segments below 80 MiB take the lowest
  free range that holds them, larger ones the highest: the model once scanned every free
  range per new segment;
* ``expandable_holes`` (replayed with ``expandable_segments:True``): each cycle keeps a
  22 MiB block, frees a temporary one after it and releases its pages, leaving a hole;
  the next temporary is 512 B larger, so it fits no hole and the room search once looked
  at every hole per new mapping;
* ``many_streams``: a new stream per cycle, each with its own small segment, and an
  ``empty_cache()`` per cycle: the release once walked the free lists of every stream ever
  seen;
* ``many_pools``: a new private pool (``pool_id`` in the entries, as torch 2.12+ writes) per
  cycle, each allocating, freeing and being released.

Used by ``tests/hostile/test_adversarial_traces.py`` and ``benchmarks/bench_replay_shapes.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MiB = 1 << 20
_BASE = 0x7F00_0000_0000
#: distinct streams or pools a shape uses before it takes the first one again: within the
#: decoder's limit of (pool, stream) pairs (``trace.decode.MAX_LANES``), so a shape of any size
#: decodes; every cycle releases what it made, so a lane taken again starts empty
LANES = 60_000

Entry = dict[str, Any]


def _e(action: str, addr: int, size: int, t: int, stream: int = 0, **extra: Any) -> Entry:
    entry: Entry = {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t}
    entry.update(extra)
    return entry


def freed_segments(n: int) -> list[Entry]:
    """Keep a 42 or 100 MiB segment, make and release a 30 MiB one, per cycle (7 entries)."""
    out: list[Entry] = []
    for i in range(max(1, n // 7)):
        kept = (100 if i % 2 else 42) * MiB
        seg = _BASE - (i + 1) * 256 * MiB
        tmp = _BASE + (i + 1) * 64 * MiB
        t = len(out)
        out += [
            _e("segment_alloc", seg, kept, t),
            _e("alloc", seg, kept, t),
            _e("segment_alloc", tmp, 30 * MiB, t),
            _e("alloc", tmp, 30 * MiB, t),
            _e("free_requested", tmp, 30 * MiB, t),
            _e("free_completed", tmp, 30 * MiB, t),
            _e("segment_free", tmp, 30 * MiB, t),
        ]
    return out


def expandable_holes(n: int) -> list[Entry]:
    """Kept 22 MiB blocks with released holes between them; temporaries grow by 512 B."""
    out: list[Entry] = []
    pos = _BASE
    for i in range(max(1, n // 7)):
        tmp_size = 22 * MiB + 512 * i
        t = len(out)
        tmp = pos
        keep = pos + tmp_size
        out += [
            _e("segment_map", tmp, 20 * MiB, t),
            _e("alloc", tmp, tmp_size, t),
            _e("segment_map", keep, 40 * MiB, t),
            _e("alloc", keep, 22 * MiB, t),
            _e("free_requested", tmp, tmp_size, t),
            _e("free_completed", tmp, tmp_size, t),
            _e("segment_unmap", tmp, 20 * MiB, t),
        ]
        pos = keep + 22 * MiB
    return out


def many_streams(n: int) -> list[Entry]:
    """A new stream per cycle (the first again after :data:`LANES`): its small segment, one block
    made and freed, then a release."""
    out: list[Entry] = []
    for i in range(max(1, n // 5)):
        stream = 1000 + i % LANES
        seg = _BASE + i * 2 * MiB
        t = len(out)
        out += [
            _e("segment_alloc", seg, 2 * MiB, t, stream),
            _e("alloc", seg, 512, t, stream),
            _e("free_requested", seg, 512, t, stream),
            _e("free_completed", seg, 512, t, stream),
            _e("segment_free", seg, 2 * MiB, t, stream),
        ]
    return out


def many_pools(n: int) -> list[Entry]:
    """A new private pool per cycle (``pool_id`` on every entry; the first again after
    :data:`LANES`), released at the cycle's end."""
    out: list[Entry] = []
    for i in range(max(1, n // 5)):
        pool = [0, 1 + i % LANES]
        seg = _BASE + i * 32 * MiB
        t = len(out)
        out += [
            _e("segment_alloc", seg, 20 * MiB, t, pool_id=pool),
            _e("alloc", seg, 4 * MiB, t, pool_id=pool),
            _e("free_requested", seg, 4 * MiB, t, pool_id=pool),
            _e("free_completed", seg, 4 * MiB, t, pool_id=pool),
            _e("segment_free", seg, 20 * MiB, t, pool_id=pool),
        ]
    return out


#: name -> (builder, the PYTORCH_CUDA_ALLOC_CONF it is replayed under)
SHAPES: dict[str, tuple[Callable[[int], list[Entry]], str]] = {
    "freed_segments": (freed_segments, ""),
    "expandable_holes": (expandable_holes, "expandable_segments:True"),
    "many_streams": (many_streams, ""),
    "many_pools": (many_pools, ""),
}
