"""``%allocconf flight …``: the OOM flight recorder from the magic.

``on`` / ``off`` / ``status`` keep or drop torch's allocation history
(:mod:`allocconf_widget.app.flight`); ``show`` re-displays the last OOM view,
``apply`` applies its verdict's winner, ``export`` writes the files PyTorch's
viewer opens, and ``demo`` shows the view on a real OOM recorded on an H200
(for machines without a GPU). Handlers parse and print; the use cases decide.
"""

from __future__ import annotations

import argparse
from typing import Any

from allocconf_widget._errors import RuntimeStateError

ACTIONS = ("on", "off", "status", "show", "apply", "export", "demo")


def register(subparsers: Any) -> None:
    """Add ``flight`` to the magic's parser."""
    p = subparsers.add_parser(
        "flight", help="OOM flight recorder: keep allocation history; explain the next OOM",
        description="Keep torch's allocation history in a bounded ring buffer across cells. When "
        "a cell runs out of GPU memory, the OOM view shows who held the memory, the segment map "
        "at the OOM, and which setting would have avoided it (the recorded window replayed), "
        "with one click to apply it. `on` before CUDA starts arms it (nothing is initialised). "
        "Nothing is saved: a new kernel starts with it off.")
    p.add_argument("action", nargs="?", choices=ACTIONS, default="status")
    p.add_argument("--stacks", action="store_true",
                   help="also record each allocation's Python stack (sites by line; a few %% "
                   "slower, see docs/flight.md)")
    p.add_argument("--max-entries", type=int, metavar="N",
                   help="ring-buffer entries (default 100,000; older events are dropped)")
    p.set_defaults(handler=run_flight)


def run_flight(args: argparse.Namespace, ctx: Any) -> Any:
    from allocconf_widget.app import flight

    if args.action != "on" and (args.stacks or args.max_entries is not None):
        raise RuntimeStateError(f"--stacks and --max-entries go with `flight on`, not "
                                f"`flight {args.action}`")
    if args.action == "on":
        try:
            state = flight.turn_on(max_entries=args.max_entries, python_stacks=args.stacks)
        except ValueError as exc:
            raise RuntimeStateError(f"--max-entries: {exc}") from None
        print(state.line + ".")
        if state.on:
            print(f"Memory: {flight.memory_bound(state.settings)}. `%allocconf flight off` stops it.")
        return state
    if args.action == "off":
        state = flight.turn_off()
        print(state.line + " (the ring buffer is dropped).")
        return state
    if args.action == "status":
        return _status(flight)
    if args.action == "demo":
        return _demo(ctx)
    from allocconf_widget.adapters.flight_history import flight_history

    capture = flight_history().last_capture()
    if capture is None:
        raise RuntimeStateError("no OOM has been captured in this kernel yet (turn the recorder "
                                "on with %allocconf flight on; %allocconf flight demo shows a "
                                "recorded one)")
    if args.action == "export":
        files = flight.export_for_viewer(capture)
        for line in files.lines:
            print(line)
        return files
    if args.action == "apply":
        analysis = flight.analyse(capture)
        winner = analysis.verdict.winner if analysis.verdict is not None else None
        if winner is None:
            raise RuntimeStateError(analysis.verdict.headline if analysis.verdict is not None
                                    else analysis.verdict_error or "no verdict")
        outcome = flight.apply_setting(ctx.session, winner.conf)
        print(f"{'Applied' if outcome.applied else 'Did not apply'} {winner.shown_conf}.")
        for line in outcome.lines:
            print(line)
        return outcome
    return _show(capture, ctx)


def _status(flight: Any) -> Any:
    state = flight.status()
    print(state.line + ".")
    if state.on:
        print(f"Memory: {flight.memory_bound(state.settings)}.")
    if state.last_capture_at is not None:
        import time

        stamp = time.strftime("%H:%M:%S", time.localtime(state.last_capture_at))
        print(f"Last OOM captured at {stamp}: %allocconf flight show")
    return state


def _show(capture: Any, ctx: Any, *, label: str = "", settings: Any = None,
          version: Any = None, settings_text: str | None = None) -> Any:
    from allocconf_widget.adapters.flight_history import flight_history
    from allocconf_widget.views.widgets.flight import show_flight_oom
    from allocconf_widget.views.widgets.oom import ObservedOom, build_report, report_html, report_text

    observed = None
    if capture.requested is not None and capture.limit is not None:
        observed = ObservedOom(capture.device, capture.requested, capture.limit,
                               capture.device_free or 0, capture.stats)
    report = build_report(capture.message or "", settings=settings, torch_version=version,
                          settings_text=settings_text, observed=observed)
    view = show_flight_oom(capture, session=ctx.session, report_text=report_text(report),
                           report_html=report_html(report), label=label)
    if not label:  # a recording shown as a demo never becomes this kernel's last OOM
        flight_history().set_capture(capture)
    return view


def _demo(ctx: Any) -> Any:
    from allocconf_widget._errors import AllocConfError
    from allocconf_widget.app.flight import load_demo_oom
    from allocconf_widget.core.versions import parse_version

    demo = load_demo_oom()
    settings = dict(demo.capture.snapshot.get("allocator_settings") or {})
    try:
        version = parse_version(demo.capture.torch_version or "2.11").key
    except AllocConfError:
        version = (2, 11)
    print(f"Recording (not this kernel): {demo.description}")
    text = str(settings.get("PYTORCH_CUDA_ALLOC_CONF") or "torch's defaults") + " (as recorded)"
    return _show(demo.capture, ctx, label="Recording", settings=settings, version=version,
                 settings_text=text)
