"""Issue 22 (hardening, round 2) in IPython's real shell: bad arguments and a deleted cwd.

Item 13: ``--max-entries`` is bounded and validated for ``%%allocconf record`` and
``flight on``; a bad value refuses the command before anything runs. Item 10: with the
kernel's working directory deleted, ``apply``, ``show`` and ``restart`` say so in one message
("Applied, but NOT saved") instead of a raw FileNotFoundError.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError


@pytest.mark.parametrize("value", ["-5", "0", "999", "10000001", "abc", "1e6"])
def test_record_refuses_a_bad_max_entries_before_the_cell_runs(ip: Any, value: str) -> None:
    ip.user_ns["ran"] = False
    result = ip.run_cell(f"%%allocconf record --max-entries {value}\nran = True\n")
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    assert "--max-entries" in str(result.error_in_exec)
    assert "1,000 to 10,000,000" in str(result.error_in_exec) or "whole number" in str(
        result.error_in_exec)
    assert ip.user_ns["ran"] is False


@pytest.mark.parametrize("value", ["0", "-5", "999"])
def test_flight_on_refuses_a_bad_max_entries_instead_of_using_the_default(ip: Any, value: str) -> None:
    from allocconf_widget.app import flight

    result = ip.run_cell(f"%allocconf flight on --max-entries {value}")
    try:
        assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
        assert "1,000 to 10,000,000" in str(result.error_in_exec)
        assert not flight.status().on
    finally:
        flight.turn_off()


def test_record_accepts_the_bounds(ip: Any) -> None:
    from allocconf_widget.adapters.recorder import MAX_ENTRIES, MIN_ENTRIES, check_max_entries

    assert check_max_entries(MIN_ENTRIES) == MIN_ENTRIES
    assert check_max_entries(MAX_ENTRIES) == MAX_ENTRIES
    with pytest.raises(ValueError, match="out of range"):
        check_max_entries(-5)


@pytest.fixture
def deleted_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    gone = tmp_path / "project"
    gone.mkdir()
    monkeypatch.chdir(gone)  # restored after the test
    monkeypatch.delenv("ALLOCCONF_PROJECT_DIR", raising=False)
    gone.rmdir()
    return gone


def test_apply_with_the_cwd_deleted_applies_and_says_not_saved(ip: Any, deleted_cwd: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("allocconf", "set max_split_size_mb=256")
    result = ip.run_cell("%allocconf apply")
    out = capsys.readouterr().out
    assert result.error_in_exec is None, result.error_in_exec
    assert "Applied, but NOT saved" in out and "working directory no longer exists" in out
    assert "max_split_size_mb:256" in (os.environ.get("PYTORCH_ALLOC_CONF", "")
                                       + os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))


def test_show_with_the_cwd_deleted_says_why_nothing_saved_is_known(
        ip: Any, deleted_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = ip.run_cell("%allocconf show")
    out = capsys.readouterr().out + " ".join(str(w.message) for w in caught)
    assert result.error_in_exec is None, result.error_in_exec
    assert "Runtime:" in out and "working directory no longer exists" in out


def test_restart_with_the_cwd_deleted_refuses_with_a_message(ip: Any, deleted_cwd: Path) -> None:
    ip.run_line_magic("allocconf", "set max_split_size_mb=256")
    ip.run_line_magic("allocconf", "apply")
    result = ip.run_cell("%allocconf restart")
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    assert "working directory no longer exists" in str(result.error_in_exec)


def test_load_ext_with_the_cwd_deleted_prints_its_one_line(deleted_cwd: Path) -> None:
    import io

    from allocconf_widget.views.magic.core import restore_saved_settings

    out = io.StringIO()
    restore_saved_settings(print_to=out)
    text = out.getvalue()
    assert text.count("\n") == 1 and "working directory no longer exists" in text
