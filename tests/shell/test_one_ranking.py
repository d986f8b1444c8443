"""One way to rank: the What if? tab, ``%allocconf simulate``, ``allocconf simulate`` and the OOM
card's verdict rank the same recording identically for the same kernel.

They all go through ``app.simulate.simulate(rank=True)``; the request says which kernel's
settings the rows compare with and so which torch must take them. The kernel here runs
torch's defaults, as the recording did, so the CLI (no kernel: the recording's settings are
current, rows offered for the installed torch) ranks the same rows. On torch 1.13 (CI's
torch113 cell) all four leave out ``expandable_segments:True``, which 1.13 rejects.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("IPython")
pytest.importorskip("ipywidgets")

from allocconf_widget.adapters.flight_history import FlightSettings, OomCapture
from allocconf_widget.adapters.recorder import CellRecording
from allocconf_widget.app.flight import verdict
from allocconf_widget.app.session import Session
from allocconf_widget.core.memory.snapshot import load_snapshot
from allocconf_widget.views.widgets.whatif import WhatIfView
from tests.torch_versions import has_torch

DATA = Path(__file__).resolve().parents[1] / "data"
TRACE = DATA / "cnn__default.pickle.gz"
META = json.loads((DATA / "cnn__default.json").read_text())
NON_PYTORCH = META["device_total_bytes"] - META["free_at_start_bytes"]


def _cli() -> list[tuple[str, int, bool]]:
    run = subprocess.run([sys.executable, "-m", "allocconf_widget", "simulate", str(TRACE),
                          "--json", "--workers", "1", "--non-pytorch", str(NON_PYTORCH)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    return [(row["conf"], row["peak_reserved_bytes"], row["oom"] is None) for row in json.loads(run.stdout)]


def _rows(report) -> list[tuple[str, int, bool]]:
    return [(row.conf, row.result.peak_reserved_bytes, row.result.oom is None) for row in report.rows]


def test_the_four_front_ends_rank_one_recording_identically(ip, monkeypatch):
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)  # the kernel runs torch's defaults, as recorded
    cli = _cli()

    magic = _rows(ip.run_line_magic("allocconf", f"-r simulate {TRACE}"))

    snapshot = dict(load_snapshot(TRACE))
    session = Session()
    session.set_recording(CellRecording(snapshot=snapshot, torch_version=META["torch"],
                                        device_total=META["device_total_bytes"],
                                        free_at_start=META["free_at_start_bytes"]))
    view = WhatIfView(session)
    try:
        tab = _rows(view.run())
    finally:
        view.close()

    capture = OomCapture(snapshot, 0, None, None, META["free_at_start_bytes"], META["device_total_bytes"],
                         None, None, FlightSettings(), META["torch"])
    card = verdict(capture, kernel=session.view().effective)
    card_rows = {(o.conf, o.peak_reserved) for o in (*card.winners, *card.losers)}

    assert tab == magic == cli, (tab, magic, cli)
    # the card leaves out the recorded settings (the run that failed) and splits the rest
    assert card_rows == {(conf, peak) for conf, peak, _ok in tab if conf != ""}
    confs = [conf for conf, _peak, _ok in tab]
    assert ("expandable_segments:True" in confs) == has_torch((2, 1))
