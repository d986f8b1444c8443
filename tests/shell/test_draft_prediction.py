"""The Settings tab and ``%allocconf set`` say what each draft would do to the user's recorded step.

What a user would notice: before anything is recorded the panel says how to get a prediction;
after a recording, ticking a row or moving a slider shows the draft's peak reserved (the same
number the What if? tab's replay gives for that setting), whether it fits the GPU, and how it
compares with what is applied; a draft that runs out of memory is said so; a draft the replay
cannot model says why instead of throwing; a new recording is answered from its own trace.
The recordings are real H200 traces from tests/data (torch 2.11).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ipywidgets")

from allocconf_widget.adapters.recorder import CellRecording
from allocconf_widget.app.session import Session
from allocconf_widget.app.simulate import SimulationRequest, simulate
from allocconf_widget.core.config.conf import parse_conf
from allocconf_widget.core.memory.snapshot import load_snapshot
from allocconf_widget.core.units import GIB, format_bytes
from allocconf_widget.views.widgets.panel import Panel
from tests.torch_versions import has_torch

DATA = Path(__file__).resolve().parents[1] / "data"
H200_TOTAL = 150109880320
H200_FREE = 149557477376


def _recording(name: str = "cnn__default", total: int = H200_TOTAL, free: int = H200_FREE) -> CellRecording:
    return CellRecording(snapshot=dict(load_snapshot(DATA / f"{name}.pickle.gz")), torch_version="2.11.0",
                         device_total=total, free_at_start=free)


def _replayed_peak(session: Session, conf: str) -> str:
    """What the What if? tab's replay says this setting peaks at (the number the panel must show)."""
    source, trace = session.trace_cache.get(session)
    report = simulate(source, SimulationRequest(confs=(conf,)), trace=trace)
    return format_bytes(report.rows[0].result.peak_reserved_bytes)


@pytest.fixture
def session():
    return Session()


@pytest.fixture
def panel(session):
    p = Panel(session)
    yield p
    p.close()


def _stage(session: Session, text: str) -> None:
    session.stage(parse_conf(text, session.state().version, warn=False), eager=False)


def test_before_a_recording_the_panel_says_how_to_get_a_prediction(panel):
    shown = panel.prediction.value
    assert "%%allocconf record" in shown and "%%allocconf dryrun" in shown
    assert "peaks at" not in shown  # the bundled demo is not the user's model: no numbers


@pytest.mark.skipif(not has_torch((2, 1)), reason="expandable_segments is 2.1+")
def test_ticking_a_row_shows_its_peak_beside_the_applied_one(session, panel):
    session.set_recording(_recording())
    shown = panel.prediction.value
    assert "Prediction from the last %%allocconf record" in shown
    assert f"with torch&#x27;s defaults: peak reserved {_replayed_peak(session, '')} of" in shown
    panel._rows["expandable_segments"].enabled.value = True  # the user ticks the switch
    shown = panel.prediction.value
    peak = _replayed_peak(session, "expandable_segments:True")
    assert (f"with expandable_segments:True: peak reserved {peak} of the 139.29 GiB usable by PyTorch; "
            "fits.") in shown
    assert "#1b5e20" in shown  # the verdict in green
    assert "Applied now, with torch&#x27;s defaults: peak reserved" in shown
    assert "The draft: 5.41 GiB less reserved at the peak." in shown


def test_moving_the_size_slider_updates_the_prediction(session, panel):
    session.set_recording(_recording())
    row = panel._rows["max_split_size_mb"]
    row.enabled.value = True
    row.editor.children[0].value = 2 ** 7  # the slider, released at 128 MiB
    shown = panel.prediction.value
    peak = _replayed_peak(session, "max_split_size_mb:128")
    assert f"with max_split_size_mb:128: peak reserved {peak} of" in shown
    assert " more reserved at the peak." in shown  # this recording fragments under a split limit
    row.editor.children[0].value = 2 ** 9
    assert "with max_split_size_mb:512: peak reserved" in panel.prediction.value


@pytest.mark.skipif(not has_torch((2, 1)), reason="expandable_segments is 2.1+")
def test_a_draft_that_runs_out_of_memory_is_said_so(session, panel):
    # the same trace on a 6 GiB card: torch's defaults run out (frees and retries do not save
    # them), expandable segments (5.3 GiB) fit
    total = 6 * GIB
    session.set_recording(_recording(total=total, free=total - (H200_TOTAL - H200_FREE)))
    shown = panel.prediction.value
    assert "with torch&#x27;s defaults: runs out of memory at event " in shown and "#b00020" in shown
    assert "more with" in shown and "reserved, over the" in shown  # what it needs, against what
    panel._rows["expandable_segments"].enabled.value = True
    shown = panel.prediction.value
    assert "with expandable_segments:True: peak reserved" in shown and "; fits" in shown
    assert "Applied now, with torch&#x27;s defaults: runs out of memory" in shown
    # not "116 MiB more": the applied settings stopped early, their peak is no comparison
    assert "The draft fits where the applied settings run out of memory." in shown
    assert "more reserved" not in shown


def test_an_invalid_edit_keeps_the_last_prediction(session, panel):
    session.set_recording(_recording())
    row = panel._rows["max_split_size_mb"]
    row.enabled.value = True
    before = panel.prediction.value
    row.editor.children[1].value = "abc"  # the number box: not a size
    assert "max_split_size_mb" in panel.status.value and "✖" in panel.status.value
    assert panel.prediction.value == before


@pytest.mark.skipif(not has_torch((2, 0)), reason="backend is 2.0+")
def test_a_draft_the_replay_cannot_model_says_why(session, panel):
    session.set_recording(_recording())
    _stage(session, "backend:cudaMallocAsync")
    shown = panel.prediction.value
    assert "not available for this draft" in shown and "native caching allocator" in shown


def test_a_new_recording_is_answered_from_its_own_trace(session, panel):
    session.set_recording(_recording("cnn__default"))
    first = panel.prediction.value
    session.set_recording(_recording("growing__default"))
    second = panel.prediction.value
    assert second != first
    assert f"peak reserved {_replayed_peak(session, '')} of" in second


def test_the_magic_prints_the_same_prediction(session, ip, capsys):
    from allocconf_widget.app.session import get_session

    ip.run_line_magic("allocconf", "set max_split_size_mb=256")
    assert "Prediction" not in capsys.readouterr().out  # nothing of the user's recorded yet
    shell_session = get_session(ip)
    shell_session.set_recording(_recording())
    ip.run_line_magic("allocconf", "set max_split_size_mb=128")
    out = capsys.readouterr().out
    assert ("Prediction from the last %%allocconf record, with max_split_size_mb:128: peak reserved "
            f"{_replayed_peak(shell_session, 'max_split_size_mb:128')} of") in out


def test_a_recording_too_long_for_the_python_engine_says_where_to_rank_it(session, panel, monkeypatch):
    from allocconf_widget.app import draft_prediction
    from allocconf_widget.core.sim import native

    recording = _recording()
    monkeypatch.setattr(draft_prediction, "LIMIT_EVENTS", recording.events - 1)
    with native.python_engine():
        session.set_recording(recording)
        shown = panel.prediction.value
    assert f"has {recording.events:,} trace entries" in shown and "%allocconf simulate" in shown
    assert "the last %%allocconf record has" in shown  # named as every other view names it
    assert "Python replay engine" in shown and "allocconf check --env" in shown
    assert "peak reserved" not in shown


def test_the_compiled_engine_predicts_past_the_python_engines_limit(session, panel, monkeypatch):
    from allocconf_widget.app import draft_prediction
    from allocconf_widget.core.sim import native

    if native.engine_name() != "native":
        pytest.skip("the compiled replay engine is not built")
    recording = _recording()
    monkeypatch.setattr(draft_prediction, "LIMIT_EVENTS", recording.events - 1)
    session.set_recording(recording)
    shown = panel.prediction.value
    assert "with torch&#x27;s defaults: peak reserved" in shown and "trace entries" not in shown


def _batch_finder(tmp_path: Path, usable: int) -> CellRecording:
    """``batchfind`` (H200, benchmarks/data): a batch-size finder that caught two OOMs under a
    3 GiB memory fraction and finished; replayed on a card with ``usable`` bytes for PyTorch."""
    import json
    import tarfile

    archive = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "batchfind.tar.xz"
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, members=[m for m in tar.getmembers() if "default_f3g" in m.name],
                       filter="data")
    meta = json.loads((tmp_path / "batchfind__default_f3g.json").read_text())
    outside = meta["device_total_bytes"] - meta["free_at_start_bytes"]
    return CellRecording(snapshot=dict(load_snapshot(tmp_path / "batchfind__default_f3g.pickle")),
                         torch_version="2.11.0", device_total=usable + outside,
                         free_at_start=usable)


def test_a_program_that_catches_its_ooms_is_never_called_dead(session, panel, tmp_path):
    """On the recorded card the finder's OOMs are caught again, as recorded: it fits. On a
    smaller card a request fails where the recording's did not: the program's own handler
    decides what follows, which the replay cannot follow, so the panel says neither "fits"
    nor "runs out of memory" (amber), and compares nothing past that point."""
    session.set_recording(_batch_finder(tmp_path, 3 * GIB))
    shown = panel.prediction.value
    assert "the OOM the program caught in the recording is caught again" in shown
    assert "#1b5e20" in shown and "runs out of memory" not in shown
    session.set_recording(_batch_finder(tmp_path, 2 * GIB))
    shown = panel.prediction.value
    assert "where the recording did not" in shown
    assert "the program catches its OOMs, so its own handler decides what follows" in shown
    assert "#8a6d00" in shown and "runs out of memory" not in shown and "; fits." not in shown
    _stage(session, "max_split_size_mb:256")  # any draft beside the applied settings (torch 1.13 too)
    assert "Not comparable past the first OOM the recording did not have" in panel.prediction.value


def test_where_the_findings_failed_request_fits_the_panel_does_not_say_fits(session, panel, tmp_path):
    """On a card with room for the request the finder's handler caught, that handler never runs
    and the program takes a path nobody recorded: the Settings tab said "fits." while the
    What-if table said the path changes (round 21's review)."""
    import html

    session.set_recording(_batch_finder(tmp_path, 8 * GIB))
    shown = html.unescape(panel.prediction.value)
    said = "a request that failed in the recording fits: the program's OOM handler would not run"
    assert said in shown, shown
    assert "; fits." not in shown and "#8a6d00" in shown  # amber: not predicted past there


def test_under_a_memory_fraction_the_peak_is_measured_against_its_limit(session, panel, tmp_path):
    """The finder recorded under a 3 GiB fraction of an H200: the Settings tab measures the
    peak against that limit (it said "of 138.67 GiB usable", the whole card)."""
    import json

    from allocconf_widget.core.units import format_bytes

    recording = _batch_finder(tmp_path, 3 * GIB)
    meta = json.loads((tmp_path / "batchfind__default_f3g.json").read_text())
    recording.device_total, recording.free_at_start = meta["device_total_bytes"], meta["free_at_start_bytes"]
    recording.fraction = meta["fraction"]
    session.set_recording(recording)
    shown = panel.prediction.value
    limit = format_bytes(int(meta["fraction"] * meta["device_total_bytes"]))
    assert f"of the {limit} limit (memory fraction {meta['fraction']:.4g} of" in shown, shown
    assert "usable" not in shown
