"""Record the issue-23 edge workloads on one GPU, each run in a fresh process (``record.py``'s child).

* ``batchfind`` / ``batchgrow`` (programs that catch their own OOMs) under memory fractions of
  2, 3 and 5 GiB with the default settings, and ``batchfind`` at 3 GiB under three other settings;
* ``cnn_bf16``: the default run, then a fraction derived from its peaks (as ``record.py`` does)
  with the defaults and with ``garbage_collection_threshold:0.6``;
* ``streams3`` (timing-dependent pending frees): each setting ``--repeats`` times, one run at a
  time so that the GPU is otherwise idle.

``--timing-only streams2,prefetch`` records only repeated two-stream runs (every setting
``--repeats`` times, one at a time), for the timing ranges.

``--gc-only lightning_bf16`` records only that garbage-collection pair for Lightning's own
``Trainer`` (``precision="bf16-mixed"``).

Usage (on a CUDA machine): ``python benchmarks/gpu/record_edges.py --out DIR [--deadline 220]``.
Names: ``<workload>__<setting>[_f<GiB>g][_r<k>]``; ``index.json`` lists every run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from record import _spawn

GIB = 1 << 30
CONFS = {
    "default": "",
    "expandable": "expandable_segments:True",
    "split128": "max_split_size_mb:128",
    "split512": "max_split_size_mb:512",
    "gc06": "garbage_collection_threshold:0.6",
    "roundlist": "roundup_power2_divisions:[256:1,512:2,>:8]",
}


def _device_total() -> int:
    import subprocess

    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout.split()[0]
    return int(out) << 20


def _fraction_between(meta_path: Path, total: int) -> float:
    """A memory fraction above the run's peak allocated but below its peak reserved, where the
    allocator must free cached blocks (and garbage collection decides which)."""
    meta = json.loads(meta_path.read_text())
    peak_a = int(meta["stats"]["allocated_bytes.all.peak"])
    peak_r = int(meta["stats"]["reserved_bytes.all.peak"])
    return round(max(int(peak_a * 1.12), (peak_a + peak_r) // 2) / total, 6)


def _gc_pair(workload: str, out: Path, spawn, total: int) -> list[dict[str, object]]:  # type: ignore[no-untyped-def]
    runs = [spawn(workload, "default", "", None)]
    if runs[0].get("rc") == 0:
        fraction = _fraction_between(out / f"{workload}__default.json", total)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            runs += list(pool.map(lambda name: spawn(workload, f"frac_{name}", CONFS[name], fraction),
                                  ("default", "gc06")))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="recordings")
    parser.add_argument("--deadline", type=float, default=220.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gc-only", metavar="WORKLOAD",
                        help="only the garbage-collection pair (defaults and gc06 under a fraction "
                             "derived from a first default run) for this workload, e.g. lightning_bf16")
    parser.add_argument("--timing-only", metavar="WORKLOADS",
                        help="only repeated runs of two-stream workloads (e.g. streams2,prefetch), "
                             "each setting --repeats times, one run at a time")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stop_at = time.time() + args.deadline
    total = _device_total()
    index: list[dict[str, object]] = []

    def spawn(workload: str, name: str, conf: str, fraction: float | None) -> dict[str, object]:
        if time.time() > stop_at:
            result: dict[str, object] = {"workload": workload, "name": name, "skipped": "deadline"}
            print(json.dumps(result), flush=True)
            return result
        return _spawn(workload, name, conf, fraction, out)

    def frac(gib: float) -> float:
        return round(gib * GIB / total, 6)

    if args.timing_only:  # each run alone on the GPU, as a user's run would be
        for k in range(1, args.repeats + 1):
            for workload in args.timing_only.split(","):
                for name in ("default", "split512", "roundlist", "expandable", "split128"):
                    index.append(spawn(workload, name if k == 1 else f"{name}_r{k}", CONFS[name], None))
        (out / "index.json").write_text(json.dumps(index, indent=1))
        return
    if args.gc_only:
        index.extend(_gc_pair(args.gc_only, out, spawn, total))
        (out / "index.json").write_text(json.dumps(index, indent=1))
        return
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        jobs = [pool.submit(spawn, "cnn_bf16", "default", "", None)]
        for w in ("batchfind", "batchgrow"):
            for gib in (2, 3, 5):
                jobs.append(pool.submit(spawn, w, f"default_f{gib}g", "", frac(gib)))
        for name in ("expandable", "split128", "gc06"):
            jobs.append(pool.submit(spawn, "batchfind", f"{name}_f3g", CONFS[name], frac(3)))
        base = jobs[0].result()
        if base.get("rc") == 0:
            fraction = _fraction_between(out / "cnn_bf16__default.json", total)
            for name in ("default", "gc06"):
                jobs.append(pool.submit(spawn, "cnn_bf16", f"frac_{name}", CONFS[name], fraction))
        index.extend(j.result() for j in jobs)
    for k in range(1, args.repeats + 1):  # one at a time: an idle GPU, as a user's run would have
        for name in ("default", "split512", "roundlist", "expandable"):
            index.append(spawn("streams3", name if k == 1 else f"{name}_r{k}", CONFS[name], None))
    (out / "index.json").write_text(json.dumps(index, indent=1))


if __name__ == "__main__":
    main()
