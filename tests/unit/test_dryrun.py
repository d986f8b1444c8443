"""The dry run on this machine's torch (a CPU-only build): what it records, saves, predicts, refuses.

A CPU-only torch can run inference on fake CUDA tensors (``torch.no_grad()``), which is enough to
check the whole path a GPU runtime takes: the recorded allocations and frees, the snapshot that
``allocconf simulate`` replays, labelled an estimate, the predictions and the batch planner. What it
cannot do, autograd on fake CUDA tensors, must stop with a message naming the user's line instead
of aborting the interpreter (it does abort without the guard: measured on torch 2.13). GPU runs of
training steps are in ``tests/gpu/test_dryrun_gpu.py``.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from allocconf_widget._errors import AllocConfError
from allocconf_widget.core.dryrun.profiles import (
    PROFILES,
    Convolution,
    ConvWorkspaces,
    GpuProfile,
    attention_backward_workspace_bytes,
    conv_workspaces,
    match_name,
    profile,
)
from allocconf_widget.core.units import GIB, MIB
from tests.torch_versions import cuda_build, needs_torch

torch = pytest.importorskip("torch")
requires_fake_cuda = needs_torch((2, 4), "the dry run")
ROOT = Path(__file__).resolve().parents[2]


def _mlp_step(batch: int) -> None:
    """An inference step as a user writes it: a CPU-built model moved to "cuda", a loss printed."""
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).to("cuda")
    with torch.no_grad():
        out = model(torch.randn(batch, 1024, device="cuda"))
        print(f"mean {out.mean().item():.3f}")


# ---------------------------------------------------------------- profiles (pure)

def test_profiles_leave_room_for_the_cuda_context_and_know_the_named_gpus():
    assert set(PROFILES) == {"t4", "l4", "a100-40", "a100-80", "h100", "h200"}
    for gpu in PROFILES.values():
        assert 0 < gpu.usable_bytes < gpu.total_bytes
    assert profile("T4").total_bytes == 15 * GIB
    assert profile("A100").key == "a100-40"
    assert profile("h200").measured and profile("h200").context_bytes == 552_402_944
    assert not profile("t4").bf16_native and profile("a100-80").bf16_native


def test_an_unknown_profile_lists_the_known_ones():
    with pytest.raises(AllocConfError, match="t4, l4, a100-40"):
        profile("v100")


def test_a_gpu_named_by_the_driver_gets_the_table_figures_and_the_driver_total():
    found = match_name("NVIDIA A100-SXM4-80GB", 85_899_345_920)
    assert (found.key, found.capability, found.total_bytes) == ("a100-80", (8, 0), 85_899_345_920)
    other = match_name("NVIDIA RTX 6000 Ada Generation", 48 * GIB)
    assert other.key == "this-gpu" and other.total_bytes == 48 * GIB


#: ResNet-18's second-stage 3×3 convolution at batch 64 (fp32, NCHW), as measured on the H200
_CONV = Convolution(input_bytes=49 * MIB, output_bytes=49 * MIB, weight_bytes=147_456, in_channels=64,
                    kernel=3, stride=1, groups=1, channels_last=False, backward=False)


def _conv(**changes: Any) -> Convolution:
    return dataclasses.replace(_CONV, **changes)


def test_the_cudnn_workspace_rule_follows_the_h200_measurements():
    """docs/dryrun.md's measurements (H200, cuDNN 9.19): a contiguous 3×3 forward borrowed its
    operands' sum (98.1 MiB here); its backward borrowed that sum for the data pass and 1.00–1.19
    of it for the filter pass, one after the other; a stride-1 1×1 forward, a depthwise one, a
    channels-last forward and a 3×3 stem on 3 channels borrowed nothing; a strided 1×1 forward
    its sum; ResNet's 7×7/2 stem its sum (232.8 MiB), in bf16 with the 3 input channels padded
    to 8 (147.05 MiB), in channels-last its input's size."""
    operands = 98.1 * MIB
    forward = conv_workspaces(_conv())
    assert forward.after_output == pytest.approx(operands, rel=0.01) and forward.after_weight_grad == 0
    backward = conv_workspaces(_conv(backward=True))
    assert backward.after_output == pytest.approx(operands, rel=0.01)
    assert operands <= backward.after_weight_grad <= 1.19 * operands
    assert conv_workspaces(_conv(kernel=1)) == ConvWorkspaces(0)
    assert conv_workspaces(_conv(kernel=1, stride=2)).after_output > 0
    assert conv_workspaces(_conv(groups=64)) == ConvWorkspaces(0)
    assert conv_workspaces(_conv(channels_last=True)) == ConvWorkspaces(0)
    assert 0 < conv_workspaces(_conv(channels_last=True, backward=True)).after_weight_grad < 25 * MIB
    stem = {"input_bytes": int(36.75 * MIB), "output_bytes": 196 * MIB, "weight_bytes": 37_632,
            "in_channels": 3}
    assert conv_workspaces(_conv(**stem, kernel=3)) == ConvWorkspaces(0)
    big_stem = conv_workspaces(_conv(**stem, kernel=7, stride=2))
    assert big_stem.after_output == pytest.approx(232.8 * MIB, rel=0.01)
    bf16_stem = {"input_bytes": int(18.375 * MIB), "output_bytes": 98 * MIB, "weight_bytes": 18_816,
                 "in_channels": 3, "element_size": 2}
    assert conv_workspaces(_conv(**bf16_stem, kernel=7, stride=2)).after_output == pytest.approx(
        147.05 * MIB, rel=0.01)
    last = conv_workspaces(_conv(**stem, kernel=7, stride=2, channels_last=True))
    assert last.after_output == int(36.75 * MIB)
    assert conv_workspaces(_conv(**stem, kernel=16, stride=16)) == ConvWorkspaces(0)  # ViT's patch embedding
    assert conv_workspaces(_conv(input_bytes=4 * GIB)).after_output == GIB  # never more than 1 GiB


def test_the_attention_backward_rule_gives_the_h200_measurements():
    """cuDNN attention's backward borrowed 16.25 MiB in the LM (16×8×512×64 bf16 query), 9.38 MiB
    in ViT-S (32×6×197×64) and 16.13 MiB in the Llama (8×8×512×64 query, 4 key/value heads)."""
    def rule(batch: int, heads: int, seq: int, grouped: bool) -> float:
        elements = batch * heads * seq * 64
        return attention_backward_workspace_bytes(elements, 2 * elements, 4 * batch * heads * seq,
                                                  grouped) / MIB

    assert rule(16, 8, 512, False) == pytest.approx(16.25, abs=0.01)
    assert rule(32, 6, 197, False) == pytest.approx(9.38, abs=0.01)
    assert rule(8, 8, 512, True) == pytest.approx(16.13, abs=0.01)


# ---------------------------------------------------------------- the dry run itself

@requires_fake_cuda
def test_an_inference_step_is_recorded_with_its_frees_and_cuda_never_starts():
    import allocconf_widget

    with allocconf_widget.dry_run("t4") as run:
        _mlp_step(256)
    trace = run.trace
    weights = (1024 * 4096 + 4096 + 4096 * 1024 + 1024) * 4
    activations = 256 * (1024 + 4096 + 1024) * 4
    assert weights < trace.peak_requested <= weights + activations + 16 * MIB  # + cuBLAS workspace
    actions = [e["action"] for e in trace.entries]
    assert actions.count("free_requested") == actions.count("free_completed") > 0
    assert all(e["size"] > 0 and e["stream"] == 0 for e in trace.entries)
    # every free names an address allocated before it, exactly once
    live: set[int] = set()
    for e in trace.entries:
        if e["action"] == "alloc":
            assert e["addr"] not in live
            live.add(e["addr"])
        elif e["action"] == "free_completed":
            live.remove(e["addr"])
    assert torch.cuda.is_initialized() is False
    assert any("cuBLAS workspace" in note for note in run.all_notes())


@requires_fake_cuda
def test_a_printed_loss_reads_1_and_the_note_names_the_line():
    import allocconf_widget

    with allocconf_widget.dry_run("t4") as run:
        x = torch.randn(8, 8, device="cuda")
        shown = f"{x.mean().item():.2f}"
    assert shown == "1.00"
    assert any("test_dryrun.py" in n and "shown = f" in n for n in run.all_notes()), run.all_notes()


@requires_fake_cuda
def test_branching_on_a_tensor_stops_naming_the_users_line():
    import allocconf_widget
    from allocconf_widget._errors import DryRunError

    with pytest.raises(DryRunError) as caught, allocconf_widget.dry_run("t4"):
        x = torch.randn(8, device="cuda")
        if x.sum() > 0:  # needs a value
            pass
    assert "if x.sum() > 0:" in str(caught.value)
    assert torch.cuda.is_initialized() is False


@requires_fake_cuda
def test_gpu_queries_are_answered_from_the_profile_and_restored_afterwards():
    import allocconf_widget

    before = torch.cuda.get_device_properties
    with allocconf_widget.dry_run("a100-80"):
        props = torch.cuda.get_device_properties(0)
        capability = torch.cuda.get_device_capability()
        bf16 = torch.cuda.is_bf16_supported()
        free, total = torch.cuda.mem_get_info()
        compiled = torch.compile(torch.nn.Linear(4, 4))
    assert (props.name, props.total_memory) == ("NVIDIA A100-SXM4-80GB", 80 * GIB)
    assert capability == (8, 0) and bf16 is True
    assert total - free == profile("a100-80").context_bytes
    assert isinstance(compiled, torch.nn.Linear)  # eager, with a note
    assert torch.cuda.get_device_properties is before


@requires_fake_cuda
def test_torch_compile_runs_eager_and_says_so():
    import allocconf_widget

    with allocconf_widget.dry_run("t4") as run:
        step = torch.compile(lambda t: t * 2)
        step(torch.randn(4, device="cuda"))
    assert any("torch.compile ran uncompiled" in n for n in run.all_notes())


@pytest.mark.skipif(cuda_build(), reason="a CUDA build records gradients on fake CUDA tensors")
@requires_fake_cuda
def test_training_on_fake_cuda_on_a_cpu_only_build_stops_with_the_line_instead_of_aborting(tmp_path):
    """Fake CUDA tensors forced (``standin=False``): without the guard this kills the interpreter
    (c10::Error, terminate), so a fresh process; the default runs it on the CPU stand-in."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch, allocconf_widget
        from allocconf_widget._errors import DryRunError
        try:
            with allocconf_widget.dry_run("t4", standin=False):
                model = torch.nn.Linear(16, 16).to("cuda")
                loss = model(torch.randn(4, 16, device="cuda")).sum()
                loss.backward()
        except DryRunError as exc:
            print("STOPPED", exc)
        print("CUDA", torch.cuda.is_initialized())
    """))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "STOPPED" in proc.stdout and "CPU-only build" in proc.stdout
    assert 'loss = model(torch.randn(4, 16, device="cuda")).sum()' in proc.stdout
    assert "CUDA False" in proc.stdout


# ---------------------------------------------------------------- save, replay, predict, plan

@requires_fake_cuda
def test_predict_gives_peak_reserved_and_an_oom_verdict_per_gpu():
    import allocconf_widget

    with allocconf_widget.dry_run("t4") as run:
        _mlp_step(1 << 17)  # ≈ 3 GiB of activations
    on_t4 = run.predict("")
    assert on_t4.fits and on_t4.estimate and on_t4.peak_reserved >= run.trace.peak_requested
    tiny = GpuProfile("tiny", "a 1 GiB GPU", GIB, 0, (8, 0), 10)
    small = run.predict("expandable_segments:True", tiny)
    assert not small.fits and "out of memory" in small.describe()
    with pytest.raises(AllocConfError):
        run.predict("max_split_size_mb:not-a-number")


@requires_fake_cuda
def test_predict_replays_a_recording_too():

    from allocconf_widget.app.dryrun import predict
    from allocconf_widget.app.session import Session
    from allocconf_widget.app.sources import trace_source
    from allocconf_widget.core.sim.trace.extract import extract_trace

    source = trace_source(Session())  # no recording, no dry run: the bundled one
    decoded = extract_trace(source.snapshot)
    default = predict(source, "", trace=decoded)
    expandable = predict(source, "expandable_segments:True", trace=decoded)
    assert not default.estimate and default.fits
    assert expandable.peak_reserved < default.peak_reserved  # the recording's known ranking
    assert not predict(source, "", "t4", trace=decoded).fits or default.peak_reserved < 14 * GIB


@requires_fake_cuda
def test_the_planner_reports_the_largest_batch_that_fits_and_stops_after_one_that_does_not():
    from allocconf_widget.app.dryrun import plan_batch
    from allocconf_widget.views.text.dryrun import render_plan

    gpu = GpuProfile("small", "a 3 GiB GPU", 3 * GIB, 0, (8, 0), 10)
    plan = plan_batch(_mlp_step, [1 << 12, 1 << 14, 1 << 16, 1 << 17, 1 << 18], gpus=(gpu,),
                      confs=("", "expandable_segments:True"))
    largest = plan.largest("", gpu.name)
    assert largest == 1 << 16
    assert 1 << 18 not in plan.sizes  # 2**17 ran out everywhere: larger sizes are not tried
    text = render_plan(plan)
    assert "largest predicted to fit with (torch defaults): batch 65536" in text
    assert "OOM" in text


@requires_fake_cuda
def test_the_whatif_replays_a_dry_run_labelled_an_estimate():
    import allocconf_widget
    from allocconf_widget.app.simulate import SimulationRequest, simulate

    with allocconf_widget.dry_run("l4") as run:
        _mlp_step(2048)
    report = simulate(run.source(), SimulationRequest(rank=True))
    assert "dry run (estimate)" in report.source_label
    assert any("fake CUDA tensors" in n for n in report.all_notes())
    assert report.device_total == profile("l4").total_bytes
    assert report.rows
    assert run.source().trace() is run.decoded()  # predictions and the what-if: one decoding


def test_without_a_gpu_visible_to_nvml_the_prediction_is_for_a_t4_and_says_so():
    from allocconf_widget.adapters.nvml import runtime_profile
    from allocconf_widget.app.dryrun import resolve_gpu

    if runtime_profile() is not None:
        pytest.skip("this machine has a GPU NVML sees")
    gpu, note = resolve_gpu(None)
    assert gpu.key == "t4" and note is not None and "pass gpu=" in note


@requires_fake_cuda
def test_a_convolution_borrows_its_workspace_after_its_output_exists():
    """cuDNN takes its workspace once the output is allocated and frees it on return: the
    replay must see that order (taken before the output, the output would reuse its block)."""
    import allocconf_widget

    with allocconf_widget.dry_run("h200") as run, torch.no_grad():
        conv = torch.nn.Conv2d(64, 64, 3, padding=1).to("cuda")
        conv(torch.randn(8, 64, 56, 56, device="cuda"))
    entries = run.trace.entries
    at = next(i for i, e in enumerate(entries)
              if e["frames"] and e["frames"][0]["name"] == "cuDNN workspace (estimate)")
    output, workspace = entries[at - 1], entries[at]
    assert output["action"] == "alloc" and output["size"] == 8 * 64 * 56 * 56 * 4
    operands = 2 * output["size"] + 64 * 64 * 9 * 4
    assert workspace["size"] == operands
    assert [e["action"] for e in entries[at + 1:at + 3]] == ["free_requested", "free_completed"]
    assert any("cuDNN workspace to 1 convolution (" in n for n in run.all_notes())


@requires_fake_cuda
def test_the_dry_runs_fake_mode_never_copies_to_the_gpu():
    """Where a GPU is visible, FakeTensorMode copies a one-element constant (BatchNorm's
    ``num_batches_tracked``) to it for real, which froze the allocator settings on the H200
    (docs/dryrun.md). The dry run's mode must avoid the device as on a GPU-less machine; this
    machine has no GPU, so the behaviour itself is checked by tests/gpu/test_dryrun_gpu.py and
    here only that the mode says so whatever torch.cuda reports."""
    from allocconf_widget.adapters.dryrun.tensors import fake_mode

    mode = fake_mode()
    assert mode.avoid_device_init is True
    mode.avoid_device_init = False  # releases that assign it in __init__ cannot switch it off
    assert mode.avoid_device_init is True
