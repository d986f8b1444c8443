"""The panel's flight-recorder toggle: on/off, Python stacks, and the state in one line.

It calls the same use cases as ``%allocconf flight on|off`` and re-reads the
state after each click, so the magic and the toggle never disagree. Rendering
the toggle only *looks* (no CUDA initialisation).
"""

from __future__ import annotations

from html import escape
from typing import Any

from allocconf_widget.app import flight


class FlightToggle:
    """``toggle.widget`` is displayed; ``toggle.set(on, stacks=…)`` is what a click does."""

    def __init__(self) -> None:
        import ipywidgets as W

        state = flight.status()
        self.button = W.ToggleButton(value=state.on, description="OOM flight recorder",
                                     icon="plane", tooltip="keep allocation history so the next "
                                     "OOM can be explained (see docs/flight.md)",
                                     layout=W.Layout(width="auto"))
        self.button.add_class("allocconf-flight-toggle")
        self.stacks = W.Checkbox(value=state.settings.python_stacks, description="with Python stacks",
                                 indent=False, layout=W.Layout(width="auto"))
        self.stacks.add_class("allocconf-flight-stacks")
        self.line = W.HTML()
        self.line.add_class("allocconf-flight-line")
        self._syncing = False
        self.button.observe(self._clicked, names="value")
        self.stacks.observe(self._clicked, names="value")
        self.widget = W.HBox([self.button, self.stacks, self.line])
        self.widget.add_class("allocconf-flight-panel")
        self.refresh()

    def _clicked(self, _change: Any) -> None:
        if not self._syncing:
            self.set(bool(self.button.value))

    def set(self, on: bool, *, stacks: bool | None = None) -> Any:
        """Turn the recorder on (with the stacks choice) or off; show the outcome."""
        if stacks is not None and stacks != self.stacks.value:
            self._syncing = True
            try:
                self.stacks.value = stacks
            finally:
                self._syncing = False
        state = (flight.turn_on(python_stacks=bool(self.stacks.value)) if on else flight.turn_off())
        self.refresh()
        return state

    def refresh(self) -> None:
        state = flight.status()
        if self.button.value != state.on:
            self._syncing = True
            try:
                self.button.value = state.on
            finally:
                self._syncing = False
        self.button.button_style = "info" if state.on else ""
        bound = f" ({flight.memory_bound(state.settings)})" if state.on else ""
        # a sentence of its own, set apart: beside the checkbox, "Python stacks flight recorder
        # off" read as one phrase
        said = state.line + bound
        self.line.value = (f"<span style='font-size:12px;color:#555;border-left:1px solid #ccc;"
                           f"padding-left:8px'>{escape(said[:1].upper() + said[1:])}.</span>")
