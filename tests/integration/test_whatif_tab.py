"""The What if? tab as a widget tree (no front end): what it shows after each action.

"Current" is this kernel's effective configuration (the Session), not the recording's;
a row's Apply first says what it will set and unset and waits for a yes; the outcome
appears under the row that was clicked; the tab follows Applies made elsewhere.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("ipywidgets")

from allocconf_widget.app.session import Session
from allocconf_widget.views.widgets.whatif import WhatIfView

VAR = "PYTORCH_ALLOC_CONF"


def _applied(session: Session, text: str) -> None:
    session.stage_text(text, eager=False)
    session.apply(save=False)


def _row(view: WhatIfView, conf: str):
    row = next((r for r in view._rows if r.conf == conf), None)
    assert row is not None, f"no row {conf!r} in {[r.conf for r in view._rows]}"
    return row


def test_current_is_the_kernels_settings_and_the_defaults_row_can_be_applied():
    session = Session()
    _applied(session, "expandable_segments:True")
    view = WhatIfView(session)
    rec = view.run()
    assert "This kernel runs <code>expandable_segments:True</code>" in view.current.value
    assert rec.current.conf == "expandable_segments:True"
    current = _row(view, "expandable_segments:True")
    assert current.apply.disabled  # nothing to change
    defaults = _row(view, "")  # the recording's settings are torch's defaults
    assert not defaults.apply.disabled
    assert "(this kernel)" in current.box.children[0].children[1].value
    # every reason compares with what this kernel runs
    assert "vs 5.29 GiB now" in _row(view, "max_split_size_mb:128").box.children[0].children[1].value
    view.close()


def test_row_apply_says_what_changes_waits_for_a_yes_and_answers_under_the_row():
    session = Session()
    _applied(session, "expandable_segments:True,release_lock_on_cudamalloc:True")
    view = WhatIfView(session)
    view.run()
    row = _row(view, "max_split_size_mb:128")
    row.apply.click()
    # nothing happened yet: the row asks first, naming what will be set, unset and kept
    assert os.environ[VAR] == "expandable_segments:True,release_lock_on_cudamalloc:True"
    question = row.question.value
    assert "set max_split_size_mb:128" in question
    assert "unset expandable_segments:True" in question
    assert "keeps release_lock_on_cudamalloc" in question
    assert row.confirm in row.box.children and row.confirm.layout.display == ""
    row.yes.click()
    assert os.environ[VAR] == "max_split_size_mb:128,release_lock_on_cudamalloc:True"
    assert row.result.value.startswith("<b>Applied max_split_size_mb:128.</b>")
    assert row.confirm.layout.display == "none"
    others = [r.result for r in view._rows if r is not row]
    assert others == [None] * len(others)  # the outcome is next to the row clicked, nowhere else
    assert row.box.children[-1] is row.result  # right under it
    # the tab follows the Session: this row is now what the kernel runs
    assert row.apply.disabled
    assert not _row(view, "expandable_segments:True").apply.disabled
    assert "Compare again" in view.current.value
    view.close()


def test_cancel_changes_nothing():
    session = Session()
    view = WhatIfView(session)
    view.run()
    row = _row(view, "expandable_segments:True")
    row.apply.click()
    assert "set expandable_segments:True" in row.question.value
    row.confirm.children[2].click()  # Cancel
    assert row.confirm.layout.display == "none"
    assert os.environ.get(VAR) is None
    view.close()


def test_an_apply_elsewhere_moves_the_current_mark():
    session = Session()
    view = WhatIfView(session)
    view.run()
    assert _row(view, "").apply.disabled  # defaults: this kernel runs them
    _applied(session, "expandable_segments:True")  # e.g. the Settings tab or the magic
    assert _row(view, "expandable_segments:True").apply.disabled
    assert not _row(view, "").apply.disabled
    assert "This kernel runs <code>expandable_segments:True</code>" in view.current.value
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
