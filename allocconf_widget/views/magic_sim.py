"""``%%allocconf record`` and ``%allocconf simulate``: record a cell's trace, ask "what if?".

``record`` runs the cell body with torch's allocation history on and keeps the
snapshot in the session (and optionally on disk). ``simulate`` replays the
latest recording — or a file, or the bundled H200 recording with ``--demo`` —
under candidate settings and prints the ranking; the panel's What-if tab
shows the same with charts and an Apply button per candidate.
"""

from __future__ import annotations

import argparse
from typing import Any

from allocconf_widget._errors import RuntimeStateError, SnapshotError

RECORDING_KEY = "recording"


def register(subparsers: Any) -> None:
    """Add ``record`` (cell) and ``simulate`` to the magic's parser."""
    p = subparsers.add_parser(
        "record", help="%%%%allocconf record: run the cell with allocation history on",
        description="Run the cell body while torch records every allocation, then keep the "
        "trace for `%allocconf simulate` and the What-if tab. Needs a CUDA GPU.")
    p.add_argument("--save", metavar="PATH", help="also write the snapshot (memory_viz opens it)")
    p.add_argument("--max-entries", type=int, default=1_000_000, help="trace ring-buffer size")
    p.set_defaults(handler=run_record, takes_cell=True)
    p = subparsers.add_parser(
        "simulate", help="replay the recorded trace under other settings and rank them",
        description="Replay the last %%allocconf record trace (or TRACE) through the allocator "
        "model under candidate settings; prints peak reserved, OOM and the reason for each.")
    p.add_argument("trace", nargs="?", help="a snapshot pickle with a trace (default: last recording)")
    p.add_argument("--conf", action="append", default=[], help="extra setting string to try")
    p.add_argument("--demo", action="store_true", help="use the bundled H200 recording")
    p.add_argument("--fraction", type=float, help="memory fraction limit in force")
    p.set_defaults(handler=run_simulate)


def run_record(args: argparse.Namespace, ctx: Any) -> Any:
    from allocconf_widget.adapters.recorder import record

    if ctx.cell is None:
        raise RuntimeStateError("record is a cell magic: start the cell with %%allocconf record")
    try:
        with record(max_entries=args.max_entries) as rec:
            result = ctx.shell.run_cell(ctx.cell)
    except RuntimeStateError:
        raise
    ctx.session.extras[RECORDING_KEY] = rec
    if args.save and rec.snapshot is not None:
        from allocconf_widget.core.snapshot import save_snapshot

        save_snapshot(rec.snapshot, args.save)
        print(f"Saved the snapshot to {args.save} (open it at pytorch.org/memory_viz).")
    failed = getattr(result, "error_in_exec", None)
    status = f"the cell raised {type(failed).__name__}" if failed else "the cell finished"
    print(f"Recorded {rec.events:,} allocator events in {rec.seconds:.1f} s ({status}). "
          "Next: %allocconf simulate, or the panel's What if? tab.")
    for note in rec.notes:
        print(f"note: {note}")
    return rec


def trace_source(session: Any, path: str | None = None, demo: bool = False) -> tuple[Any, str, dict]:
    """(snapshot, label, context) for the simulator: a file, the last recording, or the demo.

    ``context`` holds the recording's torch release and, when known, the device
    capacity the replay should respect.
    """
    from allocconf_widget.core.snapshot import load_snapshot
    from allocconf_widget.core.versions import default_version

    if path:
        return load_snapshot(path), path, {"torch_version": default_version().key}
    rec = session.extras.get(RECORDING_KEY)
    if rec is not None and rec.snapshot is not None and not demo:
        # Memory in use when recording started, less what the allocator already held (the
        # replay starts from those segments), is memory outside PyTorch's allocator.
        from allocconf_widget.core.sim_state import INITIAL_SEGMENTS_KEY

        held = sum(int(seg.get("total_size", 0)) for seg in rec.snapshot.get(INITIAL_SEGMENTS_KEY) or ()
                   if isinstance(seg, dict) and seg.get("device", 0) == 0)
        return rec.snapshot, "the last %%allocconf record", {
            "torch_version": rec.torch_version, "device_total": rec.device_total,
            "non_pytorch_bytes": max((rec.device_total or 0) - (rec.free_at_start or 0) - held, 0)}
    from allocconf_widget.core.recording import load_demo

    demo_rec = load_demo()
    return demo_rec.snapshot(), f"the bundled recording ({demo_rec.description})", {
        "torch_version": demo_rec.torch_version, "device_total": demo_rec.device_total_bytes,
        "non_pytorch_bytes": demo_rec.non_pytorch_bytes or 0}


def run_simulate(args: argparse.Namespace, ctx: Any) -> Any:
    from allocconf_widget.core.recommend import recommend
    from allocconf_widget.core.simulator import SimSettings, extract_trace
    from allocconf_widget.core.snapshot import allocator_settings

    try:
        snapshot, label, context = trace_source(ctx.session, args.trace, args.demo)
        trace = extract_trace(snapshot)
    except SnapshotError as exc:
        raise RuntimeStateError(str(exc)) from None
    version = context.pop("torch_version")
    settings = allocator_settings(snapshot)
    current = SimSettings.from_allocator_settings(settings, version) if settings else None
    result = recommend(trace, torch_version=version, current_settings=current,
                       current_conf=(settings or {}).get("PYTORCH_CUDA_ALLOC_CONF"),
                       extra_confs=args.conf, fraction=args.fraction, **context)
    print(f"What if? Replaying {label} ({trace.num_events:,} events) under "
          f"{len(result.candidates)} settings.")
    if result.fidelity is not None:
        print(f"Model check on the recorded settings: {result.fidelity.summary()}")
    for cand in result.candidates:
        print(f"  {cand.conf or '(torch defaults)'}: {cand.reason}")
    for note in result.notes:
        print(f"note: {note}")
    ctx.session.extras["whatif"] = result
    return result
