"""What a user types to ``%allocconf simulate``: the flags its notes name are flags it takes,
and a bad one is a usage error that says why. The same for ``allocconf simulate``:
tests/cli/test_simulate_user_flags.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data"


def test_the_magic_takes_the_flags_its_notes_name(ip, capsys):
    """``%allocconf simulate`` told users to "give --device-total", then refused the flag."""
    from IPython.core.error import UsageError

    trace = DATA / "batchfind_raw__frac_default.pickle.gz"
    ip.run_line_magic("allocconf", f"simulate {trace} --device-total 79.18GiB --torch-version 2.11 "
                      "--non-pytorch 600MiB")
    out = capsys.readouterr().out
    assert "torch 2.11; device: 79.18 GiB (78.59 GiB usable by PyTorch)" in out
    with pytest.raises(UsageError, match=r"--device-total '0\.5MiB' is less than 1 MiB"):
        ip.run_line_magic("allocconf", f"simulate {trace} --device-total 0.5MiB")
    with pytest.raises(UsageError, match="give a trace file or --demo, not both"):
        ip.run_line_magic("allocconf", f"simulate --demo {trace}")
    with pytest.raises(UsageError, match="usage: %allocconf simulate") as refused:
        ip.run_line_magic("allocconf", f"simulate {trace} --bogus")
    assert "--device-total" in str(refused.value)
