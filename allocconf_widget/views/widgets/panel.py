"""The ``%allocconf`` control panel: tabs for settings, the live monitor and the what-if simulator.

The Settings tab is generated from the schema of the *installed* torch
(:mod:`allocconf_widget.views.widgets.controls`). Around the controls: a status
banner (runtime state, environment problems), the resulting string with its
variable name, inline validation, what Apply will do per changed option, and
Apply / Restart (only when needed) / Copy-snippet buttons. All logic lives in
:class:`~allocconf_widget.app.panel_draft.PanelModel`; this module only
wires widgets to it, and every callback goes through the model's lock because
ipykernel 7 may run it on a subshell thread while a cell is busy.

The Monitor and What-if tabs are built the first time they are opened, so
showing the panel starts no sampler thread.
"""

from __future__ import annotations

import html
import json
import threading
import uuid
from typing import Any

from allocconf_widget._errors import AllocConfError
from allocconf_widget.app.draft_prediction import NOTHING_YET, DraftPrediction, predict_staged
from allocconf_widget.app.panel_draft import PanelModel
from allocconf_widget.app.session import Session
from allocconf_widget.views.text.forecast import draft_lines
from allocconf_widget.views.widgets.controls import OptionRow
from allocconf_widget.views.widgets.flight_toggle import FlightToggle

_TAB_TITLES = ("Settings", "Monitor", "What if?")


class Panel:
    """The widget tree and its callbacks. ``panel.widget`` is what gets displayed."""

    def __init__(self, session: Session) -> None:
        import ipywidgets as W

        self.model = PanelModel(session)
        self._lock = threading.RLock()
        self._rows = {spec.name: OptionRow(spec, self.model.draft.get(spec.name), self._edited,
                                          version=self.model.version)
                      for spec in self.model.specs}
        self.banner = W.HTML(self.model.banner_html())
        self.banner.add_class("allocconf-banner")
        self.status = W.HTML()
        self.status.add_class("allocconf-status")
        self.prediction = W.HTML()
        self.prediction.add_class("allocconf-prediction")
        self.apply_button = W.Button(description="Apply", button_style="primary", icon="check")
        self.apply_button.add_class("allocconf-apply")
        self.restart_button = W.Button(description="Restart kernel", button_style="warning",
                                       icon="refresh", layout=W.Layout(display="none"))
        self.restart_button.add_class("allocconf-restart")
        self.snippet_button = W.Button(description="Copy snippet", icon="clipboard")
        self.snippet_button.add_class("allocconf-snippet")
        self.snippet_area = W.Textarea(layout=W.Layout(width="100%", height="130px", display="none"))
        self.snippet_area.add_class("allocconf-snippet-text")
        self._copy_id = uuid.uuid4().hex[:12]
        self.snippet_note = W.HTML()
        self.snippet_note.add_class("allocconf-snippet-note")
        # Where the copy script runs: front ends that render JavaScript outputs (JupyterLab,
        # Notebook 7, Colab) execute it; elsewhere nothing happens and the text area remains.
        # Made on the first Copy click, not with the panel: classic Notebook 6's ipywidgets-7
        # manager cannot create an Output model, and one in the tree kept the whole panel
        # from rendering there (docs/verification.md).
        self._clipboard: Any = None
        self.result = W.HTML()
        self.result.add_class("allocconf-result")
        self.apply_button.on_click(self._apply_clicked)
        self.restart_button.on_click(self._restart_clicked)
        self.snippet_button.on_click(self._snippet_clicked)
        device_rows = [r.box for n, r in self._rows.items() if not n.startswith("pinned_")]
        pinned_rows = [r.box for n, r in self._rows.items() if n.startswith("pinned_")]
        groups = W.Accordion(children=[W.VBox(device_rows), W.VBox(pinned_rows)])
        groups.set_title(0, f"GPU memory allocator ({len(device_rows)} options)")
        groups.set_title(1, f"Pinned host memory ({len(pinned_rows)} options)")
        groups.selected_index = 0
        settings = W.VBox([
            self.banner,
            self.status,
            self.prediction,
            W.HBox([self.apply_button, self.restart_button, self.snippet_button]),
            self.snippet_note,
            self.snippet_area,
            self.result,
            FlightToggle().widget,
            groups,
        ])
        self._settings_box = settings
        self.tabs = W.Tab(children=[settings, W.VBox(), W.VBox()])
        for index, title in enumerate(_TAB_TITLES):
            self.tabs.set_title(index, title)
        self.tabs.observe(self._tab_changed, names="selected_index")
        self.widget = W.VBox([self.tabs])
        self.widget.add_class("allocconf-panel")
        self.whatif: Any = None  # the What if? tab's view, built when first opened
        self._shown_outcome = session.last_outcome  # an apply from before the panel is not news
        self._result_draft = ""  # the draft the result line (an apply's outcome) was about
        self._unsubscribe = session.subscribe(self._session_changed)
        self._refresh_status()

    # -- callbacks (any thread) --------------------------------------------------
    def _edited(self, name: str, value: str | None) -> None:
        with self._lock:
            # a valid edit is staged, and the session's notification re-renders the panel;
            # only an invalid one (nothing staged, nothing notified) needs its message shown here
            if self.model.set_option(name, value) is not None:
                self._refresh_status()

    def _refresh_status(self) -> None:
        status = self.model.status()
        if self.result.value and self.model.draft_text() != self._result_draft:
            # the draft moved on since: an "Applied." block under an unapplied draft read as
            # if the new draft were applied
            self.result.value = ""
        self.status.value = self.model.status_html(status)
        for name, row in self._rows.items():  # the error is shown on the row it is about
            row.mark_error(status.error if name == status.error_option else None)
        self.apply_button.disabled = not status.can_apply
        self.restart_button.layout.display = "" if self._restart_worthwhile(status) else "none"
        self._show_prediction(status.error is not None)

    def _show_prediction(self, invalid: bool) -> None:
        """The staged draft's predicted peak and OOM verdict on the user's recorded or dry-run
        step. Answered here, on the callback's own thread: the controls send a value only when
        released (``continuous_update=False``), which is the debounce, and a replay of the
        bundled recording's size takes tens of ms (benchmarks/bench_predict.py); an update from
        a background thread may never be drawn in Colab (docs/internals/notebook_facts.md)."""
        if invalid:  # the staged settings did not change: what they predict is still right
            return
        self.prediction.value = prediction_html(predict_staged(self.model.session))

    def _restart_worthwhile(self, status: Any) -> bool:
        last = self.model.session.last_outcome
        return status.restart_needed or bool(last and last.restart_needed)

    def _apply_clicked(self, _button: Any) -> None:
        with self._lock:
            try:
                # the session's notification renders the outcome, with the rows and banner
                self.model.apply()
            except AllocConfError as exc:
                self._say_result(f"<span style='color:#b00020'>✖ {html.escape(str(exc))}</span>")
                return
            except RuntimeError as exc:  # torch's own setter refused it
                self._say_result(f"<span style='color:#b00020'>✖ torch refused the settings: "
                                 f"{html.escape(str(exc).splitlines()[0])}</span>")
                return

    def _show_last_apply(self) -> None:
        """The session's last apply, whoever made it (this tab, the What if? tab, the OOM card,
        the magic), and what is saved now: a message about an earlier apply, or a "saved" line
        after ``%allocconf forget``, would contradict the rows above it."""
        session = self.model.session
        outcome = session.last_outcome
        if outcome is None or outcome is self._shown_outcome:
            return
        self._shown_outcome = outcome
        lines = []
        for line in outcome.lines():
            saved = (outcome.save is not None and line == outcome.save.message()
                     and not outcome.save.saved)
            lines.append(f"<span style='color:#b00020'>⚠ {html.escape(line)}</span>" if saved
                         else html.escape(line))
        self._say_result(f"<b>{html.escape(outcome.headline())}</b><br>" + "<br>".join(lines))

    def _restart_clicked(self, _button: Any) -> None:
        from allocconf_widget.app.restart import save_and_restart

        try:
            request = save_and_restart(self.model.session)
        except AllocConfError as exc:  # a restart now would lose the settings: nothing restarts
            self._say_result(f"<span style='color:#b00020'>✖ {html.escape(str(exc))}</span>")
            return
        self._say_result(html.escape(request.restart.message))

    def _say_result(self, text: str) -> None:
        """Show an apply's (or restart's) outcome under the controls, for the draft as it is."""
        self._result_draft = self.model.draft_text()
        self.result.value = text

    def _snippet_text(self) -> str:
        snips = self.model.snippets()
        return (f"# notebook cell, before `import torch`\n{snips['magic']}\n\n"
                f"# Python, before `import torch`\n{snips['python']}\n\n"
                f"# shell\n{snips['shell']}\n")

    def _snippet_clicked(self, _button: Any) -> None:
        text = self._snippet_text()
        self.snippet_area.value = text
        self.snippet_area.layout.display = ""
        self.snippet_note.value = (f"<span class='allocconf-copy-{self._copy_id}'>The lines are below; "
                                   "copy them from there if your browser did not let the panel "
                                   "put them on the clipboard.</span>")
        self._copy_to_clipboard(text)

    def _snippet_follows(self, text: str) -> None:
        """New lines in the box: the clipboard still holds the copied ones, and the note says
        so (it said "Copied to the clipboard" above lines that were never copied)."""
        if text == self.snippet_area.value:
            return
        self.snippet_area.value = text
        self.snippet_note.value = ("The settings changed since the copy: the lines below are the "
                                   "new ones, not on the clipboard; click Copy snippet to copy them.")

    def _copy_to_clipboard(self, text: str) -> None:
        """Ask the browser to copy ``text`` (the click is the user gesture it requires).

        The output bundle is written as is, not through the shell's display formatter:
        a shell whose formatter leaves JavaScript out would otherwise send nothing to run.
        """
        if self._clipboard is None:
            import ipywidgets as W

            self._clipboard = W.Output(layout=W.Layout(display="none"))
            children = list(self._settings_box.children)
            children.insert(children.index(self.snippet_area) + 1, self._clipboard)
            self._settings_box.children = tuple(children)
        self._clipboard.outputs = ({
            "output_type": "display_data",
            "data": {"application/javascript": copy_script(text, self._copy_id),
                     "text/plain": "(copying the snippet to the clipboard)"},
            "metadata": {},
        },)

    def _session_changed(self) -> None:
        """The magic (or another panel) changed the staged settings: show them."""
        with self._lock:
            self.model.reload()
            for name, row in self._rows.items():
                row.show(self.model.draft.get(name))
            self.banner.value = self.model.banner_html()
            self._refresh_status()
            self._show_last_apply()
            if self.snippet_area.layout.display != "none":  # the copied lines follow the settings
                self._snippet_follows(self._snippet_text())

    def _tab_changed(self, change: Any) -> None:
        index = change["new"]
        container = self.tabs.children[index]
        if index == 0 or container.children:
            return
        if index == 2:
            from allocconf_widget.views.widgets.whatif import WhatIfView

            self.whatif = WhatIfView(self.model.session)
            container.children = [self.whatif.widget]
            return
        container.children = [_lazy_tab(index)]

    def close(self) -> None:
        """Stop listening to the session and close the widgets."""
        self._unsubscribe()
        if self.whatif is not None:
            self.whatif.close()
        self.widget.close()


def _lazy_tab(index: int) -> Any:
    import ipywidgets as W

    try:
        if index == 1:
            from allocconf_widget.views.widgets.monitor import start_monitor

            return start_monitor().widget
        return W.HTML("<i>unknown tab</i>")
    except ImportError as exc:
        return W.HTML(f"<i>Not available: {html.escape(str(exc))}</i>")


def show_panel(session: Session) -> Panel | None:
    """Display the panel in a notebook, or print a text summary in a terminal."""
    from allocconf_widget.adapters.frontend import detect_frontend

    frontend = detect_frontend()
    if not frontend.shows_widgets:
        _print_text_panel(session, frontend.why_no_widgets or "No widgets here")
        return None
    from IPython.display import display

    panel = Panel(session)
    display(panel.widget)
    return panel


def prediction_html(prediction: DraftPrediction | None) -> str:
    """The draft's prediction: its verdict first (green fits, red out of memory), then the rest."""
    if prediction is None:
        # a word, not "ⓘ": fonts without the glyph showed an empty box
        return f"<span style='color:#666'><b>Prediction:</b> {html.escape(NOTHING_YET)}</span>"
    first, *rest = draft_lines(prediction)
    colour = {True: "#1b5e20", False: "#b00020", None: "#8a6d00"}[prediction.fits]
    parts = [f"<b style='color:{colour}'>{html.escape(first)}</b>"]
    parts += [html.escape(line) for line in rest]
    return "<br>".join(parts)


def _print_text_panel(session: Session, why: str) -> None:
    model = PanelModel(session)
    status = model.status()
    print(model.state.describe())
    for problem in model.state.env.problems:
        print(f"  problem: {problem}")
    # as the widget panel says it: a draft's line is what Apply would write, not what is in effect
    line = (f"{status.variable}={status.text!r}" if status.text
            else f"{status.variable} unset (torch's defaults)")
    print(f"{line} (after Apply)" if status.has_changes else line)
    prediction = predict_staged(session)
    for line in draft_lines(prediction) if prediction is not None else [NOTHING_YET]:
        print(line)
    width = max(len(s.name) for s in model.specs)
    for spec in model.specs:
        value = model.draft.get(spec.name)
        shown = value if value is not None else f"default (unset): {spec.default}"
        print(f"  {spec.name.ljust(width)}  {shown}")
    print(f"{why}: use %allocconf set k=v …, %allocconf apply, %allocconf show (see %allocconf?).")


def copy_script(text: str, copy_id: str) -> str:
    """JavaScript that puts ``text`` on the clipboard and says in the panel whether it could."""
    note = json.dumps(f".allocconf-copy-{copy_id}")
    return (f"(function() {{\n"
            f"  const note = document.querySelector({note});\n"
            f"  const say = (t) => {{ if (note) note.textContent = t; }};\n"
            f"  if (!navigator.clipboard) {{ say('This page cannot use the clipboard: copy the "
            f"lines below.'); return; }}\n"
            f"  navigator.clipboard.writeText({json.dumps(text)}).then(\n"
            f"    () => say('Copied to the clipboard (the lines are below too).'),\n"
            f"    (e) => say('The browser did not allow copying (' + e.name + '): copy the lines "
            f"below.'));\n"
            f"}})();")
