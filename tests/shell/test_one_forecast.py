"""One forecast: every front end gives a setting the same outcome and the same peak.

"What would this setting do to my step?" is answered from the one replay
(``app.simulate.simulate``) and worded once (``views/text/forecast.py``). Over every recording in
``tests/data`` and two dry runs (a CNN and an attention block written with SDPA, as inference on
the CPU build), these front ends must agree per setting, outcome and peak reserved:

* ``allocconf simulate FILE --json`` (a real subprocess) and its table's OOM column;
* ``%allocconf simulate`` in a real IPython shell;
* ``run.predict()`` / ``app.dryrun.predict``;
* the Settings tab and ``%allocconf set`` (the staged draft's prediction; the widget's text);
* the What if? tab's rows and bars;
* the OOM card's verdict (a capture of the same window);
* ``%allocconf plan`` for the dry runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("IPython")
pytest.importorskip("ipywidgets")

from allocconf_widget.adapters.flight_history import FlightSettings, OomCapture
from allocconf_widget.adapters.recorder import CellRecording
from allocconf_widget.app.draft_prediction import predict_staged
from allocconf_widget.app.dryrun import predict
from allocconf_widget.app.flight import verdict
from allocconf_widget.app.session import Session
from allocconf_widget.app.simulate import SimulationRequest, simulate
from allocconf_widget.app.sources import file_source
from allocconf_widget.core.config.conf import parse_conf
from allocconf_widget.core.sim.outcome import Outcome
from allocconf_widget.core.sim.state import INITIAL_SEGMENTS_KEY
from allocconf_widget.views.text.forecast import forecast_sentence, outcome_tag
from allocconf_widget.views.widgets.whatif import WhatIfView, _runs
from tests.torch_versions import has_torch

DATA = Path(__file__).resolve().parents[1] / "data"
RECORDINGS = sorted(p for p in DATA.glob("*.pickle.gz"))
#: settings every torch since 2.1 takes; each front end is asked about each
SETTINGS = ("", "expandable_segments:True", "max_split_size_mb:128")

Answer = tuple[str, int]  # (outcome, peak reserved)


def _settings() -> tuple[str, ...]:
    return SETTINGS if has_torch((2, 1)) else tuple(s for s in SETTINGS if "expandable" not in s)


def _cli(path: Path) -> dict[str, Answer]:
    confs = [arg for conf in _settings() for arg in ("--conf", conf)]
    run = subprocess.run([sys.executable, "-m", "allocconf_widget", "simulate", str(path), *confs,
                          "--json", "--workers", "1"], capture_output=True, text=True, timeout=300,
                         check=False)
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout)
    assert all(row["fits"] == Outcome(row["outcome"]).fits for row in rows)
    return {row["conf"]: (row["outcome"], row["peak_reserved_bytes"]) for row in rows
            if row["conf"] in _settings()}


def _answers(rows: Any) -> dict[str, Answer]:
    return {row.conf: (row.outcome.value, row.result.peak_reserved_bytes) for row in rows
            if row.conf in _settings()}


def _session_with(path: Path) -> Session:
    """A session whose step is the recording ``path``, with the facts its file's sidecar gives
    (the Settings tab and the What if? tab replay the session's step)."""
    source = file_source(str(path))
    capacity = simulate(source, SimulationRequest(workers=1)).capacity
    snapshot = dict(source.snapshot) if source.decoded is None else dict(_whole(path))
    held = sum(int(seg.get("total_size", 0)) for seg in snapshot.get(INITIAL_SEGMENTS_KEY) or ()
               if isinstance(seg, dict) and seg.get("device", 0) == 0)
    total = capacity.device_total
    free = None if total is None else total - capacity.non_pytorch_bytes - held
    session = Session()
    version = str(source.torch_version) if source.torch_version is not None else ""
    session.set_recording(CellRecording(snapshot=snapshot, torch_version=version, device_total=total,
                                        free_at_start=free, fraction=source.fraction))
    return session


def _whole(path: Path) -> dict[str, Any]:
    from allocconf_widget.core.memory.snapshot import load_snapshot

    return dict(load_snapshot(path))


def _settings_tab(session: Session) -> dict[str, Answer]:
    """The staged draft's prediction (what the Settings tab and ``%allocconf set`` show), and
    the Settings tab's own text saying that outcome."""
    from allocconf_widget.views.widgets.panel import Panel

    out: dict[str, Answer] = {}
    panel = Panel(session)
    try:
        for conf in _settings():
            session.stage(parse_conf(conf, warn=False), eager=False)
            prediction = predict_staged(session)
            assert prediction is not None and prediction.draft is not None, prediction
            row = prediction.draft
            out[conf] = (row.outcome.value, row.result.peak_reserved_bytes)
            panel._refresh_status()
            sentence = forecast_sentence(row.result, row.limit, estimate=prediction.estimate)
            import html

            assert html.escape(sentence) in panel.prediction.value, panel.prediction.value
        session.discard()
    finally:
        panel.close()
    return out


def _whatif(session: Session) -> dict[str, Answer]:
    view = WhatIfView(session)
    try:
        report = view.run()
        assert report is not None, view.summary.value
        for label, *_rest, tag, _low, _high in _runs(report, limit=len(report.rows)):
            row = next(r for r in report.rows if label.startswith(r.shown_conf))
            assert tag == outcome_tag(row.outcome)  # each bar says its row's outcome
        return _answers(report.rows)
    finally:
        view.close()


def _card(path: Path, session: Session) -> dict[str, Answer]:
    source = file_source(str(path))
    total = source.device_total
    outside = simulate(source, SimulationRequest(workers=1)).capacity.non_pytorch_bytes
    # the card's window with the facts the file's sidecar gives (its memory outside PyTorch
    # is the device less what was free, less what was reserved: nothing was at the capture)
    capture = OomCapture(_whole(path), 0, None, None, None if total is None else total - outside, total,
                         source.fraction, {"reserved_bytes.all.current": 0}, FlightSettings(),
                         str(source.torch_version or ""))
    card = verdict(capture, kernel=session.view().effective)
    options = (*card.winners, *card.losers, *((card.current,) if card.current else ()))
    for option in options:
        assert option.avoids_oom == option.row.outcome.avoids_oom
    return _answers([o.row for o in options])


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name.removesuffix(".pickle.gz"))
def test_every_front_end_gives_a_recording_one_outcome_and_peak_per_setting(ip, path):
    cli = _cli(path)
    magic = _answers(ip.run_line_magic("allocconf", f"-r simulate {path} " + " ".join(
        f"--conf={conf}" for conf in _settings() if conf)).rows)
    source = file_source(str(path))
    api = {conf: (p.outcome.value, p.peak_reserved) for conf in _settings()
           for p in [predict(source, conf, trace=source.trace())]}
    session = _session_with(path)
    tab, whatif, card = _settings_tab(session), _whatif(session), _card(path, session)
    assert cli == api == tab, (cli, api, tab)
    for name, answers in (("%allocconf simulate", magic), ("What if?", whatif), ("OOM card", card)):
        shared = {conf: cli[conf] for conf in answers}
        assert answers == shared, (name, answers, shared)


# ---------------------------------------------------------------- dry runs

CNN_CELL = """
import torch
model = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(64, 10)).to("cuda")
with torch.no_grad():
    out = model(torch.randn(BATCH, 3, 224, 224, device="cuda"))
"""

ATTENTION_CELL = """
import torch
import torch.nn.functional as F
proj = torch.nn.Linear(1024, 3 * 1024).to("cuda")
with torch.no_grad():
    x = torch.randn(BATCH, 2048, 1024, device="cuda")
    q, k, v = proj(x).view(BATCH, 2048, 3, 16, 64).permute(2, 0, 3, 1, 4)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
"""


def _requires_fake_cuda() -> None:
    if not has_torch((2, 6)):
        pytest.skip("the dry run's fake CUDA tensors need torch 2.6+")


@pytest.mark.parametrize("cell", [CNN_CELL, ATTENTION_CELL], ids=["cnn", "sdpa-attention"])
def test_every_front_end_gives_a_dry_run_one_outcome_and_peak_per_setting(ip, cell, tmp_path):
    _requires_fake_cuda()
    from allocconf_widget.app.session import get_session

    ip.user_ns["BATCH"] = 8
    ip.run_cell_magic("allocconf", "dryrun --gpu t4", cell)
    session = get_session(ip)
    result = session.dry_run
    assert result is not None and session.step().kind == "dryrun"
    api = {conf: (p.outcome.value, p.peak_reserved) for conf in _settings()
           for p in [result.predict(conf)]}
    saved = result.save(tmp_path / "step.pickle")
    cli = _cli(saved)
    magic = _answers(ip.run_line_magic("allocconf", "-r simulate " + " ".join(
        f"--conf={conf}" for conf in _settings() if conf)).rows)
    plan = ip.run_line_magic("allocconf", "-r plan BATCH 8 --gpu t4 " + " ".join(
        f"--conf={conf}" if conf else "--conf=" for conf in _settings()))
    planned = {cell.conf: (cell.prediction.outcome.value, cell.prediction.peak_reserved)
               for cell in plan.cells if cell.batch == 8 and cell.prediction is not None}
    tab, whatif = _settings_tab(session), _whatif(session)
    assert api == cli == tab == planned, (api, cli, tab, planned)
    for name, answers in (("%allocconf simulate", magic), ("What if?", whatif)):
        assert answers == {conf: api[conf] for conf in answers}, (name, answers)


def test_a_newer_dry_run_is_the_step_everywhere_and_each_view_says_how_to_use_the_recording(ip, capsys):
    """After a recording, a newer dry run answers every view (the Settings tab and ``%allocconf
    set`` had answered from the older recording); ``%allocconf step recording`` goes back."""
    _requires_fake_cuda()
    from allocconf_widget.app.session import get_session
    from allocconf_widget.app.sources import source_label

    session = get_session(ip)
    recorded = _session_with(DATA / "cnn__default.pickle.gz").recording
    assert recorded is not None
    session.set_recording(recorded)
    ip.user_ns["BATCH"] = 8
    ip.run_cell_magic("allocconf", "dryrun --gpu t4", CNN_CELL)
    assert session.step().kind == "dryrun"
    said = capsys.readouterr().out
    assert "%allocconf step recording uses the last %%allocconf record instead" in said

    ip.run_line_magic("allocconf", "set expandable_segments=True")
    said = capsys.readouterr().out
    assert f"Prediction from {source_label(session)}" in said and "dry run" in source_label(session)
    assert "%allocconf step recording uses the last %%allocconf record instead" in said
    report = ip.run_line_magic("allocconf", "-r simulate")
    assert report.estimate and "dry run" in report.source_label
    assert "Predictions use a dry run (estimate)" in capsys.readouterr().out

    ip.run_line_magic("allocconf", "step recording")
    said = capsys.readouterr().out
    assert "Predictions use the last %%allocconf record (chosen with %allocconf step)" in said
    prediction = predict_staged(session)
    assert prediction is not None and not prediction.estimate
    assert prediction.source_label == "the last %%allocconf record"
    ip.run_line_magic("allocconf", "step latest")
    assert session.step().kind == "dryrun"
    ip.run_line_magic("allocconf", "discard")
