"""``%allocconf monitor …`` and ``%allocconf report …``: the monitor's magic subcommands.

Registered by :mod:`allocconf_widget.views.magic` (``register(subparsers)``);
handlers take ``(args, ctx)`` and return a value so tests can inspect it.
Bad input raises IPython's ``UsageError`` with a message naming the problem.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from allocconf_widget.views.monitor_render import RENDERERS


def register(subparsers: Any) -> None:
    """Add ``monitor`` and ``report`` to the magic's parser."""
    p = subparsers.add_parser(
        "monitor", help="live GPU memory chart: reserved, allocated, non-PyTorch, fragmentation",
        description="Start, stop or query the live memory monitor. Without a GPU (or with --demo) "
        "it replays a real recording made on an H200, labelled as such.")
    p.add_argument("action", nargs="?", choices=("start", "stop", "status"), default="start")
    p.add_argument("--interval", type=float, default=0.1, metavar="S",
                   help="seconds between samples (default 0.1 = 10 Hz)")
    p.add_argument("--device", type=int, metavar="N", help="GPU shown first (all are sampled)")
    p.add_argument("--renderer", choices=RENDERERS, default="auto",
                   help="figurewidget (plotly, JupyterLab/Notebook 7) or svg (works everywhere)")
    p.add_argument("--demo", action="store_true", help="replay the bundled H200 recording")
    p.add_argument("--step-sync", action="store_true",
                   help="sample once per optimizer step on the training thread (for Colab)")
    p.set_defaults(handler=run_monitor)
    r = subparsers.add_parser(
        "report", help="memory and fragmentation figures of this process's allocator, now",
        description="Take one memory_snapshot() without its trace and report reserved/allocated "
        "memory and fragmentation per device and pool (docs/metrics.md). Without CUDA, reports "
        "the bundled recording instead, labelled as a recording.")
    r.add_argument("--device", type=int, metavar="N", help="only this CUDA device")
    r.add_argument("--json", action="store_true", help="print JSON instead of a table")
    r.set_defaults(handler=run_report)


def _usage(message: str) -> Exception:
    from IPython.core.error import UsageError

    return UsageError(message)


def _in_terminal() -> bool:
    from allocconf_widget.adapters.frontend import Frontend, detect_frontend

    return detect_frontend() in (Frontend.TERMINAL, Frontend.PLAIN)


# ----------------------------------------------------------------- monitor


def run_monitor(args: argparse.Namespace, _ctx: Any) -> Any:
    """``%allocconf monitor [start|stop|status]``; start returns the MonitorView."""
    from allocconf_widget.views import monitor

    if args.action == "stop":
        view = monitor.active_monitor()
        monitor.stop_monitor()
        print("monitor stopped" if view is not None else "no monitor was running")
        return view
    if args.action == "status":
        return _status(monitor.active_monitor())
    if args.demo and args.step_sync:
        raise _usage("--step-sync samples your training loop; --demo replays a recording: "
                     "choose one")
    if args.interval < 0.01:
        raise _usage(f"--interval {args.interval:g} is too short: use 0.01 s (100 Hz) or more")
    if not args.interval <= 60:  # also nan and inf: the thread could not sleep that long
        raise _usage(f"--interval {args.interval:g} is too long: use at most 60 s")
    if args.device is not None and args.device < 0:
        raise _usage(f"--device {args.device}: GPU indices start at 0")
    try:
        view = monitor.start_monitor(interval=args.interval, device=args.device,
                                     renderer=args.renderer, demo=True if args.demo else None,
                                     step_sync=args.step_sync)
    except (ValueError, RuntimeError) as exc:
        raise _usage(str(exc)) from None
    if _in_terminal():
        print(view.text())
    else:
        from IPython.display import display

        display(view)
    return view


def _status(view: Any) -> dict[str, Any]:
    if view is None:
        print("no monitor running; start one with %allocconf monitor")
        return {"running": False}
    print(view.text())
    return {"running": view.running, "renderer": view.renderer,
            "recording": view.recording.label if view.recording is not None else None,
            "updates": view.updates, **view.source.overhead()}


# ----------------------------------------------------------------- report


def _live_snapshot() -> tuple[dict[str, Any] | None, str]:
    """``{"segments": [...]}`` of this process (trace-free), or None and why not."""
    from allocconf_widget.adapters import torch_private

    torch = torch_private.imported_torch()
    if torch is None:
        return None, "torch is not imported"
    if not torch_private.cuda_built(torch):
        return None, "this torch build has no CUDA"
    if not torch_private.cuda_initialized(torch):
        return None, "CUDA is not initialised yet (looking now would freeze the allocator settings)"
    try:
        segments = torch_private.trace_free_snapshot(torch)
    except RuntimeError as exc:  # backend:cudaMallocAsync
        return None, f"memory_snapshot() is not available: {exc}"
    settings = torch_private.effective_settings(torch)
    snapshot: dict[str, Any] = {"segments": segments}
    if settings is not None:
        snapshot["allocator_settings"] = settings
    return snapshot, "live"


_ROWS = (
    ("reserved", "reserved_bytes", "bytes"),
    ("allocated", "allocated_bytes", "bytes"),
    ("active", "active_bytes", "bytes"),
    ("inactive (cached, free)", "inactive_bytes", "bytes"),
    ("largest free block", "largest_free_block_bytes", "bytes"),
    ("external fragmentation", "external_fragmentation", "pct"),
    ("internal fragmentation", "internal_fragmentation_bytes", "bytes"),
    ("segments", "segment_count", "int"),
    ("blocks", "block_count", "int"),
)


def _cell(value: Any, kind: str) -> str:
    from allocconf_widget.core.metrics import format_bytes

    if kind == "bytes":
        return format_bytes(value)
    if kind == "pct":
        return f"{value * 100:.1f}%"
    return f"{value:,}"


def report_text(label: str, per_device: dict[int, Any]) -> str:
    """A table per device: total plus one column per pool."""
    lines = [label]
    if not per_device:
        lines.append("no segments: the allocator holds no memory")
    for index, dm in per_device.items():
        columns = [("total", dm.total), *dm.pools.items()]
        header = ["", *(name for name, _m in columns)]
        rows = [[title] + [_cell(getattr(m, key), kind) for _n, m in columns]
                for title, key, kind in _ROWS]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        lines += ["", f"device {index}"]
        for row in [header, *rows]:
            lines.append("  " + row[0].ljust(widths[0]) + "  "
                         + "  ".join(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)))
    lines.append("\nexternal fragmentation = 1 - largest free block / inactive (docs/metrics.md)")
    return "\n".join(lines)


def run_report(args: argparse.Namespace, _ctx: Any) -> dict[str, Any]:
    """``%allocconf report [--device N] [--json]``: returns the JSON document (with ``source``)."""
    from allocconf_widget.core.metrics import metrics_json, snapshot_metrics

    snapshot, why = _live_snapshot()
    if snapshot is not None:
        source, label = "live", "this process, now (memory_snapshot without trace)"
    else:
        from allocconf_widget.core.recording import load_demo

        demo = load_demo()
        snapshot = dict(demo.snapshot())
        source, label = "recording", f"{demo.label} (no live CUDA allocator here: {why})"
    devices = sorted({seg.get("device", 0) for seg in snapshot["segments"]})
    if args.device is not None and args.device not in devices:
        listed = ", ".join(map(str, devices)) or "none"
        raise _usage(f"--device {args.device} has no segments in {source} data "
                     f"(devices with segments: {listed})")
    per_device = snapshot_metrics(snapshot, args.device)  # type: ignore[arg-type]
    document = {"source": source, "label": label, **metrics_json(per_device)}
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(report_text(label, per_device))
    return document
