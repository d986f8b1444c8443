"""The Python classifiers name the Pythons CI runs the suite on, no more and no fewer."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_classifiers_are_the_pythons_ci_tests() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    listed = set(re.findall(r'"Programming Language :: Python :: (3\.\d+)"', pyproject))
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    main = re.search(r"with Python (3\.\d+) at `python3`", ci)
    colab = re.search(r"COLAB_PYTHON=\$\{CI_COLAB_PYTHON:-/root/\.pyenv/versions/(3\.\d+)\.\d+/", ci)
    assert main is not None and colab is not None
    assert listed == {main.group(1), colab.group(1)} == {"3.11", "3.13"}
