"""``%allocconf simulate`` says our settings warning as a note of ours, once (issue 24, item 4).

In a real kernel (as ``notebooks/colab.ipynb`` runs it), with the kernel's settings combining
max_split_size_mb and expandable segments: the replay used to print a raw ``AllocConfWarning``
to stderr with our install path and a source line.
"""

from __future__ import annotations

import pytest

from tests.kernel.kernels import RealKernel
from tests.torch_versions import needs_torch

pytestmark = pytest.mark.kernel

COMBINED = "max_split_size_mb together with expandable_segments:True"


@needs_torch((2, 1), "the max_split_size_mb + expandable_segments combination")
def test_the_combination_warning_is_one_note_and_nothing_on_stderr(kernel: RealKernel) -> None:
    kernel.execute("%load_ext allocconf_widget").check()
    kernel.execute("%allocconf set max_split_size_mb=256 expandable_segments=True\n"
                   "%allocconf apply --no-save").check()
    run = kernel.execute("%allocconf simulate --demo", timeout=180)
    run.check()
    assert "AllocConfWarning" not in run.stderr and ".py:" not in run.stderr, run.stderr
    assert run.stdout.count(COMBINED) == 1, run.stdout
    assert f"note: {COMBINED}" in run.stdout
