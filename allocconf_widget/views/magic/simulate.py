"""``%%allocconf record`` and ``%allocconf simulate``: record a cell's trace, ask "what if?".

``record`` runs the cell body with torch's allocation history on and keeps the
snapshot in the session (and optionally on disk). ``simulate`` replays the
latest recording — or a file, or the bundled H200 recording with ``--demo`` —
under candidate settings and prints the ranking; the panel's What-if tab
shows the same with charts and an Apply button per candidate.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from allocconf_widget._errors import RuntimeStateError, SnapshotError

if TYPE_CHECKING:
    from allocconf_widget.app.recording import CellRecording
    from allocconf_widget.views.magic.context import MagicContext, SubParsers


def register(subparsers: SubParsers) -> None:
    """Add ``record`` (cell) and ``simulate`` to the magic's parser."""
    p = subparsers.add_parser(
        "record", help="%%%%allocconf record: run the cell with allocation history on",
        description="Run the cell body while torch records every allocation, then keep the "
        "trace for `%allocconf simulate` and the What-if tab. Needs a CUDA GPU.")
    p.add_argument("--save", metavar="PATH", help="also write the snapshot (memory_viz opens it)")
    p.add_argument("--max-entries", type=_entries, default=1_000_000,
                   help="trace ring-buffer size (1,000 to 10,000,000)")
    p.set_defaults(handler=run_record, takes_cell=True)
    p = subparsers.add_parser(
        "simulate", help="replay the recorded trace under other settings and rank them",
        description="Replay the last %%allocconf record trace (or TRACE) through the allocator "
        "model under candidate settings; prints peak reserved, OOM and the reason for each.")
    p.add_argument("trace", nargs="?", help="a snapshot pickle with a trace (default: last recording)")
    p.add_argument("--conf", action="append", default=[],
                   help="a setting to add to the ranking, beside the grid of common settings and "
                        "this kernel's own (repeatable), as `allocconf simulate --conf` does")
    p.add_argument("--rank", action=argparse.BooleanOptionalAction, default=True,
                   help="rank the grid of common settings, this kernel's and each --conf (the "
                        "default, as `allocconf simulate` does); --no-rank replays only each "
                        "--conf, or without one the recorded settings (the self-check)")
    p.add_argument("--recommend", dest="rank", action="store_const", const=True,
                   help="the same as the default (--rank)")
    p.add_argument("--demo", action="store_true", help="use the bundled H200 recording")
    p.add_argument("--fraction", type=float, help="memory fraction limit in force")
    # the facts a file cannot say, as `allocconf simulate` takes them (app.simulate.SourceOptions)
    p.add_argument("--device-total", metavar="SIZE",
                   help="the GPU's memory, e.g. 79.2GiB (default: the recording's, a sidecar's, "
                        "else read off an OOM in the trace)")
    p.add_argument("--non-pytorch", metavar="SIZE",
                   help="memory outside PyTorch's allocator (CUDA context, libraries), e.g. 600MiB")
    p.add_argument("--torch-version", metavar="X.Y", help="the torch release that recorded the trace")
    p.add_argument("--device", type=int, metavar="N", help="CUDA device whose trace to use")
    p.set_defaults(handler=run_simulate)
    p = subparsers.add_parser(
        "step", help="which step predictions use: latest (default), recording or dryrun",
        description="Every prediction (the Settings tab, %allocconf set, simulate, the What-if "
        "tab) uses one step: the newer of your last %%allocconf record and your last "
        "%%allocconf dryrun, unless you choose one here.")
    p.add_argument("which", nargs="?", choices=("latest", "recording", "dryrun"),
                   help="the step to use (without it: say which one is used now)")
    p.set_defaults(handler=run_step)


def _entries(text: str) -> int:
    """``--max-entries`` checked at parse time: a bad value refuses the cell before it runs."""
    from allocconf_widget.app.recording import check_max_entries

    try:
        return check_max_entries(int(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc) if text.strip().lstrip("+-").isdigit()
                                         else f"{text!r} is not a whole number") from None


def run_record(args: argparse.Namespace, ctx: MagicContext) -> CellRecording | None:
    from allocconf_widget.app.recording import record_cell

    if ctx.cell is None:
        raise RuntimeStateError("record is a cell magic: start the cell with %%allocconf record")
    if args.save is not None:
        from allocconf_widget.views.magic.dryrun import check_save_target

        check_save_target(args.save)  # said before the training cell runs, not after it
    cell = ctx.cell
    done = record_cell(ctx.session, lambda: ctx.shell.run_cell(cell), max_entries=args.max_entries,
                       save=args.save)
    rec, result = done.recording, done.result
    if rec is None:  # no GPU to record on: the cell ran, and the user is told what the what-if uses
        print(f"note: not recording: {done.not_recorded}. Running the cell without recording.")
        return None
    if done.saved_to is not None:
        print(f"Saved the snapshot to {done.saved_to} (open it at pytorch.org/memory_viz).")
    failed = getattr(result, "error_in_exec", None)
    status = f"the cell raised {type(failed).__name__}" if failed else "the cell finished"
    print(f"Recorded {rec.events:,} allocator events in {rec.seconds:.1f} s ({status}). "
          "Next: %allocconf simulate, or the panel's What if? tab.")
    for note in rec.notes:
        print(f"note: {note}")
    from allocconf_widget.views.magic.dryrun import report_estimate

    report_estimate(ctx)  # a dry run before it: how far its estimate was
    if ctx.session.step().other is not None:
        from allocconf_widget.app.sources import source_label
        from allocconf_widget.views.text.step import step_words

        print(step_words(ctx.session.step(), source_label(ctx.session)))
    return rec


def run_step(args: argparse.Namespace, ctx: MagicContext) -> Any:
    from allocconf_widget.app.sources import source_label
    from allocconf_widget.views.text.step import step_words

    step = ctx.session.choose_step(args.which) if args.which else ctx.session.step()
    print(step_words(step, source_label(ctx.session)))
    return step


def run_simulate(args: argparse.Namespace, ctx: MagicContext) -> Any:
    from allocconf_widget.adapters.frontend import detect_frontend
    from allocconf_widget.app.simulate import SimulationRequest, simulate
    from allocconf_widget.app.sources import SourceOptions, trace_source
    from allocconf_widget.views.text.notes import warnings_as_notes
    from allocconf_widget.views.text.simulate import render_simulation

    notebook = detect_frontend().shows_widgets
    progress = _CellProgress() if notebook else None
    finished = False
    try:
        # "current" is what this kernel runs, as in the What if? tab (one session state)
        fraction = args.fraction  # else the source's: a file's sidecar, a recording's own
        with warnings_as_notes() as ours:  # said below as our notes, once
            view = ctx.session.view()
            if progress is not None:
                progress.say("reading the trace")
            options = SourceOptions.parse(torch_version=args.torch_version,
                                          device_total=args.device_total,
                                          non_pytorch=args.non_pytorch, device=args.device)
            source = trace_source(ctx.session, args.trace, args.demo, options)
            if progress is not None:
                progress.say("replaying")
            report = simulate(source, SimulationRequest(confs=tuple(args.conf), rank=args.rank,
                                                        fraction=fraction, kernel=view.effective,
                                                        draft=view.staged if view.has_changes else None,
                                                        progress=progress))
        finished = True
    except SnapshotError as exc:
        raise RuntimeStateError(str(exc)) from None
    finally:
        if progress is not None and not finished:
            progress.clear()  # an error: its message follows, no progress line above it
    if progress is None:
        print(render_simulation(report), end="")
    else:  # a notebook: an HTML table that fits the output area, where the progress line was
        from allocconf_widget.views.text.simulate import SimulationDisplay

        progress.replace_with(SimulationDisplay(report))
    if not args.trace and not args.demo:  # the session's step: say which one, and how to use the other
        from allocconf_widget.app.sources import source_label
        from allocconf_widget.views.text.step import step_words

        print(step_words(ctx.session.step(), source_label(ctx.session)))
    for note in (*report.all_notes(), *ours):
        print(f"note: {note}")
    return report


class _CellProgress:
    """How far ``%allocconf simulate`` has got, in the cell's output: one line (a display with an
    id, updated in place: seen in JupyterLab and classic Notebook; Colab and VS Code are not
    verified here) that each finished setting rewrites, and that the report's table then takes
    the place of. The ranking replays a dozen settings or more; on a 1M-event trace with frees
    that wait on other streams that is tens of seconds, with nothing in the cell before."""

    def __init__(self) -> None:
        self.handle: Any = None

    def say(self, what: str) -> None:
        from allocconf_widget.views.text.simulate import progress_line

        self._show({"text/plain": progress_line(what)}, raw=True)

    def __call__(self, done: int, total: int) -> None:
        """The use case's progress callback: ``done`` of ``total`` settings replayed."""
        from allocconf_widget.views.text.simulate import replay_count

        self.say(replay_count(done, total))

    def replace_with(self, report: Any) -> None:
        self._show(report, raw=False)

    def clear(self) -> None:
        if self.handle is not None:
            self.handle.update({"text/plain": ""}, raw=True)

    def _show(self, obj: Any, *, raw: bool) -> None:
        from IPython.display import display

        if self.handle is None:
            self.handle = display(obj, raw=raw, display_id=True)
        else:
            self.handle.update(obj, raw=raw)
