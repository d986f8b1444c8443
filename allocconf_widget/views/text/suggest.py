""""Did you mean" for a mistyped subcommand or choice, as option names already get it.

argparse answers ``%allocconf sett`` with "invalid choice: 'sett' (choose from …)" and no hint;
both parsers (the magic's and the CLI's) pass their error message through :func:`with_hint`.
"""

from __future__ import annotations

import argparse
import difflib
import re

_INVALID = re.compile(r"invalid choice: '?([^'\s(]+)'?")


def with_hint(parser: argparse.ArgumentParser, message: str) -> str:
    """``message``, plus "did you mean X?" when it is about an invalid choice close to one."""
    match = _INVALID.search(message)
    if match is None:
        return message
    typed = match.group(1)
    choices = [str(c) for action in parser._actions if action.choices is not None
               for c in action.choices]
    close = difflib.get_close_matches(typed, choices, n=1, cutoff=0.6)
    return f"{message}: did you mean {close[0]}?" if close else message
