"""The one unit system a user reads: binary (KiB, MiB, GiB, TiB), as torch's own messages use.

Every number of bytes shown anywhere (CLI tables, reasons, charts, the panel) goes through
:func:`format_bytes`, so the What-if bars and the rows under them can never disagree.
"""

from __future__ import annotations

import math
import re

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40
_UNITS = ((TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB"))


def format_bytes(size: int | float) -> str:
    """Binary units with two decimals; plain bytes below 1 KiB.

    >>> format_bytes(1536 * 1024 * 1024)
    '1.50 GiB'
    >>> format_bytes(512)
    '512 bytes'
    """
    magnitude = abs(size)
    for factor, unit in _UNITS:
        if magnitude >= factor:
            return f"{size / factor:.2f} {unit}"
    return f"{int(size)} bytes"


_SIZE_FACTORS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
                 "ki": KIB, "mi": MIB, "gi": GIB, "ti": TIB}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """A size a user typed: a binary unit (``GiB``) in powers of two, a decimal one (``GB``) in
    powers of ten, as written; a bare number in bytes.

    Raises:
        ValueError: not a size, or beyond 2^64 bytes; the message says what to write.
    """
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"cannot read {text[:40]!r} as a size; write bytes or e.g. 79.2GiB, 512MiB")
    number, unit = match.groups()
    value = float(number) * _SIZE_FACTORS[(unit or "").lower()]
    if not math.isfinite(value) or value >= 2**64:
        raise ValueError(f"{text[:40]!r} is larger than any device (2^64 bytes)")
    return int(value)
