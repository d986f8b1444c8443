"""A tuple nested 200,000 deep, put in place of any value of a snapshot, never crashes the loader.

Such a value unpickles without harm (nothing hashes it while unpickling) and the checks refuse
it (too deep), but hashing it overflows the C stack and kills the process: the notebook's
kernel. So nothing may hash a value read from the file before the checks have passed (round 12
tried decoding the trace while the checking child ran, and the first case of this test crashed
it: a set lookup of the action). This walks a snapshot holding every kind of entry and key the
decoder reads, and replaces each value in turn, in one fresh interpreter that loads every case
the way ``allocconf simulate FILE`` does.
"""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MiB = 1 << 20
DEPTH = 200_000
_MARK = "\x00deep\x00"


def _base() -> dict[str, object]:
    """A small snapshot with every action the decoder reads, private pools, fraction changes,
    a cell-start mark, start segments and a dry run's mark."""
    frames = [{"filename": "train.py", "line": 3, "name": "step"}]
    seg_addr, pool_addr = 1 << 40, 1 << 41
    block = {"size": 2 * MiB, "requested_size": 2 * MiB, "address": seg_addr,
             "state": "active_allocated", "frames": frames}
    segment = {"address": seg_addr, "total_size": 20 * MiB, "allocated_size": 2 * MiB,
               "active_size": 2 * MiB, "requested_size": 2 * MiB, "device": 0, "stream": 0,
               "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
               "blocks": [block, {"size": 18 * MiB, "address": seg_addr + 2 * MiB,
                                  "state": "inactive", "frames": []}], "frames": frames}
    pooled = {**copy.deepcopy(segment), "address": pool_addr, "segment_pool_id": (1, 2),
              "blocks": [{"size": 20 * MiB, "address": pool_addr, "state": "inactive", "frames": []}]}

    def entry(action: str, addr: int, size: int, t: int, **extra: object) -> dict[str, object]:
        return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
                "frames": frames, **extra}

    a = seg_addr + 30 * MiB
    trace = [
        entry("segment_alloc", a, 20 * MiB, 1), entry("alloc", a, 4 * MiB, 2),
        entry("alloc", a + 4 * MiB, 1 * MiB, 3), entry("free_requested", a + 4 * MiB, 1 * MiB, 4),
        entry("alloc", a + 5 * MiB, 1 * MiB, 5), entry("free_completed", a + 4 * MiB, 1 * MiB, 6),
        entry("free_requested", a, 4 * MiB, 7), entry("free_completed", a, 4 * MiB, 8),
        entry("alloc", pool_addr, 2 * MiB, 9, pool_id=(1, 2)),
        entry("free_requested", pool_addr, 2 * MiB, 10, pool_id=(1, 2)),
        entry("free_completed", pool_addr, 2 * MiB, 11, pool_id=(1, 2)),
        entry("oom", 0, 900 * MiB, 12, device_free=10 * MiB),
        entry("segment_free", a, 20 * MiB, 13), entry("snapshot", 0, 0, 14),
        entry("segment_map", a, 20 * MiB, 15), entry("segment_unmap", a, 20 * MiB, 16),
        entry("alloc", a + 9 * MiB, 512, 17, user_metadata="cell"),
    ]
    return {
        "segments": [segment, pooled],
        "device_traces": [trace],
        "allocator_settings": {"max_split_size": -1, "garbage_collection_threshold": 0.0,
                               "large_segment_size": 20 * MiB, "expandable_segments": False,
                               "roundup_power2_divisions": [0] * 16,
                               "PYTORCH_CUDA_ALLOC_CONF": ""},
        "allocconf_fraction_changes": [{"device": 0, "fraction": 0.5, "time_us": 5}],
        "allocconf_cell_start": {"started_us": 1.0, "ended_us": 2.0, "token": "cell"},
        "allocconf_initial_segments": [copy.deepcopy(segment)],
        "allocconf_dry_run": {"gpu_name": "H200", "device_total_bytes": 141 << 30},
    }


def _positions(node: object, path: tuple[object, ...] = ()) -> Iterator[tuple[object, ...]]:
    """Every value's path, containers included (each replaced whole, then its parts)."""
    if path:
        yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _positions(value, (*path, key))
    elif isinstance(node, list | tuple):
        for index, value in enumerate(node):
            yield from _positions(value, (*path, index))


def _with_deep_value(path: tuple[Any, ...]) -> bytes:
    """The base snapshot with a ``DEPTH``-deep tuple at ``path`` (built as pickle opcodes: the
    pickler itself cannot write one that deep)."""
    snap: Any = _base()
    holder: Any = snap
    for key in path[:-2]:
        holder = holder[key]
    parent = holder[path[-2]] if len(path) > 1 else snap
    if isinstance(parent, tuple):  # a pair such as a pool id: rebuilt around the mark
        items = list(parent)
        items[path[-1]] = _MARK
        holder[path[-2]] = tuple(items)
    else:
        parent[path[-1]] = _MARK
    return _swap_mark(pickle.dumps(snap, protocol=4))


def _swap_mark(data: bytes) -> bytes:
    encoded = _MARK.encode()
    mark = b"\x8c" + bytes((len(encoded),)) + encoded  # SHORT_BINUNICODE
    assert data.count(mark) == 1
    return data.replace(mark, b"N" + b"\x85" * DEPTH)  # None, then TUPLE1 over and over


_LOAD_ALL = textwrap.dedent("""
    import sys
    from pathlib import Path
    from allocconf_widget._errors import AllocConfError, SnapshotError
    from allocconf_widget.app.simulate import SimulationRequest, simulate
    from allocconf_widget.app.sources import file_source
    for path in sorted(Path(sys.argv[1]).glob("*.pickle"), key=lambda p: int(p.stem)):
        print("loading", path.stem, flush=True)
        try:
            simulate(file_source(str(path)), SimulationRequest(workers=1))
        except (AllocConfError, SnapshotError):
            pass
        print("survived", path.stem, flush=True)
""")


def test_a_deep_tuple_anywhere_is_refused_without_a_crash(tmp_path: Path) -> None:
    paths = list(_positions(_base()))
    assert len(paths) > 150  # every entry field, segment field, setting and key of ours
    for number, path in enumerate(paths):
        (tmp_path / f"{number}.pickle").write_bytes(_with_deep_value(path))
    done = subprocess.run([sys.executable, "-c", _LOAD_ALL, str(tmp_path)], capture_output=True,
                          text=True, timeout=600, check=False)
    survived = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("survived")]
    last = done.stdout.splitlines()[-1] if done.stdout else ""
    crashed = paths[int(last.split()[1])] if last.startswith("loading") else None
    assert done.returncode == 0 and len(survived) == len(paths), (
        f"the process died (returncode {done.returncode}) with a deep tuple at {crashed}\n"
        f"{done.stderr[-2000:]}")
