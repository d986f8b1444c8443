"""The what-if pipeline end to end, phase by phase, beside a baseline commit (issue 23, §3).

A synthetic snapshot of ``--events`` trace entries (``bench_simulator.training_loop``, a
transformer-like training loop with ~1 % ``record_stream`` frees) is pickled once; then, in a
fresh process per tree, it goes the way ``allocconf simulate FILE --conf ... --fraction 0.5``
takes it: ``app.simulate.file_source`` loads it (restricted unpickling, structure and field
checks in a child process), ``extract_trace`` decodes it, and ``app.simulate.simulate``
replays the recorded settings (the self-check) and 8 settings on ``--workers`` processes.
Prints the wall seconds of each phase for this tree and the baseline (``--baseline REF``),
the peak memory of the process and every process it started (proportional set sizes
summed, sampled ten times a second: the issue's 1 GiB), and their ratios; on a shared
machine the ratio of two runs made back to back is the number to read.

    python benchmarks/bench_pipeline.py [--events 1000000] [--baseline 5a2f9ea] [--workers 2]
                                        [--no-stream-frees]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_replay_shapes import _export  # noqa: E402

SETTINGS = ("", "expandable_segments:True", "max_split_size_mb:128", "max_split_size_mb:512",
            "roundup_power2_divisions:4", "roundup_power2_divisions:[256:1,512:2,>:8]",
            "garbage_collection_threshold:0.6", "max_split_size_mb:256,roundup_power2_divisions:4")
PHASES = ("load", "decode", "replay 8 settings", "total", "peak memory")


def _tree_memory(root: int) -> int:
    """Bytes the process ``root`` and its descendants hold: the sum of their proportional set
    sizes (a page shared by a forked worker counts once in all), or of their resident sets
    where the kernel does not say."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_bytes()
                parents[int(entry.name)] = int(stat.rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    total = 0
    for pid in tree:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
            total += next(int(line.split()[1]) * 1024 for line in rollup if line.startswith("Pss:"))
        except (OSError, StopIteration, ValueError):
            try:
                pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
                total += pages * os.sysconf("SC_PAGE_SIZE")
            except (OSError, ValueError):
                continue
    return total


class _PeakMemory:
    """The most :func:`_tree_memory` read while the pipeline ran, sampled ten times a second
    (Linux; 0 elsewhere)."""

    def __init__(self) -> None:
        import threading

        self.peak = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, _tree_memory(os.getpid()))
            if self.done.wait(0.1):
                return

    def __enter__(self) -> _PeakMemory:
        if sys.platform.startswith("linux"):
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join()


def _worker(path: str, workers: int) -> None:
    import warnings

    from allocconf_widget.app.simulate import SimulationRequest, simulate
    from allocconf_widget.app.sources import file_source
    from allocconf_widget.core.sim.trace.extract import extract_trace

    memory = _PeakMemory().__enter__()
    t0 = time.perf_counter()
    source = file_source(path, torch_version=(2, 11), device_total=80 * 10**9, non_pytorch_bytes=0)
    t1 = time.perf_counter()
    # decoded beside the load's checks where the tree does that (TraceSource.decoded)
    trace = source.trace() if hasattr(source, "trace") else extract_trace(source.snapshot, source.device)
    t2 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = simulate(source, SimulationRequest(confs=SETTINGS, fraction=0.5, workers=workers),
                          trace=trace)
    t3 = time.perf_counter()
    memory.__exit__()
    import allocconf_widget

    print(json.dumps({"load": t1 - t0, "decode": t2 - t1, "replay 8 settings": t3 - t2,
                      "total": t3 - t0, "peak memory": memory.peak / 2**20, "events": trace.num_events,
                      "peaks": [row.result.peak_reserved_bytes for row in report.rows],
                      "package": allocconf_widget.__file__}))


def _complete_at_once(entries: list[dict[str, object]]) -> list[dict[str, object]]:
    """The entries with each ``free_completed`` moved right after its ``free_requested``."""
    late = {e["addr"] for i, e in enumerate(entries) if e["action"] == "free_requested"
            and (i + 1 == len(entries) or entries[i + 1]["action"] != "free_completed")}
    out: list[dict[str, object]] = []
    for e in entries:
        if e["action"] == "free_completed" and e["addr"] in late:
            continue
        out.append(e)
        if e["action"] == "free_requested" and e["addr"] in late:
            out.append({**e, "action": "free_completed"})
    return out


def _run(package_root: Path, path: Path, workers: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(package_root))
    out = subprocess.run([sys.executable, __file__, "--worker", str(path), "--workers", str(workers)],
                         env=env, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    assert str(result.pop("package")).startswith(str(package_root)), "measured the wrong tree"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--baseline", default="")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1, help="alternate the trees this many times")
    parser.add_argument("--no-stream-frees", action="store_true",
                        help="complete every free at once (a trace without record_stream)")
    parser.add_argument("--worker")
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.workers)
        return
    sys.path.insert(0, str(ROOT))
    from bench_simulator import training_loop

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.pickle"
        entries = training_loop(args.events)
        if args.no_stream_frees:  # every free completes at once: no record_stream, no timing range
            entries = _complete_at_once(entries)
        path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4))
        del entries
        trees = [("this tree", ROOT)]
        if args.baseline:
            trees.append((f"baseline {args.baseline}", _export(args.baseline, Path(tmp))))
        best: dict[str, dict[str, float]] = {}
        for _ in range(args.repeat):
            for name, root in trees:
                got = _run(root, path, args.workers)
                if name in best and got["peaks"] != best[name]["peaks"]:
                    raise SystemExit("results differ between runs")
                best[name] = {k: min(v, best.get(name, {}).get(k, v)) if k != "peaks" else v
                              for k, v in got.items()}
        if len(trees) == 2 and best[trees[0][0]]["peaks"] != best[trees[1][0]]["peaks"]:
            raise SystemExit("the two trees predict different peaks")
    events = int(best["this tree"]["events"])
    print(f"{events:,} trace entries, 8 settings, {args.workers} workers; best of {args.repeat}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    head = f"{'phase':<20}" + "".join(f"{name:>22}" for name, _ in trees)
    if len(trees) == 2:
        head += f"{'baseline / this':>18}"
    print(head)
    for phase in PHASES:
        unit = " MiB" if phase == "peak memory" else "s"
        digits = 0 if unit == " MiB" else 2
        line = f"{phase:<20}" + "".join(f"{best[name][phase]:>{22 - len(unit)}.{digits}f}{unit}"
                                         for name, _ in trees)
        if len(trees) == 2:
            this, base = best[trees[0][0]][phase], best[trees[1][0]][phase]
            line += f"{base / this:>17.2f}×" if this >= 0.01 else f"{'—':>18}"
        print(line)


if __name__ == "__main__":
    main()
