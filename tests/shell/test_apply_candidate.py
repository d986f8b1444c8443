"""One way to apply a replayed candidate, from every place that offers one, and none loses settings.

After the user applied ``max_split_size_mb:256`` with two pinned-host-memory options, applying
a replayed candidate from the What if? tab, the OOM card, ``%allocconf flight apply`` and
``%allocconf flight apply --demo`` must keep both pinned options (the replay does not model
them), say what it will change first, and ask before it unsets anything or acts on a
recording of another run. All four return the one ``ApplyOutcome`` the views render.
"""

from __future__ import annotations

import html
import os

import pytest

pytest.importorskip("IPython")
pytest.importorskip("ipywidgets")

from allocconf_widget.adapters.flight_history import flight_history
from allocconf_widget.app.candidates import plan_candidate
from allocconf_widget.app.flight import analyse, load_demo_oom
from allocconf_widget.app.oom import build_report
from allocconf_widget.app.session import ApplyOutcome, Session, get_session
from allocconf_widget.core.config.conf import parse_conf
from allocconf_widget.views.widgets.flight import FlightOomView
from allocconf_widget.views.widgets.whatif import WhatIfView
from tests.torch_versions import READ_VAR, has_torch

pytestmark = pytest.mark.skipif(not has_torch((2, 3)), reason="pinned host-memory options: torch 2.3+")

PINNED = "pinned_use_cuda_host_register:True,pinned_num_register_threads:4"
BEFORE = f"max_split_size_mb:256,{PINNED}"


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))  # saves go to a temporary folder
    monkeypatch.chdir(tmp_path)


def _applied_before(session: Session) -> None:
    session.apply(parse_conf(BEFORE, session.state().version, warn=False), save=None)
    assert os.environ[READ_VAR] == BEFORE


def _kept(session: Session) -> None:
    now = session.view().applied
    assert now.get("pinned_use_cuda_host_register") is True, now
    assert now.get("pinned_num_register_threads") == 4, now
    assert PINNED in os.environ[READ_VAR]


def test_a_whatif_row_keeps_the_pinned_options(clean_env):
    session = Session()
    _applied_before(session)
    view = WhatIfView(session)
    try:
        view.run()
        row = next(r for r in view._rows if r.conf == "expandable_segments:True")
        plan = view.ask(row)
        assert plan is not None and plan.needs_confirmation  # it unsets max_split_size_mb:256
        question = row.confirm.question.value
        assert "keeps pinned_use_cuda_host_register, pinned_num_register_threads" in question
        assert os.environ[READ_VAR] == BEFORE  # nothing before the yes
        outcome = view.apply("expandable_segments:True")
        assert isinstance(outcome, ApplyOutcome)
    finally:
        view.close()
    _kept(session)
    assert session.view().applied.get("expandable_segments") is True


def test_the_oom_cards_apply_asks_first_and_keeps_the_pinned_options(clean_env):
    session = Session()
    _applied_before(session)
    demo = load_demo_oom()
    view = FlightOomView(analyse(demo.capture, kernel=session.view().effective, label="Recording"),
                         session=session, report=build_report(demo.message, demo.settings))
    winner = view.analysis.verdict.winner
    assert winner is not None
    view.apply_button.click()  # the green button: a question, nothing applied
    assert os.environ[READ_VAR] == BEFORE
    question = html.unescape(view.confirm.question.value)
    assert "a recording of another run, not from this kernel's own run" in question
    assert "pinned_use_cuda_host_register" in question  # it says what it keeps
    view.confirm.yes.click()
    _kept(session)
    assert session.view().applied.get(winner.conf.partition(":")[0]) is not None
    assert view.applied is not None and "Applied" in view.result.value


def test_flight_apply_of_this_kernels_oom_keeps_the_pinned_options(clean_env, ip, capsys):
    session = get_session(ip)
    _applied_before(session)
    demo = load_demo_oom()
    flight_history().set_capture(demo.capture)  # as if this kernel had captured it
    try:
        result = ip.run_line_magic("allocconf", "-r flight apply")
        out = capsys.readouterr().out
        plan = plan_candidate(session.view().applied, demo.meta["winner"])
        if plan.needs_confirmation:  # it unsets something: nothing changed without --yes
            assert "--yes" in out and os.environ[READ_VAR] == BEFORE
            result = ip.run_line_magic("allocconf", "-r flight apply --yes")
        assert isinstance(result, ApplyOutcome)
    finally:
        flight_history().set_capture(None)
    _kept(session)


def test_flight_apply_of_the_demo_asks_then_keeps_the_pinned_options(clean_env, ip, capsys):
    session = get_session(ip)
    _applied_before(session)
    ip.run_line_magic("allocconf", "flight apply --demo")
    out = capsys.readouterr().out
    assert "a recording of another run" in out and "--yes" in out
    assert os.environ[READ_VAR] == BEFORE  # a recording of another run: asked, not applied
    result = ip.run_line_magic("allocconf", "-r flight apply --demo --yes")
    assert isinstance(result, ApplyOutcome)
    _kept(session)


def test_a_rows_apply_says_it_replaces_a_staged_draft_and_saves(clean_env):
    """A staged, unapplied draft was dropped without a word by a row's Apply, and the question
    did not say the setting is saved for every new kernel of the project."""
    session = Session()
    _applied_before(session)
    session.stage(parse_conf(f"garbage_collection_threshold:0.8,{PINNED}", session.state().version,
                             warn=False), eager=False)  # the panel's draft, before its Apply
    view = WhatIfView(session)
    try:
        view.run()
        row = next(r for r in view._rows if r.conf == "expandable_segments:True")
        plan = view.ask(row)
        assert plan is not None and plan.needs_confirmation
        question = html.unescape(row.confirm.question.value)
        assert "replaces your staged draft garbage_collection_threshold:0.8" in question
        assert "which is not applied" in question
        assert "saved for this project and re-applied in new kernels" in question
    finally:
        view.close()
