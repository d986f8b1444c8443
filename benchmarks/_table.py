"""Printing a benchmark's result rows as an aligned text table or as Markdown."""

from __future__ import annotations

from collections.abc import Sequence


def print_table(head: Sequence[str], lines: Sequence[Sequence[str]], markdown: bool) -> None:
    """One header row and ``lines`` of cells (strings), Markdown or padded columns."""
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for line in lines:
            print("| " + " | ".join(line) + " |")
        return
    widths = [max([len(h), *(len(line[i]) for line in lines)]) for i, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)))
