"""The OOM report as plain text (terminal IPython, ``%allocconf flight`` in a terminal, logs).

The card (:mod:`allocconf_widget.views.widgets.oom`) shows the same facts; both take the one
:class:`~allocconf_widget.app.oom.OomRecommendation`, so the rules of thumb never contradict
the replay's verdict beside them.
"""

from __future__ import annotations

from allocconf_widget.app.oom import OomRecommendation, OomReport
from allocconf_widget.core.memory.oom import Advice
from allocconf_widget.core.units import format_bytes

#: What the user does for advice that changes no allocator setting: never "no setting to
#: change" next to a replay verdict that found one, unless no setting helps.
_NO_SETTING_LABELS = {
    "fraction_limit": "raise the memory fraction",
    "no_allocator_fix": "no allocator setting helps",
    "expandable_already_on": "already on",
    "upgrade_for_expandable": "upgrade torch",
    "non_pytorch_memory": "memory outside PyTorch",
    "other_processes": "other processes",
    "memory_outside_pytorch": "memory outside PyTorch",
}


def advice_action(item: Advice, recommendation: OomRecommendation | None = None) -> str:
    """What a rule of thumb asks the user to do, as the magic would type it.

    A rule that the replay's verdict agrees with points to the verdict's own Apply, the one
    way to apply a candidate: typing ``set`` then ``apply`` would keep the other options in
    force, a combination the replay never tried.
    """
    replayed = recommendation is not None and recommendation.by_replay and recommendation.conf
    if item.conf_change and replayed and item.conf_change in str(replayed).split(","):
        return (f"set {item.conf_change}, as the verdict does: apply its winner ({replayed}) with "
                "its Apply or %allocconf flight apply, which sets exactly what was replayed")
    if item.conf_change:
        key, _, value = item.conf_change.partition(":")
        return f"set {item.conf_change} (%allocconf set {key}={value}, then %allocconf apply)"
    if item.unset:
        names = " ".join(item.unset)
        return f"remove {', '.join(item.unset)} (%allocconf unset {names}, then %allocconf apply)"
    return _NO_SETTING_LABELS.get(item.rule, "outside the allocator settings")


def advice_heading(recommendation: OomRecommendation | None) -> str:
    """"What to do", or, beside a replay verdict that disagrees, what the rules are."""
    note = recommendation.yields_note if recommendation is not None else None
    return f"Rules of thumb ({note})" if note else "What to do"


def report_text(report: OomReport, recommendation: OomRecommendation | None = None) -> str:
    """The report as plain text."""
    lines = [report.headline]
    b = report.breakdown
    if b is not None:
        lines.append(f"GPU memory ({format_bytes(b.total)}"
                     + (f", {format_bytes(b.allowed)} allowed to PyTorch" if b.allowed else "") + "):")
        lines += [f"  {label:<42} {format_bytes(size):>12}" for label, size in b.parts()]
    if report.observed is not None:
        o = report.observed
        lines.append(f"torch's OOM observer: GPU {o.device} could not get {format_bytes(o.alloc)}; "
                     f"{format_bytes(o.device_free)} free; limit {format_bytes(o.device_total_or_allowed)}")
    lines.append(f"settings in effect: {report.settings_text}")
    if report.advice:
        lines.append(f"{advice_heading(recommendation).lower()}:")
        for item in report.advice:
            lines.append(f"  - {advice_action(item, recommendation)}: {item.reason}")
    elif report.info is None:
        lines.append("the message did not contain torch's usual numbers; see the traceback above")
    return "\n".join(lines)
