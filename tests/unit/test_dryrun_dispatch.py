"""The GPU profile decides what the GPU would run, not only its capacity.

SDPA's kernel choice (torch's ``sdp_utils.cpp``) per profile, dtype and shape; whether bfloat16
is native; which workspace rules were measured on the card and which are assumed. A dry run for
a T4 must record a T4's attention (memory-efficient for float16, the math fallback for
bfloat16), whatever this machine's torch would pick (a CPU build picks math for every profile).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from allocconf_widget.core.dryrun.attention import (
    CUDNN,
    EFFICIENT,
    FLASH,
    MATH,
    AttentionCall,
    backward_workspace_bytes,
    choose,
    cudnn_first,
)
from allocconf_widget.core.dryrun.dispatch import cudnn_version_number, dispatch
from allocconf_widget.core.dryrun.profiles import profile
from tests.torch_versions import needs_torch

TRAIN = AttentionCall(batch=8, heads=8, kv_heads=8, seq_q=1024, seq_k=1024, head_dim=64, value_dim=64,
                      dtype="float16", is_causal=True, requires_grad=True)


def _with(**changes: Any) -> AttentionCall:
    return dataclasses.replace(TRAIN, **changes)


@pytest.mark.parametrize(("gpu", "dtype", "cudnn", "expected"), [
    ("t4", "float16", False, EFFICIENT),  # no flash below compute capability 8.0
    ("t4", "bfloat16", False, MATH),  # memory-efficient attention needs 8.0 for bfloat16
    ("t4", "float32", False, EFFICIENT),
    ("l4", "float16", False, FLASH),
    ("a100-40", "bfloat16", False, FLASH),
    ("a100-80", "float32", False, EFFICIENT),  # flash: 16-bit types only
    ("h100", "bfloat16", True, CUDNN),  # a cuDNN past 9.15: tried first on Hopper
    ("h100", "bfloat16", False, FLASH),
    ("h200", "float32", True, EFFICIENT),
])
def test_the_kernel_each_profile_runs(gpu, dtype, cudnn, expected):
    assert choose(profile(gpu).capability, _with(dtype=dtype), cudnn_preferred=cudnn).backend == expected


def test_shape_and_mask_rules():
    t4, a100, l4 = profile("t4").capability, profile("a100-40").capability, profile("l4").capability
    assert choose(a100, _with(has_mask=True)).backend == EFFICIENT  # flash takes no mask
    assert choose(a100, _with(seq_q=1, is_causal=True)).backend == EFFICIENT  # causal needs equal lengths
    assert choose(t4, _with(head_dim=60, value_dim=60)).backend == MATH  # float16 head size: multiples of 8
    # sm89, training with a head size in (192, 224]: not flash
    assert choose(l4, _with(head_dim=200, value_dim=200)).backend == EFFICIENT
    assert choose(l4, _with(head_dim=200, value_dim=200, requires_grad=False)).backend == FLASH
    math = choose(t4, _with(dtype="bfloat16"))
    assert "bfloat16 needs compute capability 8.0" in math.describe()


def test_when_cudnn_is_tried_first():
    assert cudnn_first((9, 0), 91900, 13) and cudnn_first((9, 0), 91900, 12)
    assert not cudnn_first((9, 0), 91000, 13)  # cuDNN 9.10: flash first
    assert not cudnn_first((8, 0), 91900, 13)
    assert not cudnn_first((9, 0), None, 13)
    assert cudnn_version_number("9.19.0.56") == 91900 and cudnn_version_number("") is None


def test_backward_buffers_per_kernel():
    rows = 8 * 8 * 1024
    assert backward_workspace_bytes(CUDNN, TRAIN) == 4 * rows * 64 + 4 * rows
    assert backward_workspace_bytes(FLASH, TRAIN) == rows * 64 * 4 + rows * 4
    assert backward_workspace_bytes(EFFICIENT, TRAIN) == rows * 64 * 4 + rows * 4
    assert backward_workspace_bytes(EFFICIENT, _with(dtype="float32")) == rows * 4
    assert backward_workspace_bytes(MATH, TRAIN) == 0


def test_each_profile_says_what_it_assumes_and_what_was_measured():
    t4 = "\n".join(dispatch(profile("t4")).lines())
    assert "float16: memory-efficient attention" in t4 and "bfloat16: the math fallback" in t4
    assert "bfloat16: not native on compute capability 7.5" in t4
    assert "torch's default size, assumed" in t4 and "measured on an H200, assumed here" in t4
    h200 = "\n".join(dispatch(profile("h200"), cudnn_preferred=True).lines())
    assert "cuDNN attention" in h200 and "bfloat16: native" in h200
    assert "measured on Hopper" in h200 and "the rule measured on this card" in h200


torch = pytest.importorskip("torch")


def _attention_step() -> None:
    q = torch.randn(4, 8, 2048, 64, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)


@needs_torch((2, 4), "the dry run")
def test_a_dry_run_records_the_profiles_kernel_not_this_machines():
    """The old dry run on this CPU build recorded the math kernel for every profile (the choice of
    the machine it ran on): a T4 and an H100 got the same trace."""
    import allocconf_widget

    peaks = {}
    for gpu in ("t4", "h100"):
        with allocconf_widget.dry_run(gpu, progress=False) as run:
            _attention_step()
        peaks[gpu] = run.trace.peak_requested
        summary = run.summary()
        assert f"{run.gpu.name}: attention kernel (SDPA, training, head size 64)" in summary
    query = 4 * 8 * 2048 * 64 * 2
    # T4, float16: memory-efficient attention, output and row statistics only
    assert peaks["t4"] < 3 * query
    # the math fallback, forced by a bfloat16 input on a T4, materialises the 2048² matrix
    with allocconf_widget.dry_run("t4", progress=False) as run:
        q = torch.randn(4, 8, 2048, 64, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert run.trace.peak_requested > 4 * 8 * 2048 * 2048 * 4


@needs_torch((2, 4), "the dry run")
def test_kernels_the_program_turns_off_are_not_chosen_and_the_switch_is_put_back():
    """``sdpa_kernel([...])`` (how a T4's choice is reproduced on a Hopper GPU) and
    ``enable_flash_sdp(False)`` restrict the choice in the dry run as on the GPU; a switch the step
    flips is put back afterwards."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import allocconf_widget

    flash_before = torch.backends.cuda.flash_sdp_enabled()
    with allocconf_widget.dry_run("h100", progress=False) as run:
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            _attention_step()
        torch.backends.cuda.enable_flash_sdp(False)
    notes = [n for n in run.all_notes() if n.startswith("attention ran as")]
    assert len(notes) == 1 and "memory-efficient attention" in notes[0] and "turned off" in notes[0]
    assert torch.backends.cuda.flash_sdp_enabled() is flash_before
