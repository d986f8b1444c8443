"""The replay stays linear on the valid trace shapes that made it quadratic (issue 22, item 6).

For each shape of ``tests/hostile/replay_shapes.py`` (many freed segments, expandable holes,
many streams, many private pools) and each size from 10k to 1M entries, prints the CPU time
per 10k entries of decoding (``extract_trace``: validation, decoding, pool attribution) and of
one replay (``simulate``), for this tree and, side by side, for a baseline commit (``--baseline
REF``, exported with ``git archive``; each baseline shape stops after a size that took longer
than ``--cap`` seconds). A flat column is linear; the ratio column is baseline / this tree.

    python benchmarks/bench_replay_shapes.py [--max 1000000] [--baseline 5a2f9ea] [--markdown]

Each measurement runs in its own process (so one tree's imports never serve the other), one
after another; on a shared machine say the load beside the numbers (``os.getloadavg``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _table import print_table  # noqa: E402

SIZES = (10_000, 20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000)


def _worker(shape: str, n: int) -> None:
    """Build, decode and replay one shape in this process; print the CPU seconds as JSON."""
    sys.path.append(str(ROOT))  # for tests.hostile; the package comes from PYTHONPATH first
    from allocconf_widget.core.sim.settings import SimSettings
    from allocconf_widget.core.sim.simulator import simulate
    from allocconf_widget.core.sim.trace.extract import extract_trace
    from tests.hostile.replay_shapes import SHAPES

    build, conf = SHAPES[shape]
    entries = build(n)
    settings = SimSettings.from_string(conf, (2, 11))
    t0 = time.process_time()
    trace = extract_trace({"device_traces": [entries], "segments": []})
    t1 = time.process_time()
    result = simulate(trace, settings)
    t2 = time.process_time()
    import allocconf_widget

    print(json.dumps({"entries": len(entries), "decode": t1 - t0, "replay": t2 - t1,
                      "peak": result.peak_reserved_bytes, "package": allocconf_widget.__file__}))


def _measure(package_root: Path, shape: str, n: int, timeout: float) -> dict[str, float] | None:
    env = dict(os.environ, PYTHONPATH=str(package_root))
    cmd = [sys.executable, __file__, "--worker", shape, "--n", str(n)]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=True)
    except (subprocess.TimeoutExpired, subprocess.CalledProcessError):
        return None
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    assert str(result.pop("package")).startswith(str(package_root)), "measured the wrong tree"
    return result


def _export(ref: str, into: Path) -> Path:
    """The package as it was at ``ref`` (``git archive``), for the baseline column."""
    archive = into / "baseline.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), ref, "allocconf_widget"],
                   check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max", type=int, default=1_000_000)
    parser.add_argument("--baseline", default="", help="git ref to compare with (default: none)")
    parser.add_argument("--cap", type=float, default=60.0, help="baseline: stop a shape after this")
    parser.add_argument("--shapes", default="", help="comma-separated shape names (default: all)")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--worker")
    parser.add_argument("--n", type=int, default=0)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.n)
        return
    sys.path.insert(0, str(ROOT))
    from tests.hostile.replay_shapes import SHAPES

    shapes = args.shapes.split(",") if args.shapes else list(SHAPES)
    head = ["shape", "entries", "decode ms/10k", "replay ms/10k"]
    if args.baseline:
        head += ["baseline decode", "baseline replay", "replay ratio"]
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        base_root = _export(args.baseline, Path(tmp)) if args.baseline else None
        for shape in shapes:
            base_alive = base_root is not None
            for n in SIZES:
                if n > args.max:
                    break
                mine = _measure(ROOT, shape, n, timeout=600)
                assert mine is not None, f"{shape} at {n} failed"
                per = 10_000 / mine["entries"] * 1000
                line = [shape, f"{int(mine['entries']):,}", f"{mine['decode'] * per:.1f}",
                        f"{mine['replay'] * per:.1f}"]
                if base_root is not None:
                    base = _measure(base_root, shape, n, timeout=args.cap * 4) if base_alive else None
                    if base is None:
                        base_alive = False
                        line += ["—", "—", "—"]
                    else:
                        line += [f"{base['decode'] * per:.1f}", f"{base['replay'] * per:.1f}",
                                 f"{base['replay'] / max(mine['replay'], 1e-9):.1f}×"]
                        base_alive = base["decode"] + base["replay"] <= args.cap
                lines.append(line)
                print("  ".join(line), file=sys.stderr, flush=True)
    print_table(head, lines, args.markdown)
    load = os.getloadavg()
    print(f"\nCPU time per 10k entries; load average during the run ≈ {load[0]:.1f} "
          f"(1 min) on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
