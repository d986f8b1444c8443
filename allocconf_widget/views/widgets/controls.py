"""One ipywidgets control row per allocator option, generated from the schema.

Only core ipywidgets (7.6 … 8.x), so the panel renders in Colab without a
custom widget manager. Each row has a "set" checkbox: unchecked is the visible
*default (unset)* state, distinct from any value (an unset ``max_split_size_mb``
is "unlimited", which no slider position can express). An unticked row shows
torch's default in its editor ("unlimited" in the number box, ``False`` on a
switch, the slider at 1.0 for ``per_process_memory_fraction``), never a made-up
value. Size sliders move in powers of two and have no readout of their own: the
number box beside them is the one readout, so the two can never disagree (a
value beyond the slider's range just pins the handle to its end). Rows report
edits through one callback ``on_change(name, text_or_None)``; they never
validate or apply anything themselves (ticking stages the value the model picks,
see ``PanelModel.tick_value``).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from allocconf_widget.app.panel_draft import default_number
from allocconf_widget.core.config import options as opt
from allocconf_widget.core.versions import TorchVersion

OnChange = Callable[[str, "str | None"], None]
_POW2 = [str(1 << i) for i in range(8)]


def css_name(name: str) -> str:
    """CSS class used by tests and styling: ``allocconf-opt-<name>``."""
    return f"allocconf-opt-{name.replace('_', '-')}"


def _label(spec: opt.OptionSpec, width: str = "280px") -> Any:
    import ipywidgets as W

    tip = html.escape(f"{spec.summary} {spec.explanation} (torch {spec.releases_text()})", quote=True)
    return W.HTML(f"<span title=\"{tip}\" style='cursor:help'>{spec.name}</span>",
                  layout=W.Layout(width=width))


@dataclass(frozen=True)
class Editor:
    """One option's value widget and how to read it, write it and show torch's default in it."""

    widget: Any
    read: Callable[[], str]
    write: Callable[[str], None]
    show_default: Callable[[], None]


class OptionRow:
    """The widgets of one option: set-checkbox, name with tooltip, value editor, hint."""

    def __init__(self, spec: opt.OptionSpec, value: str | None, on_change: OnChange,
                 version: TorchVersion | None = None) -> None:
        import ipywidgets as W

        self.spec = spec
        self._on_change = on_change
        self._quiet = False
        self._error: str | None = None
        #: the value last reported (or shown): an editor made of two widgets (a slider and its
        #: number box) changes both for one move, and the move is one edit
        self._reported = value
        self.enabled = W.Checkbox(value=value is not None, indent=False,
                                  layout=W.Layout(width="28px"))
        self.enabled.add_class("allocconf-set")
        self.hint = W.HTML(layout=W.Layout(width="300px"))
        self.hint.add_class("allocconf-hint")
        self._editor = _editor_for(spec, version)
        self.editor = self._editor.widget
        self.editor.layout.width = "430px"  # one column for every editor, so hints line up
        if value is not None:
            self._editor.write(value)
        else:
            self._editor.show_default()
        self.enabled.observe(self._changed, names="value")
        for widget in _leaves(self.editor):
            widget.observe(self._changed, names="value")
        self.box = W.HBox([self.enabled, _label(spec), self.editor, self.hint])
        self.box.add_class(css_name(spec.name))
        self._sync_enabled()

    def value(self) -> str | None:
        """The row's text value, or None when unset."""
        return self._editor.read() if self.enabled.value else None

    def show(self, value: str | None) -> None:
        """Display ``value`` (None: torch's default) without reporting it back as an edit."""
        self._quiet = True
        self._reported = value
        try:
            self.enabled.value = value is not None
            if value is not None:
                self._editor.write(value)
            else:
                self._editor.show_default()
            self._sync_enabled()
        finally:
            self._quiet = False

    def mark_error(self, message: str | None) -> None:
        """Show the draft's error on this row (None: this row is fine)."""
        if message != self._error:
            self._error = message
            self._sync_enabled()

    def _sync_enabled(self) -> None:
        unset = not self.enabled.value
        for widget in _leaves(self.editor):
            widget.disabled = unset
        kind = self.spec.unit or self.spec.kind.value
        style = "font-size:90%;color:#666"
        if self._error is not None and not unset:
            self.hint.value = (f"<span style='font-size:90%;color:#b00020'>✖ "
                               f"{html.escape(self._error)}</span>")
            self.box.add_class("allocconf-row-error")
            return
        self.box.remove_class("allocconf-row-error")
        # a ticked row says what its option does, then its unit and torch's default: the unit
        # alone ("backend name", "True/False") told nothing the editor beside it did not show.
        # An unticked row stays one line (its name's tooltip says what it does).
        self.hint.value = (f"<span style='{style}'><i>default (unset): "
                           f"{html.escape(self.spec.default)}</i></span>" if unset
                           else f"<span style='{style}'>{html.escape(self.spec.summary)} <i>("
                           f"{html.escape(kind)}; torch's default: {html.escape(self.spec.default)})"
                           "</i></span>")

    def _changed(self, _change: Any) -> None:
        if self._quiet:
            return
        self._sync_enabled()
        value = self.value()
        if value == self._reported:
            return
        self._reported = value
        self._on_change(self.spec.name, value)


def _leaves(widget: Any) -> list[Any]:
    children = getattr(widget, "children", None)
    if children is None:
        return [widget]
    return [leaf for child in children for leaf in _leaves(child)]


def _editor_for(spec: opt.OptionSpec, version: TorchVersion | None = None) -> Editor:
    """The editor for the option's kind, as ``version`` of torch takes it."""
    if spec.kind is opt.Kind.ROUNDUP:
        return _roundup_editor(spec, version)
    if spec.kind is opt.Kind.FRACTION:
        return _fraction_editor(spec, version)
    builders = {
        opt.Kind.SIZE_MB: _size_editor,
        opt.Kind.BOOL: _bool_editor,
        opt.Kind.BACKEND: _backend_editor,
        opt.Kind.COUNT: _count_editor,
    }
    return builders.get(spec.kind, _text_editor)(spec)


def _size_editor(spec: opt.OptionSpec) -> Editor:
    """Log-scale slider in powers of two plus the exact number box (the one readout)."""
    import ipywidgets as W

    low, high = spec.slider or (1, 65536)
    # the scale starts at the power of two at or below the bound, so every power of two is a
    # slider position (and the few positions below the bound show torch's error inline)
    slider = W.FloatLogSlider(value=2 ** math.floor(math.log2(max(low, 1))), base=2,
                              min=math.floor(math.log2(max(low, 1))), max=math.floor(math.log2(high)),
                              step=1, readout=False, continuous_update=False,
                              layout=W.Layout(width="300px"))
    exact = W.Text(value=str(round(slider.value)), continuous_update=False,
                   layout=W.Layout(width="110px"))
    syncing = [False]

    def slider_to_box(change: Any) -> None:
        if not syncing[0]:
            syncing[0] = True
            exact.value = str(round(change["new"]))
            syncing[0] = False

    def box_to_slider(change: Any) -> None:
        text = str(change["new"]).strip()
        if not syncing[0] and text.isdigit() and int(text) > 0:
            syncing[0] = True
            slider.value = min(max(float(int(text)), 2 ** slider.min), 2 ** slider.max)
            syncing[0] = False

    slider.observe(slider_to_box, names="value")
    exact.observe(box_to_slider, names="value")
    slider.add_class("allocconf-slider")
    exact.add_class("allocconf-exact")

    def write(text: str) -> None:
        exact.value = text

    def show_default() -> None:
        number = default_number(spec)
        if number is not None:
            exact.value = number
            return
        syncing[0] = True
        slider.value = 2 ** slider.max  # "unlimited": the far end, and the box says so
        exact.value = spec.default.split(" ", 1)[0]
        syncing[0] = False

    return Editor(W.HBox([slider, exact]), lambda: str(exact.value).strip(), write, show_default)


def _bool_editor(spec: opt.OptionSpec) -> Editor:
    import ipywidgets as W

    toggle = W.ToggleButtons(options=["True", "False"], value=spec.default
                             if spec.default in ("True", "False") else "False",
                             style={"button_width": "70px"})

    def write(text: str) -> None:
        toggle.value = text

    def show_default() -> None:
        toggle.value = spec.default if spec.default in ("True", "False") else "False"

    return Editor(toggle, lambda: str(toggle.value), write, show_default)


_FRACTION_STEP = 0.01


def fraction_range(spec: opt.OptionSpec, version: TorchVersion | None = None) -> tuple[float, float]:
    """The slider's ends: the option's bound for ``version`` (the newest rule without one),
    one step inside an exclusive end, so that every position is a value torch accepts
    (``garbage_collection_threshold`` takes 0 < t < 1: 0.00 and 1.00 are both refused)."""
    bound = (spec.bound_in(version) if version is not None
             else spec.bounds[-1][1] if spec.bounds else None)
    low, high = 0.0, 1.0
    if bound is not None:
        if isinstance(bound.low, int | float):
            low = float(bound.low) + (0.0 if bound.low_inclusive else _FRACTION_STEP)
        if bound.high is not None:
            high = float(bound.high) - (0.0 if bound.high_inclusive else _FRACTION_STEP)
    return round(low, 4), round(high, 4)


def _fraction_editor(spec: opt.OptionSpec, version: TorchVersion | None = None) -> Editor:
    import ipywidgets as W

    low, high = fraction_range(spec, version)
    slider = W.FloatSlider(value=low, min=low, max=high, step=_FRACTION_STEP, readout_format=".2f",
                           continuous_update=False, layout=W.Layout(width="372px"))

    def write(text: str) -> None:
        slider.readout = True
        slider.value = float(text)

    def show_default() -> None:
        number = default_number(spec)
        if number is None:  # "off": no position means off, so the slider shows no number
            slider.readout = False
            slider.value = slider.min
        else:
            write(number)

    return Editor(slider, lambda: repr(round(float(slider.value), 4)), write, show_default)


def _dropdown_editor(options: list[str], default: str, width: str) -> Editor:
    import ipywidgets as W

    dropdown = W.Dropdown(options=options, value=default, layout=W.Layout(width=width))

    def write(text: str) -> None:
        if text not in dropdown.options:
            dropdown.options = [*dropdown.options, text]
        dropdown.value = text

    return Editor(dropdown, lambda: str(dropdown.value), write, lambda: write(default))


def _backend_editor(spec: opt.OptionSpec) -> Editor:
    return _dropdown_editor(["native", "cudaMallocAsync"], spec.default, "200px")


def _count_editor(spec: opt.OptionSpec) -> Editor:
    return _dropdown_editor(list(_POW2), default_number(spec) or "1", "120px")


def _roundup_editor(_spec: opt.OptionSpec, version: TorchVersion | None = None) -> Editor:
    """One division count for every size, or (torch 2.0+) a per-band list.

    torch 1.13 has only the single number, so the per-band form is not offered
    there: offering it would only lead to an error after the user filled it in.
    A list value that arrives anyway (from the environment) is still shown.
    """
    import ipywidgets as W

    forms = ["one value", "per band"]
    if version is not None and version.schema_key < (2, 0):
        forms = ["one value"]
    form = W.Dropdown(options=forms, value="one value", layout=W.Layout(width="110px"))
    uniform = W.Dropdown(options=_POW2[1:], value="4", layout=W.Layout(width="70px"))
    bands = W.Text(value="", placeholder="[256:1,512:2,>:8]",
                   continuous_update=False, layout=W.Layout(width="170px"))
    if len(forms) == 1:
        bands.layout.display = "none"

    def start_bands(change: dict[str, object]) -> None:
        # switched to "per band" with nothing typed: the empty value showed "no value given …"
        # before the user could type; start from the one value as bands (the same rounding)
        if change["new"] == "per band" and not str(bands.value).strip():
            one = str(uniform.value)
            bands.value = f"[256:{one},>:{one}]" if one != "off" else "[256:1,512:2,>:8]"

    form.observe(start_bands, names="value")  # before the row's own observer: no error flashes

    def read() -> str:
        return str(uniform.value) if form.value == "one value" else str(bands.value).strip()

    def write(text: str) -> None:
        if "off" in uniform.options:
            uniform.options = [o for o in uniform.options if o != "off"]
        if text.startswith("["):
            if "per band" not in form.options:
                form.options = [*form.options, "per band"]
                bands.layout.display = None
            form.value = "per band"
            bands.value = text
        else:
            form.value = "one value"
            if text not in uniform.options:
                uniform.options = [*uniform.options, text]
            uniform.value = text

    def show_default() -> None:  # torch's default: no rounding
        form.value = "one value"
        if "off" not in uniform.options:
            uniform.options = ["off", *uniform.options]
        uniform.value = "off"
        bands.value = ""

    return Editor(W.HBox([form, uniform, bands]), read, write, show_default)


def _text_editor(spec: opt.OptionSpec) -> Editor:
    import ipywidgets as W

    example = "0.5 or 40G" if spec.kind is opt.Kind.RESERVE else "[name:0.5]"
    text = W.Text(value="", placeholder=example, continuous_update=False,
                  layout=W.Layout(width="200px"))

    def write(value: str) -> None:
        text.value = value

    def show_default() -> None:
        text.value = ""
        text.placeholder = f"default: {spec.default}"

    return Editor(text, lambda: str(text.value).strip(), write, show_default)
