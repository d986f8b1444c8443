"""Simulator fidelity against real H200 runs: prints the table kept in docs/fidelity.md.

For every workload recorded by ``benchmarks/gpu/record.py`` (66 runs, each
setting in a fresh process on an H200 with torch 2.11, ``benchmarks/data``):

* **self-check** — the trace of each run, replayed under the settings it was
  recorded with and with exactly the information a what-if has (segments placed
  by the driver address model, no recorded addresses), must reproduce that run's
  own segment events; ``confident`` says whether the replay claims it may say
  "no OOM" without a caveat. The replay *with* the recorded addresses (a model
  diagnostic a what-if cannot have) is shown beside it, labelled;
* **prediction** — the *default* run's trace, replayed under every other
  setting, is compared with the real ``reserved_bytes.all.peak`` that setting
  produced in its own process (the request sequence is the same, the
  allocator's answer differs). Fraction runs replay under the same
  ``set_per_process_memory_fraction`` limit, where OOM (yes/no) must match too;
* **tie-break** — the prediction replayed again with 2.12's registration-counter
  tie-break instead of 2.11's address order: where peak or OOM differ, the
  prediction depends on where the CUDA driver put segments (``addr`` in the table).

Usage: ``python benchmarks/fidelity.py [--data benchmarks/data] [--markdown] [--workloads a,b]``;
``--data benchmarks/data/heldout`` gives the 52 held-out runs recorded in round 19 (on an H100),
and round 20's 20 runs of the same weight-streaming program with a slower host (``PACED``).
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

import dataclasses  # noqa: E402

from _table import print_table  # noqa: E402

from allocconf_widget.core.memory.snapshot import load_snapshot  # noqa: E402
from allocconf_widget.core.sim.simulator import SimSettings, extract_trace, simulate  # noqa: E402
from allocconf_widget.views.text.forecast import outcome_cell  # noqa: E402

GIB = 1 << 30


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


#: programs that allocate exactly as another does and differ only in how far the host runs
#: ahead of the GPU (``benchmarks/gpu/workloads.offload``'s ``host``): their runs are judged
#: against the ranges that program's own recordings give, and are no prediction rows
PACED = {"offload_slow": "offload", "offload_synced": "offload"}


def _with_paced(workload: str, by_name: dict[str, dict], runs: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """``by_name`` and the runs of every program paced like ``workload``, each named
    ``<pacing>:<setting>`` (``slow:expandable_r2``)."""
    out = dict(by_name)
    for paced, program in PACED.items():
        if program == workload:
            out.update({f"{paced.removeprefix(program + '_')}:{name}": meta
                        for name, meta in runs.get(paced, {}).items()})
    return out


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
    parser.add_argument("--workloads", default="", help="comma-separated workloads (default: all)")
    args = parser.parse_args()
    wanted = set(args.workloads.split(",")) if args.workloads else None
    rows = []
    caught_rows: list[dict] = []
    range_rows: list[dict] = []
    source_rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = _load_runs(args.data, Path(tmp))
        for workload, by_name in runs.items():
            if (wanted is not None and workload not in wanted) or workload in PACED:
                continue
            if workload in CATCHERS:
                caught_rows += _caught_rows(workload, by_name)
                continue
            if workload in TIMING:
                range_rows += _range_rows(workload, _with_paced(workload, by_name, runs))
                source_rows += _other_sources(workload, _with_paced(workload, by_name, runs))
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
                hinted = simulate(own, settings, device_total=total, non_pytorch_bytes=non_pytorch,
                                  stop_at_oom=False, check=True, address_hints=True)
                pred = simulate(base_trace, settings, device_total=total,
                                non_pytorch_bytes=non_pytorch, stop_at_oom=True)
                counter = simulate(base_trace, dataclasses.replace(settings, torch_version=(2, 12)),
                                   device_total=total, non_pytorch_bytes=non_pytorch, stop_at_oom=True)
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
                    "confident": bool(check.fidelity and check.fidelity.confident),
                    "self_err": ((check.peak_reserved_bytes - real) / real) if real else 0.0,
                    "hinted_exact": bool(hinted.fidelity and hinted.fidelity.exact),
                    "hinted_score": hinted.fidelity.score if hinted.fidelity else None,
                    "tie_break": (counter.peak_reserved_bytes != pred.peak_reserved_bytes
                                  or (counter.oom is None) != (pred.oom is None)),
                    "events": own.num_events, "seconds": elapsed,
                })
    _print(rows, args.markdown)
    if caught_rows:
        _print_caught(caught_rows, args.markdown)
    if range_rows:
        _print_ranges(range_rows, args.markdown)
    if source_rows:
        print("\nThe same with each repeat of the default run as the recording (a user records one "
              "run; which one is luck):\n")
        print_table(["workload", "recording", "real peaks inside", "widest high/low"], source_rows,
                    args.markdown)


#: workloads that catch their own OOMs (recorded under fractions only): the 3 GiB default run's
#: trace is replayed under every run's settings and fraction
CATCHERS = {"batchfind": "default_f3g", "batchgrow": "default_f3g"}
#: workloads whose frees wait on other streams (record_stream): the default run's trace gives a
#: peak range per setting, to hold every real run of that setting (repeats included)
TIMING = {"streams", "streams2", "streams2alone", "streams3", "streams2idle", "prefetch", "d2h",
          "buckets", "pipe2", "offload"}


def _caught_rows(workload: str, by_name: dict[str, dict]) -> list[dict]:
    base_meta = by_name[CATCHERS[workload]]
    trace = extract_trace(load_snapshot(base_meta["pickle"]))
    out = []
    for name, meta in sorted(by_name.items()):
        total, non_pytorch = _capacity(meta)
        pred = simulate(trace, _settings(meta), device_total=total, non_pytorch_bytes=non_pytorch)
        real = int(meta["stats"]["reserved_bytes.all.peak"])
        out.append({"workload": workload, "setting": name, "fraction": meta["fraction"],
                    "real_peak": real, "real_ooms": int(meta["stats"]["num_ooms"]),
                    "completed": meta["oom"] is None, "pred": pred,
                    "err": (pred.peak_reserved_bytes - real) / real if real else 0.0})
    return out


def _print_caught(rows: list[dict], markdown: bool) -> None:
    print("\nPrograms that catch their own OOMs (a batch-size finder under a memory fraction; the "
          "3 GiB default run's trace replayed under each run's settings):\n")
    head = ["workload", "run", "fraction", "real peak GiB", "real OOMs (caught)", "run completed",
            "predicted GiB", "error", "predicted OOM", "oom_fatal", "replay"]
    lines = []
    for r in rows:
        pred = r["pred"]
        if pred.oom is None:
            what = "follows the run"
        elif pred.stopped_early:
            what = f"stops at event {pred.oom.event_index:,}: the handler decides"
        else:
            what = "follows the run"
        if pred.path_changes_at is not None:
            what = f"path changes at event {pred.path_changes_at:,}"
        lines.append([r["workload"], r["setting"], f"{r['fraction']:.4f}", f"{r['real_peak'] / GIB:.3f}",
                      str(r["real_ooms"]), "yes" if r["completed"] else "no",
                      f"{pred.peak_reserved_bytes / GIB:.3f}", f"{r['err'] * 100:+.2f}%",
                      outcome_cell(pred), str(pred.oom_fatal).lower(), what])
    print_table(head, lines, markdown)
    dead = [r for r in rows if r["completed"] and r["pred"].oom_fatal]
    print(f"\ncompleted runs called dead (oom_fatal true): {len(dead)}/{sum(r['completed'] for r in rows)}")


def _range_rows(workload: str, by_name: dict[str, dict], source: str = "default") -> list[dict]:
    """Every run of ``workload`` beside the range the ``source`` run's trace gives its settings
    (replayed once per setting and fraction)."""
    trace = extract_trace(load_snapshot(by_name[source]["pickle"]))
    out = []
    replays: dict[tuple[object, ...], object] = {}
    for name, meta in sorted(by_name.items()):
        if name == "frames":
            continue
        total, non_pytorch = _capacity(meta)
        settings = json.dumps(meta["allocator_settings"], sort_keys=True)
        key = (settings, meta.get("fraction"), total, non_pytorch)
        if key not in replays:
            replays[key] = simulate(trace, _settings(meta), device_total=total, non_pytorch_bytes=non_pytorch)
        pred = replays[key]
        out.append({"workload": workload, "setting": name, "fraction": meta.get("fraction"),
                    "real_peak": int(meta["stats"]["reserved_bytes.all.peak"]), "pred": pred,
                    "real_oom": meta["oom"] is not None})
    return out


def _held(rows: list[dict]) -> tuple[list[dict], int, float]:
    """(the completed runs, how many of their real peaks lie in their range, the widest range's
    high/low). A run that ran out of memory stops its own peak at the limit: the range is about
    completed runs."""
    done = [r for r in rows if not r["real_oom"] and r["pred"].oom is None]
    inside = sum(r["pred"].reserved_range[0] <= r["real_peak"] <= r["pred"].reserved_range[1] for r in done)
    widest = max((r["pred"].reserved_range[1] / r["pred"].reserved_range[0] for r in done
                  if r["pred"].reserved_range[0]), default=1.0)
    return done, inside, widest


def _other_sources(workload: str, by_name: dict[str, dict]) -> list[list[str]]:
    """For workloads recorded several times under the defaults: each repeat's trace as the
    recording, how many completed runs' real peaks lie in the ranges it gives."""
    out = []
    for source in sorted(n for n in by_name if n.startswith("default_r")):
        done, inside, widest = _held(_range_rows(workload, by_name, source))
        out.append([workload, source, f"{inside}/{len(done)}", f"{widest:.2f}"])
    return out


def _print_ranges(rows: list[dict], markdown: bool) -> None:
    print("\nPeaks that depend on GPU timing (frees waiting on other streams): the default run's "
          "trace replayed with those frees completing as early and as late as it allows:\n")
    head = ["workload", "run", "fraction", "real peak GiB", "point GiB", "range GiB", "inside",
            "high/low"]
    lines = []
    for r in rows:
        pred = r["pred"]
        low, high = pred.reserved_range
        inside = low <= r["real_peak"] <= high
        lines.append([r["workload"], r["setting"], f"{r['fraction']:.4f}" if r["fraction"] else "",
                      f"{r['real_peak'] / GIB:.3f}", f"{pred.peak_reserved_bytes / GIB:.3f}",
                      f"{low / GIB:.3f}–{high / GIB:.3f}", "yes" if inside else "NO",
                      f"{high / low:.2f}" if low else ""])
    print_table(head, lines, markdown)
    done, inside, widest = _held(rows)
    point = sum(r["pred"].peak_reserved_bytes == r["real_peak"] for r in done)
    print(f"\nreal peaks inside their range: {inside}/{len(done)} runs without an OOM (the point "
          f"prediction alone: {point}/{len(done)} exact); widest range high/low: {widest:.2f}")


def _print(rows: list[dict], markdown: bool) -> None:
    head = ["workload", "setting", "fraction", "real peak GiB", "predicted GiB", "error",
            "OOM real/pred", "self-check", "self-check peak", "recorded addresses", "depends on"]
    lines = []
    for r in rows:
        oom = ("yes" if r["real_oom"] else "no") + "/" + ("yes" if r["pred_oom"] else "no")
        exact = "exact" if r["self_exact"] else f"{r['self_score']:.3f}"
        if not r["confident"]:
            exact += " (low)"
        hinted = "exact" if r["hinted_exact"] else f"{r['hinted_score']:.3f}"
        lines.append([r["workload"], r["conf"], f"{r['fraction']:.4f}" if r["fraction"] else "",
                      f"{r['real_peak'] / GIB:.3f}", f"{r['pred_peak'] / GIB:.3f}",
                      f"{r['err'] * 100:+.2f}%", oom, exact, f"{r['self_err'] * 100:+.2f}%", hinted,
                      "addr" if r["tie_break"] else ""])
    print_table(head, lines, markdown)
    non_frac = [r for r in rows if not r["fraction"] and r["setting"] != "default"]
    within = sum(abs(r["err"]) <= 0.02 for r in non_frac)
    exact = sum(r["self_exact"] for r in rows)
    hinted = sum(r["hinted_exact"] for r in rows)
    oom_match = sum(r["real_oom"] == r["pred_oom"] for r in rows)
    wrong_no = [r for r in rows if r["real_oom"] and not r["pred_oom"]]
    confident_wrong_no = sum(r["confident"] for r in wrong_no)
    ties = sum(r["tie_break"] for r in rows)
    print(f"\nself-check exact: {exact}/{len(rows)} runs (with recorded addresses: {hinted}); "
          f"predictions within 2%: {within}/{len(non_frac)} (non-fraction settings); "
          f"OOM outcome matched: {oom_match}/{len(rows)}; real OOMs predicted 'no': {len(wrong_no)} "
          f"({confident_wrong_no} of them with a confident self-check); "
          f"predictions the 2.11 address tie-break decides: {ties}/{len(rows)}")


if __name__ == "__main__":
    main()
