"""A mistyped subcommand of ``allocconf`` gets "did you mean", as a mistyped option name does
(issue 24, item 12). The magic's: tests/shell/test_subcommand_hint.py."""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_suggests_the_subcommand():
    run = subprocess.run([sys.executable, "-m", "allocconf_widget", "simulat", "--demo"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2
    assert "did you mean simulate?" in run.stderr or "maybe you meant 'simulate'?" in run.stderr
    assert "Traceback" not in run.stderr
