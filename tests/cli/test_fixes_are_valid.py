"""``allocconf options`` says what the huge MiB bound means (issue 24, item 14). The fixes the
errors offer: tests/unit/test_fixes_are_valid.py.
"""

from __future__ import annotations

import subprocess
import sys


def test_options_says_what_the_largest_size_means():
    # 2.10 is the first release that bounds the MiB sizes by the 64-bit ceiling; pin it so the test
    # says the same on every installed torch (2.4's CI cell has no ceiling to word)
    out = subprocess.run([sys.executable, "-m", "allocconf_widget", "options", "--torch-version", "2.13"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "no upper limit in practice" in out
    assert "at most 17592186044415 MiB" not in out
