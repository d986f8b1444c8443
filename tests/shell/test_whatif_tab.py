"""The What if? tab as a widget tree (no front end): what it shows after each action.

"Current" is this kernel's effective configuration (the Session), not the recording's;
a row's Apply first says what it will set and unset and waits for a yes; the outcome
appears under the row that was clicked; the tab follows Applies made elsewhere; a
row the kernel's torch cannot take is not offered, and a note says which were left out.
The rows used run on every release (1.13+); the tests ask the installed torch for the rest.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("ipywidgets")

from allocconf_widget.app.session import Session
from allocconf_widget.core.config.conf import parse_conf
from allocconf_widget.views.widgets.whatif import WhatIfView
from tests.torch_versions import READ_VAR, TORCH_TEXT, has_torch

VAR = READ_VAR
# an option the replay does not model, which a row's Apply keeps (torch 2.2+)
KEPT = ",release_lock_on_cudamalloc:True" if has_torch((2, 2)) else ""


def _applied(session: Session, text: str) -> None:
    session.apply(parse_conf(text, session.state().version, warn=False), save=None)


def _settled(view: WhatIfView) -> WhatIfView:
    """Wait for the re-ranking an Apply starts (the rows compare with the kernel's new settings)."""
    if view.rerank is not None:
        view.rerank.join(timeout=60)
        assert not view.rerank.is_alive()
    return view


def _label(row) -> str:
    return row.box.children[0].children[1].value


def _row(view: WhatIfView, conf: str):
    row = next((r for r in view._rows if r.conf == conf), None)
    assert row is not None, f"no row {conf!r} in {[r.conf for r in view._rows]}"
    return row


def test_current_is_the_kernels_settings_and_the_defaults_row_can_be_applied():
    session = Session()
    _applied(session, "max_split_size_mb:256")
    view = WhatIfView(session)
    rec = view.run()
    assert "This kernel runs <code>max_split_size_mb:256</code>" in view.current.value
    assert rec.current.conf == "max_split_size_mb:256"
    current = _row(view, "max_split_size_mb:256")
    assert current.apply.disabled  # nothing to change
    defaults = _row(view, "")  # the recording's settings are torch's defaults
    assert not defaults.apply.disabled
    assert "(this kernel)" in current.box.children[0].children[1].value
    # every reason compares with what this kernel runs
    assert "vs 22.10 GiB now" in _row(view, "max_split_size_mb:128").box.children[0].children[1].value
    view.close()


def test_row_apply_says_what_changes_waits_for_a_yes_and_answers_under_the_row():
    session = Session()
    _applied(session, f"roundup_power2_divisions:8{KEPT}")
    view = WhatIfView(session)
    view.run()
    row = _row(view, "max_split_size_mb:128")
    row.apply.click()
    # nothing happened yet: the row asks first, naming what will be set, unset and kept
    assert os.environ[VAR] == f"roundup_power2_divisions:8{KEPT}"
    question = row.confirm.question.value
    assert "set max_split_size_mb:128" in question
    assert "unset roundup_power2_divisions:8" in question
    assert ("keeps release_lock_on_cudamalloc" in question) == bool(KEPT)
    assert row.confirm.widget in row.box.children and row.confirm.widget.layout.display == ""
    row.confirm.yes.click()
    assert os.environ[VAR] == f"max_split_size_mb:128{KEPT}"
    assert row.confirm.widget.layout.display == "none"
    # the tab follows the Session: the rows are ranked again against what the kernel runs now
    row = _row(_settled(view), "max_split_size_mb:128")
    assert row.result.value.startswith("<b>Applied max_split_size_mb:128.</b>")
    # said in the past tense, now that it happened
    assert "Set max_split_size_mb:128 and unset roundup_power2_divisions:8" in row.result.value
    assert "Apply will" not in row.result.value
    others = [r.result for r in view._rows if r is not row]
    assert others == [None] * len(others)  # the outcome is next to the row clicked, nowhere else
    assert row.box.children[-1] is row.result  # right under it
    assert row.apply.disabled  # this row is now what the kernel runs …
    current = view.report.current  # … and the kernel's own string (with what Apply kept) is marked
    assert current.conf == f"max_split_size_mb:128{KEPT}"
    assert "(this kernel)" in _label(_row(view, current.conf))
    old = _row(view, "roundup_power2_divisions:8")
    assert not old.apply.disabled and "(this kernel)" not in _label(old)
    assert view.report is not None and view.report.compared_with == f"max_split_size_mb:128{KEPT}"
    now = view.report.current.result.peak_reserved_bytes  # every "now" is the new current's peak
    from allocconf_widget.core.units import format_bytes

    assert f"vs {format_bytes(now)} now" in _label(_row(view, ""))
    assert "ranking them again" not in view.current.value
    view.close()


def test_an_outcome_goes_once_the_kernel_runs_something_else():
    """It stayed under its row after another Apply (elsewhere) had replaced what it applied:
    "Applied expandable_segments:True" under a ranking against max_split_size_mb:128."""
    session = Session()
    view = WhatIfView(session)
    view.run()
    row = _row(view, "max_split_size_mb:512")  # a row every release (1.13+) is offered
    row.apply.click()
    if row.confirm is not None:  # asked first only when it unsets something
        row.confirm.yes.click()
    assert _row(_settled(view), "max_split_size_mb:512").result.value.startswith("<b>Applied")
    _applied(session, "max_split_size_mb:128")  # the Settings tab, the magic or the OOM card
    _settled(view)
    assert "This kernel runs <code>max_split_size_mb:128</code>" in view.current.value
    assert all(r.result is None for r in view._rows), [r.result.value for r in view._rows if r.result]
    view.close()


def test_cancel_changes_nothing():
    session = Session()
    view = WhatIfView(session)
    view.run()
    row = _row(view, "max_split_size_mb:256")
    row.apply.click()
    assert "set max_split_size_mb:256" in row.confirm.question.value
    question, buttons = row.confirm.widget.children  # the question above its buttons
    assert question is row.confirm.question
    cancel = next(b for b in buttons.children if b.description == "Cancel")
    assert cancel.layout.flex == "0 0 auto"  # never shrunk to "Can…" (issue 24, item 2)
    cancel.click()
    assert row.confirm.widget.layout.display == "none"
    assert os.environ.get(VAR) is None
    view.close()


def test_an_apply_elsewhere_moves_the_current_mark():
    session = Session()
    view = WhatIfView(session)
    view.run()
    assert _row(view, "").apply.disabled  # defaults: this kernel runs them
    _applied(session, "max_split_size_mb:256")  # e.g. the Settings tab or the magic
    _settled(view)
    assert _row(view, "max_split_size_mb:256").apply.disabled
    assert "(this kernel)" in _label(_row(view, "max_split_size_mb:256"))
    assert not _row(view, "").apply.disabled
    assert "This kernel runs <code>max_split_size_mb:256</code>" in view.current.value
    view.close()


def test_compare_button_and_progress():
    session = Session()
    view = WhatIfView(session)
    assert view.run_button.description == "Compare settings"
    assert view.run_button.layout.width == "auto"  # never cut to "Compare setti…"
    seen: list[tuple[int, int]] = []
    view.progress.observe(lambda ch: seen.append((ch["new"], view.progress.max)), names="value")
    view.run()
    assert seen and seen[-1][0] == seen[-1][1] == len(view._rows) + 1  # every replay + self-check
    assert view.progress.layout.display == "none"  # hidden once the answer is there
    view.close()


# grid rows that need a newer torch than 1.13, with the release that takes them
_NEWER_ROWS = {"expandable_segments:True": (2, 1),
               "max_split_size_mb:256,max_non_split_rounding_mb:512": (2, 6)}


def test_rows_the_kernels_torch_cannot_take_are_not_offered_and_a_note_says_which():
    session = Session()
    view = WhatIfView(session)
    view.run()
    offered = [r.conf for r in view._rows]
    note = next((line for line in view.summary.value.split("<br>") if line.startswith("not offered")), "")
    for conf, since in _NEWER_ROWS.items():
        if has_torch(since):
            assert conf in offered
            assert conf not in note
        else:  # no Apply the kernel would refuse: the row is gone and the note names it
            assert conf not in offered
            assert f"not offered, because torch {TORCH_TEXT} does not take them: " in note
            assert conf in note
    if not has_torch((2, 1)):
        assert not any("expandable_segments" in c for c in offered)
    assert offered and "max_split_size_mb:256" in offered  # the rows every release takes remain
    view.close()


def test_the_settings_tab_shows_an_apply_made_in_this_tab():
    """The Settings tab's message under Apply follows the session: after an Apply here, its
    earlier "Applied. max_split_size_mb …" would contradict the rows right above it."""
    from allocconf_widget.views.widgets.panel import Panel

    session = Session()
    panel = Panel(session)
    panel._rows["max_split_size_mb"].enabled.value = True
    panel._rows["max_split_size_mb"].editor.children[1].value = "512"
    panel._apply_clicked(None)
    first = panel.result.value
    assert "Applied." in first and "max_split_size_mb" in first
    assert "Saved for this project to" in first  # the panel saves, as the magic does: say so
    assert panel.apply_button.disabled  # "No changes to apply": nothing for Apply to do
    view = WhatIfView(session)
    view.run()
    row = _row(view, "")  # back to torch's defaults, from the What if? tab
    row.apply.click()
    row.confirm.yes.click()
    assert os.environ.get(VAR) in (None, "")
    shown = panel.result.value
    assert shown != first
    assert "max_split_size_mb: 512 → unset" in shown or "512 → unset" in shown, shown
    view.close()
    panel.close()


def test_the_settings_tabs_outcome_goes_once_the_draft_moves_on():
    """An "Applied." block stayed under the next, unapplied draft, as if that were applied."""
    from allocconf_widget.views.widgets.panel import Panel

    session = Session()
    panel = Panel(session)
    panel._rows["max_split_size_mb"].enabled.value = True
    panel._rows["max_split_size_mb"].editor.children[1].value = "512"
    panel._apply_clicked(None)
    assert "Applied." in panel.result.value
    assert "(after Apply)" not in panel.status.value  # the variable holds what it shows
    panel._rows["max_split_size_mb"].editor.children[1].value = "256"  # a new draft, not applied
    assert panel.result.value == ""
    assert not panel.apply_button.disabled  # and Apply offers it
    assert "max_split_size_mb:256</code> (after Apply)" in panel.status.value
    panel.close()


def test_the_staged_draft_is_a_row_of_its_own_and_a_newer_one_asks_for_compare():
    """The tab ranked only its grid: a draft staged in the Settings tab never appeared, so
    "what would my draft do?" had no answer on the bundled recording."""
    session = Session()
    session.stage(parse_conf("roundup_power2_divisions:2", session.state().version, warn=False),
                  eager=False)
    view = WhatIfView(session)
    try:
        report = view.run()
        assert report is not None
        drafted = [r for r in report.rows if r.label.endswith("[staged draft]")]
        assert [r.conf for r in drafted] == ["roundup_power2_divisions:2"]
        assert "(your staged draft)" in _label(_row(view, "roundup_power2_divisions:2"))
        assert "not among the rows" not in view.current.value
        session.stage(parse_conf("roundup_power2_divisions:32", session.state().version, warn=False),
                      eager=False)
        assert ("Your staged draft <code>roundup_power2_divisions:32</code> is not among the rows yet"
                in view.current.value)
    finally:
        view.close()


def test_a_draft_the_trace_cannot_replay_is_a_note_not_a_failure():
    from allocconf_widget.app.simulate import SimulationRequest, simulate
    from allocconf_widget.app.sources import trace_source

    report = simulate(trace_source(Session(), demo=True),
                      SimulationRequest(rank=True, workers=1, draft=parse_conf(
                          "throw_on_cudamalloc_oom:True", "2.13", warn=False)))
    assert report.rows and any("your staged draft throw_on_cudamalloc_oom:True is not ranked" in n
                               for n in report.all_notes())


@pytest.mark.skipif(not has_torch((2, 1)), reason="expandable segments need torch 2.1+")
def test_a_draft_that_replays_as_a_grid_row_marks_that_row():
    """expandable_segments:False replays as the defaults: it got no row and no word."""
    from allocconf_widget.app.simulate import SimulationRequest, simulate
    from allocconf_widget.app.sources import trace_source

    report = simulate(trace_source(Session(), demo=True),
                      SimulationRequest(rank=True, workers=1,
                                        draft=parse_conf("expandable_segments:False", warn=False),
                                        kernel=parse_conf("max_split_size_mb:256", warn=False)))
    drafted = [r for r in report.rows if r.is_draft]
    assert len(drafted) == 1 and drafted[0].result.peak_reserved_bytes == next(
        r for r in report.rows if r.conf == "").result.peak_reserved_bytes
