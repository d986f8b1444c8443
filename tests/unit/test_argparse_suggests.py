"""A close match is suggested once: by argparse where it can (Python 3.14+), else by us.

Python 3.14's argparse suggests a close choice itself when a parser has ``suggest_on_error``
(off by default in 3.14, on in 3.15): "invalid choice: 'sett', maybe you meant 'set'? (choose
from …)". Ours ("did you mean set?") must then not be added. This machine has no 3.14, so the
argparse message is written here as 3.14's ``_check_value`` words it; the end-to-end checks run
on whichever Python runs the suite and expect exactly one suggestion in either wording (the
CLI's: tests/cli/test_argparse_suggests.py).
"""

from __future__ import annotations

import argparse
import re
import sys

import pytest

from allocconf_widget.views.text import suggest
from allocconf_widget.views.text.suggest import with_hint

ARGPARSE_314 = ("argument COMMAND: invalid choice: 'simulat', maybe you meant 'simulate'? "
                "(choose from check, options, report, simulate)")


def suggestions(text: str, meant: str) -> int:
    return len(re.findall(rf"did you mean {meant}\?|maybe you meant '{meant}'\?", text))


def _parser(**extra: object) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="allocconf")
    for name, value in extra.items():
        setattr(parser, name, value)
    parser.add_argument("command", choices=["check", "options", "report", "simulate"])
    return parser


def test_where_argparse_suggests_ours_is_not_added() -> None:
    assert with_hint(_parser(suggest_on_error=True), ARGPARSE_314) == ARGPARSE_314


def test_where_it_does_not_ours_is() -> None:
    message = "argument COMMAND: invalid choice: 'simulat' (choose from check, options, report, simulate)"
    assert suggestions(with_hint(_parser(), message), "simulate") == 1
    assert suggestions(with_hint(_parser(suggest_on_error=False), message), "simulate") == 1


def test_our_parsers_turn_argparses_suggestions_on_where_it_has_them(monkeypatch) -> None:
    monkeypatch.setattr(suggest, "ARGPARSE_SUGGESTS", True)
    assert suggest.parser_options({"prog": "x"}) == {"prog": "x", "suggest_on_error": True}
    assert suggest.parser_options({"suggest_on_error": False}) == {"suggest_on_error": False}
    monkeypatch.setattr(suggest, "ARGPARSE_SUGGESTS", False)
    assert suggest.parser_options({"prog": "x"}) == {"prog": "x"}


@pytest.mark.parametrize("build", ["cli", "magic"])
def test_every_parser_of_ours_asks_argparse_to_suggest(build: str) -> None:
    if not suggest.ARGPARSE_SUGGESTS:
        pytest.skip(f"Python {sys.version.split()[0]}'s argparse has no suggest_on_error (3.14+)")
    if build == "cli":
        from allocconf_widget.views.cli.main import build_parser
    else:
        pytest.importorskip("IPython")
        from allocconf_widget.views.magic.extension import build_parser
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert parser.suggest_on_error  # type: ignore[attr-defined]
    assert all(sub.suggest_on_error for sub in subparsers.choices.values())
