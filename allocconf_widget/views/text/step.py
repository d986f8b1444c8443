"""Which of the user's steps every prediction uses, said the same way in every view."""

from __future__ import annotations

from allocconf_widget.app.session import Step


def step_words(step: Step, label: str) -> str:
    """One sentence: the step predictions use (``label``: its name, ``app.sources.source_label``),
    why that one, and how to use the other."""
    if step.kind == "demo":
        return f"Predictions use {label}."
    if step.pinned:
        why = "chosen with %allocconf step"
    elif step.other is not None:
        why = "the newer of your recording and your dry run"
    else:
        why = "your only recorded or dry-run step"
    text = f"Predictions use {label} ({why})"
    if step.other_hint is not None:
        text += f"; {step.other_hint}"
    return text + "."
