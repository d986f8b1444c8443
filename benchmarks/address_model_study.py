"""Where the CUDA driver puts the caching allocator's segments, and how well the replay's
synthetic address model (``core/sim/engine.AddressSpace``) reproduces it.

Addresses matter to the simulator only through torch ≤ 2.11's equal-size tie-break (the
lower address wins). Replaying a run under its own settings reuses the recorded segment
addresses (``check=True``); a what-if replay cannot, and uses the model instead. This
study measures the model on the 66 recorded H200 / torch 2.11 runs in three parts:

1. **Observed placement** in the raw snapshots (``segment_alloc``/``segment_free``
   ``addr``/``size``; expandable runs map pages inside reservations and are left out).
2. **One step at a time**: before each ``segment_alloc`` the layout is the *real* one so
   far; each rule predicts the new segment's address, exact hits are counted. This scores
   placement rules without letting one early miss spoil everything after it.
3. **Replays without address hints**: each run's own trace under its own settings,
   peak reserved vs the measured ``reserved_bytes.all.peak`` and the segment events vs
   the recorded ones; then every run's ``default`` trace under the other runs' settings
   (as ``benchmarks/fidelity.py``). The old model ("top-down, newest lowest, never
   reused") and the new one side by side.

Usage: ``python benchmarks/address_model_study.py [--data benchmarks/data] [--markdown]
[--archives cnn,streams]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tarfile
import tempfile
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _table import print_table  # noqa: E402

from allocconf_widget.core.memory.snapshot import load_snapshot  # noqa: E402
from allocconf_widget.core.sim import engine as sim_engine  # noqa: E402
from allocconf_widget.core.sim.engine import VA_ALIGN, AddressSpace, Engine  # noqa: E402
from allocconf_widget.core.sim.result import compare_segments  # noqa: E402
from allocconf_widget.core.sim.settings import SimSettings  # noqa: E402
from allocconf_widget.core.sim.trace.extract import extract_trace  # noqa: E402
from allocconf_widget.core.sim.trace.model import Trace  # noqa: E402

MiB = 1 << 20
SMALL_SEGMENT = 2 * MiB  # small-pool segments are exactly 2 MiB; large ones never are
NAMED = ("cnn__largeseg64", "streams__frac_gc06")


# ----------------------------------------------------------------------------- data
@dataclasses.dataclass
class Run:
    name: str
    meta: dict[str, Any]
    trace: Trace
    segments: list[tuple[str, int, int]]  # (action, addr, size) of segment_alloc/segment_free

    @property
    def expandable(self) -> bool:
        return bool(self.meta["allocator_settings"].get("expandable_segments"))


def load_runs(data: Path, workdir: Path, archives: set[str] | None = None) -> dict[str, Run]:
    """Every run of the archives in ``data`` (only those named in ``archives``, when given)."""
    for archive in sorted(data.glob("*.tar.xz")):
        if archives is not None and archive.name.removesuffix(".tar.xz") not in archives:
            continue
        with tarfile.open(archive) as tar:
            tar.extractall(workdir, filter="data")
    runs = {}
    for meta_path in sorted(workdir.glob("*.json")):
        meta = json.loads(meta_path.read_text())
        if "workload" not in meta:
            continue
        snapshot = load_snapshot(meta_path.with_suffix(".pickle"))
        entries = snapshot["device_traces"][0]
        segments = [(e["action"], int(e["addr"]), int(e["size"])) for e in entries
                    if e["action"] in ("segment_alloc", "segment_free")]
        runs[meta_path.stem] = Run(meta_path.stem, meta, extract_trace(snapshot), segments)
    return runs


def _settings(meta: dict[str, Any]) -> SimSettings:
    settings = SimSettings.from_allocator_settings(meta["allocator_settings"], (2, 11))
    if meta.get("fraction"):
        settings = dataclasses.replace(settings, per_process_memory_fraction=meta["fraction"])
    return settings


def _up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


# ----------------------------------------------------------- 1. observed placement
def observed(runs: dict[str, Run]) -> None:
    fresh = Counter()
    inside: dict[str, Counter[str]] = {}
    for run in runs.values():
        if run.expandable:
            continue
        live: dict[int, int] = {}
        freed: set[int] = set()
        low = None
        for action, addr, size in run.segments:
            if action == "segment_free":
                live.pop(addr)
                freed.add(addr)
                continue
            if low is not None and addr + size <= low:
                fresh["placements"] += 1
                fresh["start on a 32 MiB boundary"] += addr % VA_ALIGN == 0
                fresh["right below the lowest segment, in whole 32 MiB units"] += (
                    addr % VA_ALIGN == 0 and low - addr == _up(size, VA_ALIGN))
            elif low is not None:
                cls = ("2 MiB (small pool)" if size == SMALL_SEGMENT
                       else "4-78 MiB" if size < 80 * MiB else ">= 80 MiB")
                ends = {a + s for a, s in live.items()}
                above = min((a for a in live if a >= addr + size), default=None)
                if addr in ends:
                    kind = "bottom: where a live segment ends"
                elif above is not None and addr == (above - size) // VA_ALIGN * VA_ALIGN:
                    kind = "top: highest 32 MiB-aligned start below a live segment"
                elif addr in freed:
                    kind = "where a freed segment started"
                else:
                    kind = "elsewhere (next to memory the trace does not show)"
                inside.setdefault(cls, Counter())[kind] += 1
            live[addr] = size
            low = addr if low is None else min(low, addr)
    n = fresh["placements"]
    print("1. Observed placement (non-expandable runs)\n")
    print(f"New segments below every earlier one: {n}")
    for key in ("start on a 32 MiB boundary", "right below the lowest segment, in whole 32 MiB units"):
        print(f"  {key}: {fresh[key]} ({fresh[key] / n:.0%})")
    print("New segments inside the range already used, by size:")
    for cls in ("2 MiB (small pool)", "4-78 MiB", ">= 80 MiB"):
        counts = inside.get(cls, Counter())
        total = sum(counts.values())
        parts = ", ".join(f"{k} {v} ({v / total:.0%})" for k, v in counts.most_common())
        print(f"  {cls}: {total}: {parts}")
    print()


# ------------------------------------------------------------ 2. one step at a time
class _Layout:
    """The real layout so far: lowest start, and free ranges the driver could reuse
    (freed segments, and leftovers under 32 MiB below fresh placements; larger gaps
    hold memory the trace does not show)."""

    def __init__(self, low: int) -> None:
        self.low = low
        self.free: list[list[int]] = []  # [start, end), sorted, disjoint

    def release(self, a: int, b: int) -> None:
        merged = [a, b]
        keep = []
        for r in self.free:
            if r[1] < merged[0] or r[0] > merged[1]:
                keep.append(r)
            else:
                merged = [min(r[0], merged[0]), max(r[1], merged[1])]
        keep.insert(bisect_left(keep, merged), merged)
        self.free = keep

    def occupy(self, a: int, b: int) -> None:
        keep = []
        for s, e in self.free:
            if e <= a or b <= s:
                keep.append([s, e])
                continue
            if s < a:
                keep.append([s, a])
            if b < e:
                keep.append([b, e])
        self.free = keep

    def space(self) -> AddressSpace:
        space = AddressSpace(self.low)
        for s, e in self.free:
            space.release(s, e - s)
        return space


Rule = Callable[[_Layout, int], int]


def _old_rule(layout: _Layout, size: int) -> int:
    return layout.low - _up(size, 2 * MiB)


def _fresh_32(layout: _Layout, size: int) -> int:
    return (layout.low - size) // VA_ALIGN * VA_ALIGN


def _model(threshold: int | None = None) -> Rule:
    def rule(layout: _Layout, size: int) -> int:
        saved = sim_engine.VA_TOP_DOWN_FROM
        if threshold is not None:
            sim_engine.VA_TOP_DOWN_FROM = threshold
        try:
            return layout.space().allocate(size)
        finally:
            sim_engine.VA_TOP_DOWN_FROM = saved
    return rule


def one_step(runs: dict[str, Run], rule: Rule) -> Counter[str]:
    hits: Counter[str] = Counter()
    for run in runs.values():
        if run.expandable:
            continue
        layout: _Layout | None = None
        for action, addr, size in run.segments:
            if action == "segment_free":
                assert layout is not None
                layout.release(addr, addr + size)
                continue
            if layout is None:
                layout = _Layout(addr)
                continue
            cls = "small" if size == SMALL_SEGMENT else "large"
            hits[cls + " total"] += 1
            hits[cls] += rule(layout, size) == addr
            if addr + size <= layout.low and layout.low - addr - size < VA_ALIGN:
                layout.release(addr + size, layout.low)
            layout.occupy(addr, addr + size)
            layout.low = min(layout.low, addr)
    return hits


def placement_rules(runs: dict[str, Run]) -> None:
    rules: list[tuple[str, Rule]] = [
        ("old: below the lowest, 2 MiB granular, never reused", _old_rule),
        ("below the lowest, on a 32 MiB boundary, never reused", _fresh_32),
        ("reuse: every size bottom-up (lowest free range)", _model(1 << 62)),
        ("reuse: every size top-down (highest 32 MiB start)", _model(0)),
        ("reuse: 2 MiB bottom-up, the rest top-down", _model(2 * MiB + 1)),
        ("new: < 80 MiB bottom-up, >= 80 MiB top-down", _model()),
    ]
    print("2. Placement rules, one step at a time (exact address predicted)\n")
    print(f"{'rule':56s} {'small (2 MiB)':>15s} {'large':>15s} {'all':>15s}")
    for label, rule in rules:
        h = one_step(runs, rule)
        cells = []
        for hit, total in ((h["small"], h["small total"]), (h["large"], h["large total"]),
                           (h["small"] + h["large"], h["small total"] + h["large total"])):
            cells.append(f"{hit}/{total} {hit / total:4.0%}")
        print(f"{label:56s} {cells[0]:>15s} {cells[1]:>15s} {cells[2]:>15s}")
    scan = []
    for mib in (16, 32, 48, 64, 80, 96, 112, 128):
        h = one_step(runs, _model(mib * MiB))
        scan.append(f"{mib}: {(h['small'] + h['large']) / (h['small total'] + h['large total']):.1%}")
    print("bottom-up below / top-down from N MiB, all hits: " + ", ".join(scan))
    print()


# ---------------------------------------------------------------- 3. replays
class OldLayoutEngine(Engine):
    """The engine with the address model it had before: a bump pointer that moves down
    by each new segment's size (rounded to 2 MiB) and never gives ranges back."""

    def segment_address(self, size: int) -> int:
        if self.hints is None:
            return self.reserve_va(size)
        return super().segment_address(size)

    def release_address(self, addr: int, size: int) -> None:
        if self.hints is not None:
            super().release_address(addr, size)


def _capacity(meta: dict[str, Any]) -> tuple[int, int]:
    total = int(meta["device_total_bytes"])
    return total, total - int(meta["free_at_start_bytes"])


def replay_own(run: Run, engine: type[Engine]) -> tuple[int, int, int, int]:
    """(peak reserved, segment events matched, simulated, exact?) without address hints."""
    total, other = _capacity(run.meta)
    eng = engine(run.trace, _settings(run.meta), device_total=total, non_pytorch_bytes=other,
                 stop_at_oom=False, record_segments=True)
    result = eng.run()
    fidelity = compare_segments(run.trace, tuple(eng.seg_events), result.peak_reserved_bytes)
    return (result.peak_reserved_bytes, fidelity.matched_events, fidelity.simulated_events,
            int(fidelity.exact))


def replay_what_if(runs: dict[str, Run], engine: type[Engine]) -> dict[str, float]:
    """Relative peak reserved error per case: the default trace under each run's settings."""
    errors: dict[str, float] = {}
    for name, run in runs.items():
        workload, setting = name.split("__", 1)
        if setting in ("default", "frames") or f"{workload}__default" not in runs:
            continue  # a workload recorded without a default run (e.g. only under a fraction)
        total, other = _capacity(run.meta)
        eng = engine(runs[f"{workload}__default"].trace, _settings(run.meta),
                     device_total=total, non_pytorch_bytes=other, stop_at_oom=True)
        peak = eng.run().peak_reserved_bytes
        real = int(run.meta["stats"]["reserved_bytes.all.peak"])
        errors[name] = (peak - real) / real
    return errors


def replays(runs: dict[str, Run], markdown: bool) -> None:
    rows = []
    totals: Counter[str] = Counter()
    for name, run in runs.items():
        real = int(run.meta["stats"]["reserved_bytes.all.peak"])
        recorded = len(run.trace.seg_kinds)
        old = replay_own(run, OldLayoutEngine)
        new = replay_own(run, Engine)
        for label, (peak, _, _, exact) in (("old", old), ("new", new)):
            totals[label + " peak"] += peak == real
            totals[label + " segments"] += exact
        rows.append((name, real, recorded, old, new))
    head = ["run", "real peak reserved", "old: peak error", "old: segment events",
            "new: peak error", "new: segment events"]
    lines = []
    for name, real, recorded, old, new in rows:
        line = [name, f"{real:,}"]
        for peak, matched, simulated, exact in (old, new):
            line.append("exact" if peak == real else f"{(peak - real) / real * 100:+.2f}%")
            line.append("exact" if exact else f"{matched}/{recorded} matched, {simulated} simulated")
        lines.append(line)
    print("3. Replays of each run's own trace without address hints\n")
    print_table(head, lines, markdown)
    n = len(rows)
    print(f"\npeak reserved exact: old {totals['old peak']}/{n}, new {totals['new peak']}/{n}")
    print(f"every segment event reproduced: old {totals['old segments']}/{n}, "
          f"new {totals['new segments']}/{n}")
    for name, real, _, old, new in rows:
        if name in NAMED:
            print(f"{name}: real {real:,}; old {old[0]:,} ({(old[0] - real) / real:+.2%}); "
                  f"new {new[0]:,} ({(new[0] - real) / real:+.2%})")
    print("\nWhat-if: each workload's default trace under the other runs' settings")
    results = {label: replay_what_if(runs, engine)
               for label, engine in (("old", OldLayoutEngine), ("new", Engine))}
    plain = [name for name in results["old"] if not runs[name].meta.get("fraction")]
    for label, errors in results.items():
        exact = sum(e == 0 for e in errors.values())
        within = sum(abs(errors[name]) <= 0.02 for name in plain)
        print(f"  {label}: peak exact {exact}/{len(errors)}; within 2% {within}/{len(plain)} "
              "(settings without a fraction)")
    for name, old_error in results["old"].items():
        new_error = results["new"][name]
        if new_error != old_error:
            print(f"  changed: {name}: {old_error:+.2%} -> {new_error:+.2%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=ROOT / "benchmarks" / "data")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--archives", help="comma-separated archive names (e.g. cnn,streams); "
                        "default: every archive in --data")
    args = parser.parse_args()
    archives = set(args.archives.split(",")) if args.archives else None
    with tempfile.TemporaryDirectory() as tmp:
        runs = load_runs(args.data, Path(tmp), archives)
    if not runs:
        parser.error(f"no recorded runs in {args.data} for --archives {args.archives}")
    print(f"{len(runs)} recorded runs\n")
    observed(runs)
    placement_rules(runs)
    replays(runs, args.markdown)


if __name__ == "__main__":
    main()
