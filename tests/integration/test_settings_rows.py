"""The Settings tab's rows as a widget tree (no front end): what each row shows and stages.

Unticked rows show torch's default; ticking stages a value valid with the rest of the
draft; size sliders sit on powers of two and the number box is their one readout; a
size larger than the GPU is warned about (no GPU here: no warning); an error names
the row it is about; Copy snippet sends the copy script and keeps the text area.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("ipywidgets")

from allocconf_widget.app.session import Session
from allocconf_widget.views.widgets.panel import Panel

VAR = "PYTORCH_ALLOC_CONF"


@pytest.fixture
def panel():
    p = Panel(Session())
    yield p
    p.close()


def _slider(panel, name):
    return panel._rows[name].editor.children[0]


def _box(panel, name):
    return panel._rows[name].editor.children[1]


def test_unticked_rows_show_torchs_defaults(panel):
    rows = panel._rows
    assert _box(panel, "max_split_size_mb").value == "unlimited"
    assert _slider(panel, "max_split_size_mb").value == 2 ** _slider(panel, "max_split_size_mb").max
    assert _box(panel, "large_segment_size_mb").value == "20"
    assert _box(panel, "max_non_split_rounding_mb").value == "20"
    assert rows["expandable_segments"].editor.value == "False"
    gc = rows["garbage_collection_threshold"].editor
    assert gc.readout is False  # "off" is no slider position: no number shown
    assert rows["per_process_memory_fraction"].editor.value == 1.0
    assert rows["roundup_power2_divisions"].editor.children[1].value == "off"
    assert rows["pinned_num_register_threads"].editor.value == "1"
    for row in rows.values():
        assert "default (unset)" in row.hint.value
        assert row.editor.layout.width == "430px"


def test_ticking_large_segment_keeps_an_existing_max_split_valid(panel):
    panel.model.session.stage_text("max_split_size_mb:128", eager=False)
    row = panel._rows["large_segment_size_mb"]
    row.enabled.value = True
    assert "large_segment_size_mb:20" in panel.status.value and "max_split_size_mb:128" in panel.status.value
    assert "✖" not in panel.status.value and not panel.apply_button.disabled
    assert _box(panel, "large_segment_size_mb").value == "20"


def test_ticking_picks_a_valid_value_for_the_draft(panel):
    panel.model.session.stage_text("large_segment_size_mb:1024", eager=False)
    panel._rows["max_split_size_mb"].enabled.value = True  # 512 would be below 1024
    assert "max_split_size_mb:1024" in panel.status.value and "✖" not in panel.status.value
    panel._rows["expandable_segments"].enabled.value = True  # a switch ticks to its non-default
    assert "expandable_segments:True" in panel.status.value
    panel._rows["garbage_collection_threshold"].enabled.value = True
    assert "garbage_collection_threshold:0.8" in panel.status.value
    assert panel._rows["garbage_collection_threshold"].editor.readout is True
    panel._rows["roundup_power2_divisions"].enabled.value = True
    assert "roundup_power2_divisions:4" in panel.status.value


def test_size_sliders_move_in_powers_of_two_and_the_box_is_the_one_readout(panel):
    for name in ("max_split_size_mb", "max_non_split_rounding_mb", "large_segment_size_mb",
                 "pinned_reserve_segment_size_mb"):
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


def test_a_size_larger_than_the_gpu_is_warned_about(panel):
    # NVML cannot run here: give the model the total an H200 reports (150,109,880,320 bytes)
    panel.model.device_total = 150_109_880_320
    panel._rows["max_split_size_mb"].enabled.value = True
    _box(panel, "max_split_size_mb").value = "99999999999"
    assert "max_split_size_mb:99999999999 is" in panel.status.value
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
    panel._rows["expandable_segments"].enabled.value = True
    panel._snippet_clicked(None)
    outputs = panel._clipboard.outputs
    assert len(outputs) == 1
    script = outputs[0]["data"]["application/javascript"]
    assert "navigator.clipboard.writeText(" in script
    assert "export PYTORCH_ALLOC_CONF='expandable_segments:True'" in script
    assert "%env PYTORCH_ALLOC_CONF=expandable_segments:True" in panel.snippet_area.value
    assert panel.snippet_area.layout.display == ""
    panel._snippet_clicked(None)
    assert len(panel._clipboard.outputs) == 1  # one script per click, not a growing pile
    assert os.environ.get(VAR) is None  # copying applies nothing
