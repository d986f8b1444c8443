"""Every recording as the source of a what-if, not only the default run (round 18).

``benchmarks/fidelity.py`` replays each workload's *default* run under every other setting. A
user records whatever they run: a run under ``max_split_size_mb:128`` from a blog post, or under
a memory fraction. Here each archived run that completed (`benchmarks/data`) is the recording,
through the one use case every front end calls (``app.simulate.simulate``, its sidecar's facts
known: device, memory outside PyTorch, the fraction it ran under), and each row asks for another
run's settings *without* a fraction (``--fraction 1``); the row is compared with that run's real
``reserved_bytes.all.peak`` and OOM outcome. Workloads whose frees wait on other streams, and
programs that catch their OOMs, have their own sections in ``fidelity.py``.

    python benchmarks/fidelity_sources.py [--workloads cnn,mixed] [--fraction-sources-only]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import fidelity  # noqa: E402

from allocconf_widget.app.simulate import SimulationRequest, simulate  # noqa: E402
from allocconf_widget.app.sources import TraceSource  # noqa: E402
from allocconf_widget.core.memory.snapshot import load_snapshot  # noqa: E402
from allocconf_widget.core.versions import TorchVersion  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workloads", default="")
    parser.add_argument("--fraction-sources-only", action="store_true")
    args = parser.parse_args()
    wanted = set(args.workloads.split(",")) if args.workloads else None
    warnings.simplefilter("ignore")
    counts = {"no fraction": [0, 0], "under a fraction": [0, 0]}
    with tempfile.TemporaryDirectory() as tmp:
        runs = fidelity._load_runs(ROOT / "benchmarks" / "data", Path(tmp))
        for workload, by_name in runs.items():
            if workload in fidelity.CATCHERS or workload in fidelity.TIMING:
                continue  # their own sections in fidelity.py
            if wanted is not None and workload not in wanted:
                continue
            targets = [(n, m) for n, m in sorted(by_name.items()) if n != "frames" and not m.get("fraction")]
            for name, meta in sorted(by_name.items()):
                if name == "frames" or meta.get("oom") or (args.fraction_sources_only
                                                          and not meta.get("fraction")):
                    continue
                kind = "under a fraction" if meta.get("fraction") else "no fraction"
                total, non_pytorch = fidelity._capacity(meta)
                source = TraceSource(load_snapshot(meta["pickle"]), name, TorchVersion(2, 11), total,
                                     non_pytorch, fraction=meta.get("fraction"), limit_known=True)
                others = [(n, m) for n, m in targets if n != name]
                if not others:
                    continue
                report = simulate(source, SimulationRequest(confs=tuple(m["conf"] for _, m in others),
                                                            fraction=1.0, workers=2))
                for (target, tmeta), row in zip(others, report.rows, strict=True):
                    real = int(tmeta["stats"]["reserved_bytes.all.peak"])
                    err = (row.result.peak_reserved_bytes - real) / real
                    same_oom = bool(tmeta["oom"]) == (row.result.oom is not None)
                    counts[kind][1] += 1
                    if abs(err) <= 0.02 and same_oom:
                        counts[kind][0] += 1
                    else:
                        print(f"{workload:15} {name:18} -> {target:20} {err * 100:+7.2f}%"
                              + ("" if same_oom else " (OOM outcome differs)"), flush=True)
    for kind, (good, total) in counts.items():
        if total:
            print(f"recordings {kind}: {good}/{total} rows within 2 % of the real peak, same OOM outcome")


if __name__ == "__main__":
    main()
