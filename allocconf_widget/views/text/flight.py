"""The OOM flight recorder's analysis as plain text (terminal IPython, logs, tests).

The notebook view (:mod:`allocconf_widget.views.widgets.flight`) shows the same
facts with a segment map drawn; here the map is summarised by its caption.
"""

from __future__ import annotations

from allocconf_widget.app.flight import FlightAnalysis, Sureness, Verdict, VerdictOption
from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.text.forecast import limit_words, result_peak
from allocconf_widget.views.text.reasons import row_reason


def _of(verdict: Verdict) -> str:
    words = limit_words(verdict.limit)
    return f" of {words}" if words else ""


def headline(verdict: Verdict) -> str:
    """The verdict in one sentence: what to apply, that nothing needs applying, or why none helps."""
    if verdict.current is not None:
        return (f"the settings this kernel runs now ({verdict.current.shown_conf}) would have "
                f"avoided it: peak {result_peak(verdict.current.row.result)}{_of(verdict)}; "
                "nothing to apply")
    if verdict.winner is None:
        return (f"no setting avoids this: {format_bytes(verdict.allocated_at_oom)} is allocated, "
                "not cached")
    return option_line(verdict, verdict.winner)


def option_line(verdict: Verdict, option: VerdictOption) -> str:
    """One setting: its peak where it avoids the OOM, else why it does not."""
    if option.avoids_oom:
        return (f"under {option.shown_conf} the peak would have been "
                f"{result_peak(option.row.result)}{_of(verdict)}: no OOM")
    reason = row_reason(verdict.report, option.row) if verdict.report is not None else None
    return f"under {option.shown_conf}: still out of memory" + (f" ({reason})" if reason else "")


def sureness_text(verdict: Verdict) -> str:
    """How far to trust the verdict, with the self-check's numbers."""
    summary = verdict.fidelity.summary() if verdict.fidelity is not None else ""
    return {
        Sureness.SURE: f"sure: the replay of your settings reproduced the OOM and {summary}",
        Sureness.APPROXIMATE: f"approximate: the replay reproduced the OOM, but {summary}",
        Sureness.UNCHECKED: ("unchecked: the replay reproduced the OOM, but the window holds no "
                             "segment events to check the model against"),
        Sureness.NOT_SURE: ("not sure: the replay of your own settings did not run out of memory, "
                            "so the model misses something here (no setting is promised)"),
    }[verdict.sureness]


def verdict_lines(verdict: Verdict) -> list[str]:
    """The verdict as lines: headline, the other settings that avoid it (numbered from 1), how
    sure, notes."""
    out = [f"Verdict: {headline(verdict)}"]
    if verdict.also:
        out.append("Also avoids it, by peak:")
        out += [f"  {i}. {option_line(verdict, o)}" for i, o in enumerate(verdict.also, 1)]
    out.append(f"How sure: {sureness_text(verdict)}")
    out += [f"note: {n}" for n in verdict.notes]
    return out


def analysis_lines(analysis: FlightAnalysis, *, segment_caption: str | None = None) -> list[str]:
    """Capture, top sites, segments, verdict: one list of lines."""
    lines = [analysis.capture_line()]
    for note in analysis.capture.notes:
        lines.append(f"note: {note}")
    lines += analysis.sites.lines()
    if segment_caption:
        lines.append(f"Segments at the OOM: {segment_caption}")
    if analysis.verdict is not None:
        lines += verdict_lines(analysis.verdict)
        if analysis.verdict.winner is not None:
            conf = analysis.verdict.winner.conf
            key, _, value = conf.partition(":")
            how = (f"%allocconf set {key}={value}" if "," not in conf
                   else f'%allocconf set "{conf}"') + " then %allocconf apply"
            if not analysis.label:  # this kernel's own OOM: the short way applies the winner
                how = f"%allocconf flight apply (or {how})"
            lines.append(f"To apply it: {how}")
    elif analysis.verdict_error:
        lines.append(analysis.verdict_error)
    lines.append("PyTorch's viewer: %allocconf flight export (writes the snapshot pickle and "
                 "torch's trace_plot page)")
    return lines
