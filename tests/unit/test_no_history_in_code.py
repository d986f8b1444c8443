"""Comments and docstrings say what the code does and why, not how it got there.

Measurements, bug stories and review rounds belong in commit messages, ``CHANGELOG.md`` and the
current docs page of the topic, which says how to re-measure a figure; a constant that rests on
a measurement names that page. This test counts history markers in the package's comments and
docstrings (``tokenize``: comment tokens, and strings that are a statement of their own) and
holds them to at most three per 1,000 lines of product code. Doctest examples are code, not
prose, and are not read. When it fails it prints every hit as ``file:line: text``.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "allocconf_widget"

#: at most this many markers per 1,000 lines of the package's Python files
LIMIT_PER_1000_LINES = 3

_COUNT = r"\d{1,3}(?:,\d{3})+|\d+"
#: what a history marker looks like, by name
MARKERS: dict[str, re.Pattern[str]] = {
    "issue N": re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE),
    "round N": re.compile(r"\brounds?\s+\d+", re.IGNORECASE),
    "H100/H200": re.compile(r"\bH[12]00\b"),
    "a/b count": re.compile(rf"(?<![\w./])({_COUNT})\s?/\s?({_COUNT})(?![\w./])"),
    "measurement": re.compile(r"(?<![\w.])[-+−]?\d[\d,]*(?:\.\d+)?\s?(?:ms|s|%|GiB|MiB)(?!\w)"),
    "it said": re.compile(r"\bit said\b", re.IGNORECASE),
    "once replayed/showed": re.compile(r"\bonce (?:replayed|showed)\b", re.IGNORECASE),
    "used to": re.compile(r"\bused to\b", re.IGNORECASE),
}

_STATEMENT_START = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
_SKIPPED = {tokenize.NL, tokenize.COMMENT}


def _is_count(match: re.Match[str]) -> bool:
    """``86/88`` is a count of runs or cases; ``9/8`` or ``1/2`` is a ratio."""
    part, whole = (int(group.replace(",", "")) for group in match.groups())
    return part <= whole and whole >= 10


def _docstring_lines(first_line: int, text: str) -> Iterator[tuple[int, str]]:
    """The prose lines of a string statement, less doctest examples (``>>>`` to the next blank line)."""
    in_example = False
    for offset, line in enumerate(text.split("\n")):
        stripped = line.strip()
        if stripped.startswith(">>>"):
            in_example = True
        elif not stripped:
            in_example = False
        if not in_example:
            yield first_line + offset, line


def prose(source: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of every comment and every string that is a statement of its own."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    previous = tokenize.NEWLINE
    for index, token in enumerate(tokens):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
        elif token.type == tokenize.STRING and previous in _STATEMENT_START:
            following = index + 1
            while tokens[following].type in _SKIPPED:
                following += 1
            if tokens[following].type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                yield from _docstring_lines(token.start[0], token.string)
        if token.type not in _SKIPPED:
            previous = token.type


def history_markers(path: Path) -> list[str]:
    """``file:line: [marker] text`` for each marker in ``path``'s comments and docstrings."""
    label = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path.name
    hits = []
    for line, text in prose(path.read_text(encoding="utf-8")):
        for name, pattern in MARKERS.items():
            for match in pattern.finditer(text):
                if name != "a/b count" or _is_count(match):
                    hits.append(f"{label}:{line}: [{name}: {match.group(0)}] {text.strip()}")
    return hits


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_history_in_comments_and_docstrings_stays_under_the_limit():
    modules = _modules()
    lines = sum(p.read_text(encoding="utf-8").count("\n") for p in modules)
    hits = [hit for path in modules for hit in history_markers(path)]
    allowed = LIMIT_PER_1000_LINES * lines // 1000
    if len(hits) > allowed:
        pytest.fail(
            f"{len(hits)} history markers in comments and docstrings, {1000 * len(hits) / lines:.1f} "
            f"per 1,000 of {lines:,} lines (at most {allowed}). Say what the code does and why; move "
            "measurements and stories to the commit message, CHANGELOG.md or the docs page of the "
            "topic (a measured constant may name that page):\n" + "\n".join(hits), pytrace=False)


@pytest.mark.parametrize(("line", "marker"), [
    ("# fixed in issue 22", "issue N"),
    ("# as round 21's review found", "round N"),
    ("# measured on the H200", "H100/H200"),
    ("# exact on 86/88 runs", "a/b count"),
    ("# 1,204/2,533 placements", "a/b count"),
    ("# took 8.5 s to return", "measurement"),
    ("# 4 ms measured", "measurement"),
    ("# within 2 % of the real peak", "measurement"),
    ("# peaked at 5.23 GiB", "measurement"),
    ("# a 32 MiB file", "measurement"),
    ("# it said LOW CONFIDENCE", "it said"),
    ("# once replayed an H200 run", "once replayed/showed"),
    ("# the card once showed 0 B", "once replayed/showed"),
    ("# it used to stop here", "used to"),
])
def test_each_marker_is_seen_in_a_comment(tmp_path, line, marker):
    sample = tmp_path / "sample.py"
    sample.write_text(f"x = 1\n{line}\n")
    (hit,) = [h for h in history_markers(sample) if f"[{marker}:" in h]
    assert hit.startswith("sample.py:2: ")


def test_docstrings_are_read_and_code_is_not(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Module docstring: 44/89 runs."""\n'
        "\n"
        "def f() -> str:\n"
        '    """Returns in 0.18 s.\n'
        "\n"
        "    >>> f()\n"
        "    '1.50 GiB'\n"
        '    """\n'
        '    message = "a 2 MiB segment on the H200"  # peak 9.10 GiB\n'
        '    return f"{message}: 3 ms"\n')
    hits = history_markers(sample)
    assert [h.split(" [")[0] for h in hits] == ["sample.py:1:", "sample.py:4:", "sample.py:9:"]


def test_ratios_and_plain_numbers_are_not_markers(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("# 9/8 of the device; a 1/2 share; 512 bytes; pages of 4096; 3 streams; python3.11\n")
    assert history_markers(sample) == []
