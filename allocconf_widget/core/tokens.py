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
        elif ch.isspace():
            _check_whitespace(i, ch, version)
            if word_start is not None and gap_at is None:
                gap_at = i
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


def _name(ch: str) -> str:
    return {"\t": "tab", "\n": "line break", "\r": "carriage return"}.get(ch, f"whitespace {ch!r}")


def _glued_error(text: str, start: int, gap: int, resume: int) -> None:
    left = text[start:gap].strip()
    end = resume
    while end < len(text) and text[end] not in SEPARATORS and not text[end].isspace():
        end += 1
    right = text[resume:end]
    raise AllocConfError(
        f"space inside {left + ' ' + right!r}: torch deletes spaces, so it would read "
        f"{left + right!r}",
        position=gap,
        fix=f"remove the space, or put a comma between {left!r} and {right!r} if they are "
        "separate settings",
    )
