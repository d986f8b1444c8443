"""A malformed sidecar ``<name>.json`` beside a valid snapshot: ignored with a note (issue 22, item 11).

The sidecar is optional (it only adds the device's size and the torch release), so a bad one
must never make ``allocconf simulate`` refuse the valid snapshot beside it, nor end
``%allocconf simulate FILE`` in a raw KeyError / OverflowError.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostile.bombs import valid_snapshot

GIB = 1 << 30
_TOTAL = f'"device_total_bytes": {80 * GIB}'
BAD_SIDECARS = {
    "object for a list": "{" + _TOTAL + ', "timeline_keys": {"t_s": 1}, "timeline": [[0]]}',
    "object for the rows": "{" + _TOTAL + ', "timeline": {"a": [1]}}',
    "1e999": '{"device_total_bytes": 1e999, "free_at_start_bytes": 1e999}',
    "400 digits": '{"device_total_bytes": 1' + "0" * 399 + ', "free_at_start_bytes": 5}',
    "negative free": '{"device_total_bytes": ' + str(GIB) + ', "free_at_start_bytes": -1'
                     + "0" * 30 + "}",
    "steps of objects": "{" + _TOTAL + ', "steps": [{"a": 1}, 5, null]}',
    "torch a list": "{" + _TOTAL + ', "torch": ["2.11"]}',
}


def _pair(tmp_path: Path, sidecar: str) -> Path:
    snapshot = tmp_path / "run.pickle"
    snapshot.write_bytes(valid_snapshot())
    (tmp_path / "run.json").write_text(sidecar)
    return snapshot


@pytest.mark.parametrize("case", list(BAD_SIDECARS))
def test_the_cli_replays_the_snapshot_and_notes_the_bad_sidecar(tmp_path: Path, case: str) -> None:
    snapshot = _pair(tmp_path, BAD_SIDECARS[case])
    done = subprocess.run([sys.executable, "-m", "allocconf_widget", "simulate", str(snapshot)],
                          capture_output=True, text=True, timeout=120, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-2000:]
    assert "Traceback" not in out
    if case not in ("negative free", "torch a list"):  # those facts are dropped, the rest is used
        assert "ignored the sidecar run.json" in out, out[-2000:]


@pytest.mark.parametrize("case", ["object for a list", "1e999", "400 digits"])
def test_the_magic_replays_the_snapshot_and_notes_the_bad_sidecar(tmp_path: Path, case: str) -> None:
    snapshot = _pair(tmp_path, BAD_SIDECARS[case])
    code = ("import sys\nfrom IPython.testing.globalipapp import start_ipython\n"
            "ip = start_ipython()\nip.run_line_magic('load_ext', 'allocconf_widget')\n"
            "r = ip.run_cell('%allocconf simulate ' + sys.argv[1])\n"
            "print('ERROR', type(r.error_in_exec).__name__)")
    done = subprocess.run([sys.executable, "-c", code, str(snapshot)], capture_output=True,
                          text=True, timeout=120, check=False, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert "ERROR NoneType" in done.stdout, out[-3000:]
    assert "ignored the sidecar run.json" in out and "Traceback" not in out


@pytest.mark.parametrize("case", list(BAD_SIDECARS))
def test_read_sidecar_never_raises(tmp_path: Path, case: str) -> None:
    from allocconf_widget.core.memory.recording import read_sidecar

    read = read_sidecar(_pair(tmp_path, BAD_SIDECARS[case]))
    if read.facts is not None:
        total = read.facts.device_total_bytes
        assert total is None or 0 < total <= 1 << 50
        nonpt = read.facts.non_pytorch_bytes
        assert nonpt is None or (total is not None and 0 <= nonpt <= total)
