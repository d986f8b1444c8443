"""What a user types to ``allocconf simulate``, and what they read.

Round 21's review as a new user found answers that changed for the worse when the user said
more (the device's true size), a flag the magic named but did not take, verdicts that hid a
changed run, and raw byte counts. Each test runs the real CLI (or the replay it prints) on real
recordings in ``tests/data`` and checks what is printed; the magic's flags are checked in
tests/shell/test_simulate_user_flags.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from allocconf_widget.core.sim.outcome import Outcome
from allocconf_widget.views.text.reasons import row_reason

DATA = Path(__file__).resolve().parents[1] / "data"
PACKAGE_DATA = Path(__file__).resolve().parents[2] / "allocconf_widget" / "data"
H200_TOTAL = 150_109_880_320  # the H200's memory as torch reports it (the sidecars')


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "allocconf_widget", "simulate", *args, "--workers", "1"],
                          capture_output=True, text=True, timeout=300, check=False)


def _body(text: str) -> str:
    """The header (but the file's name) and the table."""
    return "\n".join(line.split(" — ", 1)[-1] if line.startswith("trace: ") else line
                     for line in text.splitlines())


def test_giving_the_devices_true_size_changes_nothing_of_a_sidecars_answer():
    """``--device-total`` once threw away the sidecar's memory fraction and memory outside
    PyTorch: stating the H200's real size turned an exact self-check (89/89, 5.93 GiB) into
    44/89 and 10.69 GiB. Each option now overrides only its own fact."""
    trace = str(DATA / "cnn__frac_gc06.pickle.gz")
    plain, sized = _cli(trace), _cli(trace, "--device-total", str(H200_TOTAL))
    assert plain.returncode == sized.returncode == 0, sized.stderr
    assert _body(sized.stdout) == _body(plain.stdout)
    assert "89/89 recorded segment events reproduced" in sized.stdout
    assert "the run's memory fraction 0.056954" in sized.stderr
    # another size is used, the note says the sidecar had another, and the run keeps its limit
    # in bytes: the self-check still reproduces it (the share of the new size gave 44/89)
    other = _cli(trace, "--device-total", "79.18GiB")
    assert other.returncode == 0, other.stderr
    assert "says the device had 139.80 GiB; replayed with --device-total 79.18 GiB" in other.stderr
    assert "the run's memory limit 7.96 GiB, a fraction 0.056954 of 139.80 GiB" in other.stderr
    assert "89/89 recorded segment events reproduced" in other.stdout
    assert "limit of 7.96 GiB" in other.stdout


def test_memory_outside_pytorch_beyond_a_sidecars_device_is_refused_and_changes_nothing():
    run = _cli(str(DATA / "streams__default.pickle.gz"), "--non-pytorch", "200GB")
    assert run.returncode == 2 and not run.stdout
    assert "the memory outside PyTorch (186.26 GiB) leaves nothing of the device's 139.80 GiB" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_recorded_oom_that_fits_says_the_run_takes_another_path():
    """A batch finder under a larger fraction: the request that failed in the recording fits,
    so its handler never runs. The row once said a plain "no" (and "as recorded" for a caught
    OOM), the JSON alone carried ``path_changes_at``."""
    trace = str(DATA / "batchfind_raw__frac_default.pickle.gz")
    run = _cli(trace, "--fraction", "0.9", "--conf", "")
    assert run.returncode == 0, run.stderr
    assert "the request that failed at event 886 fits here: the run's path changes there" in run.stdout
    rows = json.loads(_cli(trace, "--fraction", "0.9", "--conf", "", "--json").stdout)
    assert rows[0]["path_changes_at"] == 886


def test_rows_predicted_to_the_end_rank_before_rows_whose_path_changes():
    from allocconf_widget.app.simulate import SimulationRequest, simulate
    from allocconf_widget.app.sources import file_source

    trace = str(DATA / "batchfind_raw__frac_default.pickle.gz")
    report = simulate(file_source(trace), SimulationRequest(rank=True, workers=1, fraction=0.06))
    changed = [row.outcome is Outcome.PATH_CHANGES for row in report.rows if not row.outcome.stops]
    assert changed == sorted(changed), "a row with an unpredicted tail ranked above a whole one"
    for row in report.rows:
        if row.result.path_changes_at is not None:
            reason = row_reason(report, row)
            assert reason is not None and "fits here" in reason


def test_rows_that_fail_where_the_current_settings_fail_get_no_better_or_worse_story():
    """Under a fraction every setting fails at the same request as the defaults: "mapping in
    20 MiB pages costs more than it saves" was the reason for expandable segments, whose peak
    was lower."""
    from allocconf_widget.app.session import Session
    from allocconf_widget.app.simulate import SimulationRequest, simulate
    from allocconf_widget.app.sources import trace_source

    report = simulate(trace_source(Session(), demo=True),
                      SimulationRequest(rank=True, workers=1, fraction=0.03))
    current = next(row for row in report.rows if row.is_current)
    assert current.result.oom is not None
    same = [row for row in report.rows if not row.is_current and row.result.oom is not None
            and row.result.events == current.result.events]
    assert same, "the demo under 0.03 no longer has rows failing with the current settings"
    for row in same:
        reason = row_reason(report, row)
        assert reason is not None and reason.endswith("the same request fails as now"), reason


def test_the_bundled_flight_recording_replays_with_its_own_facts():
    run = _cli(str(PACKAGE_DATA / "flight_oom_h200.pickle.gz"), "--conf", "")
    assert run.returncode == 0, run.stderr
    assert "from the recording's sidecar flight_oom_h200.json: device capacity 139.80 GiB" in run.stderr
    assert "torch 2.11; device: 139.80 GiB" in run.stdout and "limit of 4.00 GiB" in run.stdout
    assert "22/22 recorded segment events reproduced" in run.stdout


def test_a_setting_asked_for_twice_is_one_row():
    run = _cli(str(DATA / "cnn__default.pickle.gz"), "--no-rank", "--conf", "", "--conf", "", "--conf",
               "expandable_segments:True", "--conf", " expandable_segments:True")
    assert run.returncode == 0, run.stderr
    assert sum(line.startswith("(torch defaults)") for line in run.stdout.splitlines()) == 1
    assert sum("expandable_segments:True" in line for line in run.stdout.splitlines()) == 1


def test_an_unknown_flag_shows_the_usage_of_the_parser_it_was_given_to():
    run = _cli(str(DATA / "cnn__default.pickle.gz"), "--bogus")
    assert run.returncode == 2
    assert run.stderr.startswith("usage: allocconf simulate") and "--device-total" in run.stderr
    assert "unrecognized arguments: --bogus" in run.stderr
    top = subprocess.run([sys.executable, "-m", "allocconf_widget", "--bogus", "simulate", "x"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert top.returncode == 2 and top.stderr.startswith("usage: allocconf [-h]")


def test_a_size_that_cannot_be_read_names_its_flag():
    run = _cli(str(DATA / "cnn__default.pickle.gz"), "--device-total", "80GiB", "--non-pytorch", "abc")
    assert run.returncode == 2 and "--non-pytorch: cannot read 'abc' as a size" in run.stderr


def test_a_split_limit_beside_expandable_segments_is_blamed_on_the_pair():
    """Worse than now, the pair's reason said "mapping in 20 MiB pages costs more than it
    saves" although expandable segments alone halve this run's peak."""
    from allocconf_widget.app.simulate import SimulationRequest, simulate
    from allocconf_widget.app.sources import file_source

    report = simulate(file_source(str(DATA / "cnn__default.pickle.gz")), SimulationRequest(
        rank=True, workers=1, confs=("max_split_size_mb:256,expandable_segments:True",)))
    row = next(r for r in report.rows if r.conf == "max_split_size_mb:256,expandable_segments:True")
    reason = row_reason(report, row)
    assert reason is not None and "drop the split limit" in reason
    assert "costs more than it saves" not in reason
