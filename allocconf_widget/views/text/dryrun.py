"""Text for dry runs: the batch planner's table (CLI-free; the magic prints it)."""

from __future__ import annotations

from allocconf_widget.app.dryrun import BatchPlan, EstimateCheck
from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.text.table import aligned_table


def render_plan(plan: BatchPlan, variable: str = "the batch size") -> str:
    """Peak reserved per batch size and setting, then per GPU what the sizes tried say: the
    largest that fits, that every size fits (and which to try next), or that every size gave the
    same allocations (the step does not use ``variable``)."""
    lines: list[str] = []
    for gpu in plan.gpus:
        rows = [["batch", *[conf or "(torch defaults)" for conf in plan.confs]]]
        for size in plan.sizes:
            row = [str(size)]
            for conf in plan.confs:
                cell = plan.cell(size, conf, gpu)
                pred = cell.prediction if cell is not None else None
                if pred is None:
                    row.append("dry run failed")
                else:
                    row.append(format_bytes(pred.peak_reserved) if pred.fits else "OOM")
            rows.append(row)
        usable = next((c.prediction.usable for c in plan.cells
                       if c.gpu == gpu and c.prediction is not None), None)
        shown = f" ({format_bytes(usable)} usable)" if usable is not None else ""
        lines.append(f"{gpu}{shown}: predicted peak reserved (dry run, estimate)")
        lines.extend(aligned_table(rows, indent="  "))
        if plan.interrupted is not None:  # no verdict from the sizes a Ctrl-C let run
            continue
        if gpu in plan.same_trace:
            lines.append(f"  every size gave the same allocations: the step does not size its tensors by "
                         f"{variable}, so no size is larger than another here. Make the cell build its batch "
                         f"from {variable} (e.g. torch.randn({variable}, ...)), then plan again")
            continue
        for conf in plan.confs:
            name = conf or "(torch defaults)"
            if plan.all_fit(conf, gpu):
                larger = " ".join(str(s) for s in plan.larger_sizes())
                lines.append(f"  every size tried fits with {name} (up to batch {plan.sizes[-1]}): the "
                             f"largest that fits is larger; try larger sizes, e.g. {larger}")
                continue
            best = plan.largest(conf, gpu)
            verdict = f"batch {best}" if best is not None else "none of the sizes tried"
            lines.append(f"  largest predicted to fit with {name}: {verdict}")
    if plan.interrupted is not None:
        lines.append(f"interrupted at batch {plan.interrupted}: the sizes above were dry-run; nothing "
                     "was left changed")
    errors = {c.error for c in plan.cells if c.error}
    lines += [f"note: {e}" for e in sorted(errors)]
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines) + "\n"


def estimate_beside(check: EstimateCheck, conf: str) -> str | None:
    """What the dry run estimated for one setting, beside the recording's replay of it."""
    row = next((r for r in check.rows if r.conf == conf), None)
    if row is None:
        return None
    return f"your dry run estimated {format_bytes(row.estimated)} ({100 * row.error:+.1f}%)"


def estimate_verdict(check: EstimateCheck) -> str:
    """One sentence: did the dry run rank the settings as the recording does, and its worst error."""
    worst = check.worst()
    return (f"ranking of the settings: {'the same' if check.ranking_agrees else 'DIFFERENT'}; "
            f"largest error {100 * worst.error:+.1f}% ({worst.conf or '(torch defaults)'})")


def render_estimate_check(check: EstimateCheck) -> str:
    """The dry run's estimate beside the recorded run, per setting, and whether the ranking held."""
    rows = [["setting", "dry run (estimate)", "recorded (replayed)", "error"]]
    rows += [[r.conf or "(torch defaults)", format_bytes(r.estimated), format_bytes(r.recorded),
              f"{100 * r.error:+.1f}%"] for r in check.rows]
    lines = ["How far the dry run's estimate was from this recording (peak reserved):",
             *aligned_table(rows, indent="  "), f"  {estimate_verdict(check)}"]
    return "\n".join(lines) + "\n"
