"""Exception and warning types shared by every layer.

Kept in a module of its own so the pure core, the adapters and the views can
all raise the same types without importing each other.
"""

from __future__ import annotations

_MAX_MESSAGE = 2000


def printable(text: str, limit: int = _MAX_MESSAGE, *, newlines: bool = True) -> str:
    """``text`` safe to show: control characters escaped, and cut to ``limit`` characters.

    Every message that quotes user or file input goes through this, so a NUL or an
    escape sequence never reaches a terminal raw, and a huge value never builds a huge line.
    ``newlines=False`` escapes newlines too, for a name that must stay on its one line (a
    folder named with one could forge a line of its own).
    """
    if len(text) > limit:
        text = f"{text[:limit]}… ({len(text) - limit} more characters)"
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or (newlines and c == "\n") else f"\\x{ord(c):02x}"
                   if ord(c) < 256 else f"\\u{ord(c):04x}" for c in text)


def one_line(text: str, limit: int = _MAX_MESSAGE) -> str:
    """``text`` from a file or a user's argument, shown as exactly one line: every newline and
    other line break, escape sequence and control character escaped (:func:`printable`), so a
    file's GPU name or path cannot add a line of its choosing to a report."""
    return printable(text, limit, newlines=False)



class AllocConfError(ValueError):
    """A configuration string (or a value for one option) that torch would reject or misread.

    Attributes:
        option: the option the problem is in, or ``None`` when it is not tied to one.
        position: 0-based character offset into the text that was parsed, when known.
        fix: one sentence telling the user what to write instead.
    """

    def __init__(
        self,
        message: str,
        *,
        option: str | None = None,
        position: int | None = None,
        fix: str | None = None,
    ) -> None:
        self.option = option
        self.position = position
        self.fix = fix
        self.reason = message = printable(message)
        fix = printable(fix) if fix else fix
        text = message
        if position is not None:
            text = f"{text} (at character {position + 1})"  # counted from 1, as people count
        if fix:
            text = f"{text}. Fix: {fix}"
        super().__init__(text)


class AllocConfWarning(UserWarning):
    """A setting torch accepts but that probably does not do what the user hopes."""


class SnapshotError(ValueError):
    """A snapshot or trace file that cannot be read safely (corrupt, truncated, or not a snapshot)."""


class RuntimeStateError(RuntimeError):
    """An action that the current torch runtime state does not allow (e.g. no CUDA)."""


class DryRunError(RuntimeStateError):
    """The dry run cannot go on (an op needs real values, or this torch cannot fake CUDA)."""
