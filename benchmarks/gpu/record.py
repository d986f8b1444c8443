"""Record allocation traces of the GPU workloads, each (workload, setting) in a fresh process.

Usage (on a CUDA machine)::

    python benchmarks/gpu/record.py --out DIR [--workloads cnn,mixed] [--parallel 3]

For every workload it first runs the default setting, derives a memory-fraction
limit from that run's peaks (so the fraction runs exercise the allocator's
out-of-memory path and garbage collection), then runs every setting in
``SETTINGS`` and ``FRACTION_SETTINGS`` in its own process with the setting in
``PYTORCH_CUDA_ALLOC_CONF`` before ``import torch``. Each child writes

* ``<workload>__<name>.pickle`` — ``torch.cuda.memory._snapshot()`` at the end, with the
  full alloc/free trace (history on from before the first allocation, no stack frames);
* ``<workload>__<name>.json`` — the real ``memory_stats()`` peaks and counters, device total,
  NVML-free start/end, settings read back, wall time, per-step timestamps, a 20 Hz
  ``memory_stats()`` timeline, and the out-of-memory error if one happened.

The parent writes ``index.json`` listing every run. Nothing here imports allocconf_widget:
these are the ground-truth measurements the simulator and the demo are checked against.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

SETTINGS: dict[str, str] = {
    "default": "",
    "expandable": "expandable_segments:True",
    "split128": "max_split_size_mb:128",
    "split512": "max_split_size_mb:512",
    "round4": "roundup_power2_divisions:4",
    "roundlist": "roundup_power2_divisions:[256:1,512:2,>:8]",
    "split256_nsr1024": "max_split_size_mb:256,max_non_split_rounding_mb:1024",
    "largeseg64": "large_segment_size_mb:64",
    "expandable_split128": "expandable_segments:True,max_split_size_mb:128",
}
FRACTION_SETTINGS: dict[str, str] = {
    "frac_default": "",
    "frac_gc06": "garbage_collection_threshold:0.6",
    "frac_expandable": "expandable_segments:True",
    "frac_split128": "max_split_size_mb:128",
}
CHILD_TIMEOUT_S = 300  # a run that hangs (a compile gone wrong) must not take the whole call

_STAT_KEYS = (
    "reserved_bytes.all.current", "allocated_bytes.all.current", "active_bytes.all.current",
    "requested_bytes.all.current", "inactive_split_bytes.all.current",
)
_PEAK_KEYS = (
    "reserved_bytes.all.peak", "allocated_bytes.all.peak", "active_bytes.all.peak",
    "requested_bytes.all.peak", "num_alloc_retries", "num_ooms", "num_device_alloc",
    "num_device_free", "segment.all.peak", "max_split_size", "num_sync_all_streams",
)


def _child(workload: str, conf: str, fraction: float | None, out: Path, frames: bool) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from workloads import WORKLOADS

    device = torch.device("cuda", 0)
    free0, total = torch.cuda.mem_get_info(0)
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction, 0)
    torch.cuda.memory._record_memory_history(
        enabled="all",
        context="alloc" if frames else None,
        stacks="python",
        max_entries=3_000_000,
    )
    fraction_calls = _note_fraction_calls(torch)
    timeline: list[list[float]] = []
    steps: list[list[float]] = []
    stop = threading.Event()
    t0 = time.time()

    def sample() -> None:
        while not stop.wait(0.05):
            stats = torch.cuda.memory_stats(0)
            timeline.append([round(time.time() - t0, 4)] + [stats.get(k, 0) for k in _STAT_KEYS])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    oom = None
    try:
        WORKLOADS[workload](device, lambda i: steps.append([i, round(time.time() - t0, 4),
                                                            time.time() * 1e6]))
    except torch.OutOfMemoryError as exc:
        oom = str(exc)
    wall = time.time() - t0
    stop.set()
    sampler.join()
    stats = torch.cuda.memory_stats(0)
    snap = torch.cuda.memory._snapshot()
    if fraction_calls:  # the allocator writes no trace entry for them (docs/simulator.md)
        snap["allocconf_fraction_changes"] = fraction_calls
    name = out.name
    with out.with_suffix(".pickle").open("wb") as fh:
        pickle.dump(snap, fh, protocol=4)
    free1, _ = torch.cuda.mem_get_info(0)
    reserved1 = int(stats.get("reserved_bytes.all.current", 0))
    meta = {
        "name": name,
        "workload": workload,
        "conf": conf,
        "fraction": fraction,
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(0),
        "device_total_bytes": total,
        "free_at_start_bytes": free0,
        "free_at_end_bytes": free1,
        "reserved_at_end_bytes": reserved1,
        # memory in use on the device that the caching allocator does not hold (context, libraries)
        "non_pytorch_at_end_bytes": total - free1 - reserved1,
        "wall_s": round(wall, 3),
        "oom": oom,
        "stats": {k: stats.get(k) for k in _PEAK_KEYS},
        "allocator_settings": snap.get("allocator_settings"),
        "trace_events": len(snap["device_traces"][0]),
        "steps": steps,
        "timeline_keys": ["t_s", *_STAT_KEYS],
        "timeline": timeline,
    }
    out.with_suffix(".json").write_text(json.dumps(meta))


def _note_fraction_calls(torch: object) -> list[dict[str, object]]:
    """Wrap the workload's ``torch.cuda.set_per_process_memory_fraction`` calls (made after this
    point) so each is noted with its device, fraction and time on the trace's clock (epoch µs),
    the format docs/simulator.md gives for the snapshot key ``allocconf_fraction_changes``."""
    cuda = torch.cuda  # type: ignore[attr-defined]
    original = cuda.memory.set_per_process_memory_fraction
    calls: list[dict[str, object]] = []

    def wrapper(fraction: float, device: object = None) -> None:
        original(fraction, device)
        index = device if isinstance(device, int) else getattr(device, "index", None)
        calls.append({"device": index if isinstance(index, int) else cuda.current_device(),
                      "fraction": float(fraction), "time_us": time.time_ns() // 1000})

    cuda.set_per_process_memory_fraction = cuda.memory.set_per_process_memory_fraction = wrapper
    return calls


def _spawn(workload: str, name: str, conf: str, fraction: float | None, out_dir: Path,
           frames: bool = False) -> dict[str, object]:
    env = dict(os.environ)
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        env.pop(var, None)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    stem = out_dir / f"{workload}__{name}"
    cmd = [sys.executable, __file__, "--child", workload, "--conf", conf, "--stem", str(stem)]
    if fraction is not None:
        cmd += ["--fraction", repr(fraction)]
    if frames:
        cmd.append("--frames")
    t = time.time()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False,
                              timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        result_t = {"workload": workload, "name": name, "conf": conf, "fraction": fraction,
                    "rc": None, "timeout_s": CHILD_TIMEOUT_S}
        print(json.dumps(result_t), flush=True)
        return result_t
    result: dict[str, object] = {"workload": workload, "name": name, "conf": conf,
                                 "fraction": fraction, "rc": proc.returncode,
                                 "seconds": round(time.time() - t, 2)}
    if proc.returncode != 0:
        result["stderr"] = proc.stderr[-3000:]
    else:
        meta = json.loads(stem.with_suffix(".json").read_text())
        result["peak_reserved"] = meta["stats"]["reserved_bytes.all.peak"]
        result["peak_allocated"] = meta["stats"]["allocated_bytes.all.peak"]
        result["oom"] = bool(meta["oom"])
        result["events"] = meta["trace_events"]
    print(json.dumps(result), flush=True)
    return result


def _parent(args: argparse.Namespace) -> None:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    workloads = args.workloads.split(",")
    settings = {k: v for k, v in SETTINGS.items() if not args.settings or k in args.settings.split(",")}
    fractions = {k: v for k, v in FRACTION_SETTINGS.items()
                 if not args.fraction_settings or k in args.fraction_settings.split(",")}
    no_fraction = set(args.no_fraction.split(",")) if args.no_fraction else set()
    deadline = time.time() + args.deadline if args.deadline else None
    index: list[dict[str, object]] = []

    def spawn(*a: object, **kw: object) -> dict[str, object]:
        if deadline is not None and time.time() > deadline:
            result = {"workload": a[0], "name": a[1], "rc": None, "skipped": "deadline"}
            print(json.dumps(result), flush=True)
            return result
        return _spawn(*a, **kw)  # type: ignore[arg-type]

    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        # defaults first, then the other settings (they need nothing from the default run);
        # each workload's fraction runs are queued as soon as its default run has given the limit
        firsts = {w: pool.submit(spawn, w, "default", "", None, out_dir) for w in workloads}
        jobs = [pool.submit(spawn, w, name, conf, None, out_dir)
                for w in workloads for name, conf in settings.items() if name != "default"]
        if "cnn" in workloads and not args.settings:
            jobs.append(pool.submit(spawn, "cnn", "frames", "", None, out_dir, True))
        fraction_jobs = []
        for fut in concurrent.futures.as_completed(list(firsts.values())):
            base = fut.result()
            index.append(base)
            w = str(base["workload"])
            if base.get("rc") != 0 or w in no_fraction:
                continue
            meta = json.loads((out_dir / f"{w}__default.json").read_text())
            peak_a = int(meta["stats"]["allocated_bytes.all.peak"])
            peak_r = int(meta["stats"]["reserved_bytes.all.peak"])
            limit = max(int(peak_a * 1.12), (peak_a + peak_r) // 2)
            fraction = round(limit / meta["device_total_bytes"], 6)
            for name, conf in fractions.items():
                fraction_jobs.append(pool.submit(spawn, w, name, conf, fraction, out_dir))
        index.extend(j.result() for j in jobs + fraction_jobs)
    (out_dir / "index.json").write_text(json.dumps(index, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="recordings")
    parser.add_argument("--workloads", default="cnn,transformer,growing,mixed,streams")
    parser.add_argument("--parallel", type=int, default=3)
    parser.add_argument("--child")
    parser.add_argument("--conf", default="")
    parser.add_argument("--stem")
    parser.add_argument("--fraction", type=float)
    parser.add_argument("--frames", action="store_true")
    parser.add_argument("--settings", default="", help="names from SETTINGS to run (default: all)")
    parser.add_argument("--fraction-settings", default="", help="names from FRACTION_SETTINGS")
    parser.add_argument("--no-fraction", default="", help="workloads that get no fraction runs")
    parser.add_argument("--deadline", type=float, default=0.0,
                        help="seconds after which no new run starts (0: none)")
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.conf, args.fraction, Path(args.stem), args.frames)
    else:
        _parent(args)


if __name__ == "__main__":
    main()
