"""Scenes for "nothing a user must read is cut off" (issue 24), shared by JupyterLab and classic
Notebook 6 tests: each opens one view the way a user would, measures it with
:func:`tests.browser.jupyter.cut_off_labels`, saves a screenshot into the artifacts dir, and returns
what it found. The tests assert; the scenes only look.

Window: 1400 × 1000 px, the size the issue was reported at.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from tests.browser.jupyter import artifacts_dir, cut_off_labels, find_widget, safe_name, wait_until

WINDOW = {"width": 1400, "height": 1000}

#: The kernel runs max_split_size_mb:128, which the bundled recording ranks 10th of 10: the
#: What-if charts (top 6) used to leave out the very setting every row is compared with.
WHATIF_CELLS = ["%load_ext allocconf_widget\n%allocconf set max_split_size_mb=128\n"
                "%allocconf apply --no-save",
                "import torch\n%allocconf"]
FLIGHT_CELLS = ["%load_ext allocconf_widget", "%allocconf flight demo"]
SIMULATE_CELLS = ["%load_ext allocconf_widget", "%allocconf simulate --demo"]


@dataclass
class Seen:
    """What one scene found: cut labels, plus whatever the scene reads for its own asserts."""

    scene: str
    cut: list[str]
    texts: list[str] = field(default_factory=list)
    rows: list[str] = field(default_factory=list)
    legend: list[str] = field(default_factory=list)
    shot: str = ""

    def save(self, front_end: str) -> None:
        """Keep what was measured beside the screenshot (before/after evidence)."""
        path = artifacts_dir() / "cutoff" / f"{front_end}-{self.scene}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.__dict__, indent=1), encoding="utf-8")


def _shot(page: Any, locator: Any, name: str) -> str:
    path = artifacts_dir() / "cutoff" / f"{safe_name(name)}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    locator.first.scroll_into_view_if_needed()
    locator.first.screenshot(path=os.fspath(path))
    return os.fspath(path)


def whatif_scene(nb: Any, front_end: str) -> Seen:
    """Compare, then ask to apply the best row: charts, rows and the confirmation on screen."""
    page = nb.page
    panel = page.locator(".allocconf-panel")
    panel.wait_for(state="visible", timeout=60_000)
    panel.locator(".lm-TabBar-tab, .p-TabBar-tab").filter(has_text="What if?").first.click()
    find_widget(panel, "whatif-run").first.click(timeout=30_000)
    rows = panel.locator(".allocconf-whatif-row")
    wait_until(lambda: rows.count() > 5, timeout=120, what="What-if rows")
    wait_until(lambda: panel.locator(".allocconf-whatif-apply:not([disabled])").count() > 0,
               timeout=30, what="an enabled Apply")
    # the row whose question is longest (the longest setting): the one most likely to crowd
    # its buttons
    confs = [str(t) for t in rows.locator("code").evaluate_all("els => els.map(e => e.textContent)")]
    enabled = [i for i in range(rows.count())
               if not rows.nth(i).locator(".allocconf-whatif-apply").first.is_disabled()]
    target = rows.nth(max(enabled, key=lambda i: len(confs[i])))
    target.locator(".allocconf-whatif-apply").first.click()
    confirm = find_widget(target, "whatif-confirm").first
    confirm.wait_for(state="visible", timeout=30_000)
    style = [f"confirmation: {c}" for c in confirmation_problems(
        find_widget(target, "whatif-confirmation").first)]
    tab = panel.locator(".allocconf-whatif").first
    # and in a narrow output area (Colab beside another pane; a phone): the rows, the question
    # and its buttons must still be readable when the tab is 560 px wide
    tab.evaluate("t => { t.dataset.width = t.style.width; t.style.width = '560px'; }")
    cut_narrow = [f"in 560 px: {c}" for c in cut_off_labels(target)]
    _shot(page, target, f"{front_end}-whatif-row-560px")
    tab.evaluate("t => { t.style.width = t.dataset.width; }")
    texts = tab.locator("svg").first.locator("text").evaluate_all("els => els.map(e => e.textContent)")
    seen = Seen("whatif", [*cut_off_labels(tab), *cut_narrow, *style], [str(t) for t in texts])
    seen.rows = [str(t) for t in rows.locator("code").evaluate_all(
        "els => els.map(e => e.textContent)")]
    seen.legend = [str(t) for t in tab.locator("svg").nth(1).locator("text").evaluate_all(
        "els => els.map(e => e.textContent)")]
    seen.shot = _shot(page, tab, f"{front_end}-whatif")
    seen.save(front_end)
    return seen


_JS_CONFIRMATION = r"""
(box) => {
  // one style for every confirmation: the question on its own line, the buttons under it at
  // the width of their text (neither cut nor stretched across the view)
  const bad = [];
  const question = box.querySelector('[class*="-question"]');
  const buttons = [...box.querySelectorAll('button')].filter(b => b.offsetParent !== null);
  if (!buttons.length) bad.push('no confirmation buttons shown');
  const width = box.getBoundingClientRect().width;
  for (const b of buttons) {
    const r = b.getBoundingClientRect();
    if (question && question.getBoundingClientRect().bottom > r.top + 1)
      bad.push(`"${b.textContent.trim()}" beside its question, not under it`);
    if (r.width > Math.max(260, 0.5 * width))
      bad.push(`"${b.textContent.trim()}" ${Math.round(r.width)} px wide of ${Math.round(width)} px`);
  }
  return bad;
}
"""


def confirmation_problems(confirmation: Any) -> list[str]:
    """What breaks the one confirmation style in ``confirmation`` (a ``…-confirmation`` box),
    besides the cut labels :func:`cut_off_labels` finds."""
    return [*cut_off_labels(confirmation), *confirmation.evaluate(_JS_CONFIRMATION)]


def flight_scene(nb: Any, front_end: str) -> Seen:
    """The OOM card with its verdict filled in: its confirmation open, then after Apply (the
    outcome under the button). ``texts``: the Apply button's text, then the confirmation's
    buttons as shown."""
    page = nb.page
    view = page.locator(".allocconf-flight")
    view.wait_for(state="visible", timeout=60_000)
    apply = find_widget(view, "flight-apply").first
    apply.wait_for(state="visible", timeout=120_000)
    wait_until(lambda: re.search(r"Apply \S", apply.inner_text()), timeout=30,
               what="the Apply button's setting")
    apply.click()  # the card asks first (a recording of another run): confirm
    confirmation = find_widget(view, "flight-confirmation").first
    confirmation.wait_for(state="visible", timeout=30_000)
    cut_confirm = [f"confirmation: {c}" for c in confirmation_problems(confirmation)]
    buttons = [str(t).strip() for t in confirmation.locator("button").evaluate_all(
        "els => els.filter(b => b.offsetParent !== null).map(b => b.textContent)")]
    _shot(page, view, f"{front_end}-flight-confirm")
    find_widget(view, "flight-confirm").first.click()
    wait_until(lambda: "Applied" in find_widget(view, "flight-result").first.inner_text(), timeout=30,
               what="the Apply outcome")
    seen = Seen("flight", [*cut_confirm, *cut_off_labels(view)],
                [find_widget(view, "flight-apply").first.inner_text().strip(), *buttons])
    seen.shot = _shot(page, view, f"{front_end}-flight")
    seen.save(front_end)
    return seen


_JS_WRAPPED_TABLE_CELLS = r"""
(out) => {
  // a cell of numbers (or the OOM column) broken over lines, or a text table whose rows wrap
  const bad = [];
  for (const tr of out.querySelectorAll('table tr')) {
    [...tr.children].slice(1).forEach(c => {
      const r = document.createRange(); r.selectNodeContents(c);
      const tops = new Set([...r.getClientRects()].map(x => Math.round(x.top)));
      if (tops.size > 1) bad.push(`cell "${c.textContent.trim()}" on ${tops.size} lines`);
    });
  }
  for (const pre of out.querySelectorAll('pre')) {
    const style = getComputedStyle(pre);
    const line = parseFloat(style.lineHeight) || parseFloat(style.fontSize) * 1.3;
    const lines = pre.textContent.replace(/\n$/, '').split('\n').length;
    const shown = Math.round(pre.getBoundingClientRect().height / line);
    if (shown > lines) bad.push(`text of ${lines} lines shown on ${shown} lines (rows wrap)`);
    if (pre.scrollWidth > pre.clientWidth + 1)
      bad.push(`text ${pre.scrollWidth}px wide in ${pre.clientWidth}px`);
  }
  return bad;
}
"""


def simulate_scene(nb: Any, front_end: str, cell: int = 1) -> Seen:
    """``%allocconf simulate --demo``'s table in a 1400 px window."""
    out = nb.cell(cell).locator(".jp-OutputArea, .output_wrapper").first
    wait_until(lambda: "peak reserved" in out.inner_text(), timeout=120, what="the simulate table")
    # the progress line ("replaying: k of n settings done") was one display, the table took its place
    assert "replaying" not in out.inner_text(), out.inner_text()[:300]
    bad = out.evaluate(_JS_WRAPPED_TABLE_CELLS)
    html_table = out.locator("table").count() > 0
    seen = Seen("simulate", [*cut_off_labels(out), *bad], ["html table" if html_table else "text"])
    seen.shot = _shot(nb.page, out, f"{front_end}-simulate")
    seen.save(front_end)
    return seen


VIEWER_CELLS = ["%load_ext allocconf_widget\nimport torch", "%allocconf flight demo"]


@dataclass
class Links:
    """What the OOM card's "Open in PyTorch's viewer" gave: the links and what they led to."""

    hrefs: list[str]
    pickle_bytes: int
    pickle_size: int
    viewer_url: str
    viewer_status: int
    exports: list[str]


def viewer_links_scene(nb: Any) -> Links:
    """Click "Open in PyTorch's viewer"; fetch the pickle link; click the page link (new tab)."""
    page = nb.page
    view = page.locator(".allocconf-flight")
    view.wait_for(state="visible", timeout=60_000)
    find_widget(view, "flight-viewer").first.click()
    links = view.locator("a.allocconf-flight-link")
    wait_until(lambda: links.count() >= 2, timeout=60, what="the viewer and download links")
    hrefs = [str(h) for h in links.evaluate_all("els => els.map(a => a.href)")]
    pickle = next(h for h in hrefs if h.endswith(".pickle"))
    body = page.request.get(pickle).body()
    exports = sorted(nb.value("sorted(os.listdir('allocconf-exports'))", setup="import os"))
    size = nb.value(f"os.path.getsize('allocconf-exports/{pickle.rsplit('/', 1)[1]}')", setup="import os")
    with page.context.expect_page(timeout=30_000) as opened:
        links.filter(has_text="new browser tab").first.click()
    tab = opened.value
    tab.wait_for_load_state("domcontentloaded")
    status = page.request.get(tab.url).status
    tab.close()
    return Links(hrefs, len(body), int(size), tab.url, status, exports)


MONITOR_CELLS = ["from allocconf_widget.views.widgets.monitor import start_monitor\n"
                 "mon = start_monitor(demo=True, renderer='svg', interval=0.05)\n"
                 "display(mon)\n"
                 "import time; time.sleep(6)  # the replay goes on meanwhile"]


def monitor_scene(nb: Any, front_end: str) -> Seen:
    """The Monitor with the recording replayed, then its Segments button: which moment is which."""
    page = nb.page
    monitor = page.locator(".allocconf-monitor").first
    monitor.wait_for(state="visible", timeout=60_000)
    find_widget(monitor, "monitor-segments").first.click()
    segmap = find_widget(monitor, "monitor-segmap").first
    wait_until(lambda: "segments" in segmap.inner_text(), timeout=30, what="the segment map")
    seen = Seen("monitor", cut_off_labels(monitor),
                [find_widget(monitor, "monitor-status").first.inner_text(), segmap.inner_text()])
    seen.shot = _shot(page, monitor, f"{front_end}-monitor")
    seen.save(front_end)
    return seen
