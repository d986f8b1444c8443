"""The one unit system a user reads: binary (KiB, MiB, GiB, TiB), as torch's own messages use.

Every number of bytes shown anywhere (CLI tables, reasons, charts, the panel) goes through
:func:`format_bytes`, so the What-if bars and the rows under them can never disagree.
"""

from __future__ import annotations

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40
_UNITS = ((TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB"))


def format_bytes(size: int | float) -> str:
    """Binary units with two decimals (``1.51 GiB``); plain bytes below 1 KiB.

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
