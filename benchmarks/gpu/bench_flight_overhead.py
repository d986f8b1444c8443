"""What does the OOM flight recorder cost a real training loop? Side by side, one process.

Alternates blocks of steps with the recorder off, on at its defaults (trace only,
100k entries), on with Python stacks, and on with a ring buffer small enough to
wrap at once (the steady state of a long run), on the transformer and the CNN of
``bench_sampler_overhead.py``. Then measures the memory bound: host bytes per
ring-buffer entry (resident-set growth over a filled buffer), and what a snapshot
of a full buffer costs (time, pickle size) — the work done at the OOM.

    python3 benchmarks/gpu/bench_flight_overhead.py --json result.json

Targets (issue 13): ≤ 0.5 % at the defaults, ≤ 3 % with Python stacks.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pickle
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from bench_sampler_overhead import cnn_step_fn, timed_steps, transformer_step_fn

from allocconf_widget.adapters import torch_private
from allocconf_widget.adapters.flight_history import FlightSettings, flight_history

ARMS = {
    "off": None,
    "defaults (trace, 100k)": FlightSettings(),
    "python stacks (100k)": FlightSettings(python_stacks=True),
    "trace, wrapping (5k)": FlightSettings(max_entries=5_000),
}


def rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


def entries() -> int:
    return len(torch_private.snapshot_at_oom(torch)["device_traces"][0])


def overhead(step: object, rounds: int, steps: int) -> list[dict[str, object]]:
    times: dict[str, list[float]] = {name: [] for name in ARMS}
    history = flight_history()
    for r in range(rounds):
        order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
        for name in order:
            settings = ARMS[name]
            if settings is not None:
                history.turn_on(settings)
            times[name] += timed_steps(step, steps)
            history.turn_off()
    base = statistics.fmean(times["off"])
    rows = []
    for name, values in times.items():
        mean = statistics.fmean(values)
        rows.append({"arm": name, "steps": len(values), "mean_ms": mean * 1e3,
                     "median_ms": statistics.median(values) * 1e3,
                     "overhead_pct": None if name == "off" else (mean / base - 1) * 100,
                     "median_overhead_pct": None if name == "off" else
                     (statistics.median(values) / statistics.median(times["off"]) - 1) * 100})
    return rows


def memory(step: object, stacks: bool, target: int) -> dict[str, object]:
    history = flight_history()
    history.turn_on(FlightSettings(max_entries=target, python_stacks=stacks))
    before = rss()
    n = 0
    i = 0
    while n < target * 0.9 and i < 2000:
        timed_steps(step, 4)
        i += 4
        if i % 40 == 0:
            n = entries()
    n = entries()
    after = rss()
    started = time.perf_counter()
    snap = torch_private.snapshot_at_oom(torch)
    snap_s = time.perf_counter() - started
    raw = pickle.dumps(snap, protocol=4)
    history.turn_off()
    return {"python_stacks": stacks, "entries": n, "rss_growth": after - before,
            "bytes_per_entry": (after - before) / n if n else None,
            "snapshot_s": snap_s, "pickle_bytes": len(raw), "gzip_bytes": len(gzip.compress(raw, 6)),
            "steps": i}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json")
    args = parser.parse_args()
    result: dict[str, object] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                 "rounds": args.rounds, "steps_per_block": args.steps}
    for model in ("transformer", "cnn"):
        step, description = transformer_step_fn() if model == "transformer" else cnn_step_fn()
        timed_steps(step, 8)
        result[model] = {"workload": description, "rows": overhead(step, args.rounds, args.steps)}
        print(model, description)
        for row in result[model]["rows"]:  # type: ignore[index]
            mean, median = row["overhead_pct"], row["median_overhead_pct"]
            print(f"  {row['arm']:<26} {row['mean_ms']:8.2f} ms  "
                  f"{'' if mean is None else format(mean, '+.2f') + '%'}"
                  f"  median {'' if median is None else format(median, '+.2f') + '%'}")
        if model == "transformer":
            result["memory"] = [memory(step, False, 100_000), memory(step, True, 100_000)]
            for m in result["memory"]:  # type: ignore[attr-defined]
                print("  memory", m)
        del step
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
