"""One simulation, one renderer: ``allocconf simulate`` and ``%allocconf simulate`` rank by
default and print the same header, table and reasons for the same file, under the same torch
rules; ``--no-rank`` gives both the self-check's one row, and ``--recommend`` changes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("IPython")

DATA = Path(__file__).resolve().parents[1] / "data"
TRACE = DATA / "cnn__expandable.pickle.gz"
DEFAULTS = DATA / "cnn__default.pickle.gz"


def _table(text: str) -> str:
    """Everything the user reads except the notes and the source's name."""
    lines = [line for line in text.splitlines() if not line.startswith("note: ")]
    return "\n".join(line.split(" — ", 1)[-1] if line.startswith("trace: ") else line
                     for line in lines)


def _both(ip, capsys, path: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """``allocconf simulate PATH`` and ``%allocconf simulate PATH``, with the same ``flags``:
    (CLI run, magic's output)."""
    cli = subprocess.run([sys.executable, "-m", "allocconf_widget", "simulate", str(path),
                          *flags, "--workers", "1"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert cli.returncode == 0, cli.stderr
    ip.run_line_magic("allocconf", " ".join(["simulate", str(path), *flags]))
    return cli, capsys.readouterr().out


def test_cli_and_magic_print_the_same_simulation(ip, capsys):
    # the CLI has no kernel: the recording's settings are "current"; the magic compares with
    # what its kernel runs: torch's defaults here, as in this recording
    cli, magic = _both(ip, capsys, DEFAULTS)
    assert "why:" in cli.stdout and "peak reserved" in magic  # both rank, with the reasons
    assert _table(magic) == _table(cli.stdout)
    # the recording's sidecar gave both the device and the torch release, and both say so
    sidecar = "from the recording's sidecar cnn__default.json: device capacity 139.80 GiB"
    assert sidecar in cli.stderr and sidecar in magic
    assert "torch 2.11; device: 139.80 GiB" in magic


def test_no_rank_gives_both_the_self_checks_one_row_and_recommend_changes_nothing(ip, capsys):
    cli, magic = _both(ip, capsys, DEFAULTS, "--no-rank")
    assert _table(magic) == _table(cli.stdout)
    rows = [line for line in cli.stdout.splitlines()[4:] if line.strip()]
    assert len(rows) == 2 and rows[1].startswith("recorded: (defaults)"), cli.stdout  # header + 1
    assert "why:" not in cli.stdout and "self-check (replay under the recorded settings): " in cli.stdout
    ranked, _ = _both(ip, capsys, DEFAULTS)
    recommended, magic_recommended = _both(ip, capsys, DEFAULTS, "--recommend")
    assert recommended.stdout == ranked.stdout and _table(magic_recommended) == _table(ranked.stdout)


def test_without_a_sidecar_both_infer_the_release_the_same_way(ip, capsys, tmp_path):
    import shutil

    alone = tmp_path / "alone.pickle.gz"  # the snapshot without its recording's sidecar
    shutil.copy(DEFAULTS, alone)
    cli, magic = _both(ip, capsys, alone)
    assert _table(magic) == _table(cli.stdout)
    assert "reproduce this trace best" in cli.stderr
    assert "reproduce this trace best" in magic
    assert "from the recording's sidecar" not in cli.stderr + magic


def test_magic_simulate_compares_with_what_this_kernel_runs(ip, capsys):
    """The recording ran with expandable segments; this kernel runs max_split_size_mb:256.
    "[current]" is the kernel's (as in the What if? tab), the recording's gets "[recorded]",
    and every reason compares with the kernel's settings."""
    ip.run_line_magic("allocconf", "set max_split_size_mb:256")
    ip.run_line_magic("allocconf", "apply --no-save")
    capsys.readouterr()
    ip.run_line_magic("allocconf", f"simulate {TRACE}")
    out = capsys.readouterr().out
    assert "max_split_size_mb:256 [current]" in out
    assert "expandable_segments:True [recorded]" in out
    assert "expandable_segments:True [current]" not in out


def test_magic_simulate_reports_bad_extra_settings_as_a_usage_error(ip):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="max_split_size_mb"):
        ip.run_line_magic("allocconf", f"simulate {TRACE} --conf max_split_size_mb:1")


def test_record_without_a_gpu_still_runs_the_cell_and_says_it_did_not_record(ip, capsys):
    ip.run_cell("ran = []")
    ip.run_cell_magic("allocconf", "record", "ran.append(1)")
    out = capsys.readouterr().out
    assert ip.user_ns["ran"] == [1]  # the user's code ran
    assert "not recording" in out and "needs a CUDA GPU" in out


def test_in_a_notebook_the_table_is_html_with_the_same_cells(ip, capsys, monkeypatch):
    """Issue 24, item 5: the text table is wider than a 1400 px window's output area; a notebook
    gets an HTML table (the browser tests measure that it fits) with the very same cells."""
    import html
    import re

    from allocconf_widget.adapters import frontend

    monkeypatch.setattr(frontend, "detect_frontend", lambda *_a, **_k: frontend.Frontend.JUPYTER)
    report = ip.run_line_magic("allocconf", f"-r simulate {DEFAULTS}")
    capsys.readouterr()
    from allocconf_widget.views.text.simulate import SimulationDisplay, render_simulation

    shown = SimulationDisplay(report)
    page = shown._repr_html_()
    cells = [html.unescape(c) for c in re.findall(r"<t[dh][^>]*>([^<]*)</t[dh]>", page)]
    for line in render_simulation(report).splitlines():
        if line.startswith(("settings ", "(torch defaults)")):
            assert all(word in cells or word in " ".join(cells) for word in line.split("  ") if word)
    assert repr(shown) == render_simulation(report).rstrip("\n")  # text front ends: the table


def test_in_a_notebook_a_peak_and_its_range_each_keep_to_one_line():
    """In a narrow output area "608.00 MiB (608.00 MiB– 714.00 MiB by GPU timing)" wrapped over
    four lines: the value and its parenthesis are each unbreakable, one under the other."""
    from allocconf_widget.app.simulate import SimulationRequest, simulate
    from allocconf_widget.app.sources import file_source
    from allocconf_widget.views.text.simulate import render_simulation_html

    report = simulate(file_source(str(DATA / "streams2__frac_default.pickle.gz")),
                      SimulationRequest(confs=("", "expandable_segments:True"), workers=1))
    assert any(row.result.timing_dependent for row in report.rows)
    page = render_simulation_html(report)
    assert "<br><span style='white-space:nowrap'>(" in page and "by GPU timing)</span>" in page
