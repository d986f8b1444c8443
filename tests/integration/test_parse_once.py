"""A configuration string is parsed once per user action, however many views look at it.

Every view of one action (the magic's report, the plan, the runtime state, an open panel)
reads the staged configuration and the environment; past the edges, functions pass
``AllocConf`` objects, and the environment's text is parsed once while it is unchanged.
"""

from __future__ import annotations

import pytest

pytest.importorskip("IPython")

import allocconf_widget.core.config.conf as conf_module


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


@pytest.fixture
def ip(monkeypatch, tmp_path):
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    shell = start_ipython() or get_ipython()
    shell.run_line_magic("load_ext", "allocconf_widget")
    import torch  # noqa: F401  (so that set stages instead of applying at once)

    yield shell
    shell.run_line_magic("allocconf", "discard")
    shell.run_line_magic("unload_ext", "allocconf_widget")


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
