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
    p.set_defaults(handler=run_plan)


def _namespace_copy(shell: Any) -> dict[str, Any]:
    from allocconf_widget.app.dryrun import cell_namespace

    return cell_namespace(shell.user_ns)


def _compiled(shell: Any, cell: str) -> Any:
    """The cell as IPython would run it; its source is registered so messages quote its lines."""
    import linecache

    source = shell.transform_cell(cell)
    name = "<dry-run cell>"
    linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)
    return compile(source, name, "exec")


def _run_cell(ctx: MagicContext, cell: str, gpu: str | None, rules: bool) -> DryRunResult | None:
    from allocconf_widget.app.dryrun import dry_run

    ns = _namespace_copy(ctx.shell)
    run = dry_run(gpu, rules=rules)
    code = _compiled(ctx.shell, cell)
    with run:
        exec(code, ns)  # the user's own cell, in a copy of their namespace
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
    result = _run_cell(ctx, ctx.cell, args.gpu, not args.raw)  # an interrupt here is the cell's
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

    ctx.session.set_dry_run(result, DryRunCell(ctx.cell, args.gpu))
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


def _check_plan_variable(var: str, code: Any) -> None:
    """Refuse a name the dry-run cell never reads: plan sets it before each run, so a typo
    (``BATHC`` for ``BATCH``) ran the same step at every size, and the table called the
    largest size "predicted to fit". Functions the cell calls read the user's own globals,
    not the copy plan sets, so the cell itself must read the name."""
    import keyword

    if not var.isidentifier() or keyword.iskeyword(var):
        raise AllocConfError(f"{printable(var, 60)!r} is not a variable name: give the name the "
                             "dry-run cell reads the batch size from, e.g. %allocconf plan BATCH 8 16 32")
    names: set[str] = set()
    pending = [code]
    while pending:
        unit = pending.pop()
        names.update(unit.co_names, unit.co_varnames, unit.co_freevars, unit.co_cellvars)
        pending.extend(c for c in unit.co_consts if hasattr(c, "co_names"))
    if var not in names:
        raise AllocConfError(f"the dry-run cell never reads {var}, so every size would run the same "
                             "step: give the variable the cell itself uses for the batch size "
                             "(plan sets it before each run)")


def run_plan(args: argparse.Namespace, ctx: MagicContext) -> Any:
    from allocconf_widget.app.dryrun import plan_batch
    from allocconf_widget.views.text.dryrun import render_plan

    saved = ctx.session.dry_run_cell
    if saved is None:
        raise RuntimeStateError("no dry-run cell yet: run a cell with %%allocconf dryrun first; "
                                "plan re-runs it with each batch size")
    cell = saved.code
    _check_plan_variable(args.var, _compiled(ctx.shell, cell))

    def prepare(size: int) -> dict[str, Any]:  # outside the dry run: real copies (plan_batch)
        ns = _namespace_copy(ctx.shell)
        ns[args.var] = size
        return ns

    def step(ns: dict[str, Any]) -> None:
        from allocconf_widget._errors import DryRunError

        code = _compiled(ctx.shell, cell)
        try:
            exec(code, ns)
        except DryRunError:
            raise
        except Exception as exc:  # the cell failed at this size: say so in the table
            # one line: torch's errors carry a C++ backtrace of dozens of lines after it
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise DryRunError(f"the cell raised {type(exc).__name__}: {printable(first, 200)}") from None

    plan = plan_batch(step, args.sizes, confs=tuple(args.conf or ("", "expandable_segments:True")),
                      gpus=tuple(args.gpu or ("t4",)), prepare=prepare)
    print(render_plan(plan), end="")
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
