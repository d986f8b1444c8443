"""Differential test of the reserve grammar against torch 2.15's own CUDA parser.

PyPI's Linux builds of torch are CUDA builds; ``torch._C._accelerator_setAllocatorSettings``
runs the CUDA parser's hook on a machine without a GPU, without initialising CUDA. torch 2.15
ignores a bad reserve with a C++ warning on the process's stderr (not a Python warning), so
the test reads file descriptor 2 around each call. It skips on a CPU build and on torch older
than 2.15 (CI's cells); run it in a venv with PyPI's torch 2.15 (docs/testing.md).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest

from allocconf_widget import AllocConfError, parse_conf
from allocconf_widget.core.versions import parse_version
from tests.reserve_cases import (
    ACCEPTED_CLASS_LISTS,
    ACCEPTED_RESERVES,
    BROKEN_CLASS_VALUES,
    BY_CLASS,
    IGNORED_CLASS_LISTS,
    IGNORED_RESERVES,
    RESERVE,
)

torch = pytest.importorskip("torch")
SETTER: Any = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
VERSION = parse_version(torch.__version__)
pytestmark = pytest.mark.skipif(
    SETTER is None or torch.version.cuda is None or VERSION.key < (2, 15),
    reason=f"torch {torch.__version__}: no 2.15+ CUDA parser to ask (a CPU build, or older)")

WARNING = "Ignoring invalid expandable-segment reserve value"


def torch_verdict(text: str) -> str:
    """``accepted``, ``ignored`` (torch warned and kept its default) or ``failed``."""
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            SETTER(text)
            failed = False
        except (RuntimeError, ValueError, IndexError):
            failed = True
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        sink.seek(0)
        said = sink.read().decode("utf-8", "replace")
    SETTER("")  # back to the defaults for the next case
    return "failed" if failed else "ignored" if WARNING in said else "accepted"


def ours(text: str) -> bool:
    try:
        parse_conf(text, VERSION, warn=False)
    except AllocConfError:
        return False
    return True


CASES = ([(f"{RESERVE}:{v}", "accepted") for v, _ in ACCEPTED_RESERVES]
         + [(f"{RESERVE}:{v}", "ignored") for v in IGNORED_RESERVES]
         + [(f"{BY_CLASS}:{v}", "accepted") for v, _ in ACCEPTED_CLASS_LISTS]
         + [(f"{BY_CLASS}:{v}", "ignored") for v in IGNORED_CLASS_LISTS]
         + [(f"{BY_CLASS}:{v}", "failed") for v in BROKEN_CLASS_VALUES])


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_the_table_is_what_torch_2_15_does(text: str, expected: str) -> None:
    assert torch_verdict(text) == expected
    assert ours(text) == (expected == "accepted")
    assert not torch.cuda.is_initialized()
