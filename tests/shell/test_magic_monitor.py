"""``%allocconf monitor`` and ``%allocconf report`` through the real magic in IPython's test shell."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("IPython")

from IPython.core.error import UsageError

from allocconf_widget.app.monitor import MonitorRun
from allocconf_widget.app.session import get_session
from allocconf_widget.core.memory.recording import load_demo


def _widget_count() -> int:
    from ipywidgets.widgets import widget

    registry = getattr(widget, "_instances", None)  # ipywidgets 8
    if registry is None:  # ipywidgets 7 (Colab's)
        registry = widget.Widget.widgets
    return len(registry)


def test_monitor_demo_in_a_terminal_prints_text_and_builds_no_widget(ip, capsys):
    pytest.importorskip("ipywidgets")
    before = _widget_count()
    run = ip.run_line_magic("allocconf", "-r monitor --demo --renderer svg --interval 0.05")
    # terminal IPython: the Session's one monitor runs, its status is printed as text, no widget
    assert isinstance(run, MonitorRun)
    assert run is get_session(ip).monitors.active
    assert run.running
    assert run.recording is not None
    assert _widget_count() == before
    assert "samples" in capsys.readouterr().out
    status = ip.run_line_magic("allocconf", "-r monitor status")
    assert status["running"] is True and status["recording"].startswith("Recording: ")
    stopped = ip.run_line_magic("allocconf", "-r monitor stop")
    assert stopped is run
    assert not stopped.running
    assert get_session(ip).monitors.active is None
    out = capsys.readouterr().out
    assert "monitor stopped" in out
    assert ip.run_line_magic("allocconf", "-r monitor status") == {"running": False}


def test_the_demo_cuts_idle_stretches_unless_asked_to_keep_them(ip, capsys):
    run = ip.run_line_magic("allocconf", "-r monitor --demo --renderer svg")
    assert len(run.source.cuts) == 1
    real_time = ip.run_line_magic("allocconf", "-r monitor --demo --renderer svg --keep-idle")
    assert real_time.source.cuts == []
    assert run.closed  # the second start replaced the first
    ip.run_line_magic("allocconf", "monitor stop")
    capsys.readouterr()


@pytest.mark.parametrize(("line", "message"), [
    ("monitor --interval 0.001", "too short"),
    ("monitor --renderer canvas", "invalid choice"),
    ("monitor --demo --step-sync", "choose one"),
    ("monitor --device -2", "start at 0"),
    ("monitor sideways", "invalid choice"),
    ("report --device 7", "devices with segments: 0"),
])
def test_bad_input_is_a_usage_error_that_says_what_is_wrong(ip, line, message):
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("allocconf", line)


def test_report_without_cuda_shows_the_recording_labelled_as_such(ip, capsys):
    doc = ip.run_line_magic("allocconf", "-r report")
    assert doc["source"] == "recording"
    assert doc["label"].startswith("Recording: ") and "torch" in doc["label"]
    total = doc["devices"]["0"]["total"]
    demo = load_demo()
    assert total["reserved_bytes"] == sum(s["total_size"] for s in demo.snapshot()["segments"])
    assert total["reserved_bytes"] == demo.peak("reserved_bytes.all.peak")  # it ended at its peak
    out = capsys.readouterr().out
    assert out.startswith("Recording: ") and "external fragmentation" in out


def test_report_json_prints_the_same_document(ip, capsys):
    doc = ip.run_line_magic("allocconf", "-r report --json --device 0")
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(json.dumps(doc))


@pytest.mark.parametrize(("value", "said"), [("inf", "too long"), ("1e308", "too long"),
                                             ("nan", "is not a number of seconds")])
def test_monitor_interval_without_bound_is_a_usage_error(ip, value, said):
    with pytest.raises(UsageError, match=said):
        ip.run_line_magic("allocconf", f"monitor start --interval {value}")


def test_cli_and_magic_print_the_same_table_for_the_same_recording(ip, capsys):
    """One renderer: the magic's report of the bundled recording equals the CLI's of its file."""
    import subprocess
    import sys
    from pathlib import Path

    import allocconf_widget

    ip.run_line_magic("allocconf", "report")
    magic_out = capsys.readouterr().out
    demo = Path(allocconf_widget.__file__).parent / "data" / "demo_cnn_h200.pickle.gz"
    cli = subprocess.run([sys.executable, "-m", "allocconf_widget", "report", str(demo)],
                         capture_output=True, text=True, check=True).stdout
    # everything but the first line (the label: which file, or which recording) is the same
    assert magic_out.splitlines()[1:] == cli.splitlines()[1:]
    assert "segsum: external free" in magic_out
