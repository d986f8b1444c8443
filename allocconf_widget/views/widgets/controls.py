"""One ipywidgets control row per allocator option, generated from the schema.

Only core ipywidgets (7.6 … 8.x), so the panel renders in Colab without a
custom widget manager. Each row has a "set" checkbox: unchecked is the visible
*default (unset)* state, distinct from any value (an unset ``max_split_size_mb``
is "unlimited", which no slider position can express). Rows report edits
through one callback ``on_change(name, text_or_None)``; they never validate
or apply anything themselves.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

from allocconf_widget.core.config import options as opt

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


class OptionRow:
    """The widgets of one option: set-checkbox, name with tooltip, value editor, hint."""

    def __init__(self, spec: opt.OptionSpec, value: str | None, on_change: OnChange) -> None:
        import ipywidgets as W

        self.spec = spec
        self._on_change = on_change
        self._quiet = False
        self.enabled = W.Checkbox(value=value is not None, indent=False,
                                  layout=W.Layout(width="28px"))
        self.enabled.add_class("allocconf-set")
        self.hint = W.HTML(layout=W.Layout(width="300px"))
        self.editor, self._read, self._write = _editor_for(spec)
        self.editor.layout.width = "430px"  # one column for every editor, so hints line up
        if value is not None:
            self._write(value)
        self.enabled.observe(self._changed, names="value")
        for widget in _leaves(self.editor):
            widget.observe(self._changed, names="value")
        self.box = W.HBox([self.enabled, _label(spec), self.editor, self.hint])
        self.box.add_class(css_name(spec.name))
        self._sync_enabled()

    def value(self) -> str | None:
        """The row's text value, or None when unset."""
        return self._read() if self.enabled.value else None

    def show(self, value: str | None) -> None:
        """Display ``value`` without reporting it back as an edit."""
        self._quiet = True
        try:
            self.enabled.value = value is not None
            if value is not None:
                self._write(value)
            self._sync_enabled()
        finally:
            self._quiet = False

    def _sync_enabled(self) -> None:
        unset = not self.enabled.value
        for widget in _leaves(self.editor):
            widget.disabled = unset
        kind = self.spec.unit or self.spec.kind.value
        style = "font-size:90%;color:#666"
        self.hint.value = (f"<span style='{style}'><i>default (unset): "
                           f"{html.escape(self.spec.default)}</i></span>" if unset
                           else f"<span style='{style}'>{html.escape(kind)}</span>")

    def _changed(self, _change: Any) -> None:
        if self._quiet:
            return
        self._sync_enabled()
        self._on_change(self.spec.name, self.value())


def _leaves(widget: Any) -> list[Any]:
    children = getattr(widget, "children", None)
    if children is None:
        return [widget]
    return [leaf for child in children for leaf in _leaves(child)]


def _editor_for(spec: opt.OptionSpec) -> tuple[Any, Callable[[], str], Callable[[str], None]]:
    """(widget, read text, write text) for the option's kind."""
    builders = {
        opt.Kind.SIZE_MB: _size_editor,
        opt.Kind.BOOL: _bool_editor,
        opt.Kind.FRACTION: _fraction_editor,
        opt.Kind.BACKEND: _backend_editor,
        opt.Kind.ROUNDUP: _roundup_editor,
        opt.Kind.COUNT: _count_editor,
    }
    return builders.get(spec.kind, _text_editor)(spec)


def _size_editor(spec: opt.OptionSpec) -> tuple[Any, Callable[[], str], Callable[[str], None]]:
    """Log-scale slider (base 2) plus an exact number box, kept in step."""
    import ipywidgets as W

    low, high = spec.slider or (1, 65536)
    # start the scale at the power of two at or below the bound, so every power of two is a
    # slider position (and the few positions below the bound show torch's error inline)
    slider = W.FloatLogSlider(value=512 if low <= 512 <= high else low, base=2,
                              min=math.floor(math.log2(max(low, 1))), max=math.log2(high), step=0.25,
                              readout=True, readout_format=".0f", continuous_update=False,
                              layout=W.Layout(width="300px"))
    exact = W.IntText(value=round(slider.value), layout=W.Layout(width="110px"))
    syncing = [False]

    def slider_to_box(change: Any) -> None:
        if not syncing[0]:
            syncing[0] = True
            exact.value = round(change["new"])
            syncing[0] = False

    def box_to_slider(change: Any) -> None:
        if not syncing[0] and change["new"] > 0:
            syncing[0] = True
            slider.value = min(max(float(change["new"]), 2 ** slider.min), 2 ** slider.max)
            syncing[0] = False

    slider.observe(slider_to_box, names="value")
    exact.observe(box_to_slider, names="value")
    slider.add_class("allocconf-slider")
    exact.add_class("allocconf-exact")
    box = W.HBox([slider, exact])

    def write(text: str) -> None:
        exact.value = int(text)

    return box, lambda: str(exact.value), write


def _bool_editor(_spec: opt.OptionSpec) -> tuple[Any, Callable[[], str], Callable[[str], None]]:
    import ipywidgets as W

    toggle = W.ToggleButtons(options=["True", "False"], value="True",
                             style={"button_width": "70px"})

    def write(text: str) -> None:
        toggle.value = text

    return toggle, lambda: str(toggle.value), write


def _fraction_editor(spec: opt.OptionSpec) -> tuple[Any, Callable[[], str], Callable[[str], None]]:
    import ipywidgets as W

    start = 0.8 if spec.name == "garbage_collection_threshold" else 0.9
    slider = W.FloatSlider(value=start, min=0.0, max=1.0, step=0.01, readout_format=".2f",
                           continuous_update=False, layout=W.Layout(width="372px"))

    def write(text: str) -> None:
        slider.value = float(text)

    return slider, lambda: repr(round(float(slider.value), 4)), write


def _backend_editor(_spec: opt.OptionSpec) -> tuple[Any, Callable[[], str], Callable[[str], None]]:
    import ipywidgets as W

    dropdown = W.Dropdown(options=["native", "cudaMallocAsync"], value="native",
                          layout=W.Layout(width="200px"))

    def write(text: str) -> None:
        if text not in dropdown.options:
            dropdown.options = [*dropdown.options, text]
        dropdown.value = text

    return dropdown, lambda: str(dropdown.value), write


def _count_editor(_spec: opt.OptionSpec) -> tuple[Any, Callable[[], str], Callable[[str], None]]:
    import ipywidgets as W

    dropdown = W.Dropdown(options=list(_POW2), value="1", layout=W.Layout(width="120px"))

    def write(text: str) -> None:
        if text not in dropdown.options:
            dropdown.options = [*dropdown.options, text]
        dropdown.value = text

    return dropdown, lambda: str(dropdown.value), write


def _roundup_editor(_spec: opt.OptionSpec) -> tuple[Any, Callable[[], str], Callable[[str], None]]:
    """Both forms: one division count for every size, or a per-band list."""
    import ipywidgets as W

    form = W.Dropdown(options=["one value", "per band"], value="one value",
                      layout=W.Layout(width="110px"))
    uniform = W.Dropdown(options=_POW2[1:], value="4", layout=W.Layout(width="70px"))
    bands = W.Text(value="[256:1,512:2,>:8]", placeholder="[256:1,512:2,>:8]",
                   continuous_update=False, layout=W.Layout(width="170px"))

    def read() -> str:
        return str(uniform.value) if form.value == "one value" else str(bands.value).strip()

    def write(text: str) -> None:
        if text.startswith("["):
            form.value = "per band"
            bands.value = text
        else:
            form.value = "one value"
            if text not in uniform.options:
                uniform.options = [*uniform.options, text]
            uniform.value = text

    return W.HBox([form, uniform, bands]), read, write


def _text_editor(spec: opt.OptionSpec) -> tuple[Any, Callable[[], str], Callable[[str], None]]:
    import ipywidgets as W

    placeholder = "0.5 or 40G" if spec.kind is opt.Kind.RESERVE else "[name:0.5]"
    text = W.Text(value=placeholder, continuous_update=False, layout=W.Layout(width="200px"))

    def write(value: str) -> None:
        text.value = value

    return text, lambda: str(text.value).strip(), write
