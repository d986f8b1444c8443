"""Command line: ``allocconf`` and ``python -m allocconf_widget``.

Each subcommand lives in its own module of ``views/cli/`` exposing
``register(subparsers)``, listed by import in :mod:`allocconf_widget.views.cli.commands`;
``register`` adds a parser and sets ``handler=<callable(args) -> exit code>``. The
dispatcher stays this small, and imports stay lazy: only the chosen subcommand's
dependencies are loaded.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from allocconf_widget._errors import AllocConfError, SnapshotError
from allocconf_widget.views.text.unexpected import debugging, unexpected_error


class _Parser(argparse.ArgumentParser):
    """argparse with "did you mean" for a mistyped subcommand or choice."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from allocconf_widget.views.text.suggest import parser_options

        super().__init__(*args, **parser_options(kwargs))

    def error(self, message: str) -> NoReturn:
        from allocconf_widget.views.text.suggest import with_hint

        super().error(with_hint(self, message))


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every subcommand that is installed."""
    parser = _Parser(
        prog="allocconf",
        description=(
            "Check, explain, measure and simulate PyTorch CUDA caching-allocator settings "
            "(PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF). Needs no GPU."
        ),
    )
    from allocconf_widget._version import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    from allocconf_widget.views.cli.commands import COMMANDS

    for module in COMMANDS:
        module.register(subparsers)
    return parser


#: the shell's code for a command ended by Ctrl-C (128 + SIGINT)
INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (0 ok, 2 bad input, 1 other failure, 130
    interrupted: Ctrl-C during a long what-if ends it with one line, not a 40-line traceback;
    so does one while the parser is being built, the command's first tenth of a second)."""
    _tolerate_narrow_encodings()
    try:
        parser = build_parser()
        from allocconf_widget.views.text.suggest import parse_words

        args = parse_words(parser, None if argv is None else list(argv))
        handler = getattr(args, "handler", None)
        if handler is None:
            parser.print_help()
            return 2
        return int(handler(args))
    except BrokenPipeError:  # `allocconf options | head`
        return 0
    except KeyboardInterrupt:
        print("allocconf: interrupted", file=sys.stderr)
        return INTERRUPTED
    except (AllocConfError, SnapshotError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a file or value we did not foresee: a message, never a traceback
        if debugging():
            raise
        print(f"error: {unexpected_error(exc)}", file=sys.stderr)
        return 2


def _tolerate_narrow_encodings() -> None:
    """Write what the terminal's or file's encoding lacks as an escape (``\\u2212``), never fail.

    The tables say "1 − alloc/res" and "—": on Windows a redirected ``allocconf simulate >
    out.txt`` writes cp1252, which has no "−", and Python raised UnicodeEncodeError halfway
    through the table, reported as a bad input file."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # a TextIOWrapper; a test's capture may not be
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError):  # closed, or a stream that refuses
                reconfigure(errors="backslashreplace")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
