"""What a new user's Run All of the shipped notebooks needs besides the package: the ``demo``
extra installs it. The Run All itself, in a real kernel: tests/kernel/test_notebooks_run.py.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_environment_has_what_torch_warns_without():
    # `import torch` prints a red "Failed to initialize NumPy" warning without numpy
    demo = re.search(r"^demo = \[(.*)\]", (ROOT / "pyproject.toml").read_text(), re.M)
    assert demo is not None and '"numpy"' in demo.group(1)
