"""Training steps for the dry-run benchmark and GPU tests, written as a user would write them.

Each ``run_<name>(device, batch)`` builds its model on the CPU and moves it with
``.to(device)`` (or builds it on the device), then runs a short training loop with an
evaluation or decode at the end. Inputs have fixed shapes and seeds, so a real run and a dry
run make the same requests. They run unchanged on "cuda" for real and inside
``allocconf_widget.dry_run()`` on fake CUDA tensors.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

DEFAULT_BATCH = {"lm": 16, "resnet18": 64, "llama": 8, "timm_vit": 32, "lightning": 64,
                 "resnet50": 32, "mobilenet": 64, "vgg11": 16, "resnet18_bf16": 64, "resnet18_cl": 64,
                 "lm_fp16": 8}


def run_lm(device: str, batch: int) -> None:
    """A TransformerEncoder language model, AdamW, bf16 autocast, 2 steps and an eval pass."""
    torch.manual_seed(0)
    vocab, width, seq = 16000, 512, 512
    layer = nn.TransformerEncoderLayer(width, 8, 4 * width, batch_first=True, norm_first=True)
    model = nn.ModuleDict({"emb": nn.Embedding(vocab, width), "enc": nn.TransformerEncoder(layer, 6),
                           "head": nn.Linear(width, vocab)}).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    mask = nn.Transformer.generate_square_subsequent_mask(seq, device=device)

    def forward(tokens: torch.Tensor) -> torch.Tensor:
        hidden = model["enc"](model["emb"](tokens), mask=mask, is_causal=True)
        return model["head"](hidden)

    for _ in range(2):
        tokens = torch.randint(0, vocab, (batch, seq), device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = forward(tokens)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"loss {loss.item():.3f}")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        forward(torch.randint(0, vocab, (batch, seq), device=device))


def run_resnet18(device: str, batch: int) -> None:
    """torchvision ResNet-18 at 224 px, SGD with momentum, 2 steps and an eval pass."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=1000).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        images = torch.randn(batch, 3, 224, 224, device=device)
        labels = torch.randint(0, 1000, (batch,), device=device)
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        model(torch.randn(batch, 3, 224, 224, device=device))


def run_llama(device: str, batch: int) -> None:
    """A small transformers Llama from a config (random weights, no download): a bf16 training
    step with AdamW, then a 16-token greedy decode with the KV cache (a hand-written loop:
    ``generate`` needs real values)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1536,
                         num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=1024)
    model = LlamaForCausalLM(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, 32000, (batch, 512), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(input_ids=tokens, labels=tokens)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        prompt = tokens[:, :64]
        result = model(input_ids=prompt, use_cache=True)
        past = result.past_key_values
        nxt = result.logits[:, -1:].argmax(-1)
        for _ in range(16):
            result = model(input_ids=nxt, past_key_values=past, use_cache=True)
            past = result.past_key_values
            nxt = result.logits[:, -1:].argmax(-1)


def run_timm_vit(device: str, batch: int) -> None:
    """timm ViT-S/16 (random weights), AdamW with bf16 autocast, 2 steps."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_224", pretrained=False).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(2):
        images = torch.randn(batch, 3, 224, 224, device=device)
        labels = torch.randint(0, 1000, (batch,), device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def run_lightning(device: str, batch: int) -> None:
    """A LightningModule driven by a hand-written Lightning-style loop (training_step,
    configure_optimizers, validation_step; no Trainer, which would pick the device itself)."""
    try:
        import lightning

        base: type = lightning.LightningModule
    except ImportError:
        base = nn.Module

    class Classifier(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                     nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
                                     nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))

        def training_step(self, data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            x, y = data
            return nn.functional.cross_entropy(self.net(x), y)

        def validation_step(self, data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            return self.training_step(data)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    module = Classifier().to(device)
    opt = module.configure_optimizers()
    for _ in range(3):
        data = (torch.randn(batch, 3, 128, 128, device=device),
                torch.randint(0, 10, (batch,), device=device))
        loss = module.training_step(data)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        module.validation_step((torch.randn(batch, 3, 128, 128, device=device),
                                torch.randint(0, 10, (batch,), device=device)))


def _torchvision_classifier(name: str, device: str, batch: int, *, bf16: bool = False,
                            channels_last: bool = False) -> None:
    """A torchvision classifier at 224 px, SGD with momentum, 2 steps (optionally under bf16
    autocast, or with the model and images in channels-last layout)."""
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(num_classes=1000).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        images = torch.randn(batch, 3, 224, 224, device=device)
        if channels_last:
            images = images.to(memory_format=torch.channels_last)
        labels = torch.randint(0, 1000, (batch,), device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = nn.functional.cross_entropy(model(images).float(), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def run_resnet50(device: str, batch: int) -> None:
    _torchvision_classifier("resnet50", device, batch)


def run_mobilenet(device: str, batch: int) -> None:
    _torchvision_classifier("mobilenet_v3_small", device, batch)


def run_vgg11(device: str, batch: int) -> None:
    _torchvision_classifier("vgg11", device, batch)


def run_resnet18_bf16(device: str, batch: int) -> None:
    _torchvision_classifier("resnet18", device, batch, bf16=True)


def run_resnet18_cl(device: str, batch: int) -> None:
    _torchvision_classifier("resnet18", device, batch, channels_last=True)


def run_lm_fp16(device: str, batch: int) -> None:
    """A causal LM with its own attention (``scaled_dot_product_attention``, head size 64, 1,024
    tokens), fp16 autocast with a GradScaler, AdamW, 2 steps: the attention kernel decides its
    memory (memory-efficient on a T4, flash or cuDNN attention on Ampere and Hopper)."""
    torch.manual_seed(0)
    vocab, width, heads, seq = 8000, 512, 8, 1024

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.norm2(x))

    model = nn.Sequential(nn.Embedding(vocab, width), *[Block() for _ in range(6)], nn.LayerNorm(width),
                          nn.Linear(width, vocab)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda")
    for _ in range(2):
        tokens = torch.randint(0, vocab, (batch, seq), device=device)
        with torch.autocast("cuda", dtype=torch.float16):
            logits = model(tokens)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)


WORKLOADS: dict[str, Callable[[str, int], None]] = {
    "lm": run_lm, "resnet18": run_resnet18, "llama": run_llama, "timm_vit": run_timm_vit,
    "lightning": run_lightning, "resnet50": run_resnet50, "mobilenet": run_mobilenet,
    "vgg11": run_vgg11, "resnet18_bf16": run_resnet18_bf16, "resnet18_cl": run_resnet18_cl,
    "lm_fp16": run_lm_fp16,
}
