"""Plan before you rent a GPU: a training step dry-runs on a runtime without one (this machine:
a CPU-only torch), through the CPU stand-in, labelled the coarser estimate it is.

A CPU-only torch cannot record autograd on fake CUDA tensors, so a training step could not be
dry-run at all without a GPU. The stand-in runs it on fake CPU tensors counted as the CUDA
allocations they stand for, with ``autocast("cuda")`` casting by CUDA's policy and attention
and workspaces from the profile. Where this build can run the same step on fake CUDA tensors
(inference), the two traces are compared allocation by allocation.
"""

from __future__ import annotations

import pytest

from allocconf_widget.core.dryrun.facts import STANDIN_LABEL
from allocconf_widget.core.units import MIB
from tests.torch_versions import cuda_build, has_torch, needs_fake_cuda, needs_torch

torch = pytest.importorskip("torch")
pytestmark = [needs_torch((2, 4), "the dry run"),
              pytest.mark.skipif(cuda_build() and torch.cuda.is_available(), reason="a GPU is visible")]
nn = torch.nn
F = torch.nn.functional


class Block(nn.Module):  # type: ignore[name-defined, misc]
    def __init__(self, width: int = 256, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


def _lm_step(train: bool, tokens: int = 256) -> None:
    """A bf16-autocast language model step, as notebooks write it."""
    model = nn.Sequential(nn.Embedding(1000, 256), Block(), Block(), nn.Linear(256, 1000)).to("cuda")
    idx = torch.randint(0, 1000, (4, tokens), device="cuda")
    with torch.set_grad_enabled(train), torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, 1000).float(), idx.view(-1))
    if train:
        loss.backward()
        torch.optim.AdamW(model.parameters()).step()


def _dry(step, *args, gpu: str = "h100", standin: bool | None = None):
    import allocconf_widget

    with allocconf_widget.dry_run(gpu, standin=standin, progress=False) as run:
        step(*args)
    return run


def test_a_training_step_dry_runs_without_a_gpu_labelled_a_coarser_estimate():
    run = _dry(_lm_step, True)
    assert run.trace.standin and STANDIN_LABEL in run.label and STANDIN_LABEL in run.summary()
    params = sum(p.numel() for p in nn.Sequential(nn.Embedding(1000, 256), Block(), Block(),
                                                    nn.Linear(256, 1000)).parameters()) * 4
    # weights, gradients and AdamW's two moments are live at the optimizer step
    assert run.trace.peak_requested > 4 * params
    assert any("added 2 cuBLAS workspace(s)" in n for n in run.all_notes())  # forward and backward threads
    assert torch.cuda.is_initialized() is False


@pytest.mark.skipif(has_torch((2, 10)), reason="torch 2.10+ moves tensors to a fake GPU without CUDA")
def test_before_torch_2_10_a_training_step_runs_on_the_standin_and_fake_cuda_is_refused():
    """On 2.4-2.9 every training step stopped at its first matmul ("found two different devices
    cpu, meta": ``Module.to()`` set a parameter's ``.data`` to its fake copy), and fake CUDA
    tensors call the CUDA runtime there (a driverless machine stops; a GPU's would start CUDA)."""
    from allocconf_widget._errors import DryRunError

    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    weights = sum(p.numel() for p in model.parameters()) * 4

    def step() -> None:
        moved = model.to("cuda")
        moved(torch.randn(8, 64, device="cuda")).square().mean().backward()
        torch.optim.AdamW(moved.parameters()).step()

    run = _dry(step)
    assert run.trace.standin and run.trace.peak_requested >= 4 * weights  # weights, grads, 2 moments
    assert all(p.device.type == "cpu" and p.grad is None for p in model.parameters())  # the user's model
    refused = r"fake CUDA tensors need torch 2\.10 or newer.*leave out standin=False"
    with pytest.raises(DryRunError, match=refused):
        _dry(step, standin=False)
    assert float(model(torch.ones(1, 64)).sum()) == float(model(torch.ones(1, 64)).sum())  # torch usable
    assert torch.cuda.is_initialized() is False


@needs_fake_cuda
def test_the_standin_records_what_fake_cuda_records_where_both_can_run():
    """Inference (which this build can run on fake CUDA tensors too): the same allocations, in the
    same order, for a bf16-autocast transformer (CUDA's cast policy, the profile's attention)."""
    fake_cuda = _dry(_lm_step, False, standin=False)
    standin = _dry(_lm_step, False, standin=True)
    def sizes(run):
        return [(e["action"], e["size"]) for e in run.trace.entries]

    assert sizes(standin) == sizes(fake_cuda)
    assert standin.trace.peak_requested == fake_cuda.trace.peak_requested


def test_autocast_cuda_gives_the_dtypes_cuda_gives():
    """CPU autocast would leave layer_norm and softmax in bfloat16 (and cast cat); CUDA's computes
    them in float32, which is what the GPU allocates."""
    seen = {}

    def step() -> None:
        x = torch.randn(8, 64, device="cuda")
        w = torch.randn(64, 64, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = F.linear(x, w)
            seen["linear"] = y.dtype
            seen["layer_norm"] = F.layer_norm(y, (64,)).dtype
            seen["softmax"] = torch.softmax(y, -1).dtype
            seen["add"] = (y + x).dtype
        with torch.autocast("cuda"):  # CUDA's default: float16
            seen["default"] = (x @ w).dtype

    _dry(step, standin=True)
    assert seen == {"linear": torch.bfloat16, "layer_norm": torch.float32, "softmax": torch.float32,
                    "add": torch.float32, "default": torch.float16}


def test_tensors_the_code_keeps_on_the_cpu_are_not_counted_and_gpu_ones_say_cuda():
    seen = {}

    def step() -> None:
        batch = torch.randn(64, 3, 64, 64)  # the data loader's batch, on the host
        on_gpu = batch.to("cuda")
        seen["device"] = on_gpu.device.type
        seen["is_cuda"] = on_gpu.is_cuda
        made = torch.zeros(16, device=on_gpu.device)
        seen["made"] = made.device.type
        back = on_gpu.cpu()
        seen["back"] = back.device.type

    run = _dry(step, standin=True)
    sizes = [e["size"] for e in run.trace.entries if e["action"] == "alloc"]
    assert sizes == [64 * 3 * 64 * 64 * 4, 16 * 4]  # the copy on the GPU and the zeros: not the host ones
    assert seen == {"device": "cuda", "is_cuda": True, "made": "cuda", "back": "cpu"}


@needs_torch((2, 6), "cuDNN attention in SDPA")
def test_attention_and_workspaces_come_from_the_profile():
    """A T4 has no flash or cuDNN attention and no native bf16: SDPA falls back to the math kernel,
    which materialises the attention matrix; an H100 runs cuDNN attention."""
    t4 = _dry(_lm_step, True, 1024, gpu="t4")
    h100 = _dry(_lm_step, True, 1024, gpu="h100")
    matrix = 4 * 4 * 1024 * 1024 * 4  # batch × heads × tokens², float32 (math upcasts bf16)
    assert t4.trace.peak_requested > h100.trace.peak_requested + matrix
    assert any("math fallback" in n for n in t4.all_notes())
    assert any("cuDNN attention" in n for n in h100.all_notes())


@needs_fake_cuda
def test_a_cnn_with_convolution_workspaces_matches_fake_cuda():
    def step() -> None:
        model = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3), nn.ReLU(),
                              nn.Conv2d(64, 64, 3, padding=1)).to("cuda")
        with torch.no_grad():
            model(torch.randn(16, 3, 128, 128, device="cuda"))

    standin, fake_cuda = _dry(step, gpu="h200", standin=True), _dry(step, gpu="h200", standin=False)
    assert standin.trace.peak_requested == fake_cuda.trace.peak_requested > 16 * 64 * 64 * 64 * 4
    workspaces = [e for e in standin.trace.entries if e["frames"] and "cuDNN" in e["frames"][0]["name"]]
    assert len(workspaces) == 2 and workspaces[0]["size"] > 8 * MIB


def test_a_lazy_module_stops_in_one_line_naming_the_line():
    """It ended in a raw 40-line traceback."""
    from allocconf_widget._errors import DryRunError

    def step() -> None:
        nn.LazyLinear(16).to("cuda")

    with pytest.raises(DryRunError) as caught:
        _dry(step)
    message = str(caught.value)
    assert "\n" not in message and "test_dryrun_standin.py" in message and "nn.LazyLinear(16)" in message
    assert "Run one real forward pass on the CPU before the dry run" in message


def test_reading_a_value_shows_no_torch_warning(recwarn):
    """``.item()`` and printing read a fake tensor's data pointer: torch warned, in red, that this is
    "almost definitely a bug in your code"."""
    def step() -> None:
        x = torch.randn(8, device="cuda")
        x.data_ptr()
        print(f"{x.sum().item():.2f}")

    _dry(step)
    assert not [w for w in recwarn if "data pointer" in str(w.message)]


def test_slicing_runs_where_fake_cuda_tensors_could_not():
    """On this build, slicing a fake CUDA tensor stopped the dry run, advising inference under
    no_grad, which the cell already did; the stand-in runs it (and the copy a slice makes counts)."""
    def step() -> None:
        x = torch.randn(64, 1024, device="cuda")
        with torch.no_grad():
            x[:, :512].contiguous()

    run = _dry(step)
    sizes = [e["size"] for e in run.trace.entries if e["action"] == "alloc"]
    assert sizes == [64 * 1024 * 4, 64 * 512 * 4]


def test_attention_inside_multihead_attention_runs_the_profiles_kernel():
    """``nn.TransformerEncoderLayer`` calls SDPA from inside ``F.multi_head_attention_forward``,
    which the dry run handled as one call: its attention ran by CPU rules (the math kernel,
    matrices and dropout masks kept for the backward), and an H100 LM step was predicted at
    +64 % of the real run's peak. Now it runs the profile's kernel, as a direct SDPA call does."""
    original = F.scaled_dot_product_attention

    def step() -> None:
        layer = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True, norm_first=True).to("cuda")
        mask = nn.Transformer.generate_square_subsequent_mask(512, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            layer(torch.randn(8, 512, 256, device="cuda"), src_mask=mask, is_causal=True).sum().backward()

    h100, t4 = _dry(step, gpu="h100"), _dry(step, gpu="t4")
    assert any("attention ran as NVIDIA H100" in n and "flash" in n for n in h100.all_notes())
    assert any("attention ran as Tesla T4" in n for n in t4.all_notes()), t4.all_notes()
    matrix = 8 * 4 * 512 * 512 * 4  # batch × heads × tokens², float32: what the math kernel keeps
    assert h100.trace.peak_requested + matrix < t4.trace.peak_requested  # T4: the math fallback
    assert F.scaled_dot_product_attention is original
