"""``allocconf simulate TRACE``: replay a recorded allocator trace under other settings.

Without ``--conf`` the trace is replayed under the settings it was recorded
with (read from the snapshot's ``allocator_settings``) and the fidelity
self-check is shown: how many of the recorded segment events the model
reproduces. Each ``--conf`` adds a what-if replay; ``--recommend`` ranks a
grid of common settings. ``--json`` prints a JSON array, one object per
configuration, in order (ranked for ``--recommend``).

Exit codes: 0 ok (also when an OOM is predicted), 2 bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
import warnings
from pathlib import Path
from typing import Any

from allocconf_widget._errors import AllocConfError, AllocConfWarning, SnapshotError

_PROG = "allocconf simulate"
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


def register(subparsers: Any) -> None:
    """Add the ``simulate`` subcommand to the top-level parser."""
    parser = subparsers.add_parser(
        "simulate",
        help="replay a recorded allocation trace under other allocator settings",
        description=(
            "Replay the allocation history of a snapshot written after "
            "torch.cuda.memory._record_memory_history() through a model of PyTorch's caching "
            "allocator, and predict peak reserved memory, OOMs and retries under other "
            "PYTORCH_CUDA_ALLOC_CONF settings. Needs no GPU. See docs/simulator.md."
        ),
    )
    parser.add_argument("trace", metavar="TRACE", help="snapshot .pickle (or .pickle.gz) with history")
    parser.add_argument("--torch-version", metavar="X.Y",
                        help="torch release that recorded the trace (default: installed torch, "
                             "else guessed from the snapshot)")
    parser.add_argument("--conf", action="append", metavar="C", default=None,
                        help="settings to try, e.g. expandable_segments:True (repeatable; "
                             "'' = torch defaults)")
    parser.add_argument("--device-total", metavar="BYTES",
                        help="GPU memory, e.g. 80GB or 141GiB (default: inferred from an OOM in "
                             "the trace, else unlimited)")
    parser.add_argument("--non-pytorch", metavar="BYTES", default="0",
                        help="memory used outside PyTorch's allocator (CUDA context, libraries)")
    parser.add_argument("--fraction", type=float, metavar="F",
                        help="torch.cuda.set_per_process_memory_fraction(F) in force")
    parser.add_argument("--device", type=int, metavar="N", help="CUDA device whose trace to use")
    parser.add_argument("--json", action="store_true", help="print a JSON array")
    parser.add_argument("--recommend", action="store_true",
                        help="rank a grid of common settings for this trace")
    parser.add_argument("--continue-after-oom", action="store_true",
                        help="keep replaying after a predicted OOM instead of stopping there")
    parser.add_argument("--workers", type=int, metavar="N", help="processes to use (default: all cores)")
    parser.set_defaults(handler=run)


def parse_size(text: str) -> int:
    """``80GB`` → 80·10⁹, ``141GiB`` → 141·2³⁰, ``1234`` → bytes."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"cannot read {text!r} as a size; write bytes or e.g. 80GB, 141GiB, 512MiB")
    number, unit = match.groups()
    value = float(number) * _UNITS[(unit or "").lower()]
    if not math.isfinite(value) or value >= 2**64:
        raise ValueError(f"{text[:40]!r} is larger than any device (2^64 bytes)")
    return int(value)


class _BadInputError(Exception):
    """Input problem: message goes to stderr, exit code 2."""


def _fail(message: str) -> int:
    print(f"{_PROG}: error: {message}", file=sys.stderr)
    return 2


def _note(message: str) -> None:
    print(f"{_PROG}: note: {message}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Load, replay, print; returns the exit code."""
    try:
        return _run(args)
    except _BadInputError as exc:
        return _fail(str(exc))


def _torch_version(args: argparse.Namespace, snapshot: Any, trace: Any, *,
                   device_total: int | None, non_pytorch: int) -> tuple[int, int]:
    """--torch-version, else the release whose rules best reproduce the trace."""
    from allocconf_widget.app.simulate import trace_torch_version
    from allocconf_widget.core.sim.settings import parse_torch_version

    if args.torch_version:
        try:
            return parse_torch_version(args.torch_version)
        except ValueError as exc:
            raise _BadInputError(f"--torch-version: {exc}") from None
    choice = trace_torch_version(snapshot, trace, device_total=device_total,
                                 non_pytorch_bytes=non_pytorch, fraction=args.fraction)
    if choice.note:
        _note(f"{choice.note}; pass --torch-version to override")
    return choice.version


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
    from allocconf_widget.core.memory.snapshot import load_snapshot
    from allocconf_widget.core.sim.trace import extract_trace

    path = Path(args.trace)
    try:
        snapshot = load_snapshot(path)
        trace = extract_trace(snapshot, args.device)
    except SnapshotError as exc:
        raise _BadInputError(f"{path}: {exc}") from None
    return snapshot, trace


def _sizes(args: argparse.Namespace) -> tuple[int | None, int]:
    try:
        total = parse_size(args.device_total) if args.device_total else None
        other = parse_size(args.non_pytorch)
    except ValueError as exc:
        raise _BadInputError(str(exc)) from None
    if args.fraction is not None and not 0.0 <= args.fraction <= 1.0:
        raise _BadInputError("--fraction must be between 0 and 1")
    return total, other


def _conf_settings(confs: list[str], version: tuple[int, int], fraction: float | None) -> list[Any]:
    from allocconf_widget.core.sim.settings import SimSettings

    out = []
    for conf in confs:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", AllocConfWarning)
            try:
                s = SimSettings.from_string(conf, version)
            except AllocConfError as exc:
                raise _BadInputError(f"--conf {conf!r}: {exc}") from None
        for w in caught:
            _note(f"--conf {conf!r}: {w.message}")
        if fraction is not None:
            s = dataclasses.replace(s, per_process_memory_fraction=fraction)
        out.append(s)
    return out


def _run(args: argparse.Namespace) -> int:
    from allocconf_widget.core.sim.settings import SimSettings
    from allocconf_widget.core.sim.simulator import simulate_many

    snapshot, trace = _load(args)
    device_total, non_pytorch = _sizes(args)
    if device_total is None and args.fraction is None:
        usable = trace.inferred_usable_bytes()
        if usable is not None:
            device_total, non_pytorch = usable, 0
            from allocconf_widget.core.units import format_bytes

            _note(f"no --device-total: using {format_bytes(usable)} usable, inferred from the "
                  "OOM recorded in the trace")
    if device_total is None:
        _note("no --device-total: the device is treated as unlimited, so no OOM can be predicted")
    version = _torch_version(args, snapshot, trace, device_total=device_total,
                             non_pytorch=non_pytorch)
    readback = snapshot.get("allocator_settings")
    if not isinstance(readback, dict):
        _note("snapshot has no allocator_settings (torch < 2.3): assuming default settings were used")
    recorded = SimSettings.from_allocator_settings(readback if isinstance(readback, dict) else None,
                                                   version)
    fraction = args.fraction
    if fraction is not None:
        recorded = dataclasses.replace(recorded, per_process_memory_fraction=fraction)
    if fraction is not None and device_total is None:
        raise _BadInputError("--fraction needs --device-total (the fraction is of the device's memory)")
    if trace.initial_note:
        _note(trace.initial_note)
    if trace.partial:
        _note(f"the trace is partial: {trace.unknown_frees:,} frees of memory allocated before it "
              "began (ring buffer full); predictions cover only the recorded window")
    if args.recommend:
        return _recommend(args, trace, version, recorded=recorded, device_total=device_total,
                          non_pytorch=non_pytorch, fraction=fraction)
    configs = [recorded, *_conf_settings(args.conf or [], version, fraction)]
    results = simulate_many(
        trace, configs, device_total=device_total, non_pytorch_bytes=non_pytorch,
        stop_at_oom=not args.continue_after_oom, workers=args.workers,
        check=[True] + [False] * (len(configs) - 1),
    )
    fidelity = results[0].fidelity
    shown = results[1:] if args.conf else results[:1]
    labels = list(args.conf) if args.conf else [f"recorded: {recorded.describe()}"]
    shown = [r.with_fidelity(fidelity) for r in shown]
    if args.json:
        confs = list(args.conf) if args.conf else [recorded.label or ""]
        docs = []
        for conf, r in zip(confs, shown, strict=True):
            doc = r.to_json()
            doc.pop("series", None)
            doc["conf"] = conf
            doc["recorded_settings"] = not args.conf
            docs.append(doc)
        json.dump(docs, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    sys.stdout.write(_render(args, trace, version, device_total=device_total, labels=labels,
                             results=shown, fidelity=fidelity))
    return 0


def _recommend(args: argparse.Namespace, trace: Any, version: tuple[int, int], *, recorded: Any,
               device_total: int | None, non_pytorch: int, fraction: float | None) -> int:
    from allocconf_widget.core.sim.recommend import recommend

    try:
        rec = recommend(trace, torch_version=version, current_settings=recorded,
                        current_conf=recorded.describe(), device_total=device_total,
                        non_pytorch_bytes=non_pytorch, fraction=fraction,
                        extra_confs=args.conf or (), workers=args.workers)
    except AllocConfError as exc:
        raise _BadInputError(f"--conf: {exc}") from None
    for note in rec.notes:
        _note(note)
    if args.json:
        docs = []
        for rank, cand in enumerate(rec.candidates, 1):
            doc = cand.to_json()
            doc["rank"] = rank
            doc["fidelity"] = rec.fidelity.to_json() if rec.fidelity is not None else None
            docs.append(doc)
        json.dump(docs, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    labels = [(c.conf or "(torch defaults)") + (" [current]" if c.is_current else "")
              for c in rec.candidates]
    text = _render(args, trace, version, device_total=device_total, labels=labels,
                   results=[c.result for c in rec.candidates], fidelity=rec.fidelity)
    reasons = [f"  {i}. {label}: {c.reason}"
               for i, (label, c) in enumerate(zip(labels, rec.candidates, strict=True), 1)]
    sys.stdout.write(text + "\nwhy:\n" + "\n".join(reasons) + "\n")
    return 0


def _render(args: argparse.Namespace, trace: Any, version: tuple[int, int], *,
            device_total: int | None, labels: list[str], results: list[Any], fidelity: Any) -> str:
    from allocconf_widget.core.units import format_bytes

    fid = fidelity
    lines = [
        f"trace: {args.trace} — {trace.describe()}",
        f"torch {version[0]}.{version[1]}; device: "
        + (format_bytes(device_total) if device_total is not None else "unlimited"),
        "self-check (replay under the recorded settings): "
        + (fid.summary() if fid is not None else "not run"),
    ]
    if trace.initial_state is not None:
        state = trace.initial_state
        lines.append(f"start: the replay starts from {state.provenance()} ({state.describe()}); "
                     "other settings are replayed as if switched now, keeping these segments")
    lines.append("")
    header = ["settings", "peak reserved", "peak allocated", "1 − alloc/res", "cudaMalloc/map",
              "retries", "OOM"]
    rows = [header]
    for label, r in zip(labels, results, strict=True):
        oom = "no"
        if r.oom is not None:
            oom = f"at event {r.oom.event_index:,} ({format_bytes(r.oom.segment_bytes)}"
            oom += ", as recorded)" if r.oom.recorded else ")"
        rows.append([label or "(torch defaults)", format_bytes(r.peak_reserved_bytes),
                     format_bytes(r.peak_allocated_bytes), f"{r.fragmentation_at_peak:.1%}",
                     f"{r.num_device_alloc:,}", f"{r.num_alloc_retries:,}", oom])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"
