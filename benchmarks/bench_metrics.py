"""Time ``snapshot_metrics`` on synthetic snapshots (and optionally on real files).

Target (set in the project brief): at most 5 ms for a snapshot with 20,000 blocks,
so the notebook panel can recompute on every button press without a visible delay.

    python benchmarks/bench_metrics.py                 # synthetic shapes
    python benchmarks/bench_metrics.py snap.pickle.gz  # also time a real snapshot
    python benchmarks/bench_metrics.py --check         # exit 1 when a shape misses the target
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from allocconf_widget._errors import SnapshotError
from allocconf_widget.core.memory.metrics import snapshot_metrics
from allocconf_widget.core.memory.snapshot import Snapshot, load_snapshot

TARGET_MS = 5.0
MIB = 1 << 20
STATES = ("active_allocated", "active_allocated", "inactive", "active_pending_free")


def _block(rng: random.Random, address: int, size: int, legacy: bool) -> dict[str, object]:
    state = rng.choice(STATES)
    requested = max(1, size - rng.randrange(0, 512))
    if legacy:  # torch 2.0 form: no frames / requested_size, a history list instead
        return {"size": size, "state": state,
                "history": [{"addr": address, "real_size": requested, "frames": []}]}
    frames = [{"filename": "train.py", "line": 10, "name": "forward"}]
    return {"address": address, "size": size, "requested_size": requested,
            "state": state, "frames": frames}


def synthetic_snapshot(segments: int, blocks: int, *, legacy: bool = False,
                       seed: int = 0) -> Snapshot:
    """``blocks`` blocks spread evenly over ``segments`` segments, sizes multiples of 512."""
    rng = random.Random(seed)
    per_segment = [blocks // segments + (1 if i < blocks % segments else 0)
                   for i in range(segments)]
    out: list[Any] = []
    address = 0x7F0000000000
    for index, count in enumerate(per_segment):
        small = index % 4 == 0
        sizes = [512 * rng.randrange(1, 64 if small else 4096) for _ in range(count)]
        seg_blocks, offset = [], address
        for size in sizes:
            seg_blocks.append(_block(rng, offset, size, legacy))
            offset += size
        segment: dict[str, object] = {
            "device": index % 2, "address": address, "total_size": sum(sizes),
            "stream": 0, "blocks": seg_blocks,
            "allocated_size": 0, "active_size": 0, "requested_size": 0,
        }
        if not legacy:
            segment |= {"segment_type": "small" if small else "large",
                        "segment_pool_id": (0, 0) if index % 10 else (1, 2),
                        "is_expandable": False, "frames": []}
        out.append(segment)
        address += sum(sizes) + 2 * MIB
    return {"segments": out, "device_traces": [[], []]}


def time_ms(func: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median and best wall time in milliseconds over ``repeat`` runs (after one warm-up)."""
    func()
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        func()
        runs.append((time.perf_counter() - start) * 1000)
    return statistics.median(runs), min(runs)


def _count(snapshot: Snapshot) -> tuple[int, int]:
    segs = snapshot["segments"]
    return len(segs), sum(len(s["blocks"]) for s in segs)


def _row(name: str, snapshot: Snapshot, repeat: int, segments_detail: bool) -> bool:
    nseg, nblk = _count(snapshot)
    median, best = time_ms(
        lambda: snapshot_metrics(snapshot, include_segments=segments_detail), repeat)
    ok = median <= TARGET_MS * max(1, nblk / 20_000)
    verdict = "(detail: no target)" if segments_detail else ("ok" if ok else "over target")
    print(f"{name:<38} {nseg:>8} {nblk:>8} {median:>9.2f} {best:>9.2f}  {verdict}")
    return ok or segments_detail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="real snapshot files to time as well")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a synthetic shape misses the target")
    args = parser.parse_args(argv)

    print(f"target: median <= {TARGET_MS} ms per 20,000 blocks (python {sys.version.split()[0]})")
    print(f"{'shape':<38} {'segments':>8} {'blocks':>8} {'median ms':>9} {'best ms':>9}")
    shapes = [
        ("3 segments (one huge cache)", synthetic_snapshot(3, 20_000), False),
        ("2,000 segments x 10 blocks", synthetic_snapshot(2_000, 20_000), False),
        ("20,000 segments x 1 block (worst case)", synthetic_snapshot(20_000, 20_000), False),
        ("2,000 segments, legacy 2.0 blocks",
         synthetic_snapshot(2_000, 20_000, legacy=True), False),
        ("2,000 segments, with --segments", synthetic_snapshot(2_000, 20_000), True),
    ]
    all_ok = True
    for name, snap, detail in shapes:
        ok = _row(name, snap, args.repeat, detail)
        all_ok &= ok or "worst case" in name
    for path in args.paths:
        try:
            snap = load_snapshot(path)
        except SnapshotError as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            return 2
        _row(path.name[:38], snap, args.repeat, False)
    return 0 if all_ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
