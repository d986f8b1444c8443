"""The accuracy figures the notebooks quote have one source: the README.

The quickstart quoted "169 of 182" and "102 of 130" from an older docs/fidelity.md while the
README said "199 of 212". Every "N of M" and "within N %" in a notebook's text must now be one
the README states, so a figure cannot change in one place only: change the README, and the
notebook that quotes the old figure fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIGURE = re.compile(r"\b\d[\d,]*(?:\.\d+)? of (?:the )?\d[\d,]*\b|\bwithin \d+(?:\.\d+)? ?%")


def _words(text: str) -> str:
    return " ".join(text.split())


def _notebook_text(name: str) -> str:
    """What a reader of the notebook reads: its markdown and its code's comments."""
    cells = json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))["cells"]
    parts = []
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            parts.append(source)
        else:
            parts += [line.split("#", 1)[1] for line in source.splitlines() if "#" in line]
    return _words("\n".join(parts))


@pytest.mark.parametrize("name", ["quickstart.ipynb", "colab.ipynb"])
def test_every_figure_a_notebook_quotes_is_one_the_readme_states(name):
    readme = _words((ROOT / "README.md").read_text(encoding="utf-8"))
    quoted = FIGURE.findall(_notebook_text(name))
    assert [figure for figure in quoted if figure not in readme] == []


def test_the_notebooks_quote_the_what_if_and_the_dry_run_figures():
    """What the test above holds: the quickstart states the what-if's and the dry run's
    accuracy, the Colab notebook the dry run's."""
    quickstart = FIGURE.findall(_notebook_text("quickstart.ipynb"))
    assert {"199 of the 212", "120 of 122", "38 of 40", "within 10 %"} <= set(quickstart), quickstart
    assert {"38 of 40", "within 10 %"} <= set(FIGURE.findall(_notebook_text("colab.ipynb")))
