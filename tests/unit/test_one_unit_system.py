"""One unit system for the bytes a user reads (docs/architecture.md).

``core/units`` defines ``KIB``/``MIB``/``GIB``/``TIB`` and ``format_bytes``; a second definition,
or a size divided by a power of two and printed with a unit by hand, is how the panel's banner
came to say "141 GiB" where every other surface said "140.72 GiB".
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "allocconf_widget"
UNITS = PACKAGE / "core" / "units.py"

#: ``MIB = 1 << 20``, ``_GiB = 2**30``, ``KB = 1024`` … at the start of a line
DEFINITION = re.compile(r"^\s*_?[KMGT]i?B\s*(?::\s*\w+\s*)?=\s*(?:1\s*<<|2\s*\*\*|1024)", re.M | re.I)
#: ``{n / 2**30:.0f} GiB``, ``{n / (1 << 20):.1f} MiB``, ``{n // 1024} KiB`` inside an f-string
BY_HAND = re.compile(r"\{[^{}]*(?:/|//)\s*\(?\s*(?:2\s*\*\*\s*\d+|1\s*<<\s*\d+|1024)[^{}]*\}\s*[KMGT]i?B\b")


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts and p != UNITS)


def offenders(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    label = path.relative_to(PACKAGE) if path.is_relative_to(PACKAGE) else path.name
    return [f"{label}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0).strip()}"
            for pattern in (DEFINITION, BY_HAND) for m in pattern.finditer(text)]


def test_units_are_defined_once_and_bytes_are_formatted_by_format_bytes():
    found = [hit for path in _modules() for hit in offenders(path)]
    assert found == [], ("import MIB/GIB and format_bytes from allocconf_widget.core.units:\n"
                         + "\n".join(found))


@pytest.mark.parametrize(("line", "hits"), [
    ("MIB = 1 << 20", 1), ("_MIB = 1 << 20", 1), ("GiB: int = 2**30", 1), ("KB = 1024", 1),
    ('x = f"{gpu.total_bytes / 2**30:.0f} GiB"', 1), ('x = f"{n / (1 << 30):.1f} GiB"', 1),
    ('x = f"{n // 1024} KiB"', 1),
    ("from allocconf_widget.core.units import MIB", 0), ('x = f"{format_bytes(n)}"', 0),
    ("LIMIT = 8 << 20", 0), ('x = f"max_split_size_mb:{n // MIB}"', 0),
])
def test_the_check_sees_a_hand_made_unit(tmp_path, line, hits):
    sample = tmp_path / "sample.py"
    sample.write_text(line + "\n")
    assert len(offenders(sample)) == hits
