"""Deterministic GPU workloads whose allocation traces we record and replay.

Each workload is a function ``run(device, log_step) -> None`` that allocates
in the patterns that fragment a caching allocator in practice: varying input
shapes (CNN, transformer), buffers that grow step by step (a KV-cache-like
decode loop), a random mix of small and large tensors, and a side stream with
``record_stream`` (pending frees). Every random choice comes from a seeded
generator, so the *request sequence* is identical in every process whatever
allocator settings are in force; only the allocator's response differs. That
is what makes "replay the default trace under setting X" comparable with
"run the workload under setting X".

Sizes are kept modest (peak allocated a few GB) so that several runs can share
one GPU without ever approaching its capacity.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from torch import nn

StepLogger = Callable[[int], None]


def _set_determinism() -> None:
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def cnn(device: torch.device, log_step: StepLogger, steps: int = 36) -> None:
    """A small ResNet-like classifier trained on batches of varying size and resolution."""
    _set_determinism()
    rng = random.Random(1)

    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )

    model = nn.Sequential(
        block(3, 64), block(64, 128), block(128, 256), block(256, 384),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(384, 1000),
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(steps):
        log_step(step)
        batch = rng.choice([8, 16, 24, 32, 48])
        res = rng.choice([64, 96, 128, 160, 192, 224])
        x = torch.randn(batch, 3, res, res, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        del x, y, loss
    torch.cuda.synchronize()


def transformer(device: torch.device, log_step: StepLogger, steps: int = 30) -> None:
    """A transformer encoder trained on batches of varying sequence length (AdamW)."""
    _set_determinism()
    rng = random.Random(2)
    d_model = 768
    layer = nn.TransformerEncoderLayer(d_model, 12, 3072, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False).to(device)
    head = nn.Linear(d_model, 8192).to(device)
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    for step in range(steps):
        log_step(step)
        seq = rng.choice([96, 160, 256, 384, 512, 768, 1024])
        batch = max(2, 8192 // seq)
        x = torch.randn(batch, seq, d_model, device=device)
        target = torch.randint(0, 8192, (batch * seq,), device=device)
        opt.zero_grad(set_to_none=True)
        logits = head(model(x)).reshape(-1, 8192)
        loss = nn.functional.cross_entropy(logits, target)
        loss.backward()
        opt.step()
        del x, target, logits, loss
    torch.cuda.synchronize()


def growing(device: torch.device, log_step: StepLogger, requests: int = 24) -> None:
    """A decode loop: per request a KV-like buffer grows by ``torch.cat`` every token."""
    _set_determinism()
    rng = random.Random(3)
    hidden = 1024
    weight = torch.randn(hidden, hidden, device=device, dtype=torch.float16)
    for req in range(requests):
        log_step(req)
        batch = rng.choice([1, 2, 4, 8])
        kv = torch.randn(batch, rng.randint(16, 256), hidden, device=device, dtype=torch.float16)
        for _ in range(rng.randint(40, 120)):
            new = torch.randn(batch, rng.choice([1, 1, 1, 4]), hidden, device=device,
                              dtype=torch.float16)
            kv = torch.cat([kv, new @ weight], dim=1)
            scores = torch.softmax(kv @ new.transpose(1, 2), dim=1)
            del scores, new
        del kv
    torch.cuda.synchronize()


def mixed(device: torch.device, log_step: StepLogger, ops: int = 40_000) -> None:
    """Random alloc/free of raw tensors, log-uniform 256 B .. 256 MiB, live set capped at 6 GiB."""
    rng = random.Random(4)
    live: list[torch.Tensor] = []
    live_bytes = 0
    cap = 6 << 30
    for op in range(ops):
        if op % 2000 == 0:
            log_step(op // 2000)
        if live and (live_bytes > cap or rng.random() < 0.48):
            t = live.pop(rng.randrange(len(live)))
            live_bytes -= t.numel()
            del t
        else:
            n = int(2 ** rng.uniform(8, 28))
            live.append(torch.empty(n, dtype=torch.uint8, device=device))
            live_bytes += n
    live.clear()
    torch.cuda.synchronize()


def streams(device: torch.device, log_step: StepLogger, steps: int = 60) -> None:
    """Prefetch on a side stream with ``record_stream``: frees complete later (pending frees)."""
    _set_determinism()
    rng = random.Random(5)
    side = torch.cuda.Stream(device)
    weight = torch.randn(2048, 2048, device=device)
    host = [torch.randn(rng.choice([256, 512, 1024, 1536]), 2048).pin_memory() for _ in range(6)]
    for step in range(steps):
        log_step(step)
        with torch.cuda.stream(side):
            batch = host[step % len(host)].to(device, non_blocking=True)
            scratch = torch.empty(rng.randint(1, 64) << 20, dtype=torch.uint8, device=device)
        torch.cuda.current_stream().wait_stream(side)
        batch.record_stream(torch.cuda.current_stream())
        out = torch.relu(batch @ weight) @ weight.T
        out = out.sum(dim=0)
        del batch, out, scratch
    torch.cuda.synchronize()


WORKLOADS: dict[str, Callable[..., None]] = {
    "cnn": cnn,
    "transformer": transformer,
    "growing": growing,
    "mixed": mixed,
    "streams": streams,
}
