"""The compiled replay engine beside the Python one, in one process, alternating.

    python benchmarks/bench_engines.py [--events 1000000] [--repeat 3] [--recordings 22]

Replays the 1M-entry synthetic training loop (``bench_simulator.training_loop``, 1 % frees
that wait on another stream) under six settings, and the default run of each archived workload
(``benchmarks/data``, held-out programs too) under its own settings, on each engine in turn
(Python, compiled, Python, ...), ``--repeat`` times each; every replay's result is checked to be
the same on both engines. Prints per replay the best and the median seconds of each engine (CPU time) and
the ratio of the medians, then the median ratio over the recordings. The issue's target: the
compiled engine at least 10 times the Python one's speed on the 1M trace and on the recordings
(median).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_simulator import training_loop

from allocconf_widget.core.sim.engine import Engine
from allocconf_widget.core.sim.native import NativeEngine, engine_name
from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.trace.decode import decode_entries
from allocconf_widget.core.sim.trace.model import Trace
from tests.engine_agreement import Recording, archives, recordings

CONFS = ("", "expandable_segments:True", "max_split_size_mb:128", "roundup_power2_divisions:4",
         "garbage_collection_threshold:0.6", "max_split_size_mb:256,roundup_power2_divisions:4")


def _fields(result: object) -> dict[str, object]:
    return {f.name: getattr(result, f.name) for f in dataclasses.fields(result)  # type: ignore[arg-type]
            if f.name != "seconds"}


def timed(trace: Trace, s: SimSettings, repeat: int, **kwargs: object) -> tuple[list[float], list[float]]:
    """CPU seconds per replay on each engine, alternating; asserts both gave the same result.

    CPU time of this thread (the compiled engine runs in it too): on a shared machine a
    replay of a millisecond is otherwise measured by when the scheduler let it run."""
    times: dict[str, list[float]] = {"python": [], "native": []}
    first: dict[str, dict[str, object]] = {}
    for _ in range(repeat):
        for name, cls in (("python", Engine), ("native", NativeEngine)):
            engine = cls(trace, s, **kwargs)  # type: ignore[operator]
            gc.collect()  # the other engine's garbage is not this replay's time
            t0 = time.thread_time()
            result = engine.run()
            times[name].append(time.thread_time() - t0)
            first.setdefault(name, _fields(result))
            if name == "native":
                assert engine.used_native, "the compiled engine handed this replay to Python"
    assert first["python"] == first["native"], "the engines differ"
    return times["python"], times["native"]


def row(label: str, py: list[float], nat: list[float]) -> float:
    ratio = statistics.median(py) / statistics.median(nat)
    print(f"{label:58} {min(py) * 1e3:9.1f} {statistics.median(py) * 1e3:9.1f} "
          f"{min(nat) * 1e3:8.2f} {statistics.median(nat) * 1e3:8.2f} {ratio:7.1f}×", flush=True)
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--recordings", type=int, default=100, help="at most this many workloads")
    args = parser.parse_args()
    if engine_name() != "native":
        raise SystemExit("the compiled engine is not built (python setup.py build_ext --inplace)")
    head = (f"{'replay':58} {'py min':>9} {'py med':>9} {'c min':>8} {'c med':>8} {'ratio':>8}"
            "\n" + " " * 58 + "   (CPU ms per replay; ratio: Python / compiled, of the medians)")
    print(head)
    if args.events:  # 0: the recordings only
        trace = decode_entries(training_loop(args.events))
        print(f"{args.events:,}-entry training loop: {trace.num_ops:,} operations")
        big = [row(conf or "(defaults)", *timed(trace, SimSettings.from_string(conf, "2.11"), args.repeat,
                                                  device_total=80 * 10**9))
               for conf in CONFS]
        print(f"{args.events:,}-entry trace: median ratio {statistics.median(big):.1f}× "
              f"(min {min(big):.1f}×)\n")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, archive in enumerate(archives()[:args.recordings]):
            recs: list[Recording] = list(recordings(archive, Path(tmp) / str(n)))
            rec = next((r for r in recs if r.name.endswith("__default.pickle")), recs[0])
            label = f"{rec.name.rsplit(':', 1)[-1]} ({rec.trace.num_events:,} events)"
            times = timed(rec.trace, rec.settings, args.repeat, device_total=rec.device_total,
                          non_pytorch_bytes=rec.non_pytorch_bytes, stop_at_oom=False)
            ratios.append(row(label, *times))
    if ratios:
        print(f"recordings: {len(ratios)} workloads, median ratio {statistics.median(ratios):.1f}× "
              f"(min {min(ratios):.1f}×, max {max(ratios):.1f}×)")


if __name__ == "__main__":
    main()
