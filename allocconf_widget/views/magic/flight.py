"""``%allocconf flight …``: the OOM flight recorder from the magic.

``on`` / ``off`` / ``status`` keep or drop torch's allocation history
(:mod:`allocconf_widget.app.flight`); ``show`` re-displays the last OOM view,
``apply`` applies its verdict's winner, ``export`` writes the files PyTorch's
viewer opens, and ``demo`` shows the view on a real OOM recorded on an H200
(for machines without a GPU). Handlers parse and print; the use cases decide.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from allocconf_widget._errors import RuntimeStateError
from allocconf_widget.app import flight

if TYPE_CHECKING:
    from allocconf_widget.app.candidates import CandidatePlan
    from allocconf_widget.app.flight import FlightStatus, OomCapture
    from allocconf_widget.app.oom import SettingsInForce
    from allocconf_widget.app.session import ApplyOutcome
    from allocconf_widget.views.magic.context import MagicContext, SubParsers
    from allocconf_widget.views.widgets.flight import FlightOomView

ACTIONS = ("on", "off", "status", "show", "apply", "export", "demo")


def register(subparsers: SubParsers) -> None:
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
    p.add_argument("--yes", action="store_true",
                   help="with `apply`: apply even when it unsets an option or comes from a "
                   "recording of another run (it says what changes first)")
    p.add_argument("--demo", action="store_true",
                   help="with `apply`: the bundled recording's winner (what `flight demo` shows)")
    p.set_defaults(handler=run_flight)


def run_flight(args: argparse.Namespace, ctx: MagicContext) -> Any:
    if (args.yes or args.demo) and args.action != "apply":
        raise RuntimeStateError(f"--yes and --demo go with `flight apply`, not `flight {args.action}`")
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
        return _status()
    if args.action == "demo":
        return _demo(ctx)
    if args.action == "apply" and args.demo:  # the demo's winner: a recording of another run
        demo = flight.load_demo_oom()
        return _apply(demo.capture, ctx, confirmed=args.yes, label="Recording")
    capture = flight.last_capture()
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
        return _apply(capture, ctx, confirmed=args.yes)
    return _show(capture, ctx)


def _apply(capture: OomCapture, ctx: MagicContext, *, confirmed: bool,
           label: str = "") -> ApplyOutcome | CandidatePlan | None:
    """Apply the verdict's winner through the one candidate use case; ask (--yes) first when
    it would unset an option or comes from a recording of another run."""
    from allocconf_widget.app.candidates import apply_candidate
    from allocconf_widget.views.text.flight import headline

    analysis = flight.analyse(capture, kernel=ctx.session.view().effective, label=label)
    plan = flight.plan_winner(ctx.session, analysis)
    if plan is None:
        raise RuntimeStateError(headline(analysis.verdict) if analysis.verdict is not None
                                else analysis.verdict_error or "no verdict")
    print(f"{plan.describe()}.")
    if not plan.changes:
        return None
    if plan.needs_confirmation and not confirmed:
        print("Nothing changed: run %allocconf flight apply --yes to apply it.")
        return plan
    outcome = apply_candidate(ctx.session, plan)
    print(outcome.headline())
    for line in outcome.lines():
        print(line)
    print(flight.next_step(outcome))
    return outcome


def _status() -> FlightStatus:
    state = flight.status()
    print(state.line + ".")
    if state.on:
        print(f"Memory: {flight.memory_bound(state.settings)}.")
    if state.last_capture_at is not None:
        import time

        stamp = time.strftime("%H:%M:%S", time.localtime(state.last_capture_at))
        print(f"Last OOM captured at {stamp}: %allocconf flight show")
    return state


def _show(capture: OomCapture, ctx: MagicContext, *, label: str = "",
          settings: SettingsInForce | None = None) -> FlightOomView | None:
    from allocconf_widget.app.oom import report_for_capture, settings_in_force
    from allocconf_widget.views.widgets.flight import show_flight_oom

    report = report_for_capture(capture, settings or settings_in_force(ctx.session))
    view = show_flight_oom(capture, session=ctx.session, report=report, label=label)
    if not label:  # a recording shown as a demo never becomes this kernel's last OOM
        flight.keep_capture(capture)
    return view


def _demo(ctx: MagicContext) -> FlightOomView | None:
    demo = flight.load_demo_oom()
    print(f"Recording (not this kernel): {demo.description}")
    return _show(demo.capture, ctx, label="Recording", settings=demo.settings)
