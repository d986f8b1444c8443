"""The OOM view, headless: a real OOM recorded on an H200, rendered and clicked.

ipywidgets objects are real; nothing is displayed. The recording
(``allocconf_widget/data/flight_oom_h200``) was captured by the flight recorder
from inside torch's OOM observer (``benchmarks/gpu/flight_oom.py --stacks``).
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

import pytest

from allocconf_widget.views.text.flight import headline

pytest.importorskip("ipywidgets")

from allocconf_widget.adapters.flight_history import FlightSettings, OomCapture, flight_history
from allocconf_widget.app.flight import analyse, load_demo_oom, verdict
from allocconf_widget.app.oom import build_report
from allocconf_widget.app.session import Session
from allocconf_widget.core.memory.snapshot import load_snapshot
from allocconf_widget.views.widgets.flight import FlightOomView
from allocconf_widget.views.widgets.flight_toggle import FlightToggle
from tests.torch_versions import has_torch

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def demo():
    return load_demo_oom()


@pytest.fixture
def view(demo):
    report = build_report(demo.message, demo.settings)
    return FlightOomView(analyse(demo.capture, label="Recording"), session=Session(), report=report)


def test_the_view_shows_breakdown_sites_map_and_verdict(view, demo):
    assert "CUDA out of memory on GPU 0" in view.breakdown.value
    assert "allocated by PyTorch" in view.breakdown.value
    assert "Recording: Flight recorder:" in view.header.value
    assert f"{demo.capture.events:,} allocator events captured at the OOM" in view.header.value
    sites = view.sites.value
    assert "live bytes at the OOM by Python frame" in sites
    assert "flight_oom.py" in sites and "kept_output" in sites and "activations" in sites
    assert "<svg" in view.segments.value and "segments" in view.caption
    assert "Segments at the OOM" in view.segments.value
    body = view.verdict.value
    assert "Verdict: under " in body and ": no OOM" in body
    assert "of the 4.00 GiB limit (memory fraction" in body
    assert "How sure: sure: the replay of your settings reproduced the OOM" in body
    assert view.apply_button.layout.display != "none" and not view.apply_button.disabled
    assert view.apply_button.description.startswith("Apply ")


def test_apply_asks_first_then_goes_through_the_session_and_says_what_to_rerun(view):
    winner = view.analysis.verdict.winner
    before = view.session.applied().to_string()
    plan = view.ask()  # the click on "Apply …": a question, nothing changed yet
    assert plan is not None and plan.needs_confirmation  # a recording of another run
    assert view.confirm.widget.layout.display != "none"
    assert "not from this kernel's own run" in html.unescape(view.confirm.question.value)
    assert view.session.applied().to_string() == before
    outcome = view.apply_winner()  # "Apply these settings"
    assert outcome is not None and outcome.candidate is not None, outcome
    shown = view.result.value
    assert f"Applied {winner.shown_conf}." in shown
    assert "Next:" in shown and ("re-run the cell" in shown or "restart the kernel" in shown)
    assert view.session.applied().to_string() == winner.conf
    variable = next(v for v in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF") if v in os.environ)
    assert os.environ[variable] == winner.conf


def test_open_in_pytorchs_viewer_writes_the_page_and_the_pickle(view, tmp_path, monkeypatch):
    import torch  # noqa: F401 - the viewer page is torch's own (torch.cuda._memory_viz)

    monkeypatch.chdir(tmp_path)
    files = view.open_viewer()
    assert files is not None and files.pickle.exists()
    status = html.unescape(view.viewer_status.value)
    if has_torch((2, 1)):
        assert files.html is not None
        page = files.html.read_text(encoding="utf-8")
        assert "cdn.jsdelivr.net" in page  # torch's page loads its script from a CDN …
        assert "cdn.jsdelivr.net, so it needs the internet" in status  # … and the view says so
        assert "offline, use the segment map above" in status
    else:  # torch 1.13's _memory_viz has no trace_plot: the pickle still works, and the view says so
        assert files.html is None
        assert "PyTorch's viewer page could not be made here (" in status
        assert "pytorch.org/memory_viz" in status
    again = load_snapshot(files.pickle)
    if has_torch((2, 0)):
        assert len(again["device_traces"][0]) == view.analysis.capture.events
    else:  # the layout torch 1.13's own viewer reads: its list of segments alone
        assert len(again["segments"]) == len(view.analysis.capture.snapshot["segments"])
    files = view.open_viewer(html=False)
    assert "PyTorch's viewer:" not in view.viewer_status.value and files is not None


def test_when_nothing_helps_the_verdict_says_allocated_not_cached(tmp_path):
    meta = json.loads((DATA / "growing__frac_default.json").read_text())
    snap = dict(load_snapshot(DATA / "growing__frac_default.pickle.gz"))
    capture = OomCapture(snap, 0, 20 << 20, None, None, meta["device_total_bytes"],
                         meta["fraction"], meta["stats"], FlightSettings(), meta["torch"])
    result = verdict(capture)
    assert result.winner is None
    assert headline(result) == "no setting avoids this: 40.06 MiB is allocated, not cached"
    view = FlightOomView(analyse(capture, with_verdict=False), session=Session())
    assert "no setting avoids this: 40.06 MiB is allocated, not cached" in view.verdict.value
    assert view.apply_button.layout.display == "none"
    assert view.apply_winner() is None


def test_the_panel_toggle_turns_the_recorder_on_and_off():
    toggle = FlightToggle()
    try:
        assert not toggle.button.value and "Flight recorder off." in toggle.line.value
        toggle.stacks.value = True
        toggle.button.value = True  # a click
        state = flight_history().status()
        assert state.settings.python_stacks
        assert toggle.line.value.lower().count("flight recorder") == 1
        if state.on:  # torch not imported in this process yet: armed
            assert "armed" in toggle.line.value and "entries" in toggle.line.value
        else:  # the CPU build of torch is imported: it says why it cannot record
            assert "CPU-only build" in toggle.line.value and not toggle.button.value
            toggle.button.value = True  # clicking again tries again
            assert "CPU-only build" in toggle.line.value
        toggle.set(False)
        assert flight_history().status().line == "flight recorder off"
        assert not toggle.button.value and "Flight recorder off." in toggle.line.value
    finally:
        flight_history().turn_off()


def test_the_card_states_one_recommendation_the_replays(view, demo):
    """torch's message alone suggests expandable segments; the replay found max_split_size_mb:128.
    The card must not say "What to do: expandable" beside a verdict and button for another setting."""
    winner = view.analysis.verdict.winner
    assert winner is not None and winner.conf == demo.meta["winner"]
    card = html.unescape(view.breakdown.value)
    assert "What to do" not in card
    assert "Rules of thumb (read from torch's message alone;" in card  # the heading says it once
    assert ("the replay of what the program really allocated (the verdict) decides, and "
            f"recommends {winner.conf}") in card
    advised = [a.conf_change for a in view.report.advice if a.conf_change]
    assert advised and all(c != winner.conf for c in advised)  # the rules of thumb disagree here …
    assert "color:#777" in view.breakdown.value  # … so they are shown muted, below the verdict
    assert view.apply_button.description == f"Apply {winner.conf}"  # one button, the verdict's


def test_without_a_verdict_the_rules_of_thumb_are_what_to_do(demo):
    from allocconf_widget.app.flight import recommendation_of
    from allocconf_widget.views.text.oom import report_text

    report = build_report(demo.message, demo.settings)
    text = report_text(report, recommendation_of(report, None))
    assert "what to do:" in text and "Rules of thumb" not in text


def test_in_colab_the_download_button_hands_the_file_to_colabs_download(view, tmp_path, monkeypatch):
    """Issue 24, item 1. Colab cannot run here: ``google.colab`` below is a STAND-IN module
    (its ``files.download(path)`` only records the call). What is checked is our side: in
    Colab the Download button writes the pickle into ./allocconf-exports/ and hands exactly
    that file to ``google.colab.files.download``, and the view says the download started."""
    import sys
    import types

    calls: list[str] = []
    google, colab, files = (types.ModuleType(n) for n in ("google", "google.colab", "google.colab.files"))
    files.download = calls.append  # type: ignore[attr-defined]
    colab.files = files  # type: ignore[attr-defined]
    google.colab = colab  # type: ignore[attr-defined]
    for name, module in (("google", google), ("google.colab", colab), ("google.colab.files", files)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.chdir(tmp_path)
    view.download_button.click()
    assert view.files is not None
    assert calls == [os.fspath(view.files.pickle)]
    assert view.files.pickle.parent == tmp_path / "allocconf-exports"
    assert "download started in your browser" in view.viewer_status.value


def test_viewer_files_go_into_allocconf_exports(view, tmp_path, monkeypatch):
    """Issue 24, item 9: where docs/monitor.md says (and .gitignore ignores), not beside the notebook."""
    monkeypatch.chdir(tmp_path)
    files = view.open_viewer()
    assert files is not None
    assert files.pickle.parent == tmp_path / "allocconf-exports"
    assert not list(tmp_path.glob("allocconf-oom-*"))


def test_allocconf_simulate_on_the_saved_pickle_agrees_with_the_card(view, tmp_path, monkeypatch):
    """Issue 24, item 8: the pickle the card saves carries its replay facts (torch release,
    device memory, memory fraction) in a sidecar, so the CLI replays it as the card did:
    no LOW CONFIDENCE, the recorded settings run out of memory, the card's winner does not."""
    import subprocess
    import sys

    monkeypatch.chdir(tmp_path)
    files = view.open_viewer(html=False)
    assert files is not None
    sidecar = files.pickle.with_suffix(".json")
    assert sidecar.is_file() and sidecar.name in view.viewer_status.value
    run = subprocess.run([sys.executable, "-m", "allocconf_widget", "simulate", str(files.pickle),
                          "--workers", "1", "--conf", "max_split_size_mb:128"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    assert "LOW CONFIDENCE" not in run.stdout + run.stderr
    assert "memory fraction" in run.stderr and "torch 2.11" in run.stdout
    winner = view.analysis.verdict.winner
    rows = {line.split("  ")[0].strip(): line for line in run.stdout.splitlines() if "GiB" in line}
    assert "at event" in rows["(torch defaults) [current]"]  # the OOM, as recorded
    # what the card said: it serves the failed request; the window ends there, and both say so
    said = "past the recorded OOM; the rest of the run was never recorded"
    assert rows[winner.conf].rstrip().endswith(said)
    assert "the recording ends at the OOM that ended the program" in run.stderr


@pytest.mark.skipif(not has_torch((2, 1)), reason="expandable segments need torch 2.1+")
def test_a_kernel_already_running_a_setting_that_avoids_it_is_offered_nothing(demo):
    """The card offered "Apply max_split_size_mb:64" to a kernel running it (the Apply then said
    "nothing to change"), and pushed a kernel on expandable segments, which also avoid this OOM,
    to another setting."""
    from allocconf_widget.core.config.conf import parse_conf

    kernel = parse_conf("expandable_segments:True", warn=False)
    analysis = analyse(demo.capture, label="Recording", kernel=kernel)
    verdict_ = analysis.verdict
    assert verdict_ is not None and verdict_.current is not None
    assert verdict_.winner is None and verdict_.avoided
    assert headline(verdict_).startswith("the settings this kernel runs now (expandable_segments:True) "
                                        "would have avoided it")
    assert all(o.conf != "expandable_segments:True" for o in verdict_.also)
    view = FlightOomView(analysis, session=Session(), report=build_report(demo.message, demo.settings))
    assert "nothing to apply" in view.verdict.value
    assert view.apply_button.layout.display == "none"
