"""The one tolerant number reader for values from files and read-backs we did not write.

Snapshots, recordings and ``memory_stats()`` dicts are read tolerantly: a missing or
malformed number means "unknown", never a crash and never a silent 0 where 0 means
something. ``True`` is not 1 here (a bool in a size field is a malformed file), and
NaN or infinity is unknown, not a number of bytes.
"""

from __future__ import annotations

import math

_MAX_DIGITS = 40  # longer digit strings are not sizes: refuse them before int() does work


def int_or_none(value: object, *, from_text: bool = False) -> int | None:
    """``value`` as an int, or None when it is missing, malformed, a bool, NaN or infinite.

    ``from_text`` also accepts a decimal string (``"128"``), as settings strings hold them.
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else None
    if from_text and isinstance(value, str):
        text = value.strip()
        digits = text[1:] if text[:1] in "+-" else text
        if digits.isascii() and digits.isdigit() and len(digits) <= _MAX_DIGITS:
            return int(text)
    return None


def int_or_zero(value: object) -> int:
    """Like :func:`int_or_none` (text accepted), with 0 for unknown: for counters and ids."""
    result = int_or_none(value, from_text=True)
    return 0 if result is None else result
