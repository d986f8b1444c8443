"""The one aligned-table printer for every text front end (CLI, magic, terminal panel)."""

from __future__ import annotations

from collections.abc import Sequence


def aligned_table(rows: Sequence[Sequence[str]], *, indent: str = "") -> list[str]:
    """Rows as lines: the first column left-aligned, the others right-aligned (numbers).

    The first row is usually the header. Trailing spaces are stripped, so a table
    pasted into an issue stays tidy.
    """
    if not rows:
        return []
    count = max(len(row) for row in rows)
    padded = [list(row) + [""] * (count - len(row)) for row in rows]
    widths = [max(len(row[i]) for row in padded) for i in range(count)]
    lines = []
    for row in padded:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines
