"""``allocconf`` suggests a close subcommand once, in argparse's words (Python 3.14+) or ours.
Which parser suggests what: tests/unit/test_argparse_suggests.py.
"""

from __future__ import annotations

import subprocess
import sys

from tests.unit.test_argparse_suggests import suggestions


def test_the_cli_suggests_once() -> None:
    run = subprocess.run([sys.executable, "-m", "allocconf_widget", "simulat", "--demo"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2
    assert suggestions(run.stderr, "simulate") == 1, run.stderr
