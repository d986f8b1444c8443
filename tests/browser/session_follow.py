"""One scenario for every front end: after each action, the panel shows the Session's state.

The snippet box, the What-if rows ("(this kernel)") and the saved line are texts computed from
the Session; each must re-render when the Session changes, whoever changed it (the panel, a
What-if row, the magic in another cell). Used by the JupyterLab / Notebook 7 test
(``test_session_follow_browser.py``) and the classic Notebook 6 one (``test_classic_notebook.py``).
"""

from __future__ import annotations

import re
from typing import Any

from tests.browser.jupyter import click_button, find_widget, set_toggle, wait_for_text, wait_until

VAR = "PYTORCH_ALLOC_CONF"  # what torch 2.13 (CI's torch) reads
CELLS = ["%load_ext allocconf_widget", "import torch\n%allocconf"]


def _tab(panel: Any, title: str) -> None:
    panel.locator(".lm-TabBar-tab, .p-TabBar-tab").filter(has_text=title).first.click()


def _this_kernels_row(panel: Any) -> str:
    rows = panel.locator(".allocconf-whatif-row").filter(has_text="(this kernel)")
    return str(rows.first.inner_text()) if rows.count() else ""


def views_follow_the_session(nb: Any) -> None:
    """Open the panel, apply in it, compare, then change and forget through the magic in another
    execution; check what each view shows after each action."""
    nb.run_all(timeout=120)
    panel = nb.page.locator(".allocconf-panel")
    panel.wait_for(state="visible", timeout=30_000)

    def run_magic(line: str) -> None:
        reply = nb.execute(f"get_ipython().run_line_magic('allocconf', {line!r})")
        assert reply.error is None, reply

    row = find_widget(panel, "opt-expandable-segments")
    set_toggle(row, "allocconf-set", True)
    wait_for_text(panel, "allocconf-status", re.compile(r"expandable_segments:True"))
    click_button(panel, name="snippet")
    area = find_widget(panel, "snippet-text").locator("textarea").first
    wait_until(lambda: "expandable_segments:True" in area.input_value(), timeout=15,
               what="the snippet box to show the staged setting")
    click_button(panel, name="apply")
    wait_for_text(panel, "allocconf-result", re.compile(r"Saved for this project"), timeout=15)
    nb.wait_for_value(f"os.environ.get({VAR!r})", "expandable_segments:True", setup="import os")

    _tab(panel, "What if?")
    run = find_widget(panel, "whatif-run").first
    run.wait_for(state="visible", timeout=30_000)
    run.click()
    wait_until(lambda: "expandable_segments:True" in _this_kernels_row(panel), timeout=60,
               what="the What-if rows, this kernel's marked")

    # the magic, in another cell, puts torch's defaults back: every view follows
    run_magic("reset --apply")
    nb.wait_for_value(f"os.environ.get({VAR!r}) or ''", "", setup="import os")
    wait_until(lambda: "(torch defaults)" in _this_kernels_row(panel), timeout=60,
               what="the What-if rows re-ranked against torch's defaults")
    wait_until(lambda: "expandable_segments" not in area.input_value(), timeout=15,
               what="the snippet box to drop the setting the magic unset")
    _tab(panel, "Settings")
    wait_for_text(panel, "allocconf-result", re.compile(r"unset"), timeout=15)

    run_magic("forget")
    result = wait_for_text(panel, "allocconf-result", re.compile(r"Not saved any more"), timeout=15)
    assert "Saved for this project" not in result
