"""Simulator fidelity against real H200 runs: prints the table kept in docs/fidelity.md.

For every workload recorded by ``benchmarks/gpu/record.py`` (66 runs, each
setting in a fresh process on an H200 with torch 2.11, ``benchmarks/data``):

* **self-check** — the trace of each run, replayed under the settings it was
  recorded with, must reproduce that run's own segment events exactly;
* **prediction** — the *default* run's trace, replayed under every other
  setting, is compared with the real ``reserved_bytes.all.peak`` that setting
  produced in its own process (the request sequence is the same, the
  allocator's answer differs). Fraction runs replay under the same
  ``set_per_process_memory_fraction`` limit, where OOM (yes/no) must match too.

Usage: ``python benchmarks/fidelity.py [--data benchmarks/data] [--markdown]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _table import print_table  # noqa: E402

from allocconf_widget.core.memory.snapshot import load_snapshot  # noqa: E402
from allocconf_widget.core.sim.simulator import SimSettings, extract_trace, simulate  # noqa: E402

GB = 1e9


def _load_runs(data: Path, workdir: Path) -> dict[str, dict[str, dict]]:
    runs: dict[str, dict[str, dict]] = {}
    for archive in sorted(data.glob("*.tar.xz")):
        with tarfile.open(archive) as tar:
            tar.extractall(workdir, filter="data")
    for meta_path in sorted(workdir.glob("*.json")):
        meta = json.loads(meta_path.read_text())
        if "workload" not in meta:
            continue
        meta["pickle"] = meta_path.with_suffix(".pickle")
        runs.setdefault(meta["workload"], {})[meta_path.stem.split("__", 1)[1]] = meta
    return runs


def _settings(meta: dict) -> SimSettings:
    settings = SimSettings.from_allocator_settings(meta["allocator_settings"], (2, 11))
    if meta.get("fraction"):
        settings = settings.replace(per_process_memory_fraction=meta["fraction"]) if hasattr(
            settings, "replace") else _with_fraction(settings, meta["fraction"])
    return settings


def _with_fraction(settings: SimSettings, fraction: float) -> SimSettings:
    import dataclasses

    return dataclasses.replace(settings, per_process_memory_fraction=fraction)


def _capacity(meta: dict) -> tuple[int, int]:
    total = int(meta["device_total_bytes"])
    return total, total - int(meta["free_at_start_bytes"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=ROOT / "benchmarks" / "data")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = _load_runs(args.data, Path(tmp))
        for workload, by_name in runs.items():
            base = by_name["default"]
            base_trace = extract_trace(load_snapshot(base["pickle"]))
            for name, meta in sorted(by_name.items()):
                if name == "frames":
                    continue
                total, non_pytorch = _capacity(meta)
                settings = _settings(meta)
                own = extract_trace(load_snapshot(meta["pickle"]))
                t0 = time.perf_counter()
                check = simulate(own, settings, device_total=total, non_pytorch_bytes=non_pytorch,
                                 stop_at_oom=False, check=True)
                pred = simulate(base_trace, settings, device_total=total,
                                non_pytorch_bytes=non_pytorch, stop_at_oom=True)
                elapsed = time.perf_counter() - t0
                real = int(meta["stats"]["reserved_bytes.all.peak"])
                rows.append({
                    "workload": workload, "setting": name, "conf": meta["conf"] or "(default)",
                    "fraction": meta.get("fraction"),
                    "real_peak": real, "pred_peak": pred.peak_reserved_bytes,
                    "err": (pred.peak_reserved_bytes - real) / real if real else 0.0,
                    "real_oom": bool(meta["oom"]), "pred_oom": pred.oom is not None,
                    "self_exact": bool(check.fidelity and check.fidelity.exact),
                    "self_score": check.fidelity.score if check.fidelity else None,
                    "events": own.num_events, "seconds": elapsed,
                })
    _print(rows, args.markdown)


def _print(rows: list[dict], markdown: bool) -> None:
    head = ["workload", "setting", "fraction", "real peak GB", "predicted GB", "error",
            "OOM real/pred", "self-check"]
    lines = []
    for r in rows:
        oom = ("yes" if r["real_oom"] else "no") + "/" + ("yes" if r["pred_oom"] else "no")
        exact = "exact" if r["self_exact"] else f"{r['self_score']:.3f}"
        lines.append([r["workload"], r["conf"], f"{r['fraction']:.4f}" if r["fraction"] else "",
                      f"{r['real_peak'] / GB:.3f}", f"{r['pred_peak'] / GB:.3f}",
                      f"{r['err'] * 100:+.2f}%", oom, exact])
    print_table(head, lines, markdown)
    non_frac = [r for r in rows if not r["fraction"] and r["setting"] != "default"]
    within = sum(abs(r["err"]) <= 0.02 for r in non_frac)
    exact = sum(r["self_exact"] for r in rows)
    oom_match = sum(r["real_oom"] == r["pred_oom"] for r in rows)
    print(f"\nself-check exact: {exact}/{len(rows)} runs; predictions within 2%: {within}/{len(non_frac)}"
          f" (non-fraction settings); OOM outcome matched: {oom_match}/{len(rows)}")


if __name__ == "__main__":
    main()
