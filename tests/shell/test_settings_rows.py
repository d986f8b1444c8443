"""The Settings tab's rows as a widget tree (no front end): what each row shows and stages.

Unticked rows show torch's default; ticking stages a value valid with the rest of the
draft; size sliders sit on powers of two and the number box is their one readout; a
size larger than the GPU is warned about (no GPU here: no warning); an error names
the row it is about; Copy snippet sends the copy script and keeps the text area.
Only the rows of the installed torch are shown; the tests ask it which those are.
"""

from __future__ import annotations

import html
import os

import pytest

from allocconf_widget.core.config.conf import parse_conf

pytest.importorskip("ipywidgets")

from allocconf_widget.app.session import Session
from allocconf_widget.views.widgets.panel import Panel
from tests.torch_versions import OPT, OPT_NAME, READ_VAR, TORCH, TORCH_TEXT, has_torch, needs_torch

# The size rows (a power-of-two slider and a number box) and the releases that have them
# (docs/internals/allocator_facts.md); roundup_bypass_threshold_mb existed in 1.13 only.
SIZE_ROWS = {
    "max_split_size_mb": True,
    "roundup_bypass_threshold_mb": TORCH is not None and TORCH < (2, 0),
    "max_non_split_rounding_mb": has_torch((2, 6)),
    "large_segment_size_mb": has_torch((2, 11)),
    "pinned_reserve_segment_size_mb": has_torch((2, 10)),
}


@pytest.fixture
def panel():
    p = Panel(Session())
    yield p
    p.close()


def _stage(panel, text: str) -> None:
    """What the magic's ``set`` does in another cell: stage a configuration (not applied)."""
    panel.model.session.stage(parse_conf(text, panel.model.version, warn=False), eager=False)


def _slider(panel, name):
    return panel._rows[name].editor.children[0]


def _box(panel, name):
    return panel._rows[name].editor.children[1]


def test_unticked_rows_show_torchs_defaults(panel):
    rows = panel._rows
    assert _box(panel, "max_split_size_mb").value == "unlimited"
    assert _slider(panel, "max_split_size_mb").value == 2 ** _slider(panel, "max_split_size_mb").max
    gc = rows["garbage_collection_threshold"].editor
    assert gc.readout is False  # "off" is no slider position: no number shown
    assert rows["roundup_power2_divisions"].editor.children[1].value == "off"
    # the rows of options this torch lacks are not shown; those it has show torch's default
    size = lambda name: _box(panel, name).value  # noqa: E731
    plain = lambda name: rows[name].editor.value  # noqa: E731
    defaults = {  # option: (the release that has it, how its row shows a value, torch's default)
        "large_segment_size_mb": (has_torch((2, 11)), size, "20"),
        "max_non_split_rounding_mb": (has_torch((2, 6)), size, "20"),
        "expandable_segments": (has_torch((2, 1)), plain, "False"),
        "per_process_memory_fraction": (has_torch((2, 10)), plain, 1.0),
        "pinned_num_register_threads": (has_torch((2, 2)), plain, "1"),
        "roundup_bypass_threshold_mb": (not has_torch((2, 0)), size, "unlimited"),
    }
    for name, (has, shown, default) in defaults.items():
        assert (name in rows) == has, f"{name} shown: {name in rows}; torch {TORCH_TEXT} has it: {has}"
        if has:
            assert shown(name) == default, name
    for row in rows.values():
        assert "default (unset)" in row.hint.value
        assert row.editor.layout.width == "430px"
        row.enabled.value = True  # ticked: what the option does, its unit and torch's default
        hint = html.unescape(row.hint.value)
        assert row.spec.summary in hint and f"torch's default: {row.spec.default})" in hint, hint


@needs_torch((2, 11), "large_segment_size_mb")
def test_ticking_large_segment_keeps_an_existing_max_split_valid(panel):
    _stage(panel, "max_split_size_mb:128")
    row = panel._rows["large_segment_size_mb"]
    row.enabled.value = True
    assert "large_segment_size_mb:20" in panel.status.value and "max_split_size_mb:128" in panel.status.value
    assert "✖" not in panel.status.value and not panel.apply_button.disabled
    assert _box(panel, "large_segment_size_mb").value == "20"


def test_ticking_picks_a_valid_value_for_the_draft(panel):
    if has_torch((2, 11)):
        _stage(panel, "large_segment_size_mb:1024")
        panel._rows["max_split_size_mb"].enabled.value = True  # 512 would be below 1024
        assert "max_split_size_mb:1024" in panel.status.value and "✖" not in panel.status.value
    else:  # nothing bounds it from below but torch's own minimum
        panel._rows["max_split_size_mb"].enabled.value = True
        assert "max_split_size_mb:512" in panel.status.value and "✖" not in panel.status.value
    if has_torch((2, 1)):
        panel._rows["expandable_segments"].enabled.value = True  # a switch ticks to its non-default
        assert "expandable_segments:True" in panel.status.value
    panel._rows["garbage_collection_threshold"].enabled.value = True
    assert "garbage_collection_threshold:0.8" in panel.status.value
    assert panel._rows["garbage_collection_threshold"].editor.readout is True
    panel._rows["roundup_power2_divisions"].enabled.value = True
    assert "roundup_power2_divisions:4" in panel.status.value


def test_size_sliders_move_in_powers_of_two_and_the_box_is_the_one_readout(panel):
    assert {n for n in SIZE_ROWS if n in panel._rows} == {n for n, has in SIZE_ROWS.items() if has}
    for name in (n for n, has in SIZE_ROWS.items() if has):
        slider = _slider(panel, name)
        assert slider.base == 2 and slider.step == 1 and float(slider.min).is_integer()
        assert float(slider.max).is_integer() and slider.readout is False
    row = panel._rows["max_split_size_mb"]
    row.enabled.value = True
    _slider(panel, "max_split_size_mb").value = 2 ** 13
    assert _box(panel, "max_split_size_mb").value == "8192"
    assert "max_split_size_mb:8192" in panel.status.value


def test_out_of_range_sizes(panel):
    row = panel._rows["max_split_size_mb"]
    row.enabled.value = True
    _box(panel, "max_split_size_mb").value = "99999999999"
    slider = _slider(panel, "max_split_size_mb")
    assert slider.value == 2 ** slider.max  # pinned to its end, with no number of its own
    assert _box(panel, "max_split_size_mb").value == "99999999999"
    # no GPU on this machine: nothing to compare with, so no warning
    assert panel.model.device_total is None
    assert "more than this GPU" not in panel.status.value
    assert "max_split_size_mb:99999999999" in panel.status.value
    if not has_torch((2, 10)):  # torch read it as a 32-bit number: the row says so
        assert f"torch {TORCH_TEXT} cannot read numbers above 2147483647" in panel.status.value
        assert "✖" in panel._rows["max_split_size_mb"].hint.value


def test_a_size_larger_than_the_gpu_is_warned_about(panel):
    # NVML cannot run here: give the model the total an H200 reports (150,109,880,320 bytes)
    panel.model.device_total = 150_109_880_320
    panel._rows["max_split_size_mb"].enabled.value = True
    _box(panel, "max_split_size_mb").value = "262144"  # 256 GiB: a number every release reads
    assert "max_split_size_mb:262144 is 256.00 GiB" in panel.status.value
    assert "more than this GPU&#x27;s 139.80 GiB" in panel.status.value
    _box(panel, "max_split_size_mb").value = "65536"
    assert "more than this GPU" not in panel.status.value


def test_an_error_names_the_row_not_a_character_position(panel):
    row = panel._rows["max_split_size_mb"]
    row.enabled.value = True
    _box(panel, "max_split_size_mb").value = "8"
    assert "<b>max_split_size_mb</b>: " in panel.status.value
    assert "at character" not in panel.status.value
    assert "✖" in row.hint.value and "too small" in row.hint.value
    assert "allocconf-row-error" in row.box._dom_classes
    assert panel.apply_button.disabled
    _box(panel, "max_split_size_mb").value = "1024"
    assert "✖" not in row.hint.value and "allocconf-row-error" not in row.box._dom_classes


def test_copy_snippet_sends_the_copy_script_and_keeps_the_text_area(panel):
    panel._rows[OPT_NAME].enabled.value = True  # ticks to OPT's value
    panel._snippet_clicked(None)
    outputs = panel._clipboard.outputs
    assert len(outputs) == 1
    script = outputs[0]["data"]["application/javascript"]
    assert "navigator.clipboard.writeText(" in script
    assert f"export {READ_VAR}='{OPT}'" in script
    assert f"%env {READ_VAR}={OPT}" in panel.snippet_area.value
    assert panel.snippet_area.layout.display == ""
    panel._snippet_clicked(None)
    assert len(panel._clipboard.outputs) == 1  # one script per click, not a growing pile
    assert os.environ.get(READ_VAR) is None  # copying applies nothing
