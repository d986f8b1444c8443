"""The panel, what-if tab and monitor as widget trees, without a front end.

These run in the main suite (ipywidgets 8) and again in CI under Colab's
versions (ipywidgets 7.7.1, IPython 7.34.0, plotly 5.24.1; the ``colab-compat``
phase of ``.ci/run``), so the code paths a Colab user hits are exercised with
the libraries Colab ships. Colab's front end itself cannot run here.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("ipywidgets")

from allocconf_widget.app.session import Session
from allocconf_widget.views.widgets.panel import Panel
from tests.torch_versions import OPT, OPT_NAME, READ_VAR


def test_panel_edit_validate_apply():
    panel = Panel(Session())
    row = panel._rows["max_split_size_mb"]
    row.enabled.value = True
    row.editor.children[1].value = "8"  # the exact-number box: torch needs at least 20
    assert "too small" in panel.status.value
    assert panel.apply_button.disabled
    assert READ_VAR not in os.environ
    row.editor.children[1].value = "1024"
    assert "max_split_size_mb:1024" in panel.status.value and not panel.apply_button.disabled
    panel._apply_clicked(None)
    assert os.environ[READ_VAR] == "max_split_size_mb:1024"
    assert "Applied" in panel.result.value
    panel.close()


def test_roundup_row_offers_only_the_forms_the_torch_release_takes():
    """torch 1.13 takes one number only: the row must not offer a list it would then reject."""
    from allocconf_widget.core.config import options as opt
    from allocconf_widget.core.versions import parse_version
    from allocconf_widget.views.widgets.controls import OptionRow

    old_spec = next(s for s in opt.options_for(parse_version("1.13")) if s.name == "roundup_power2_divisions")
    old = OptionRow(old_spec, None, lambda *_: None, version=parse_version("1.13"))
    form, _uniform, bands = old.editor.children
    assert list(form.options) == ["one value"] and bands.layout.display == "none"
    old.show("[256:1,>:8]")  # a list from the environment is still shown (and rejected by the check)
    assert form.value == "per band" and bands.value == "[256:1,>:8]" and bands.layout.display is None
    new_spec = next(s for s in opt.options_for(parse_version("2.0")) if s.name == "roundup_power2_divisions")
    new = OptionRow(new_spec, None, lambda *_: None, version=parse_version("2.0"))
    form, _uniform, bands = new.editor.children
    assert list(form.options) == ["one value", "per band"] and bands.layout.display != "none"
    for row in (old, new):
        row.box.close()


def test_panel_roundup_editor_both_forms():
    panel = Panel(Session())
    row = panel._rows["roundup_power2_divisions"]
    if panel.model.version.schema_key < (2, 0):
        assert list(row.editor.children[0].options) == ["one value"]
        panel.close()
        pytest.skip(f"torch {panel.model.version} has no per-band form (the panel does not offer it)")
    form, _uniform, bands = row.editor.children
    row.enabled.value = True
    assert "roundup_power2_divisions:4" in panel.status.value
    form.value = "per band"  # nothing typed yet: it starts from the one value, with no error
    assert bands.value == "[256:4,>:4]" and "✖" not in panel.status.value
    assert "roundup_power2_divisions:[256:4,&gt;:4]" in panel.status.value
    bands.value = "[256:1,512:2,>:8]"
    assert "roundup_power2_divisions:[256:1,512:2,&gt;:8]" in panel.status.value
    bands.value = "[512:1,256:2]"
    assert "must increase" in panel.status.value
    panel.close()


def test_snippet_button_shows_copyable_lines():
    panel = Panel(Session())
    row = panel._rows[OPT_NAME]
    row.enabled.value = True
    row.show(OPT.split(":")[1])
    panel._edited(OPT_NAME, row.value())
    panel._snippet_clicked(None)
    assert f"%env {READ_VAR}={OPT}" in panel.snippet_area.value
    assert f"export {READ_VAR}='{OPT}'" in panel.snippet_area.value
    panel.close()


def test_whatif_tab_on_the_bundled_recording():
    from allocconf_widget.views.widgets.whatif import WhatIfView

    view = WhatIfView(Session(), renderer="svg")
    try:
        result = view.run()
        # the best row the kernel's torch takes (1.13 is not offered expandable segments)
        best = ("expandable_segments:True" if OPT_NAME == "expandable_segments"
                else "roundup_power2_divisions:16")
        assert result.rows[0].conf == best
        caption, bars, _ = view.charts.children
        assert "<svg" in bars.value
        # the charts hold the best rows and the kernel's own; a caption says how many of all
        assert f"of the {len(result.rows)} settings" in caption.value
        assert len(view.rows.children) == len(result.rows)
        applied = view.apply("expandable_segments:True")
        if OPT_NAME == "expandable_segments":
            assert os.environ[READ_VAR] == "expandable_segments:True"
        else:  # torch 1.13 has no expandable segments: the row is refused, nothing written
            assert applied is None and READ_VAR not in os.environ
    finally:
        # the apply re-ranks the rows on a thread against the new settings: close() joins it
        # (left running, the teardown's thread-leak check failed the test once in CI)
        view.close()


def test_monitor_demo_replay_with_svg():
    import time

    from allocconf_widget.views.widgets.monitor import start_monitor, stop_monitor

    view = start_monitor(interval=0.05, renderer="svg", demo=True)
    try:
        deadline = time.monotonic() + 10
        while "reserved" not in view.text() and time.monotonic() < deadline:
            time.sleep(0.1)
        view.refresh(force=True)
        labels = [getattr(child, "value", "") for child in view.widget.children]
        assert any(label.startswith("<b>Recording:</b>") for label in labels)  # never passes as live
        assert "reserved" in view.text()
        assert "<svg" in view.chart.widget.value
    finally:
        stop_monitor()
