"""What the installed torch has, asked without importing it, for tests that depend on a release.

CI runs the suite on torch 2.13 (CPU build), 1.13.0 and 2.4.1 (PyPI's CUDA builds, on the CPU).
A test that needs something a release lacks asks here and skips with the reason; everything
else runs everywhere. The release facts are torch's, from docs/internals/allocator_facts.md,
written out here independently of the package's schema so the tests can check that schema.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

import pytest


def _installed(distribution: str) -> tuple[int, int] | None:
    """(major, minor) of an installed distribution, from its metadata (never imported)."""
    try:
        text = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


TORCH = _installed("torch")
"""(major, minor) of the installed torch, or None."""
TORCH_TEXT = f"{TORCH[0]}.{TORCH[1]}" if TORCH else "none"

READ_VAR = "PYTORCH_ALLOC_CONF" if TORCH is None or TORCH >= (2, 10) else "PYTORCH_CUDA_ALLOC_CONF"
"""The variable this torch reads (and the package writes): the generic name from 2.10."""

HAS_EXPANDABLE = TORCH is None or TORCH >= (2, 1)
# An option that takes a simple value on every modelled release, for tests of the magic,
# the panel and the lifecycle: expandable_segments (2.1+), else max_split_size_mb.
OPT_NAME = "expandable_segments" if HAS_EXPANDABLE else "max_split_size_mb"
OPT_VALUE = "True" if HAS_EXPANDABLE else "512"
OPT = f"{OPT_NAME}:{OPT_VALUE}"
"""The option as torch writes it, e.g. ``expandable_segments:True``."""
OPT_SET = f"{OPT_NAME}={OPT_VALUE}"
"""The same in the magic's ``key=value`` form."""
OPT_VALUES = ["True", "False", "default"] if HAS_EXPANDABLE else ["default"]
"""What tab completion offers after ``OPT_NAME=``."""


def has_torch(version: tuple[int, int]) -> bool:
    """Whether the installed torch is ``version`` or newer (no torch: the newest, as the package)."""
    return TORCH is None or version <= TORCH


def needs_torch(version: tuple[int, int], what: str) -> pytest.MarkDecorator:
    """Skip when the installed torch is older than ``version``, saying what it lacks."""
    return pytest.mark.skipif(
        TORCH is not None and version > TORCH,
        reason=f"torch {TORCH_TEXT} lacks {what} (torch {version[0]}.{version[1]}+)",
    )


#: ``standin=False``: torch's fake mode moves a tensor to a fake GPU without the CUDA runtime from 2.10
needs_fake_cuda = needs_torch((2, 10), "fake CUDA tensors that leave CUDA unstarted")


def cuda_build() -> bool:
    """Whether the installed torch is a CUDA build (read from its version.py, not imported)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return False
    text = (Path(spec.origin).parent / "version.py").read_text(encoding="utf-8", errors="replace")
    match = re.search(r"^cuda\s*(?::[^=]*)?=\s*(.+)$", text, re.MULTILINE)
    return bool(match) and match.group(1).strip() != "None"

TWO_OPTS = ("expandable_segments:True,max_split_size_mb:512" if HAS_EXPANDABLE
            else "max_split_size_mb:512,roundup_power2_divisions:4")
"""Two options in torch's canonical (sorted) order, both taken by the installed release."""


# A test that cannot yet ask the installed torch / IPython goes here, keyed by node id prefix
# with the release it needs and why; tests/conftest.py makes it an expected failure (not strict)
# below that release. Both are empty: every test asks the installed release, and one that is
# about an option an older release lacks skips there with needs_torch, saying what it lacks.
NOT_YET_VERSION_AWARE: dict[str, tuple[tuple[int, int], str]] = {}
IPYTHON_8_ONLY: dict[str, str] = {}


IPYTHON = _installed("ipython") or (0, 0)
"""(major, minor) of the installed IPython."""
COMPLETION_IS_OURS_ALONE = IPYTHON >= (8, 6)
"""IPython 8.6+ lets a matcher suppress the others, so a ``%allocconf`` line offers only our words.
Older IPython (Colab's 7.34) runs jedi first: where the word being completed is empty (after a
space or ``=``) jedi's Python names come first and ours are among them (duplicates such as
``True`` shown once)."""


def offered(got: list[str], ours: list[str]) -> bool:
    """Whether a completion list offers ``ours`` the way this IPython can (see above)."""
    if COMPLETION_IS_OURS_ALONE:
        return got == ours
    return set(ours) <= set(got)
