"""The one confirmation of every view: what Apply will change, then "Apply these settings" / "Cancel".

Used by the What if? tab (under the row clicked) and the OOM card (under its Apply). The
question sits on a line of its own and the buttons below it, at their natural width: beside the
question in one row, the question took the room and the buttons were cut ("Apply these setti…",
"Ca…"); stretched by the box they sat in, they ran the width of the output area.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

YES = "Apply these settings"
NO = "Cancel"


def natural_width(button: Any) -> None:
    """Keep a button at the width of its text: never shrunk by its neighbours, never stretched."""
    button.layout.width = "auto"
    button.layout.flex = "0 0 auto"
    button.layout.min_width = "max-content"
    button.layout.align_self = "flex-start"


class Confirmation:
    """``confirm.widget`` is displayed (hidden until :meth:`ask`); ``on_yes`` runs on the yes.

    The widgets get the classes ``allocconf-<name>-question``, ``-confirm`` (the yes) and
    ``-cancel``, so each view's tests find them by its own name.
    """

    def __init__(self, name: str, on_yes: Callable[[], Any], *, margin: str = "0") -> None:
        import ipywidgets as W

        self.question = W.HTML()
        self.question.add_class(f"allocconf-{name}-question")
        self.yes = W.Button(description=YES, button_style="warning")
        self.yes.add_class(f"allocconf-{name}-confirm")
        self.no = W.Button(description=NO)
        self.no.add_class(f"allocconf-{name}-cancel")
        for button in (self.yes, self.no):
            natural_width(button)
        self.yes.on_click(lambda _b: on_yes())
        self.no.on_click(lambda _b: self.hide())
        self.widget = W.VBox([self.question, W.HBox([self.yes, self.no])],
                             layout=W.Layout(display="none", margin=margin))
        self.widget.add_class(f"allocconf-{name}-confirmation")

    def ask(self, question_html: str, *, can_apply: bool) -> None:
        """Show the question; the yes only when there is something to apply."""
        self.question.value = question_html
        self.yes.layout.display = "" if can_apply else "none"
        self.widget.layout.display = ""

    def hide(self) -> None:
        self.widget.layout.display = "none"
