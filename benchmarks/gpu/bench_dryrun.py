"""How close is a dry run's prediction to the real run? Real peak reserved vs prediction.

For each workload (``dryrun_workloads.py``) and setting, a fresh process runs the step for
real under ``PYTORCH_CUDA_ALLOC_CONF`` and reports ``max_memory_reserved()``; one fresh
process per workload dry-runs it (CUDA never starts; asserted) and replays the trace under
every setting, raw and with the modelled cuBLAS/cuDNN workspaces, and once more on the CPU
stand-in (the estimate a runtime without a GPU gets). Prints per (workload, setting) real vs
predicted, the errors, whether the ranking of settings agrees, and the
batch planner's check under a memory fraction that emulates a T4 (the largest batch it
predicts must fit for real, the next size up must run out)::

    python3 benchmarks/gpu/bench_dryrun.py --out results/ --jobs 8   # everything (81 s on an H200)
    python3 benchmarks/gpu/bench_dryrun.py --workloads lm,resnet18 --no-plan

Targets (issue 21): the ranking matches; peak within 10 % on ≥ 90 % of pairs (aim 5 %).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

SETTINGS = ("", "expandable_segments:True", "max_split_size_mb:128", "roundup_power2_divisions:4")
PLAN = {"lm": (8, 16, 24, 32, 48, 64, 96), "resnet18": (64, 128, 256, 384, 512, 640, 768, 896, 1024)}
T4_BYTES = 15 << 30


# ---------------------------------------------------------------- children (fresh processes)

def child_real(workload: str, batch: int, fraction: float | None, trace: str | None) -> dict:
    import torch
    from dryrun_workloads import WORKLOADS

    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction)
    if trace:
        torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    t0 = time.perf_counter()
    oom = None
    try:
        WORKLOADS[workload]("cuda", batch)
        torch.cuda.synchronize()
    except torch.OutOfMemoryError as exc:
        oom = str(exc).splitlines()[0][:200]
    out = {"peak_reserved": torch.cuda.max_memory_reserved(),
           "peak_allocated": torch.cuda.max_memory_allocated(), "oom": oom,
           "seconds": time.perf_counter() - t0,
           "conf": torch.cuda.memory._snapshot()["allocator_settings"].get("PYTORCH_CUDA_ALLOC_CONF")}
    if trace:
        torch.cuda.memory._dump_snapshot(trace)
    return out


def child_dry(workload: str, batch: int, settings: list[str], save: str | None) -> dict:
    import torch
    from dryrun_workloads import WORKLOADS

    import allocconf_widget

    out: dict = {}
    with allocconf_widget.dry_run(_profile(), standin=True, progress=False) as run:
        WORKLOADS[workload]("cuda", batch)
    out["standin"] = {s: run.predict(s).peak_reserved for s in settings}
    for rules in (False, True):
        t0 = time.process_time()
        with allocconf_widget.dry_run(_profile(), rules=rules, standin=False, progress=False) as run:
            WORKLOADS[workload]("cuda", batch)
        cpu = time.process_time() - t0
        key = "rules" if rules else "raw"
        out[key] = {s: run.predict(s).peak_reserved for s in settings}
        out[key + "_cpu_s"] = cpu
        out[key + "_ops"] = run.trace.ops
        out[key + "_notes"] = list(run.all_notes())
        if rules and save:
            run.save(save)
    out["cuda_initialized"] = torch.cuda.is_initialized()
    return out


def _profile() -> str:
    """The profile of the GPU the benchmark runs on (NVML, as the dry run reads it: CUDA stays down)."""
    from allocconf_widget.adapters.nvml import runtime_profile

    found = runtime_profile()
    return "h100" if found is not None and found.key == "h100" else "h200"


def child_plan(workload: str, sizes: list[int], fraction_bytes: int) -> dict:
    from dryrun_workloads import WORKLOADS

    from allocconf_widget.app.dryrun import plan_batch
    from allocconf_widget.core.dryrun.profiles import GpuProfile

    t4ish = GpuProfile("t4-emulated", "H200 under a T4-sized fraction", fraction_bytes, 0, (9, 0), 132)
    plan = plan_batch(lambda b: WORKLOADS[workload]("cuda", b), sizes, confs=("",), gpus=(t4ish,))
    import torch

    return {"largest": plan.largest("", t4ish.name), "tried": list(plan.sizes),
            "peaks": {c.batch: (c.prediction.peak_reserved if c.prediction else None) for c in plan.cells},
            "cuda_initialized": torch.cuda.is_initialized()}


def spawn(args: list[str], conf: str = "") -> dict:
    env = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(args)], capture_output=True,
                          text=True, env=env, timeout=900, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (proc.stderr or proc.stdout)[-1500:]}


# ---------------------------------------------------------------- parent

def gib(n: int | None) -> str:
    return "—" if n is None else f"{n / (1 << 30):.3f}"


def ranking(values: dict[str, int]) -> list[str]:
    return [s for s, _ in sorted(values.items(), key=lambda kv: (kv[1], kv[0]))]


#: two settings whose real peaks are this far apart must be predicted in the same order (closer
#: ones are a tie within the run-to-run and estimate error; the strict ranking is printed too)
APART = 0.05


def ordered_pairs(real: dict[str, int], predicted: dict[str, int]) -> tuple[int, int]:
    """(pairs ordered as in the real runs, pairs of settings more than APART apart for real)."""
    from itertools import combinations

    right = apart = 0
    for a, b in combinations(sorted(real), 2):
        if abs(real[a] - real[b]) > APART * min(real[a], real[b]):
            apart += 1
            right += (real[a] < real[b]) == (predicted[a] < predicted[b])
    return right, apart


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="lm,resnet18,llama,timm_vit,lightning")
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-plan", action="store_true")
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        kind, *rest = json.loads(args.child)
        fn = {"real": child_real, "dry": child_dry, "plan": child_plan}[kind]
        print("RESULT " + json.dumps(fn(*rest), default=str))
        return 0
    from dryrun_workloads import DEFAULT_BATCH

    names = [w for w in args.workloads.split(",") if w]
    out = args.out
    if out:
        out.mkdir(parents=True, exist_ok=True)
    jobs = []
    for w in names:
        b = DEFAULT_BATCH[w]
        save = str(out / f"dry_{w}.pickle") if out else None
        jobs.append(((w, "dry"), ["dry", w, b, list(SETTINGS), save], ""))
        for s in SETTINGS:
            trace = str(out / f"real_{w}.pickle") if out and s == "" else None
            jobs.append(((w, s), ["real", w, b, None, trace], s))
    import torch

    total = torch.cuda.mem_get_info()[1] if torch.cuda.is_available() else 150_109_880_320
    fraction = T4_BYTES / total
    if not args.no_plan:
        for w, sizes in PLAN.items():
            if w in names:
                jobs.append(((w, "plan"), ["plan", w, list(sizes), T4_BYTES], ""))
    t0 = time.time()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = dict(zip([j[0] for j in jobs], pool.map(lambda j: spawn(j[1], j[2]), jobs), strict=True))
    checks = []
    for w in names:
        plan = results.get((w, "plan"))
        if plan and plan.get("largest") is not None:
            sizes = PLAN[w]
            best = plan["largest"]
            nxt = next((s for s in sizes if s > best), None)
            checks.append((w, best, nxt))
    with ThreadPoolExecutor(args.jobs) as pool:
        real_checks = list(pool.map(lambda c: (c, spawn(["real", c[0], c[1], fraction, None]),
                                               spawn(["real", c[0], c[2], fraction, None]) if c[2] else None),
                                    checks))
    wall = time.time() - t0
    rows, within10, within5, pairs, rank_ok = [], 0, 0, 0, []
    standin10 = 0
    pairs_right = pairs_apart = best_right = 0
    for w in names:
        dry = results[(w, "dry")]
        if "error" in dry:
            print(f"{w}: dry run failed:\n{dry['error']}")
            continue
        real = {s: results[(w, s)] for s in SETTINGS}
        realpk = {s: r.get("peak_reserved") for s, r in real.items() if "error" not in r}
        for s in SETTINGS:
            r = realpk.get(s)
            raw, mod, standin = dry["raw"][s], dry["rules"][s], dry["standin"][s]
            err = (mod - r) / r * 100 if r else None
            err_raw = (raw - r) / r * 100 if r else None
            err_standin = (standin - r) / r * 100 if r else None
            if err is not None:
                pairs += 1
                within10 += abs(err) <= 10
                within5 += abs(err) <= 5
                standin10 += abs(err_standin) <= 10
            rows.append([w, s or "(defaults)", gib(r), gib(raw), gib(mod),
                         f"{err_raw:+.1f}%" if err_raw is not None else "—",
                         f"{err:+.1f}%" if err is not None else "—",
                         f"{err_standin:+.1f}%" if err_standin is not None else "—"])
        if len(realpk) == len(SETTINGS):
            rank_ok.append((w, ranking(realpk) == ranking(dry["rules"]),
                            ranking(realpk) == ranking(dry["raw"])))
            right, apart = ordered_pairs(realpk, dry["rules"])
            pairs_right += right
            pairs_apart += apart
            best_right += ranking(realpk)[0] == ranking(dry["rules"])[0]
    from _table import print_table

    print_table(["workload", "setting", "real GiB", "dry raw GiB", "dry+rules GiB", "err raw", "err rules",
                 "err CPU stand-in"], rows, markdown=True)
    print(f"\nwithin 10 %: {within10}/{pairs}; within 5 %: {within5}/{pairs}; CPU stand-in within 10 %: "
          f"{standin10}/{pairs}")
    for w, ok_rules, ok_raw in rank_ok:
        print(f"ranking {w}: rules {'matches' if ok_rules else 'DIFFERS'}, "
              f"raw {'matches' if ok_raw else 'DIFFERS'}")
    print(f"settings whose real peaks differ by more than {APART:.0%}: ordered right by the rules "
          f"{pairs_right}/{pairs_apart}; best setting predicted best: {best_right}/{len(rank_ok)}")
    for w in names:
        dry = results[(w, "dry")]
        if "error" not in dry:
            print(f"dry {w}: cuda_initialized={dry['cuda_initialized']}, cpu raw {dry['raw_cpu_s']:.2f} s "
                  f"({dry['raw_ops']:,} ops, {1000 * dry['raw_cpu_s'] / max(dry['raw_ops'], 1):.3f} ms/op), "
                  f"notes: {dry['rules_notes']}")
        for s in SETTINGS:
            r = results[(w, s)]
            if "error" in r or r.get("oom"):
                print(f"real {w} {s!r}: {r.get('error') or r.get('oom')}")
    print(f"\nplanner (T4-sized fraction {fraction:.4f} of the H200 = {gib(T4_BYTES)} GiB):")
    for (w, best, nxt), at_best, at_next in real_checks:
        plan = results[(w, "plan")]
        print(f"  {w}: largest predicted {best} (tried {plan['tried']}, peaks "
              f"{ {k: gib(v) for k, v in plan['peaks'].items()} }); real at {best}: "
              f"{'OOM' if at_best.get('oom') else 'fits'} ({gib(at_best.get('peak_reserved'))} GiB)"
              + (f"; real at {nxt}: {'OOM' if at_next.get('oom') else 'fits'}" if at_next else "")
              + (f" {at_best.get('error', '')}" if "error" in at_best else ""))
    for w in names:
        if (w, "plan") in results and "error" in results[(w, "plan")]:
            print(f"plan {w} failed: {results[(w, 'plan')]['error']}")
    print(f"\nwall {wall:.0f} s")
    if out:
        (out / "bench_dryrun.json").write_text(json.dumps(
            {"results": {f"{k[0]}|{k[1]}": v for k, v in results.items()},
             "real_checks": real_checks}, default=str, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
