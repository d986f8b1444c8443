"""Links between the docs lead somewhere, and a section cited by name exists.

The docs are one current page per topic, rewritten as the code changes; a page that loses a
heading must not leave a link (``[x](simulator.md#speed)``) or a citation
(``docs/simulator.md, "Speed"``, in code, tests, benchmarks or another page) pointing at
nothing. A section is a heading or a paragraph's bold lead-in (``**Closing the loop.**``); a
citation may name the start of one ("Addresses" for "Addresses (the driver layout model)").
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.MULTILINE)
_LEAD_IN = re.compile(r"^\s*(?:[-*]\s+|\d+\.\s+)?\*\*(.+?)\*\*", re.MULTILINE)
_CITATION = re.compile(r'docs/([\w/]+\.md),?\s+\\?"([^"\\]+)\\?"')
#: CHANGELOG.md keeps its history as written, the data folders are not prose, and this file's
#: examples cite pages that do not exist on purpose
_SKIPPED = ("CHANGELOG.md", "tests/data/", "benchmarks/data/", "allocconf_widget/data/",
            "tests/unit/test_doc_links.py")
_TEXT = {".py", ".md", ".txt", ".toml", ".sh", ".ipynb", ""}


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _plain(text: str) -> str:
    """Compared as read: backticks, a comment's ``#`` where a citation wraps, and spacing dropped."""
    unwrapped = re.sub(r"\n\s*#+", " ", text.replace("`", ""))
    return " ".join(unwrapped.split()).rstrip(".:").casefold()


def _outside_code(text: str) -> str:
    """The text with fenced code blocks blanked (line numbers kept)."""
    return re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text,
                  flags=re.MULTILINE | re.DOTALL)


def sections(page: Path) -> set[str]:
    text = _outside_code(page.read_text(encoding="utf-8"))
    return {_plain(h) for h in _HEADING.findall(text)} | {_plain(b) for b in _LEAD_IN.findall(text)}


def broken_links(page: Path) -> list[str]:
    """``page:line: target`` for each relative link whose file or ``#anchor`` is missing."""
    text = _outside_code(page.read_text(encoding="utf-8"))
    label = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
    out = []
    for match in _LINK.finditer(text):
        target = match.group(1)
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        line = text.count("\n", 0, match.start()) + 1
        if not dest.exists():
            out.append(f"{label}:{line}: {target} (no such file)")
        elif anchor and dest.suffix == ".md":
            anchors = {_slug(h) for h in _HEADING.findall(_outside_code(dest.read_text(encoding="utf-8")))}
            if anchor not in anchors:
                out.append(f"{label}:{line}: {target} (no such heading)")
    return out


def missing_sections(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: docs/page.md "Section"`` for each citation of a section its page lacks."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    label = path.relative_to(root) if path.is_relative_to(root) else path.name
    out = []
    for match in _CITATION.finditer(text):
        page = root / "docs" / match.group(1)
        cited = _plain(match.group(2))
        known = sections(page) if page.exists() else set()
        if not any(name.startswith(cited) for name in known):
            line = text.count("\n", 0, match.start()) + 1
            out.append(f'{label}:{line}: docs/{match.group(1)} "{" ".join(match.group(2).split())}"')
    return out


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True,
                             check=True, timeout=30).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.SubprocessError):  # a source tree without git: walk it
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    return [ROOT / n for n in names if not n.startswith(_SKIPPED) and Path(n).suffix in _TEXT]


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_link_between_the_docs_leads_somewhere():
    broken = [b for page in _pages() for b in broken_links(page)]
    assert broken == [], "fix these links (a heading was renamed or removed?):\n" + "\n".join(broken)


def test_every_section_cited_by_name_exists():
    missing = [m for path in _tracked() if path.exists() for m in missing_sections(path)]
    assert missing == [], "name a heading or bold lead-in of that page:\n" + "\n".join(missing)


def test_the_checks_see_a_broken_link_and_a_missing_section(tmp_path):
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "topic.md"
    page.write_text("# Topic\n\n## Speed (measured)\n\n**Closing the loop.** Text.\n\n"
                    "[ok](#speed-measured) [gone](#performance) [file](other.md)\n"
                    "```\n## not a heading\n```\n")
    assert [b.split(": ", 1)[1] for b in broken_links(page)] == [
        "#performance (no such heading)", "other.md (no such file)"]
    code = tmp_path / "code.py"
    code.write_text('# docs/topic.md, "Speed"\n# (docs/topic.md, "Closing the\n#  loop")\n'
                    '# docs/topic.md "Performance"\n# docs/topic.md, "not a heading"\n')
    assert [m.split(": ", 1)[1] for m in missing_sections(code, tmp_path)] == [
        'docs/topic.md "Performance"', 'docs/topic.md "not a heading"']


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Addresses (the driver layout model)", "addresses-the-driver-layout-model"),
    ("`garbage_collection_threshold:0.6` under a fraction",
     "garbage_collection_threshold06-under-a-fraction"),
    ("Held out: third-party training code on an H100", "held-out-third-party-training-code-on-an-h100"),
])
def test_anchors_are_githubs(heading, anchor):
    assert _slug(heading) == anchor
