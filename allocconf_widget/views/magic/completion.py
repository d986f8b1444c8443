"""Tab completion for ``%allocconf``, and the magic's argument splitting.

Completion is derived from the magic's own argparse parser (subcommands, their
``--options`` and positional choices) and from the option schema of the
installed torch (``set`` / ``unset`` complete option names, and ``True``/``False``
or the backends after a boolean / backend name), so it can never drift from
what the parser accepts. It is registered as an IPython (≥ 8.6) matcher that,
on a ``%allocconf`` line, suppresses the Python-name matches Jupyter's kernel
would otherwise mix in (older IPython: the ``complete_command`` hook).

Splitting: ``shlex.split`` treats a backslash as an escape, so the Windows
path ``C:\\traces\\a.pickle`` became ``C:tracesa.pickle``. :func:`split_args`
keeps quotes (``"C:\\my traces\\a.pickle"`` is one argument) and every backslash.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from typing import Any

MAGIC_NAMES = ("%allocconf", "%%allocconf")
_Grammar = tuple[tuple[str, ...], dict[str, tuple[str, ...]], tuple[str, ...]]
_grammars: dict[int, _Grammar] = {}
_parser_factory: list[Callable[[], argparse.ArgumentParser]] = []


def split_args(line: str) -> list[str]:
    """Split a magic line like a shell would, except that a backslash is an ordinary character.

    Raises:
        ValueError: a quote is opened and never closed, said so.
    """
    lexer = shlex.shlex(line, posix=True)
    lexer.whitespace_split = True
    lexer.escape = ""  # Windows paths: C:\traces\a.pickle stays as typed
    lexer.commenters = ""  # '#' is a character of a value, not a comment
    try:
        return list(lexer)
    except ValueError:  # shlex: "No closing quotation"
        quote = next((q for q in ('"', "'") if line.count(q) % 2), '"')
        raise ValueError(f"a {quote} quote in {line.strip()[:200]!r} is never closed; close it "
                         f"(e.g. simulate {quote}my run.pickle{quote})") from None


def _grammar() -> _Grammar:
    """(subcommands, {subcommand: option strings and positional choices}, top-level options)."""
    if not _parser_factory:
        raise RuntimeError("register_completer() was not called")
    cached = _grammars.get(0)
    if cached is not None:
        return cached
    parser = _parser_factory[0]()
    top = tuple(s for a in parser._actions for s in a.option_strings if s not in ("-h", "--help"))
    subcommands: dict[str, tuple[str, ...]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                words: list[str] = []
                for sub_action in sub._actions:
                    words += [s for s in sub_action.option_strings if s.startswith("--")]
                    if not sub_action.option_strings and sub_action.choices:
                        words += [str(c) for c in sub_action.choices]
                subcommands[name] = tuple(w for w in words if w != "--help")
    _grammars[0] = (tuple(subcommands), subcommands, top)
    return _grammars[0]


def _option_words(partial: str) -> list[str]:
    """``name=`` for every option of the installed torch; after ``name=``, its values (bare:
    IPython completes the text after the ``=``)."""
    from allocconf_widget.core.config import options as opt
    from allocconf_widget.core.versions import resolve_version

    specs = list(opt.options_for(resolve_version(None)))
    name, sep, _value = partial.partition("=")
    if not sep:
        return [f"{spec.name}=" for spec in specs]
    spec = next((s for s in specs if s.name == name), None)
    if spec is None:
        return []
    if spec.kind is opt.Kind.BOOL:
        return ["True", "False", "default"]
    if spec.kind is opt.Kind.BACKEND:
        return ["native", "cudaMallocAsync", "default"]
    return ["default"]


def complete(text_until_cursor: str) -> list[str]:
    """The words that may come at the cursor of ``%allocconf …`` (IPython filters by prefix)."""
    subcommands, per_command, top = _grammar()
    words = text_until_cursor.split()
    partial = "" if not words or text_until_cursor[-1:].isspace() else words[-1]
    if partial:
        words = words[:-1]  # the word being completed is not yet typed
    if words and words[0] in MAGIC_NAMES:
        words = words[1:]
    command = next((w for w in words if not w.startswith("-")), None)
    if command is None:
        return [*subcommands, *top]
    if command not in per_command:
        return []
    candidates = list(per_command[command])
    if command in ("set", "unset") and not partial.startswith("-"):
        names = _option_words(partial)
        candidates = [w.rstrip("=") for w in names] if command == "unset" else names
    return candidates


def ipython_completer(_shell: Any, event: Any) -> list[str]:
    """IPython's ``complete_command`` hook signature: ``(self, event)``."""
    try:
        return complete(str(event.text_until_cursor))
    except Exception:  # completion must never print a traceback into the user's prompt
        return []


def allocconf_matcher(context: Any) -> dict[str, Any]:
    """IPython matcher (API v2): only our words on a ``%allocconf`` line, nothing elsewhere."""
    from IPython.core.completer import SimpleCompletion

    line = str(context.text_until_cursor).lstrip()
    if not line.split(maxsplit=1) or line.split(maxsplit=1)[0] not in MAGIC_NAMES:
        return {"completions": [], "suppress": False}
    try:
        words = complete(line)
    except Exception:  # completion must never print a traceback into the user's prompt
        return {"completions": [], "suppress": False}
    token = str(context.token)
    return {"completions": [SimpleCompletion(w, type="allocconf") for w in words
                            if w.startswith(token)],
            "suppress": True, "ordered": True}


allocconf_matcher.matcher_api_version = 2  # type: ignore[attr-defined]
allocconf_matcher.matcher_identifier = "allocconf"  # type: ignore[attr-defined]


def _has_matcher_api_v2() -> bool:
    """Whether this IPython calls matchers with a context (8.6+). IPython 7.34 (Colab's) also has
    a ``custom_matchers`` list, but calls its entries with the bare text: there the
    ``complete_command`` hook is the way in."""
    try:
        from IPython.core.completer import SimpleCompletion  # noqa: F401
    except ImportError:
        return False
    return True


def register_completer(ipython: Any, build_parser: Callable[[], argparse.ArgumentParser]) -> None:
    """Complete ``%allocconf`` / ``%%allocconf`` in this shell from ``build_parser()`` (idempotent)."""
    if not _parser_factory:
        _parser_factory.append(build_parser)
    completer = getattr(ipython, "Completer", None)
    matchers = getattr(completer, "custom_matchers", None)
    if isinstance(matchers, list) and _has_matcher_api_v2():
        if allocconf_matcher not in matchers:
            matchers.append(allocconf_matcher)
        return
    for name in MAGIC_NAMES:
        ipython.set_hook("complete_command", ipython_completer, str_key=name)
