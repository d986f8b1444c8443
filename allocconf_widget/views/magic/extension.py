"""The ``%allocconf`` line/cell magic: a thin argparse front over the session and the views.

Shape borrowed from memray's magic: one parser built by a factory (its help
becomes the magic's docstring, so ``%allocconf?`` shows real usage), the line
split by :func:`~allocconf_widget.views.magic.completion.split_args` (``shlex``
that keeps backslashes, for Windows paths), argparse's ``SystemExit`` swallowed after it printed
help, and every user error raised as IPython's ``UsageError``. Subcommands live in
``views/magic/<name>.py`` modules that expose ``register(subparsers)``, listed by import in
:mod:`allocconf_widget.views.magic.commands`; their handlers take ``(args, ctx)``
(:class:`~allocconf_widget.views.magic.context.MagicContext`).
"""

from __future__ import annotations

import argparse
import io
import sys
from typing import Any

from allocconf_widget._errors import AllocConfError, RuntimeStateError, SnapshotError, printable
from allocconf_widget.views.magic import core as magic_core
from allocconf_widget.views.magic.commands import COMMANDS
from allocconf_widget.views.magic.completion import register_completer, split_args
from allocconf_widget.views.magic.context import MagicContext
from allocconf_widget.views.text.unexpected import debugging, unexpected_error


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting on bad input (turned into UsageError)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from allocconf_widget.views.text.suggest import parser_options

        super().__init__(*args, **parser_options(kwargs))

    def error(self, message: str) -> Any:
        from allocconf_widget.views.text.suggest import with_hint

        raise ValueError(f"{with_hint(self, message)}\n\n{self.format_usage().strip()}")


def build_parser() -> argparse.ArgumentParser:
    """The magic's parser; also the source of ``%allocconf?``."""
    parser = _Parser(
        prog="%allocconf",
        description=(
            "Show, tune and apply PyTorch CUDA caching-allocator settings. With no subcommand, "
            "shows the control panel."
        ),
        epilog="Docs: https://github.com/allocconf-widget/allocconf_widget/tree/main/docs",
    )
    parser.add_argument("-r", "--return-result", action="store_true",
                        help="return the subcommand's result object (for scripts and tests) "
                        "instead of only printing")
    subparsers = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", parser_class=_Parser)
    for module in COMMANDS:
        module.register(subparsers)
    return parser


def _magics_class() -> Any:
    """Build the Magics class lazily, so importing this module needs no IPython."""
    from IPython.core.error import UsageError
    from IPython.core.magic import Magics, line_cell_magic, magics_class

    @magics_class
    class AllocConfMagics(Magics):
        """IPython magics of allocconf_widget."""

        @line_cell_magic
        def allocconf(self, line: str = "", cell: str | None = None) -> Any:
            """Placeholder docstring, replaced by the parser's help below."""
            from allocconf_widget.app.session import get_session
            from allocconf_widget.views.text.suggest import parse_words

            try:  # a Ctrl-C while the parser is built or the session found: one line, as below
                parser = build_parser()
                try:
                    words = split_args(line)
                except ValueError as exc:
                    raise UsageError(str(exc)) from None
                if words[:1] == ["help"]:  # `%allocconf help [SUBCOMMAND]`, as people type it
                    words = [*(w for w in words[1:2] if w != "help"), "-h"]
                try:
                    args = parse_words(parser, words)
                except SystemExit:  # -h/--help printed the help already
                    return None
                except ValueError as exc:
                    raise UsageError(str(exc)) from None
                ctx = MagicContext(self.shell, get_session(self.shell), cell)
            except KeyboardInterrupt:
                raise UsageError("%allocconf interrupted") from None
            handler = getattr(args, "handler", None) or magic_core.run_panel
            if cell is not None and not getattr(args, "takes_cell", False):
                raise UsageError(f"%%allocconf {args.command or ''} does not take a cell body; "
                                 "use the line magic %allocconf")
            try:
                result = handler(args, ctx)
            except (AllocConfError, RuntimeStateError, SnapshotError) as exc:
                raise UsageError(str(exc)) from None
            except UsageError:  # a handler's own message
                raise
            except KeyboardInterrupt:
                # the kernel's interrupt during a long what-if: one line, as the CLI says it, not
                # a dozen frames of ours; a cell magic runs the user's code and keeps its traceback
                if getattr(args, "takes_cell", False):
                    raise
                raise UsageError(f"%allocconf {args.command or ''} interrupted") from None
            except Exception as exc:
                # a cell magic runs the user's code: its own errors keep their traceback;
                # anything else is input nobody foresaw (a file), said as the CLI says it
                if getattr(args, "takes_cell", False) or debugging():
                    raise
                raise UsageError(unexpected_error(exc)) from None
            return result if args.return_result else None

        allocconf.__doc__ = build_parser().format_help()

    return AllocConfMagics


def one_line(text: str) -> str:
    """``text`` as exactly one terminal line: newlines, escape sequences and other control
    characters (a project folder may be named with any of them) shown escaped, never obeyed."""
    return printable(text.rstrip("\n"), sys.maxsize, newlines=False)  # whole: never cut


#: ``"loaded_before"``: the saved settings were re-applied when this kernel first loaded the
#: extension; a second load (``%reload_ext``, or ``%unload_ext`` then ``%load_ext``) re-applied
#: them over what the user had set since, and called that "exported before the kernel started"
LOAD_STATE = {"loaded_before": False}


def load_extension(ipython: Any) -> None:
    """``%load_ext allocconf_widget``: register the magic, re-apply saved settings, hook OOMs."""
    from allocconf_widget.app.session import get_session

    ipython.register_magics(_magics_class())
    register_completer(ipython, build_parser)
    line = io.StringIO()
    try:
        if LOAD_STATE["loaded_before"]:
            magic_core.say_settings_kept(print_to=line)
        else:
            magic_core.restore_saved_settings(print_to=line, session=get_session(ipython))
        LOAD_STATE["loaded_before"] = True
        _dry_run_errors_in_one_line(ipython)
        if line.getvalue():
            print(one_line(line.getvalue()), file=sys.stdout)
        try:
            from allocconf_widget.views.widgets.oom import install_oom_assistant
        except ImportError:
            return
        install_oom_assistant(ipython)
    except KeyboardInterrupt:  # IPython then counts the extension as not loaded: a second
        from IPython.core.error import UsageError  # %load_ext runs all of this again

        raise UsageError("allocconf_widget: loading was interrupted; run %load_ext "
                         "allocconf_widget again") from None


def _dry_run_errors_in_one_line(ipython: Any) -> None:
    """A dry run that stops (``with allocconf_widget.dry_run(): …``) shows its one line, which names
    the user's line, not a traceback through our frames; only where no other extension handles
    exceptions its own way (IPython keeps one such handler)."""
    from allocconf_widget._errors import DryRunError

    if not getattr(ipython, "custom_exceptions", None):
        ipython.set_custom_exc((DryRunError,), _one_line)


def _one_line(shell: Any, kind: type[BaseException], value: BaseException, _tb: Any,
              tb_offset: int | None = None) -> list[str]:
    """IPython calls this for a DryRunError from a cell and shows nothing itself: show the line
    as an error (a kernel sends it to the front end as the error's whole traceback)."""
    del tb_offset
    lines = [f"{kind.__name__}: {value}"]
    shell._showtraceback(kind, value, lines)
    return lines


def unload_extension(ipython: Any) -> None:
    """``%unload_ext allocconf_widget``: remove the magic and our hooks."""
    from allocconf_widget._errors import DryRunError
    from allocconf_widget.app.session import drop_session

    if getattr(ipython, "custom_exceptions", None) == (DryRunError,):
        ipython.custom_exceptions = ()

    for kind in ("line", "cell"):
        ipython.magics_manager.magics[kind].pop("allocconf", None)
    try:
        from allocconf_widget.views.widgets.oom import uninstall_oom_assistant
    except ImportError:
        pass
    else:
        uninstall_oom_assistant(ipython)
    try:
        from allocconf_widget.views.widgets.monitor import stop_monitor
    except ImportError:
        pass
    else:
        stop_monitor()
    try:
        from allocconf_widget.app.flight import turn_off
    except ImportError:
        pass
    else:
        turn_off()  # its import watcher stayed in sys.meta_path with no magic left to stop it
    drop_session(ipython)
