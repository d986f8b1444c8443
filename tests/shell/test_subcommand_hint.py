"""A mistyped subcommand of ``%allocconf`` gets "did you mean", as a mistyped option name does
(issue 24, item 12). The CLI's: tests/cli/test_subcommand_hint.py."""

from __future__ import annotations

import re

import pytest


@pytest.mark.parametrize(("typed", "meant"), [("sett max_split_size_mb=256", "set"), ("shwo", "show"),
                                              ("simulte --demo", "simulate")])
def test_the_magic_suggests_the_subcommand(ip, typed, meant):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match=rf"invalid choice: '{typed.split()[0]}'") as info:
        ip.run_line_magic("allocconf", typed)
    said = str(info.value)  # once: ours, or argparse's own from Python 3.14 (suggest_on_error)
    assert len(re.findall(rf"did you mean {meant}\?|maybe you meant '{meant}'\?", said)) == 1, said


def test_a_word_close_to_nothing_gets_no_guess(ip):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError) as info:
        ip.run_line_magic("allocconf", "xyzzy")
    assert "did you mean" not in str(info.value) and "maybe you meant" not in str(info.value)
