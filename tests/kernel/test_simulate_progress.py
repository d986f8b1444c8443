"""``%allocconf simulate`` in a notebook says how far it has got, then shows its table in the
same place (a display updated by id).

In a real kernel, as a notebook front end sees it: the ranking replays a dozen settings or more,
tens of seconds on a long trace with frees that wait on other streams, and the cell showed
nothing until the end. What a user would notice if it broke: no line while it runs, a count that
skips, a progress line left above the table, or a second output instead of the one replaced.
"""

from __future__ import annotations

import re

import pytest

from tests.kernel.kernels import RealKernel

pytestmark = pytest.mark.kernel


def test_the_cell_counts_the_replays_then_shows_the_table_in_their_place(kernel: RealKernel) -> None:
    kernel.execute("%load_ext allocconf_widget").check()
    run = kernel.execute("%allocconf simulate --demo", timeout=180)
    run.check()
    shown = [d.get("text/plain", "") for d in run.displays]
    found = re.findall(r"replaying: (\d+) of (\d+) settings done", "\n".join(shown))
    counts = [(int(d), int(t)) for d, t in found]
    assert counts, shown[:3]
    total = counts[-1][1]
    assert counts == [(done, total) for done in range(1, total + 1)]
    # one output: displayed once, then only updated; the last update is the table
    assert run.msg_types.count("display_data") == 1 and "update_display_data" in run.msg_types
    assert "peak reserved" in run.displays[-1].get("text/html", ""), list(run.displays[-1])
    assert "replaying" not in run.stdout


def test_an_error_leaves_its_message_and_no_progress_line(kernel: RealKernel, tmp_path) -> None:
    bad = tmp_path / "not-a-snapshot.pickle"
    bad.write_bytes(b"not a pickle at all")
    kernel.execute("%load_ext allocconf_widget").check()
    run = kernel.execute(f"%allocconf simulate {bad}", timeout=60)
    assert "reading the trace" in run.displays[0].get("text/plain", "")
    assert run.displays[-1] == {"text/plain": ""}  # the line is emptied: the error alone is read
    assert "not-a-snapshot.pickle" in run.stdout + run.stderr + (run.error or "")
