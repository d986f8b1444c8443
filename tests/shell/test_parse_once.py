"""A configuration string is parsed once per user action, however many views look at it.

Every view of one action (the magic's report, the plan, the runtime state, an open panel)
reads the staged configuration and the environment; past the edges, functions pass
``AllocConf`` objects, and the environment's text is parsed once while it is unchanged.
"""

from __future__ import annotations

import pytest

pytest.importorskip("IPython")

import allocconf_widget.core.config.conf as conf_module

# before the extension loads: HOME a per-test folder; torch imported, so `set` stages
pytestmark = pytest.mark.usefixtures("tmp_home", "torch_imported")


@pytest.fixture
def parses(monkeypatch):
    calls: list[str] = []
    real = conf_module._parse_text

    def counting(text, version, *rest):
        calls.append(text)
        return real(text, version, *rest)

    monkeypatch.setattr(conf_module, "_parse_text", counting)
    monkeypatch.setattr(conf_module, "_PARSED", {})
    return calls


def test_set_parses_the_users_input_once_and_the_environment_once(ip, parses):
    # three options every release takes (torch 1.13+)
    ip.run_line_magic("allocconf", "set max_split_size_mb=256 garbage_collection_threshold=0.6 "
                      "roundup_power2_divisions=4")
    staged = [t for t in parses if "max_split_size_mb" in t]
    assert len(staged) == 1, parses  # three options set, one parse of the result
    assert len(parses) <= 2, parses  # and at most one of the (unchanged) environment


def test_apply_and_a_panel_keystroke_parse_at_most_once(ip, parses):
    from allocconf_widget.app.panel_draft import PanelModel
    from allocconf_widget.app.session import get_session

    ip.run_line_magic("allocconf", "set max_split_size_mb=256")
    parses.clear()
    ip.run_line_magic("allocconf", "apply")
    assert len(parses) <= 1, parses
    model = PanelModel(get_session(ip))
    parses.clear()
    assert model.set_option("max_split_size_mb", "512") is None
    model.status()
    assert len(parses) <= 1, parses


def test_the_cache_never_hides_a_warning(ip, recwarn):
    from allocconf_widget._errors import AllocConfWarning
    from allocconf_widget.core.config.conf import parse_conf

    for _ in range(2):
        with pytest.warns(AllocConfWarning, match="given twice"):
            parse_conf("max_split_size_mb:256,max_split_size_mb:512")


@pytest.fixture
def parse_calls(monkeypatch):
    """Every call into the parser, the cache's answers included."""
    calls: list[str] = []
    real = conf_module._parse

    def counting(text, *args):
        calls.append(text)
        return real(text, *args)

    monkeypatch.setattr(conf_module, "_parse", counting)
    return calls


def test_a_slider_tick_with_the_whatif_tab_open_parses_once(ip, parse_calls):
    """One tick: the slider's value is parsed where it enters; the staged draft, its prediction
    on the recorded step, the What if? tab's line about the draft and every view of the session
    take that ``AllocConf`` (and the environment's, read once while it stays the same)."""
    from pathlib import Path

    from allocconf_widget.adapters.recorder import CellRecording
    from allocconf_widget.app.session import get_session
    from allocconf_widget.core.memory.snapshot import load_snapshot
    from allocconf_widget.views.widgets.panel import Panel

    session = get_session(ip)
    data = Path(__file__).resolve().parents[1] / "data" / "cnn__default.pickle.gz"
    session.set_recording(CellRecording(snapshot=dict(load_snapshot(data)), torch_version="2.11.0",
                                        device_total=150_109_880_320, free_at_start=149_557_477_376))
    panel = Panel(session)
    try:
        panel.tabs.selected_index = 2  # the What if? tab, open
        assert panel.whatif is not None and panel.whatif.run() is not None
        row = panel._rows["max_split_size_mb"]
        row.enabled.value = True
        before = panel.prediction.value
        parse_calls.clear()
        row.editor.children[0].value = 2 ** 8  # the slider, released at 256 MiB
        assert parse_calls == ["max_split_size_mb:256"], parse_calls
        assert panel.prediction.value != before and "max_split_size_mb:256" in panel.prediction.value
    finally:
        panel.close()
