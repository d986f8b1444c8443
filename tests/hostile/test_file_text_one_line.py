"""Text from a file is shown as one line, escaped, wherever it is shown; ``--json`` keeps it exact.

A newline in a shared dry-run file's GPU name must not add a line of the file's choosing to
``allocconf simulate``'s report (here a fake verdict); nor may the snapshot's path, its sidecar's
name, a trace action, an allocator setting or a rank record's host and note. Each case below puts
``FORGED`` after a newline (and an escape sequence) in one of them and checks that no line of
the output starts with it.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.hostile.bombs import valid_snapshot

FORGED = "verdict: every setting fits."
EVIL = f"T4\n{FORGED}\x1b[31m"


def _forged_lines(text: str) -> list[str]:
    """Lines the file wrote: a newline before ``FORGED`` starts one with it."""
    return [line for line in text.splitlines() if line.lstrip().startswith(FORGED)]


def _write(path: Path, snapshot: dict[str, Any]) -> Path:
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    return path


def _snapshot() -> dict[str, Any]:
    snapshot: dict[str, Any] = pickle.loads(valid_snapshot())
    return snapshot


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "allocconf_widget", *args], capture_output=True,
                          text=True, timeout=300, check=False)


def _dry_run_file(tmp_path: Path, name: str = "step.pickle") -> Path:
    snapshot = _snapshot()
    snapshot["allocconf_dry_run"] = {"gpu": "t4", "gpu_name": EVIL, "torch": "2.11", "ops": 2,
                                     "notes": [EVIL]}
    return _write(tmp_path / name, snapshot)


def test_a_dry_run_files_gpu_name_stays_on_the_trace_line(tmp_path: Path) -> None:
    done = _cli("simulate", str(_dry_run_file(tmp_path)))
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert _forged_lines(out) == [], out
    trace = next(line for line in done.stdout.splitlines() if line.startswith("trace: "))
    assert "T4\\x0averdict: every setting fits.\\x1b[31m" in trace  # said, escaped, on its line
    assert "\x1b" not in out


def test_a_path_and_its_sidecars_name_stay_on_their_lines(tmp_path: Path) -> None:
    path = _dry_run_file(tmp_path, f"run\n{FORGED}.pickle")
    (tmp_path / f"run\n{FORGED}.json").write_text(json.dumps(
        {"device_total_bytes": 16 << 30, "free_at_start_bytes": 15 << 30, "torch": "2.11"}))
    done = _cli("simulate", str(path))
    assert done.returncode == 0, done.stderr
    assert _forged_lines(done.stdout + done.stderr) == []
    assert "run\\x0averdict" in done.stdout and "run\\x0averdict" in done.stderr
    missing = _cli("simulate", str(tmp_path / f"gone\n{FORGED}.pickle"))
    assert missing.returncode == 2 and _forged_lines(missing.stderr) == []


def test_a_trace_action_and_a_setting_from_the_file_stay_on_their_lines(tmp_path: Path) -> None:
    snapshot = _snapshot()
    snapshot["device_traces"][0].append({"action": f"free\n{FORGED}", "addr": 1, "size": 512,
                                         "stream": 0, "time_us": 10**6})
    snapshot["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": f"x\n{FORGED}"}
    path = _write(tmp_path / "run.pickle", snapshot)
    simulated = _cli("simulate", str(path))
    assert simulated.returncode == 0, simulated.stderr
    assert _forged_lines(simulated.stdout + simulated.stderr) == []
    assert "free\\x0averdict" in simulated.stdout  # the action, counted on the trace line
    moved = tmp_path / f"moved\n{FORGED}.pickle"
    path.rename(moved)
    report = _cli("report", str(moved))
    assert report.returncode == 0, report.stderr
    assert _forged_lines(report.stdout) == [] and "x\\x0averdict" in report.stdout
    assert report.stdout.startswith("snapshot: ") and "moved\\x0averdict" in report.stdout
    wrong_device = _cli("report", str(moved), "--device", "3")
    assert wrong_device.returncode == 2 and _forged_lines(wrong_device.stderr) == []


def test_the_magic_shows_the_same_one_line(tmp_path: Path) -> None:
    path = _dry_run_file(tmp_path)
    code = ("import sys\nfrom IPython.testing.globalipapp import start_ipython\n"
            "ip = start_ipython()\nip.run_line_magic('load_ext', 'allocconf_widget')\n"
            "r = ip.run_cell('%allocconf simulate ' + sys.argv[1])\n"
            "print('ERROR', type(r.error_in_exec).__name__)")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                          timeout=300, check=False, cwd=tmp_path)
    assert "ERROR NoneType" in done.stdout, done.stdout[-3000:]
    assert _forged_lines(done.stdout) == []
    assert "T4\\x0averdict" in done.stdout


def test_a_rank_records_text_stays_on_its_line(tmp_path: Path) -> None:
    from allocconf_widget.core.memory.ranks import RECORD_VERSION, parse_rank_record

    record = parse_rank_record(json.dumps({
        "v": RECORD_VERSION, "rank": 0, "pid": 4242, "host": f"node\n{FORGED}", "seq": 1,
        "wall": 1.8e9, "interval": 1.0, "status": "sampling", "devices": [],
        "settings_variable": "PYTORCH_CUDA_ALLOC_CONF", "settings_text": f"a\n{FORGED}",
        "note": f"n\n{FORGED}", "effective": {f"k\n{FORGED}": 1}}))
    texts = [record.host, record.settings_text or "", record.note or "", *(record.effective or {})]
    assert all("\n" not in text and "\\x0a" in text for text in texts)


@pytest.mark.parametrize("name", ["a\rb", "a\u2028b", "a\x85b", "a\x0bb"])
def test_every_line_break_is_escaped(name: str) -> None:
    from allocconf_widget._errors import one_line

    shown = one_line(name)
    assert len(shown.splitlines()) == 1 and shown.startswith("a\\") and shown.endswith("b")
