"""Benchmark the allocator replay simulator (target: ≥ 500,000 trace events/s per config).

Usage::

    python benchmarks/bench_simulator.py                 # synthetic training loop, ≥ 1M events
    python benchmarks/bench_simulator.py --events 3000000
    python benchmarks/bench_simulator.py --trace tests/data/transformer__default.pickle.gz

Prints one row per configuration (events, seconds, events/s, peak reserved), then
the wall time of replaying all configurations one after another in this process
versus ``simulate_many`` across worker processes, side by side.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from allocconf_widget.core.memory.snapshot import load_snapshot
from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.simulator import simulate, simulate_many
from allocconf_widget.core.sim.trace.decode import decode_entries
from allocconf_widget.core.sim.trace.extract import extract_trace
from allocconf_widget.core.sim.trace.model import Trace
from allocconf_widget.core.units import format_bytes
from tests.trace_builder import TraceBuilder

MiB = 1 << 20


def training_loop(min_events: int, seed: int = 0) -> list[dict[str, object]]:
    """Trace entries of a transformer-like training loop whose sequence length varies.

    Per step: forward activations per layer (kept for backward), short-lived
    temporaries (attention scores, workspace), a backward pass that frees the
    activations in reverse while producing gradient temporaries, and an
    optimizer step. Weights, gradients and Adam states persist. Steps repeat
    until ``min_events`` trace entries exist; addresses are reused like real
    ones, and ~1% of frees complete late, as after ``record_stream``.
    """
    rng = random.Random(seed)
    b = TraceBuilder(reuse_addresses=True)
    layers, width, vocab = 12, 1024, 32000
    params = [b.alloc(n) for _ in range(layers) for n in (4 * width * width * 2, 4 * width * 2,
                                                          8 * width * width * 2, 2 * width * 2)]
    params.append(b.alloc(vocab * width * 2))
    grads: list[int] = []
    adam: list[int] = []
    late: list[int] = []
    while len(b.entries) < min_events:
        batch, seq = rng.choice((8, 16)), rng.randint(128, 1024)
        tokens = batch * seq
        acts = [b.alloc(tokens * 8)]
        for _ in range(layers):
            for factor in (1, 3, 1, 4, 1):
                acts.append(b.alloc(tokens * width * 2 * factor))
            scores = b.alloc(batch * 16 * seq * seq * 2)
            b.free(scores)
            for _ in range(3):
                b.free(b.alloc(rng.randint(1, 64) * 4096))  # small scratch
        logits = b.alloc(tokens * vocab * 2)
        b.free(b.alloc(tokens * 4))
        b.free(logits)
        for act in reversed(acts):
            tmp = b.alloc(tokens * width * 2)
            if rng.random() < 0.01:
                b.free_requested(act)
                late.append(act)
            else:
                b.free(act)
            b.free(tmp)
        for addr in late:
            b.free_completed(addr)
        late.clear()
        if not grads:
            grads = [b.alloc(4 * width * width * 2) for _ in range(layers * 3)]
            adam = [b.alloc(4 * width * width * 4) for _ in range(layers * 6)]
        for _ in range(layers):
            b.free(b.alloc(4 * width * width * 4))  # fused optimizer temporaries
    assert params and adam
    return b.entries


CONFIGS = (
    SimSettings(torch_version=(2, 11), label="(defaults), 2.11 address tie-break"),
    SimSettings(torch_version=(2, 12), label="(defaults), 2.12 counter tie-break"),
    SimSettings(expandable_segments=True, torch_version=(2, 11), label="expandable_segments:True"),
    SimSettings(max_split_bytes=128 * MiB, torch_version=(2, 11), label="max_split_size_mb:128"),
    SimSettings(roundup_slots=(4,) * 16, torch_version=(2, 11), label="roundup_power2_divisions:4"),
    SimSettings(gc_threshold=0.6, per_process_memory_fraction=0.5, torch_version=(2, 11),
                label="garbage_collection_threshold:0.6 + fraction 0.5"),
)


def _load(args: argparse.Namespace) -> tuple[Trace, str, float]:
    start = time.perf_counter()
    if args.trace:
        trace = extract_trace(load_snapshot(args.trace))
        what = f"{args.trace}"
    else:
        entries = training_loop(args.events)
        what = "synthetic training loop"
        start = time.perf_counter()
        trace = decode_entries(entries)
    return trace, what, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", help="replay this snapshot instead of the synthetic loop")
    parser.add_argument("--events", type=int, default=1_000_000, help="synthetic trace size")
    parser.add_argument("--device-total", type=int, default=80 * 10**9,
                        help="device bytes (for the fraction/GC config)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    trace, what, decode_s = _load(args)
    print(f"trace: {what}: {trace.num_events:,} events, {trace.num_ops:,} replay ops, "
          f"decoded in {decode_s:.2f} s")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}\n")
    header = f"{'configuration':<48} {'events':>11} {'seconds':>8} {'events/s':>11} {'peak reserved':>14}"
    print(header)
    print("-" * len(header))
    start = time.perf_counter()
    singles = [simulate(trace, c, device_total=args.device_total) for c in CONFIGS]
    single_wall = time.perf_counter() - start
    for c, r in zip(CONFIGS, singles, strict=True):
        rate = r.events / r.seconds if r.seconds else float("inf")
        print(f"{c.describe():<48} {r.events:>11,} {r.seconds:>8.3f} {rate:>11,.0f} "
              f"{format_bytes(r.peak_reserved_bytes):>14}")
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    parallel = simulate_many(trace, CONFIGS, device_total=args.device_total, workers=args.workers)
    parallel_wall = time.perf_counter() - start
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker_cpu = (children.ru_utime - children_before.ru_utime
                  + children.ru_stime - children_before.ru_stime)
    assert [r.peak_reserved_bytes for r in parallel] == [r.peak_reserved_bytes for r in singles]
    total_events = sum(r.events for r in singles)
    print()
    print(f"{len(CONFIGS)} configurations, {total_events:,} events replayed in total:")
    print(f"  {'mode':<36} {'wall s':>8} {'events/s':>12}")
    print(f"  {'one process, one after another':<36} {single_wall:>8.2f} "
          f"{total_events / single_wall:>12,.0f}")
    print(f"  {f'simulate_many, {args.workers} worker processes':<36} {parallel_wall:>8.2f} "
          f"{total_events / parallel_wall:>12,.0f}")
    print(f"  speed-up {single_wall / parallel_wall:.2f}×; worker processes used "
          f"{worker_cpu:.2f} s CPU in {parallel_wall:.2f} s = {worker_cpu / parallel_wall:.2f} "
          f"cores busy on average")
    # the what-if of a notebook: 8 settings of one trace, with progress as each one finishes
    eight = [*CONFIGS, SimSettings(max_split_bytes=512 * MiB, torch_version=(2, 11), label="split512"),
             SimSettings.from_string("roundup_power2_divisions:[256:1,512:2,>:8]", "2.11")]
    start = time.perf_counter()

    def shown(done: int, total: int) -> None:
        print(f"  … {done}/{total} settings replayed ({time.perf_counter() - start:.1f} s)",
              file=sys.stderr, flush=True)

    simulate_many(trace, eight, device_total=args.device_total, workers=args.workers, progress=shown)
    print(f"  {len(eight)} settings with progress (simulate_many): {time.perf_counter() - start:.2f} s "
          f"for {trace.num_events:,} events each (target ≤ 10 s for 1M)")
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"  note: 1-minute load average {load:.2f} on {os.cpu_count()} cores: other processes "
              "compete for the CPU, so the wall-clock speed-up understates what idle cores give")
    return 0


if __name__ == "__main__":
    sys.exit(main())
