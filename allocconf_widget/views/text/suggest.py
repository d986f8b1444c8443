""""Did you mean" for a mistyped subcommand or choice, as option names already get it.

Up to Python 3.13 argparse answers ``%allocconf sett`` with "invalid choice: 'sett' (choose
from …)" and no hint; both parsers (the magic's and the CLI's) pass their error message through
:func:`with_hint`. From 3.14 argparse can suggest itself (``suggest_on_error``, on by default
from 3.15): both parsers turn it on (:func:`parser_options`) and :func:`with_hint` then adds
nothing, so a suggestion is said once, in argparse's words.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import re
from typing import Any

_INVALID = re.compile(r"invalid choice: '?([^'\s(]+)'?")

#: whether this Python's argparse suggests close choices itself (3.14+)
ARGPARSE_SUGGESTS = "suggest_on_error" in inspect.signature(argparse.ArgumentParser).parameters


def parser_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for an ``ArgumentParser`` of ours, with argparse's own suggestions on where
    this Python has them (unless the caller decided)."""
    if ARGPARSE_SUGGESTS:
        kwargs.setdefault("suggest_on_error", True)
    return kwargs


def with_hint(parser: argparse.ArgumentParser, message: str) -> str:
    """``message``, plus "did you mean X?" when it is about an invalid choice close to one;
    unchanged where argparse suggests itself (it has said its suggestion, or found none)."""
    if getattr(parser, "suggest_on_error", False):
        return message
    match = _INVALID.search(message)
    if match is None:
        return message
    typed = match.group(1)
    choices = [str(c) for action in parser._actions if action.choices is not None
               for c in action.choices]
    close = difflib.get_close_matches(typed, choices, n=1, cutoff=0.6)
    return f"{message}: did you mean {close[0]}?" if close else message


def parse_words(parser: argparse.ArgumentParser, words: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args(words)``, except that arguments nobody takes are refused by the
    subcommand's parser: argparse's own refusal printed the top-level usage (``allocconf
    [-h] [--version] COMMAND ...``) for ``allocconf simulate F --bogus``, not simulate's options."""
    import sys

    given = list(sys.argv[1:] if words is None else words)
    args, extra = parser.parse_known_args(given)
    if extra:
        command = getattr(args, "command", None)
        subparsers = [action for action in parser._actions
                      if isinstance(action, argparse._SubParsersAction)]
        sub = subparsers[0].choices.get(command) if subparsers and command else None
        # a flag typed before the subcommand (``allocconf --bogus simulate F``) is the top
        # level's to refuse
        at = given.index(command) if command in given else len(given)
        if sub is None or any(given.index(word) < at for word in extra if word in given):
            sub = parser
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    return args
