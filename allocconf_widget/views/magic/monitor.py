"""``%allocconf monitor …`` and ``%allocconf report …``: the monitor's magic subcommands.

Registered by :mod:`allocconf_widget.views.magic.extension` (``register(subparsers)``);
handlers take ``(args, ctx)`` and return a value so tests can inspect it.
Bad input raises IPython's ``UsageError`` with a message naming the problem.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from allocconf_widget._errors import SnapshotError
from allocconf_widget.views.charts.monitor_render import RENDERERS

if TYPE_CHECKING:
    from allocconf_widget.views.magic.context import MagicContext, SubParsers


def register(subparsers: SubParsers) -> None:
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
    p.add_argument("--keep-idle", action="store_true",
                   help="replay in real time: do not cut stretches where no memory counter moved")
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
    from allocconf_widget.adapters.frontend import detect_frontend

    return not detect_frontend().shows_widgets


# ----------------------------------------------------------------- monitor


def run_monitor(args: argparse.Namespace, _ctx: MagicContext) -> Any:
    """``%allocconf monitor [start|stop|status]``; start returns the MonitorView."""
    from allocconf_widget.views.widgets import monitor

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
                                     step_sync=args.step_sync, skip_idle=not args.keep_idle)
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


def run_report(args: argparse.Namespace, _ctx: MagicContext) -> dict[str, Any]:
    """``%allocconf report [--device N] [--json]``: returns the JSON document (with ``source``)."""
    from allocconf_widget.app.report import report_live
    from allocconf_widget.views.text.report import render_report

    try:
        report = report_live(device=args.device)
    except SnapshotError as exc:
        raise _usage(f"--device {args.device}: {exc}") from None
    document = report.to_json()
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(render_report(report), end="")
    return document
