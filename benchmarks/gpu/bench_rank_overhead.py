"""What does reporting to the notebook cost a rank's training loop? Side by side, one process.

Alternates blocks of training steps without and with the rank reporter
(``allocconf_widget.rank_reporter``: one ``memory_stats()`` and one small atomic file
write per interval, on a daemon thread), on two real training loops, and prints the
step-time overhead of the reporter against the interleaved baseline. Target: ≤ 0.5 %.

    python3 benchmarks/gpu/bench_rank_overhead.py [--json out.json] [--interval 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from bench_sampler_overhead import cnn_step_fn, summarise, timed_steps, transformer_step_fn

from allocconf_widget.adapters import rank_channel


def run_workload(name: str, args: argparse.Namespace, folder: Path) -> dict[str, object]:
    step, description = transformer_step_fn() if name == "transformer" else cnn_step_fn()
    timed_steps(step, args.warmup)
    arms: dict[str, list[float]] = {"off": [], "rank reporter": []}
    reporter = rank_channel.RankReporter(folder, rank=0, interval=args.interval)
    for _ in range(args.rounds):
        arms["off"] += timed_steps(step, args.steps)
        reporter.start()
        arms["rank reporter"] += timed_steps(step, args.steps)
        reporter._stop.set()  # pause between blocks without writing a "finished" record
        if reporter._thread is not None:
            reporter._thread.join()
    reporter.close()
    base = statistics.fmean(arms["off"])
    rows = [summarise(arm, times, None if arm == "off" else base) for arm, times in arms.items()]
    record = json.loads((folder / reporter.path.name).read_text())
    return {"workload": description, "rows": rows, "reports": reporter.seq,
            "reporter_cost_ms_per_report": reporter.cost_s / max(reporter.seq, 1) * 1e3,
            "record_bytes": reporter.path.stat().st_size, "write_errors": reporter.write_errors,
            "final_reserved_peak": record["devices"][0]["reserved_peak"],
            "torch_reserved_peak": torch.cuda.memory_stats()["reserved_bytes.all.peak"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA device")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("transformer", "cnn"):
            folder = Path(tmp) / name
            folder.mkdir()
            result = run_workload(name, args, folder)
            results.append(result)
            print(result["workload"])
            for row in result["rows"]:
                over = "" if row["overhead_pct"] is None else f"{row['overhead_pct']:+.2f}%"
                print(f"  {row['arm']:<16}{row['steps']:>5} steps  mean {row['mean_ms']:.2f} ms  "
                      f"median {row['median_ms']:.2f} ms  {over}")
            print(f"  {result['reports']} reports, {result['reporter_cost_ms_per_report']:.3f} ms each, "
                  f"{result['record_bytes']} bytes on disk, {result['write_errors']} write errors; "
                  f"reported peak {result['final_reserved_peak']} vs torch {result['torch_reserved_peak']}")
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "pid": os.getpid(),
           "interval_s": args.interval, "results": results}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
