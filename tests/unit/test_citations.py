"""The project cites only its own docs.

Facts about torch and the notebook front ends live in ``docs/internals/allocator_facts.md``
and ``docs/internals/notebook_facts.md``. The notes they were first worked out in (``allocator.md``,
``notebook.md``, ``dryrun.md``, ``peers.md``, ``style.md`` of a shared folder beside the
repository) are not shipped with it, so a reader who meets "allocator.md §6" in a test, a
benchmark or a doc cannot follow it. This test reads every tracked text file.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: the unshipped notes by name (``allocator_facts.md`` is ours and does not match), or their folder
FOREIGN = re.compile(r"(?<![\w-])(?:docs/)?(?:allocator|notebook|dryrun|peers|style)\.md\b|shared/docs")
#: a name that is also a doc of ours (docs/dryrun.md) is a citation a reader can follow
SHIPPED = {p.name for p in (ROOT / "docs").glob("*.md")}
#: CHANGELOG.md keeps its history as written
EXEMPT = {"CHANGELOG.md", "tests/unit/test_citations.py"}
TEXT = {".py", ".md", ".txt", ".toml", ".cfg", ".ini", ".sh", ".ipynb", ".json", ".yml", ".yaml", ""}


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True,
                             timeout=30).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.SubprocessError):  # a source tree without git: walk it
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    return [ROOT / n for n in names if n not in EXEMPT and Path(n).suffix in TEXT
            and not n.startswith(("tests/data/", "benchmarks/data/", "allocconf_widget/data/"))]


def foreign_citations(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    label = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    return [f"{label}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in FOREIGN.finditer(text)
            if "shared" in m.group(0) or Path(m.group(0)).name not in SHIPPED]


def test_no_citation_of_notes_the_repository_does_not_ship():
    found = [hit for path in _tracked_files() for hit in foreign_citations(path)]
    assert found == [], ("cite docs/internals/allocator_facts.md or notebook_facts.md (move the fact "
                         "there if it is missing):\n" + "\n".join(found))


@pytest.mark.parametrize(("text", "hits"), [
    ("see allocator.md §6", 1), ("(notebook.md §5)", 1), ("docs/allocator.md §6.16", 1),
    ("in shared/docs/dryrun.md", 1), ("peers.md and style.md", 2), ("docs/dryrun.md", 0),
    ("docs/internals/allocator_facts.md §6", 0), ("docs/internals/notebook_facts.md §4", 0),
    ("docs/monitor.md", 0), ("README.md", 0),
])
def test_the_check_sees_a_citation(tmp_path, text, hits):
    sample = tmp_path / "sample.md"
    sample.write_text(f"line one\n{text}\n")
    assert len(foreign_citations(sample)) == hits
