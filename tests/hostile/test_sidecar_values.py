"""A well-formed sidecar with absurd values beside a real recording: advice, not law.

``tests/data/cnn__default`` is a real H200 run that reserved 10.69 GiB. Each case below changes
one fact of its sidecar to a value of the right type that the trace itself proves wrong (or
that no device has). The replay must ignore that fact alone, name it in a note, keep the
others (the device's 139.80 GiB, torch 2.11) and reproduce the run, never "OOM at event 1"
or a refusal asking for a fraction the user never gave.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from allocconf_widget.core.memory.recording import read_sidecar
from allocconf_widget.core.memory.snapshot import load_snapshot
from allocconf_widget.core.sim.trace.extract import extract_trace
from tests.recordings import DATA

RUN = "cnn__default"
TOTAL = 150109880320  # the H200's memory, as the sidecar gives it

#: case → (changed sidecar fields, the key named as ignored, facts still used)
CASES: dict[str, tuple[dict[str, Any], str, tuple[str, ...]]] = {
    "tiny fraction": ({"fraction": 1e-7}, "fraction", ("139.80 GiB", "torch 2.11")),
    "half the peak as fraction": ({"fraction": 0.03}, "fraction", ("139.80 GiB", "torch 2.11")),
    "fraction above 1": ({"fraction": 5}, "fraction", ("139.80 GiB", "torch 2.11")),
    "one byte free": ({"free_at_start_bytes": 1}, "free_at_start_bytes", ("139.80 GiB", "torch 2.11")),
    "nothing free": ({"free_at_start_bytes": 0}, "free_at_start_bytes", ("139.80 GiB", "torch 2.11")),
    "free above the device": ({"free_at_start_bytes": 2 * TOTAL}, "free_at_start_bytes",
                              ("139.80 GiB", "torch 2.11")),
    "1 MiB device": ({"device_total_bytes": 1 << 20}, "device_total_bytes", ("torch 2.11",)),
    "device below the peak": ({"device_total_bytes": 8 << 30, "free_at_start_bytes": 7 << 30},
                              "device_total_bytes", ("torch 2.11",)),
    "1 KiB device": ({"device_total_bytes": 1024}, "device_total_bytes", ("torch 2.11",)),
    "torch older than the snapshot": ({"torch": "2.4.1"}, "torch", ("139.80 GiB",)),
    "torch never released": ({"torch": "9.1"}, "torch", ("139.80 GiB",)),
}


def _pair(tmp_path: Path, changes: dict[str, Any]) -> Path:
    snapshot = tmp_path / f"{RUN}.pickle.gz"
    shutil.copyfile(DATA / f"{RUN}.pickle.gz", snapshot)
    meta = json.loads((DATA / f"{RUN}.json").read_text(encoding="utf-8"))
    meta.update(changes)
    (tmp_path / f"{RUN}.json").write_text(json.dumps(meta), encoding="utf-8")
    return snapshot


@pytest.mark.parametrize("case", list(CASES))
def test_the_fact_the_trace_contradicts_is_ignored_and_named(tmp_path: Path, case: str) -> None:
    from allocconf_widget.core.sim.sidecar_check import check_sidecar

    changes, key, _ = CASES[case]
    path = _pair(tmp_path, changes)
    snapshot = load_snapshot(path)
    checked = check_sidecar(read_sidecar(path), extract_trace(snapshot), snapshot)
    assert [fact.key for fact in checked.ignored] == [key]
    assert checked.notes and f"ignored the sidecar {RUN}.json's {key} " in checked.notes[0]
    facts = checked.facts
    assert facts is not None
    if key != "device_total_bytes":
        assert facts.device_total_bytes == TOTAL  # the others are kept
    if key != "torch":
        assert facts.torch_version == "2.11.0+cu130"


def test_the_real_sidecar_is_kept_whole(tmp_path: Path) -> None:
    from allocconf_widget.core.sim.sidecar_check import check_sidecar

    path = _pair(tmp_path, {})
    snapshot = load_snapshot(path)
    checked = check_sidecar(read_sidecar(path), extract_trace(snapshot), snapshot)
    assert checked.ignored == () and checked.notes == ()


@pytest.mark.parametrize("case", list(CASES))
def test_the_cli_replays_the_run_as_recorded(tmp_path: Path, case: str) -> None:
    changes, key, kept = CASES[case]
    done = subprocess.run([sys.executable, "-m", "allocconf_widget", "simulate",
                           str(_pair(tmp_path, changes))],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"ignored the sidecar {RUN}.json's {key} " in done.stderr
    used = next(line for line in done.stderr.splitlines() if "from the recording's sidecar" in line)
    assert all(fact in used for fact in kept)
    assert "44/44 recorded segment events reproduced" in done.stdout
    assert "OOM at event" not in done.stdout and "at event 1 " not in done.stdout


def test_the_magic_says_the_same(tmp_path: Path) -> None:
    path = _pair(tmp_path, {"free_at_start_bytes": 1})
    code = ("import sys\nfrom IPython.testing.globalipapp import start_ipython\n"
            "ip = start_ipython()\nip.run_line_magic('load_ext', 'allocconf_widget')\n"
            "r = ip.run_cell('%allocconf simulate ' + sys.argv[1])\n"
            "print('ERROR', type(r.error_in_exec).__name__)")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=300, check=False, cwd=tmp_path,
                          env={**_env(), "XDG_CONFIG_HOME": str(tmp_path)})
    assert "ERROR NoneType" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"ignored the sidecar {RUN}.json's free_at_start_bytes 1: " in done.stdout
    assert "44/44 recorded segment events reproduced" in done.stdout


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
