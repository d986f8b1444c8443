"""What does the live monitor's sampler cost a real training loop? Side by side, one process.

Runs a training loop on CUDA and alternates blocks of steps **without** and
**with** the sampler (thread mode: ``memory_stats()`` at 10 Hz plus trace-free
snapshots within a 1 % duty-cycle budget), then the step-synchronous mode,
and prints step-time statistics and the overhead of each arm against the
interleaved baseline. Alternating blocks (off, on, off, on, ...) in one
process cancels slow drifts (clocks, thermals) that separate runs would mix in.

Needs only torch with CUDA and this repository (no IPython/ipywidgets/plotly)::

    python3 benchmarks/gpu/bench_sampler_overhead.py                 # 6-layer transformer, d=1024
    python3 benchmarks/gpu/bench_sampler_overhead.py --model cnn --rounds 8
    python3 benchmarks/gpu/bench_sampler_overhead.py --json result.json

Target: overhead ≤ 1 % (docs/internals/allocator_facts.md §8 measured stats at 10 Hz + snapshots at
1 Hz below run-to-run noise on an H200).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout, no install

import torch
from torch import nn

from allocconf_widget.adapters.sampler import Sampler

DEVICE = "cuda"  # --cpu-smoke switches to a tiny CPU run that only checks the script itself


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def transformer_step_fn(batch: int = 16, seq: int = 512, d: int = 1024) -> tuple[object, str]:
    """A 6-layer TransformerEncoder, d=1024, AdamW; sequence length varies per step."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d, 16, 4 * d, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lengths = [seq // 2, seq, 3 * seq // 4, seq]

    def step(i: int) -> None:
        n = lengths[i % len(lengths)]
        x = torch.randn(batch, n, d, device=DEVICE)
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    return step, f"TransformerEncoder 6x d={d}, batch {batch}, seq {seq // 2}-{seq}, AdamW"


def cnn_step_fn() -> tuple[object, str]:
    """A ResNet-ish CNN, SGD, varying batch size and resolution."""
    torch.manual_seed(0)

    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU(inplace=True), nn.MaxPool2d(2))

    model = nn.Sequential(block(3, 64), block(64, 128), block(128, 256), block(256, 512),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    shapes = [(64, 224), (96, 160), (128, 128), (48, 192)]

    def step(i: int) -> None:
        batch, res = shapes[i % len(shapes)]
        x = torch.randn(batch, 3, res, res, device=DEVICE)
        y = torch.randint(0, 1000, (batch,), device=DEVICE)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step, "ResNet-ish CNN (4 blocks to 512 ch), SGD, batch 48-128, 128-224 px"


def timed_steps(step: object, n: int) -> list[float]:
    """Wall time of each of ``n`` steps, synchronised so each step is measured whole.

    Every block runs the same sequence of shapes (step ``i`` of a block always has
    shape ``i mod 4``), so the arms compare identical work; an earlier version let
    the shape cycle run across blocks, which gave the arms different mixes of
    long and short steps and a spurious +3.5 % "overhead".
    """
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        step(i)  # type: ignore[operator]
        sync()
        times.append(time.perf_counter() - t0)
    return times


def summarise(name: str, times: list[float], base: float | None) -> dict[str, object]:
    mean = statistics.fmean(times)
    return {
        "arm": name, "steps": len(times), "mean_ms": mean * 1e3,
        "median_ms": statistics.median(times) * 1e3,
        "stdev_ms": statistics.stdev(times) * 1e3 if len(times) > 1 else 0.0,
        "overhead_pct": None if base is None else (mean / base - 1) * 100,
    }


def run(args: argparse.Namespace) -> dict[str, object]:
    if args.cpu_smoke:
        step, description = transformer_step_fn(batch=2, seq=16, d=64)
    else:
        step, description = transformer_step_fn() if args.model == "transformer" else cnn_step_fn()
    timed_steps(step, args.warmup)  # compile kernels, fill the cache
    arms: dict[str, list[float]] = {"off": [], "thread 10 Hz + snapshots": [], "step-sync": []}
    sampler_stats: dict[str, object] = {}
    for _ in range(args.rounds):
        arms["off"] += timed_steps(step, args.steps)
        sampler = Sampler(interval=args.interval, snapshot_budget=args.budget).start()
        arms["thread 10 Hz + snapshots"] += timed_steps(step, args.steps)
        sampler.stop()
        sampler_stats = sampler.overhead()
        arms["off"] += timed_steps(step, args.steps)
        stepper = Sampler(step_sync=True, snapshot_budget=args.budget).start()
        arms["step-sync"] += timed_steps(step, args.steps)
        stepper.stop()
    base = statistics.fmean(arms["off"])
    rows = [summarise(name, times, None if name == "off" else base) for name, times in arms.items()]
    return {
        "device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "CPU (smoke run)",
        "torch": torch.__version__, "workload": description,
        "rounds": args.rounds, "steps_per_block": args.steps, "interval_s": args.interval,
        "snapshot_budget": args.budget, "rows": rows, "last_thread_sampler": sampler_stats,
        "last_step_sampler": stepper.overhead(),
    }


def print_table(result: dict[str, object]) -> None:
    print(f"{result['device']} · torch {result['torch']} · {result['workload']}")
    print(f"{result['rounds']} rounds x {result['steps_per_block']} steps per arm, interleaved; "
          f"sampler every {result['interval_s']} s, snapshot budget {result['snapshot_budget']:.1%}")
    print(f"{'arm':<26}{'steps':>6}{'mean ms':>10}{'median':>10}{'stdev':>9}{'overhead':>10}")
    for row in result["rows"]:  # type: ignore[attr-defined]
        over = "" if row["overhead_pct"] is None else f"{row['overhead_pct']:+.2f}%"
        print(f"{row['arm']:<26}{row['steps']:>6}{row['mean_ms']:>10.2f}{row['median_ms']:>10.2f}"
              f"{row['stdev_ms']:>9.2f}{over:>10}")
    for key in ("last_thread_sampler", "last_step_sampler"):
        stats = result[key]
        print(f"{key}: " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                     for k, v in stats.items()))  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("transformer", "cnn"), default="transformer")
    parser.add_argument("--rounds", type=int, default=10, help="off/on alternations (default 10)")
    parser.add_argument("--steps", type=int, default=12,
                        help="steps per block, a multiple of the 4-shape cycle (default 12)")
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--budget", type=float, default=0.01, help="snapshot duty-cycle budget")
    parser.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny CPU run: checks the script, measures nothing meaningful")
    args = parser.parse_args()
    global DEVICE  # noqa: PLW0603 - a script-level switch
    if args.cpu_smoke:
        DEVICE = "cpu"
    elif not torch.cuda.is_available():
        sys.exit("needs a CUDA device (or --cpu-smoke to check the script)")
    result = run(args)
    print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
