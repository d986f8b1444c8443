"""Trace decoding stays linear on the pattern that used to make it quadratic.

Releases (``segment_free``) alternating with ``free_completed`` entries: each release
once rescanned everything after it. Prints the time per 10k entries from 10k to 1M
entries; a flat column is linear.

    python benchmarks/bench_decode.py [--max 1000000]
"""

from __future__ import annotations

import argparse
import time

from allocconf_widget.core.sim.trace.decode import decode_entries

MiB = 1 << 20


def alternating(n: int) -> list[dict[str, object]]:
    entries: list[dict[str, object]] = []
    for i in range(n // 2):
        entries.append({"action": "segment_free", "addr": (i + 1) * 2 * MiB, "size": 2 * MiB,
                        "stream": 0, "time_us": i})
        entries.append({"action": "free_completed", "addr": (i + 1) * 2 * MiB + 512, "size": 512,
                        "stream": 0, "time_us": i})
    return entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max", type=int, default=1_000_000)
    args = parser.parse_args()
    print(f"{'entries':>10} {'seconds':>9} {'ms per 10k':>11}")
    for n in (10_000, 20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000):
        if n > args.max:
            break
        entries = alternating(n)
        t0 = time.perf_counter()
        decode_entries(entries)
        dt = time.perf_counter() - t0
        print(f"{n:>10} {dt:>9.3f} {dt / n * 10_000 * 1000:>11.2f}")


if __name__ == "__main__":
    main()
