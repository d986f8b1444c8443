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


def _why_no_widgets() -> str | None:
    """Why this front end gets text in place of widgets, in one line; None where it shows them."""
    from allocconf_widget.adapters.frontend import detect_frontend

    return detect_frontend().why_no_widgets


# ----------------------------------------------------------------- monitor


def run_monitor(args: argparse.Namespace, ctx: MagicContext) -> Any:
    """``%allocconf monitor [start|stop|status]``: the Session's one monitor; in a terminal its
    status as text (no widgets are built), in a notebook its view (start returns it)."""
    from allocconf_widget.views.charts.monitor_render import status_text

    monitors = ctx.session.monitors
    if args.action == "stop":
        run = monitors.stop()
        print("monitor stopped" if run is not None else "no monitor was running")
        return getattr(run, "view", None) or run
    if args.action == "status":
        return _status(monitors.active)
    try:
        why = _why_no_widgets()
        if why is not None:
            run = monitors.start(interval=args.interval, device=args.device,
                                 demo=True if args.demo else None, step_sync=args.step_sync,
                                 skip_idle=not args.keep_idle)
            print(f"{why}: the monitor's status as text (%allocconf monitor status again for "
                  "the latest)")
            print(status_text(run, args.device))
            return run
        from allocconf_widget.views.widgets import monitor

        view = monitor.start_monitor(interval=args.interval, device=args.device,
                                     renderer=args.renderer, demo=True if args.demo else None,
                                     step_sync=args.step_sync, skip_idle=not args.keep_idle)
    except (ValueError, RuntimeError) as exc:
        raise _usage(_with_flags(str(exc))) from None
    from IPython.display import display

    display(view)
    return view


def _with_flags(message: str) -> str:
    """The use case's words for an option, as the magic's flag is spelled."""
    for word, flag in (("interval ", "--interval "), ("device ", "--device "),
                       ("step_sync ", "--step-sync "), ("demo ", "--demo ")):
        if message.startswith(word) or f"; {word}" in message:
            message = message.replace(word, flag, 1)
    return message


def _status(run: Any) -> dict[str, Any]:
    from allocconf_widget.views.charts.monitor_render import status_text

    if run is None:
        print("no monitor running; start one with %allocconf monitor")
        return {"running": False}
    print(status_text(run))
    view = getattr(run, "view", None)
    return {"running": run.running, "renderer": getattr(view, "renderer", "text"),
            "recording": run.recording.label if run.recording is not None else None,
            "updates": getattr(view, "updates", 0), **run.source.overhead()}


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
