"""Splitting a configuration string into positioned tokens, the way torch does, but strictly.

torch splits on ``, : [ ]`` and *deletes* whitespace (2.10+: any whitespace;
2.0–2.9: only spaces). Deleting means ``max_split_size_mb:1 28`` is read as
128; we report such glued words instead. Every token keeps its character
offset so errors can point at the exact place.
"""

from __future__ import annotations

from dataclasses import dataclass

from allocconf_widget._errors import AllocConfError
from allocconf_widget.core.versions import TorchVersion

SEPARATORS = ",:[]"
# What C's std::isspace calls whitespace in torch's "C" locale. Python's str.isspace() says yes
# to 23 more characters (no-break space, U+2028 ...) that torch keeps inside a key or value.
C_WHITESPACE_TEXT = " \t\n\v\f\r"
C_WHITESPACE = frozenset(C_WHITESPACE_TEXT)


@dataclass(frozen=True)
class Token:
    """A separator character or a word, with its start offset in the original text."""

    text: str
    pos: int

    @property
    def is_word(self) -> bool:
        return self.text not in SEPARATORS or len(self.text) > 1


def tokenize(text: str, version: TorchVersion) -> list[Token]:
    """Split ``text`` into tokens; raise on whitespace torch would treat differently than it looks."""
    tokens: list[Token] = []
    word_start: int | None = None
    gap_at: int | None = None  # offset of whitespace seen inside the current word
    for i, ch in enumerate(text):
        if ch in SEPARATORS:
            if word_start is not None:
                tokens.append(Token(text[word_start:i].rstrip(), word_start))
                word_start = None
            tokens.append(Token(ch, i))
            gap_at = None
        elif ch in C_WHITESPACE:
            _check_whitespace(i, ch, version)
            if word_start is not None and gap_at is None:
                gap_at = i
        elif _is_invisible(ch):
            _invisible_error(i, ch)
        elif word_start is None:
            word_start = i
        elif gap_at is not None:
            _glued_error(text, word_start, gap_at, i)
    if word_start is not None:
        tokens.append(Token(text[word_start:].rstrip(), word_start))
    return tokens


def _check_whitespace(i: int, ch: str, version: TorchVersion) -> None:
    if ch != " " and not version.new_parser:
        raise AllocConfError(
            f"the string contains a {_name(ch)}; torch {version} removes only spaces, so the "
            f"{_name(ch)} would become part of a key or value",
            position=i,
            fix="remove it (keep everything on one line, separated by commas)",
        )


def _is_invisible(ch: str) -> bool:
    """Whitespace torch does not remove, control and format characters: all look like nothing."""
    return ch.isspace() or not ch.isprintable()


def describe_char(ch: str) -> str:
    """``U+00A0 no-break space``: a name a user can search for, never the raw character."""
    import unicodedata

    name = unicodedata.name(ch, "")
    label = name.lower() if name else ("control character" if unicodedata.category(ch) == "Cc"
                                        else "unnamed character")
    return f"U+{ord(ch):04X} {label}"


def _invisible_error(i: int, ch: str) -> None:
    raise AllocConfError(
        f"the string contains an invisible character, {describe_char(ch)}: "
        "torch keeps it as part of the key or value (it is not whitespace to torch), so the "
        "setting would fail or be ignored",
        position=i,
        fix="delete it or replace it with a plain space (it often comes from copying a web page)",
    )


def _name(ch: str) -> str:
    return {"\t": "tab", "\n": "line break", "\r": "carriage return"}.get(ch, f"whitespace {ch!r}")


def _glued_error(text: str, start: int, gap: int, resume: int) -> None:
    left = text[start:gap].strip()
    end = resume
    while end < len(text) and text[end] not in SEPARATORS and text[end] not in C_WHITESPACE:
        end += 1
    right = text[resume:end]
    raise AllocConfError(
        f"space inside {left + ' ' + right!r}: torch deletes spaces, so it would read "
        f"{left + right!r}",
        position=gap,
        fix=f"remove the space, or put a comma between {left!r} and {right!r} if they are "
        "separate settings",
    )
