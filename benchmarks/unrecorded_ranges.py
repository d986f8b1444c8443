"""Runs nobody recorded, beside the ranges a recorded run gives (issue 23 §2, round 20).

``benchmarks/gpu/unrecorded_peaks.py`` recorded each two-stream workload's default and
``expandable_segments:True`` run, then ran each setting three times with nothing recorded
(an H100, torch 2.11; ``benchmarks/data/unrecorded/``). Recording costs the CPU a little at
each allocator call, so an unrecorded run may get further ahead of its GPU and peak higher.
This prints each setting's range from the recorded default run, the recorded run's peak and
the unrecorded peaks, and how many of those lie inside.

Usage: ``python benchmarks/unrecorded_ranges.py [--data benchmarks/data/unrecorded] [--markdown]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _table import print_table  # noqa: E402
from fidelity import _capacity, _settings  # noqa: E402

from allocconf_widget.core.memory.snapshot import load_snapshot  # noqa: E402
from allocconf_widget.core.sim.simulator import extract_trace, simulate  # noqa: E402

GIB = 1 << 30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=ROOT / "benchmarks" / "data" / "unrecorded")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    lines, inside, total_runs = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for archive in sorted(args.data.glob("*.tar.xz")):
            with tarfile.open(archive) as tar:
                tar.extractall(work, filter="data")
        runs = json.loads((work / "unrecorded.json").read_text())
        for workload in dict.fromkeys(str(r["workload"]) for r in runs):
            recording = json.loads((work / f"{workload}__default.json").read_text())
            trace = extract_trace(load_snapshot(work / f"{workload}__default.pickle"))
            total, non_pytorch = _capacity(recording)
            for setting in dict.fromkeys(str(r["setting"]) for r in runs if r["workload"] == workload):
                meta = json.loads((work / f"{workload}__{setting}.json").read_text())
                low, high = simulate(trace, _settings(meta), device_total=total,
                                     non_pytorch_bytes=non_pytorch).reserved_range
                peaks = [int(r["peak_reserved"]) for r in runs
                         if r["workload"] == workload and r["setting"] == setting and r.get("rc") == 0]
                held = sum(low <= p <= high for p in peaks)
                inside, total_runs = inside + held, total_runs + len(peaks)
                lines.append([workload, setting, f"{low / GIB:.3f}–{high / GIB:.3f}",
                              f"{int(meta['stats']['reserved_bytes.all.peak']) / GIB:.3f}",
                              ", ".join(f"{p / GIB:.3f}" for p in peaks), f"{held}/{len(peaks)}"])
    print_table(["workload", "setting", "range GiB (recorded default run)", "recorded run GiB",
                 "unrecorded runs GiB", "inside"], lines, args.markdown)
    print(f"\nunrecorded peaks inside their range: {inside}/{total_runs}")


if __name__ == "__main__":
    main()
