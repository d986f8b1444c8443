"""The OOM flight recorder's analysis as plain text (terminal IPython, logs, tests).

The notebook view (:mod:`allocconf_widget.views.widgets.flight`) shows the same
facts with a segment map drawn; here the map is summarised by its caption.
"""

from __future__ import annotations

from allocconf_widget.app.flight import FlightAnalysis


def analysis_lines(analysis: FlightAnalysis, *, segment_caption: str | None = None) -> list[str]:
    """Capture, top sites, segments, verdict: one list of lines."""
    lines = [analysis.capture_line()]
    for note in analysis.capture.notes:
        lines.append(f"note: {note}")
    lines += analysis.sites.lines()
    if segment_caption:
        lines.append(f"Segments at the OOM: {segment_caption}")
    if analysis.verdict is not None:
        lines += analysis.verdict.lines()
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
