"""The dry run in a real kernel: a refused step is one line, naming the cell's line and not the
kernel's temporary file (the shell-level dry-run and planner tests are tests/shell/test_dryrun_plan.py)."""

from __future__ import annotations

import pytest

from tests.torch_versions import cuda_build, needs_torch

pytest.importorskip("torch")


@pytest.mark.kernel
@needs_torch((2, 10), "fake CUDA tensors that leave CUDA unstarted")
@pytest.mark.skipif(cuda_build(), reason="a CUDA build runs this step on fake CUDA tensors without a GPU; "
                                         "only a CPU-only build refuses it")
def test_in_a_real_kernel_the_refusal_is_one_line_without_the_kernels_temporary_file(kernel):
    kernel.execute("%load_ext allocconf_widget\nimport torch, allocconf_widget").check()
    result = kernel.execute('with allocconf_widget.dry_run("t4", standin=False, progress=False):\n'
                            '    model = torch.nn.Linear(16, 16).to("cuda")\n'
                            '    loss = model(torch.randn(4, 16, device="cuda")).sum()\n', timeout=120)
    assert result.error is not None and result.error.startswith("DryRunError: this torch")
    shown = result.traceback.strip().splitlines()
    assert len(shown) == 1, result.traceback
    assert "the cell's line 3" in shown[0] and "ipykernel_" not in shown[0]
