"""``%allocconf ranks open / status / close`` in IPython's shell: the channel's folder under the
Jupyter runtime folder, the status of a board no rank reported to yet, and nothing left after
close. The ranks themselves, real child processes: tests/unit/test_rank_channel.py.
"""

from __future__ import annotations

import os
from pathlib import Path

from allocconf_widget.adapters import rank_channel


def test_magic_opens_reports_and_closes(tmp_path, monkeypatch, ip, capsys):
    monkeypatch.delenv(rank_channel.CHANNEL_VARIABLE, raising=False)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "rt"))
    folder = ip.run_line_magic("allocconf", "-r ranks open")
    assert Path(folder).parent == tmp_path / "rt"
    report = ip.run_line_magic("allocconf", "-r ranks status")
    assert report.ranks == ()
    out = capsys.readouterr().out
    assert "no rank has reported yet" in out and "rank_reporter()" in out
    ip.run_line_magic("allocconf", "ranks close")
    assert rank_channel.CHANNEL_VARIABLE not in os.environ and not Path(folder).exists()
