"""``%%allocconf dryrun`` and ``%allocconf plan``: predict a cell's memory before CUDA starts.

``dryrun`` runs the cell body on fake CUDA tensors (``app/dryrun``) in a copy of the
notebook's namespace, so names the cell assigns and models it moves to "cuda" stay as they
were outside it; the trace is kept for ``%allocconf simulate`` and the What-if tab (labelled
"dry run (estimate)"). ``plan`` dry-runs the last dry-run cell again for several values of a
variable (the batch size) and prints the largest predicted to fit per setting and GPU.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from allocconf_widget._errors import AllocConfError, RuntimeStateError, printable

if TYPE_CHECKING:
    from allocconf_widget.app.dryrun import DryRunResult
    from allocconf_widget.views.magic.context import MagicContext, SubParsers



def register(subparsers: SubParsers) -> None:
    """Add ``dryrun`` (cell) and ``plan`` to the magic's parser."""
    p = subparsers.add_parser(
        "dryrun", help="%%%%allocconf dryrun: predict the cell's GPU memory without starting CUDA",
        description="Run the cell on fake CUDA tensors (no GPU memory, no CUDA start) and keep "
        "its allocation trace for `%allocconf simulate` and the What-if tab.")
    p.add_argument("--gpu", help="GPU profile: t4, l4, a100-40, a100-80, h100, h200 "
                   "(default: this runtime's GPU, else t4)")
    p.add_argument("--save", metavar="PATH", help="also write the snapshot (allocconf simulate reads it)")
    p.add_argument("--raw", action="store_true", help="do not add modelled cuBLAS/cuDNN workspaces")
    p.add_argument("--standin", action="store_true",
                   help="run on the CPU stand-in (a coarser estimate; chosen by itself where no GPU is "
                   "visible)")
    p.set_defaults(handler=run_dryrun, takes_cell=True)
    p = subparsers.add_parser(
        "plan", help="largest batch predicted to fit, per setting and GPU (dry runs only)",
        description="Re-run the last %%allocconf dryrun cell with VAR set to each SIZE and report "
        "the largest batch predicted to fit per setting and GPU.")
    p.add_argument("var", help="the variable the cell reads the batch size from")
    p.add_argument("sizes", nargs="+", type=int, help="batch sizes to try")
    p.add_argument("--gpu", action="append", help="GPU profile(s) (default: t4)")
    p.add_argument("--conf", action="append", help="settings to compare (default: defaults and "
                   "expandable_segments:True)")
    p.add_argument("--chart", action="store_true", help="also draw peak reserved vs batch size")
    p.add_argument("--standin", action="store_true", help="run on the CPU stand-in (as the dry-run cell did, "
                   "by default)")
    p.set_defaults(handler=run_plan)


def _source(shell: Any, cell: str) -> str:
    """The cell as IPython would run it; registered so messages quote its lines."""
    import linecache

    source = str(shell.transform_cell(cell))
    linecache.cache[_CELL_NAME] = (len(source), None, source.splitlines(keepends=True), _CELL_NAME)
    return source


_CELL_NAME = "<dry-run cell>"


def _run_cell(ctx: MagicContext, cell: str, gpu: Any, rules: bool, standin: bool | None) -> Any:
    """Dry-run the cell in a copy of the notebook (``standin`` None: the CPU stand-in where no GPU
    is visible)."""
    source = _source(ctx.shell, cell)
    code = compile(source, _CELL_NAME, "exec")
    return _attempt(ctx, source, code, gpu, rules, standin=standin)


def _attempt(ctx: MagicContext, source: str, code: Any, gpu: Any, rules: bool, *,
             standin: bool | None) -> Any:
    from allocconf_widget.app.dryrun import cell_namespace, dry_run
    from allocconf_widget.views.text.progress import ProgressLine

    ns, report = cell_namespace(ctx.shell.user_ns, source)
    line = ProgressLine("dry run", unit="ops")
    run = dry_run(gpu, rules=rules, standin=standin, progress=line.update)
    run.copy = report
    try:
        with run:
            exec(code, ns)  # the user's own cell, in a copy of their namespace
    finally:
        line.close()
    return run.result


def check_save_target(path: str, *, sidecar: bool = False) -> None:
    """Refuse a ``--save`` path before a cell runs (an empty name, a missing folder, a FIFO);
    ``sidecar``: the dry run's JSON beside it too (never over a file of the user's own)."""
    from pathlib import Path

    from allocconf_widget.core.untrusted import NotRegularFileError, check_write_target

    try:
        if sidecar:
            from allocconf_widget.app.dryrun import check_save_targets

            check_save_targets(Path(path))
        else:
            check_write_target(path)
    except NotRegularFileError as exc:
        raise AllocConfError(f"--save: {exc}") from None


def run_dryrun(args: argparse.Namespace, ctx: MagicContext) -> Any:
    if ctx.cell is None:
        raise RuntimeStateError("dryrun is a cell magic: start the cell with %%allocconf dryrun")
    if args.save is not None:
        check_save_target(args.save, sidecar=True)  # said before the cell runs, not after
    # an interrupt here is the cell's
    result = _run_cell(ctx, ctx.cell, args.gpu, not args.raw, True if args.standin else None)
    try:
        return _after_the_cell(args, ctx, result)
    except KeyboardInterrupt:  # in our steps (the prediction replays): one line, not our frames
        raise RuntimeStateError("%%allocconf dryrun interrupted after your cell ran") from None


def _after_the_cell(args: argparse.Namespace, ctx: MagicContext,
                    result: DryRunResult | None) -> DryRunResult:
    assert ctx.cell is not None  # run_dryrun refused a line magic
    if result is None:  # the block never finished entering the dry run
        raise RuntimeStateError("the dry run did not start: nothing was recorded")
    result.require_allocations()  # before the session keeps it: an empty one replaces nothing
    # saved before the session keeps it: a save that fails leaves the previous dry run in place
    saved = result.save(args.save) if args.save is not None else None
    from allocconf_widget.app.dryrun import DryRunCell

    ctx.session.set_dry_run(result, DryRunCell(ctx.cell, args.gpu, result.trace.standin))
    print(result.summary())
    # the settings this kernel applies, as the Settings tab's "Applied now" line replays them
    applied = ctx.session.view().applied
    try:
        best = result.predict(applied)
    except AllocConfError as exc:
        print(f"note: this kernel's settings cannot be replayed on the dry run ({exc}); "
              "torch's defaults instead")
        best = result.predict("")
    from allocconf_widget.views.text.forecast import prediction_text

    print(f"Predicted with the settings this kernel applies: {prediction_text(best)}")
    if saved is not None:
        from allocconf_widget.app.dryrun import sidecar_path

        print(f"Saved the dry-run snapshot to {saved}, and the GPU and torch it predicts for to "
              f"{sidecar_path(saved)} (allocconf simulate {saved}).")
    _say_step(ctx)
    print("Next: %allocconf simulate (ranks settings on this estimate), or %allocconf plan VAR SIZES.")
    return result


def _check_plan_variable(var: str, source: str) -> None:
    """Refuse a variable the plan cannot set for the cell: a name the cell never reads (a typo,
    ``BATHC`` for ``BATCH``: every size would run the same step), one the cell binds itself (a
    script's ``BATCH = 64`` at its top would run 64 at every size), or one it reads only as a
    function's own parameter or local. Functions of earlier cells read the notebook's own
    globals, not the copy plan sets, so the cell itself must read the name."""
    import keyword

    from allocconf_widget.core.dryrun.cell import variable_use

    if not var.isidentifier() or keyword.iskeyword(var):
        raise AllocConfError(f"{printable(var, 60)!r} is not a variable name: give the name the "
                             "dry-run cell reads the batch size from, e.g. %allocconf plan BATCH 8 16 32")
    use = variable_use(source, var)
    if use is None:
        return
    if use.bound_at is not None:
        import linecache

        text = linecache.getline(_CELL_NAME, use.bound_at).strip()
        raise AllocConfError(
            f"the dry-run cell sets {var} itself (line {use.bound_at}: {printable(text, 80)}), so every size "
            f"would run with the cell's own value",
            fix=f"move that line to a cell above the dry-run cell, run the dry-run cell again, then plan "
                f"(plan sets {var} before each run)")
    if not use.reads and use.shadowed_in is not None:
        raise AllocConfError(
            f"the dry-run cell reads {var} only as {use.shadowed_in}()'s own parameter or variable, which "
            "the plan's value never reaches",
            fix=f"let {use.shadowed_in}() read the notebook's {var} (drop its parameter or default of that "
                f"name), or pass {var} to it from the cell's top level")
    if not use.reads:
        raise AllocConfError(f"the dry-run cell never reads {var}, so every size would run the same step",
                             fix="give the variable the cell itself uses for the batch size (plan sets it "
                                 "before each run)")


def run_plan(args: argparse.Namespace, ctx: MagicContext) -> Any:
    from allocconf_widget.app.dryrun import PlanStep, cell_namespace, plan_batch
    from allocconf_widget.views.text.dryrun import render_plan
    from allocconf_widget.views.text.progress import ProgressLine

    saved = ctx.session.dry_run_cell
    if saved is None:
        raise RuntimeStateError("no dry-run cell yet: run a cell with %%allocconf dryrun first; "
                                "plan re-runs it with each batch size")
    source = _source(ctx.shell, saved.code)
    _check_plan_variable(args.var, source)
    code = compile(source, _CELL_NAME, "exec")

    def prepare(size: int) -> dict[str, Any]:  # outside the dry run: real copies (plan_batch)
        ns, _report = cell_namespace(ctx.shell.user_ns, source)
        ns[args.var] = size
        return ns

    def step(ns: dict[str, Any]) -> None:
        from allocconf_widget._errors import DryRunError

        try:
            exec(code, ns)
        except DryRunError:
            raise
        except Exception as exc:  # the cell failed at this size: say so in the table
            # one line: torch's errors carry a C++ backtrace of dozens of lines after it
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise DryRunError(f"the cell raised {type(exc).__name__}: {printable(first, 200)}") from None

    line = ProgressLine(f"plan {args.var}", total=len(set(args.sizes)) * len(args.gpu or ("t4",)),
                        unit="dry runs", every=0.0)

    def progress(at: PlanStep) -> None:
        line.update(at.done, f"{args.var}={at.batch} on {at.gpu}")

    try:
        plan = plan_batch(step, args.sizes, confs=tuple(args.conf or ("", "expandable_segments:True")),
                          gpus=tuple(args.gpu or ("t4",)), prepare=prepare,
                          standin=True if args.standin or saved.standin else None, progress=progress)
    finally:
        line.close()
    print(render_plan(plan, args.var), end="")
    if args.chart:
        from IPython.display import display

        from allocconf_widget.views.charts.dryrun import plan_figure

        display(plan_figure(plan))
    return plan


def report_estimate(ctx: MagicContext) -> Any:
    """After ``%%allocconf record``: how far the last dry run's estimate was from the recording,
    per setting (nothing when there was no dry run). Never raises: recording must not fail
    because of a comparison."""
    if ctx.session.dry_run is None:
        return None
    from allocconf_widget.app.dryrun import session_estimate
    from allocconf_widget.views.text.dryrun import render_estimate_check

    try:
        check = session_estimate(ctx.session)
    except Exception as exc:  # a comparison must never break recording
        print(f"note: the dry run's estimate could not be compared with this recording ({exc})")
        return None
    if check is None:
        return None
    print(render_estimate_check(check), end="")
    return check


def _say_step(ctx: MagicContext) -> None:
    """Where the session holds a recording too: which of the two every prediction now uses."""
    step = ctx.session.step()
    if step.other is not None:
        from allocconf_widget.app.sources import source_label
        from allocconf_widget.views.text.step import step_words

        print(step_words(step, source_label(ctx.session)))
