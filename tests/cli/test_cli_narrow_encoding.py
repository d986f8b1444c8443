"""The CLI on a stdout that is not UTF-8 (Windows' cp1252 when redirected to a file, a Latin-1
locale): the tables' "−" and "—" come out escaped, the command succeeds. It raised
UnicodeEncodeError halfway through the table and blamed the input file (an attack pass)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trace_builder import TraceBuilder

MiB = 1 << 20


@pytest.mark.parametrize("encoding", ["cp1252", "ascii"])
def test_simulate_and_options_write_to_a_narrow_encoding(tmp_path: Path, encoding: str) -> None:
    b = TraceBuilder()
    b.segment("segment_alloc", 0x10000000, 20 * MiB)
    b.free(b.alloc(20 * MiB))
    path = tmp_path / "run.pickle"
    path.write_bytes(pickle.dumps(b.snapshot(), protocol=4))
    env = dict(os.environ, PYTHONIOENCODING=encoding)
    for args in (["simulate", "--workers", "1", str(path)], ["options", "--markdown"]):
        run = subprocess.run([sys.executable, "-m", "allocconf_widget", *args], capture_output=True,
                             env=env, timeout=300, check=False)
        assert run.returncode == 0, run.stderr.decode(encoding, "replace")
        assert b"could not be processed" not in run.stderr
    simulate = subprocess.run([sys.executable, "-m", "allocconf_widget", "simulate", "--workers", "1",
                               str(path)], capture_output=True, env=env, timeout=300, check=True)
    assert b"1 \\u2212 alloc/res" in simulate.stdout  # the table's header, escaped not lost
