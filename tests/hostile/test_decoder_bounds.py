"""Values the checks let through must fit what the decoder keeps them in.

An attack pass (round 21) found addresses and times the field checks accepted (an address of
2^63, a time of ±2^63 or 1e300) that overflowed the decoder's signed 64-bit columns: the user
read "the input could not be processed (OverflowError) ... please report this" instead of the
field at fault. And a request for a device without a trace listed every device that has one: a
1.5 MB line for a 1 MB file of 200,000 one-entry traces.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

MiB = 1 << 20


def _snapshot(entry: dict[str, Any]) -> dict[str, Any]:
    base = {"action": "alloc", "addr": 1 << 40, "size": 2 * MiB, "stream": 0, "time_us": 1_000}
    trace = [{**base, "action": "segment_alloc", "addr": 1 << 40}, {**base, **entry}]
    return {"segments": [], "device_traces": [trace]}


def _cli(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "allocconf_widget", "simulate", str(path), *args],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(("entry", "field"), [
    ({"action": "segment_alloc", "addr": 1 << 63}, "device_traces[0][1].addr"),
    ({"time_us": 1 << 63}, "device_traces[0][1].time_us"),
    ({"time_us": -(1 << 63) - 1}, "device_traces[0][1].time_us"),
    ({"time_us": 1e300}, "device_traces[0][1].time_us"),
])
def test_a_value_beyond_the_decoders_columns_is_refused_by_name(tmp_path: Path, entry: dict[str, Any],
                                                                field: str) -> None:
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps(_snapshot(entry)))
    run = _cli(path)
    assert run.returncode == 2 and not run.stdout
    assert field in run.stderr and "outside" in run.stderr
    assert "please report" not in run.stderr and "Traceback" not in run.stderr


def test_a_device_without_a_trace_names_a_few_devices_that_have_one(tmp_path: Path) -> None:
    entry = {"action": "alloc", "addr": 1 << 40, "size": 512, "stream": 0}
    path = tmp_path / "many.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[entry]] * 20_000}))
    run = _cli(path, "--device", "20005")
    assert run.returncode == 2
    assert "devices with a trace: 0, 1, 2, 3, 4, 5, 6, 7 and 19,992 more" in run.stderr
    assert len(run.stderr) < 2_000
