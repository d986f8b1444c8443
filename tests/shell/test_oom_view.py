"""The OOM assistant, fed real out-of-memory messages recorded on an H200 with torch 2.11."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from allocconf_widget.app.oom import (
    ObservedOom,
    SettingsInForce,
    build_report,
    is_cuda_oom,
    settings_in_force,
)
from allocconf_widget.app.session import Session
from allocconf_widget.core.versions import parse_version
from allocconf_widget.views.text.oom import report_text
from allocconf_widget.views.widgets.oom import OomPanel, install_oom_assistant, uninstall_oom_assistant
from allocconf_widget.views.widgets.oom_card import report_html
from tests.torch_versions import OPT


def _settings(values: dict, text: str) -> SettingsInForce:
    return SettingsInForce(values, parse_version("2.11"), text)

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "data"


def _probe(scenario: str) -> dict:
    for line in (BENCH / "probe_runtime_h200_torch2.11.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("scenario") == scenario:
            return record["result"]
    raise AssertionError(f"scenario {scenario} not recorded")


def _recorded_oom(archive: str, member: str) -> str:
    with tarfile.open(BENCH / archive) as tar:
        handle = tar.extractfile(member)
        assert handle is not None
        return json.load(handle)["oom"]


@pytest.fixture(scope="module")
def observer_case() -> dict:
    return _probe("oom_observer_args")


@pytest.fixture(scope="module")
def fragmented_message() -> str:
    # a mixed workload under a memory fraction: 2.03 GiB reserved but unallocated
    return _recorded_oom("mixed.tar.xz", "mixed__frac_default.json")


def test_fraction_limited_oom_shows_breakdown_and_the_fraction_as_the_cause(observer_case):
    device, alloc, limit, free = observer_case["observer_calls"][0]
    observed = ObservedOom(device, alloc, limit, free)
    report = build_report(observer_case["message"], _settings({}, "torch's defaults"),
                          observed=observed)
    text = report_text(report)
    assert report.headline == "CUDA out of memory on GPU 0: tried to allocate 4.00 GiB"
    parts = dict(report.breakdown.parts())
    assert parts["this process, outside PyTorch"] == 518 * (1 << 20)  # the CUDA context
    assert "allocated by PyTorch" not in parts  # nothing was allocated
    assert "1.40 GiB allowed to PyTorch" in text
    assert [a.rule for a in report.advice] == ["fraction_limit"]
    assert "set_per_process_memory_fraction" in text
    assert "expandable" not in text.split("what to do:")[1]  # torch's stock hint is not echoed
    assert "could not get 4.00 GiB" in text  # what the observer saw


def test_fragmented_oom_suggests_expandable_segments_with_the_command(fragmented_message):
    report = build_report(fragmented_message,
                          _settings({"expandable_segments": False}, "torch's defaults"))
    changes = [a.conf_change for a in report.advice if a.conf_change]
    assert changes == ["expandable_segments:True"]
    text = report_text(report)
    assert "%allocconf set expandable_segments=True" in text
    assert "2.03 GiB" in text  # the reserved-but-unallocated figure it is based on


def test_never_suggests_expandable_segments_when_they_are_already_on(fragmented_message):
    report = build_report(fragmented_message,
                          _settings({"expandable_segments": True}, "expandable_segments:True"))
    assert all(a.conf_change != "expandable_segments:True" for a in report.advice)
    assert any(a.rule == "expandable_already_on" for a in report.advice)


def test_settings_come_from_the_sessions_view(fragmented_message, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", OPT)  # the variable every release reads
    report = build_report(fragmented_message, settings_in_force(Session()))
    assert OPT in report.settings_text
    assert all(a.conf_change != OPT for a in report.advice)


def test_html_and_panel_escape_and_show_the_numbers(observer_case):
    pytest.importorskip("ipywidgets")
    report = build_report(observer_case["message"] + " <img src=x>", _settings({}, "<defaults>"))
    html = report_html(report)
    assert "518.00 MiB" in html and "&lt;defaults&gt;" in html and "<img" not in html
    panel = OomPanel(report)
    assert "allocconf-oom" in panel.widget._dom_classes
    panel._on_save()  # no CUDA here: it says so instead of raising into the widget machinery
    assert "could not save a snapshot" in panel.status.value
    assert panel.saved is None


def test_unparseable_text_still_gives_a_report():
    report = build_report("CUDA out of memory (cut off)", _settings({}, "x"))
    assert report.info is None and report.advice == ()
    assert "could not be parsed" in report.headline


def test_assistant_reports_after_a_failed_cell_and_uninstalls(observer_case, ipython_shell, capsys):
    torch = pytest.importorskip("torch")
    shell = ipython_shell
    assistant = install_oom_assistant(shell)
    assert install_oom_assistant(shell) is assistant  # idempotent
    try:
        shell.user_ns["_oom"] = _oom_error(torch)(observer_case["message"])
        shell.run_cell("raise _oom")
        shell.run_cell("raise ValueError('not memory')")
        assert len(assistant.reports) == 1
        out = capsys.readouterr().out
        assert "tried to allocate 4.00 GiB" in out and "518.00 MiB" in out
    finally:
        uninstall_oom_assistant(shell)
    shell.run_cell("raise _oom")
    assert len(assistant.reports) == 1
    assert assistant.post_run_cell not in shell.events.callbacks["post_run_cell"]


def test_oom_detection_covers_old_torch_runtime_errors():
    assert is_cuda_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; ...)"))
    assert not is_cuda_oom(RuntimeError("shape mismatch"))
    assert not is_cuda_oom(MemoryError("host RAM"))


def test_observer_is_not_attached_before_cuda_is_initialised(ipython_shell):
    torch = pytest.importorskip("torch")
    shell = ipython_shell
    assistant = install_oom_assistant(shell)
    try:
        assert assistant.attach_observer() is False
        assert not torch.cuda.is_initialized()
    finally:
        uninstall_oom_assistant(shell)


def _oom_error(torch):
    """The error torch raises on out-of-memory: torch.OutOfMemoryError (2.4+), torch.cuda's before."""
    return getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
