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

import functools
import random
import time
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


# ------------------------------------------------------------------ notebook habits (issue 12)
# The patterns notebooks have that the five workloads above do not: empty_cache() between
# phases, two streams handing tensors over with record_stream, CUDA graph private pools from
# torch.compile(mode="reduce-overhead"), a user MemPool, and a memory fraction lowered mid-run.


def resnet_ec(device: torch.device, log_step: StepLogger, cycles: int = 2) -> None:
    """torchvision ResNet-50: train, ``gc.collect(); empty_cache()``, eval at larger batches, again."""
    import gc

    import torchvision

    _set_determinism()
    rng = random.Random(6)
    model = torchvision.models.resnet50(weights=None).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = 0
    for _ in range(cycles):
        model.train()
        for _ in range(4):
            log_step(step)
            step += 1
            batch = rng.choice([16, 24, 32])
            res = rng.choice([160, 192, 224])
            x = torch.randn(batch, 3, res, res, device=device)
            y = torch.randint(0, 1000, (batch,), device=device)
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            del x, y, loss
        gc.collect()
        torch.cuda.empty_cache()
        model.eval()
        with torch.no_grad():
            for _ in range(3):
                log_step(step)
                step += 1
                x = torch.randn(rng.choice([64, 96, 128]), 3, 224, 224, device=device)
                pred = model(x).argmax(1)
                del x, pred
        gc.collect()
        torch.cuda.empty_cache()
    torch.cuda.synchronize()


def streams2(device: torch.device, log_step: StepLogger, steps: int = 40) -> None:
    """Equal-size tensors made on a side stream, consumed on the default stream, ``record_stream``,
    deleted; the default stream allocates outputs of the same sizes (the tie-break case)."""
    _set_determinism()
    rng = random.Random(7)
    side = torch.cuda.Stream(device)
    main = torch.cuda.current_stream(device)
    weight = torch.randn(2048, 2048, device=device)
    for step in range(steps):
        log_step(step)
        rows = rng.choice([1024, 3072, 6144])  # 8, 24, 48 MiB of float32
        with torch.cuda.stream(side):
            parts = [torch.randn(rows, 2048, device=device) for _ in range(rng.choice([3, 4, 5]))]
            scratch = torch.empty(rng.randint(1, 40) << 20, dtype=torch.uint8, device=device)
        main.wait_stream(side)
        outs = []
        for p in parts:
            p.record_stream(main)
            outs.append(torch.relu(p @ weight))
        del parts, scratch
        total = torch.stack([o.sum() for o in outs]).sum()
        del outs, total
    torch.cuda.synchronize()


def compiled(device: torch.device, log_step: StepLogger, steps: int = 24) -> None:
    """A small transformer under ``torch.compile(mode="reduce-overhead")`` over three input shapes:
    CUDA graph trees capture into a private pool and re-record for each new shape."""
    _set_determinism()
    layer = nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).to(device).eval()
    fn = torch.compile(model, mode="reduce-overhead")
    shapes = [(16, 128), (8, 256), (4, 512)]
    for step in range(steps):
        log_step(step)
        batch, seq = shapes[(step // 2) % 3] if step < 12 else shapes[step % 3]
        torch.compiler.cudagraph_mark_step_begin()
        x = torch.randn(batch, seq, 512, device=device)
        with torch.no_grad():
            y = fn(x)
        out = y.float().mean()
        del x, y, out
    torch.cuda.synchronize()


def mempool(device: torch.device, log_step: StepLogger, steps: int = 36) -> None:
    """Allocations routed to a ``torch.cuda.MemPool`` with ``use_mem_pool`` beside the default pool."""
    _set_determinism()
    rng = random.Random(8)
    pool = torch.cuda.MemPool()
    kept: list[torch.Tensor] = []
    for step in range(steps):
        log_step(step)
        with torch.cuda.use_mem_pool(pool):
            a = torch.empty(rng.choice([3, 12, 40, 72]) << 20, dtype=torch.uint8, device=device)
            b = torch.empty(rng.randint(1, 900) << 10, dtype=torch.uint8, device=device)
        c = torch.empty(rng.choice([6, 12, 40, 72]) << 20, dtype=torch.uint8, device=device)
        d = torch.empty(rng.randint(1, 900) << 10, dtype=torch.uint8, device=device)
        if step % 3 == 0:
            kept.append(a)
        del a, b, d
        if rng.random() < 0.5:
            kept.append(c)
        del c
        while len(kept) > 8:
            kept.pop(rng.randrange(len(kept)))
    kept.clear()
    torch.cuda.synchronize()
    del pool


def fracmid(device: torch.device, log_step: StepLogger, ops: int = 6000) -> None:
    """Random tensors, then ``set_per_process_memory_fraction`` lowered below what is reserved,
    then more random tensors: the allocator's OOM path releases cached segments (no error)."""
    rng = random.Random(9)
    total = torch.cuda.get_device_properties(device).total_memory

    def churn(cap: int, n: int, first: int) -> None:
        live: list[torch.Tensor] = []
        live_bytes = 0
        for op in range(n):
            if op % 1000 == 0:
                log_step(first + op // 1000)
            if live and (live_bytes > cap or rng.random() < 0.47):
                t = live.pop(rng.randrange(len(live)))
                live_bytes -= t.numel()
                del t
            else:
                size = int(2 ** rng.uniform(20, 27))
                live.append(torch.empty(size, dtype=torch.uint8, device=device))
                live_bytes += size
        live.clear()

    churn(3 << 30, ops, 0)
    torch.cuda.set_per_process_memory_fraction((4 << 30) / total, device)
    churn(2 << 30, ops, 100)
    torch.cuda.synchronize()


WORKLOADS.update({
    "resnet_ec": resnet_ec,
    "streams2": streams2,
    "compiled": compiled,
    "mempool": mempool,
    "fracmid": fracmid,
})


def gpt2_ec(device: torch.device, log_step: StepLogger, cycles: int = 2) -> None:
    """Held-out check (third-party model code): a GPT-2 from ``transformers`` (random weights, from
    its config), a few training steps, ``gc.collect(); empty_cache()``, KV-cache generation."""
    import gc

    from transformers import GPT2Config, GPT2LMHeadModel

    _set_determinism()
    rng = random.Random(10)
    model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=512, n_head=8)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step = 0
    for _ in range(cycles):
        model.train()
        for _ in range(3):
            log_step(step)
            step += 1
            ids = torch.randint(0, 50257, (rng.choice([4, 8, 12]), rng.choice([128, 256, 512])),
                                device=device)
            opt.zero_grad(set_to_none=True)
            model(ids, labels=ids).loss.backward()
            opt.step()
            del ids
        gc.collect()
        torch.cuda.empty_cache()
        model.eval()
        with torch.no_grad():
            log_step(step)
            step += 1
            prompt = torch.randint(0, 50257, (rng.choice([8, 16]), 32), device=device)
            out = model.generate(prompt, max_new_tokens=48, do_sample=False, pad_token_id=0)
            del prompt, out
        gc.collect()
        torch.cuda.empty_cache()
    torch.cuda.synchronize()


WORKLOADS["gpt2_ec"] = gpt2_ec


# ------------------------------------------------------------------ edges of the what-if (issue 23)
# A program that catches its own OOMs (a batch-size finder under a memory fraction), a two-stream
# hand-over whose pending frees depend on how far the GPU lags the CPU, and a bf16 CNN for the
# garbage-collection reclaim order under a fraction.


def _finder_model(device: torch.device) -> nn.Module:
    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )

    return nn.Sequential(block(3, 64), block(64, 128), block(128, 256), block(256, 384),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(384, 1000)).to(device)


def _finder_steps(model: nn.Module, opt: torch.optim.Optimizer, device: torch.device, batch: int,
                  steps: int, log_step: StepLogger, first: int) -> None:
    for step in range(steps):
        log_step(first + step)
        x = torch.randn(batch, 3, 128, 128, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        del x, y, loss
    torch.cuda.synchronize()


def batchfind(device: torch.device, log_step: StepLogger, start: int = 512) -> None:
    """accelerate's ``find_executable_batch_size``: try a batch, on ``OutOfMemoryError`` run
    ``gc.collect(); empty_cache()`` and halve it; then train at the batch that fits. Run under a
    memory fraction, the program catches its OOMs and completes."""
    import gc

    _set_determinism()
    model = _finder_model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batch, first = start, 0
    while batch > 0:
        try:
            _finder_steps(model, opt, device, batch, 3, log_step, first)
            break
        except torch.OutOfMemoryError:
            opt.zero_grad(set_to_none=True)
            gc.collect()
            torch.cuda.empty_cache()
            batch //= 2
            first += 100
    _finder_steps(model, opt, device, batch, 6, log_step, 1000)


def batchgrow(device: torch.device, log_step: StepLogger, start: int = 8) -> None:
    """Lightning's batch-size finder in "power" mode, written out: double the batch until an
    ``OutOfMemoryError`` (caught; ``gc.collect(); empty_cache()``), then train at the last batch
    that fitted. No ``empty_cache`` between the trials that succeed."""
    import gc

    _set_determinism()
    model = _finder_model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batch, good, first = start, 0, 0
    while batch <= 4096:
        try:
            _finder_steps(model, opt, device, batch, 2, log_step, first)
        except torch.OutOfMemoryError:
            opt.zero_grad(set_to_none=True)
            gc.collect()
            torch.cuda.empty_cache()
            break
        good, batch, first = batch, batch * 2, first + 100
    _finder_steps(model, opt, device, max(good, 1), 6, log_step, 10_000)


def streams3(device: torch.device, log_step: StepLogger, steps: int = 48) -> None:
    """Two streams, timing-dependent: a side stream makes 32–128 MiB inputs, the default stream
    runs long matmuls on them (``record_stream``, then ``del``), the CPU runs ahead of the GPU and
    waits only at a loss ``.item()`` every 6 steps. When each pending free completes depends on
    how far the GPU lags, so identical runs peak differently."""
    _set_determinism()
    rng = random.Random(11)
    side = torch.cuda.Stream(device)
    main = torch.cuda.current_stream(device)
    weight = torch.randn(4096, 4096, device=device)
    total = None
    for step in range(steps):
        log_step(step)
        with torch.cuda.stream(side):
            parts = [torch.randn(rng.choice([2048, 4096, 8192]), 4096, device=device)
                     for _ in range(rng.choice([2, 3]))]
        main.wait_stream(side)
        outs = []
        for p in parts:
            p.record_stream(main)
            outs.append(torch.relu(p @ weight) @ weight)
        del parts
        s = torch.stack([o.float().mean() for o in outs]).sum()
        total = s if total is None else total + s
        del outs, s
        if step % 6 == 5:
            total.item()
            total = None
    torch.cuda.synchronize()


def cnn_bf16(device: torch.device, log_step: StepLogger, steps: int = 30) -> None:
    """The ``cnn`` workload as Lightning's ``precision="bf16-mixed"`` runs it: autocast to bf16,
    fp32 weights, batches of varying size and resolution."""
    _set_determinism()
    rng = random.Random(12)
    model = _finder_model(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(steps):
        log_step(step)
        batch = rng.choice([16, 32, 48, 64])
        res = rng.choice([96, 128, 160, 192])
        x = torch.randn(batch, 3, res, res, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        del x, y, loss
    torch.cuda.synchronize()


WORKLOADS.update({
    "batchfind": batchfind,
    "batchgrow": batchgrow,
    "streams3": streams3,
    "cnn_bf16": cnn_bf16,
})


def lightning_bf16(device: torch.device, log_step: StepLogger, steps: int = 30) -> None:
    """``cnn_bf16``'s model trained by Lightning's own ``Trainer`` with ``precision="bf16-mixed"``
    (issue 23 §4: a held-out recording of this kind replayed ``garbage_collection_threshold:0.6``
    under a fraction 4 % low). Random batches of varying size and resolution, as ``cnn_bf16``."""
    import lightning

    del device  # the Trainer picks the GPU itself
    _set_determinism()
    rng = random.Random(12)
    shapes = [(rng.choice([16, 32, 48, 64]), rng.choice([96, 128, 160, 192])) for _ in range(steps)]

    class Batches(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            for batch, res in shapes:
                yield torch.randn(batch, 3, res, res), torch.randint(0, 1000, (batch,))

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _finder_model(torch.device("cpu"))

        def training_step(self, data, index):  # type: ignore[no-untyped-def]
            log_step(index)
            x, y = data
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    trainer = lightning.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed",
                                max_steps=steps, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Module(), torch.utils.data.DataLoader(Batches(), batch_size=None))
    torch.cuda.synchronize()


WORKLOADS["lightning_bf16"] = lightning_bf16


def prefetch(device: torch.device, log_step: StepLogger, steps: int = 40) -> None:
    """The data-loader prefetch pattern: pinned CPU batches of varying size copied to the GPU
    on a side stream (``non_blocking``), ``record_stream`` on the default stream, a small conv
    net trained on them; the next batch is prefetched while the step runs, and the loss is read
    (``.item()``, a sync) every 8 steps, as a progress bar would."""
    _set_determinism()
    rng = random.Random(13)
    side = torch.cuda.Stream(device)
    main = torch.cuda.current_stream(device)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1, stride=2),
        nn.ReLU(), nn.Conv2d(128, 256, 3, padding=1, stride=2), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 100)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    host = [torch.randn(b, 3, r, r).pin_memory() for b, r in ((32, 128), (64, 160), (48, 192), (96, 96))]

    def load() -> torch.Tensor:
        with torch.cuda.stream(side):
            return host[rng.randrange(len(host))].to(device, non_blocking=True)

    batch = load()
    loss_sum = None
    for step in range(steps):
        log_step(step)
        main.wait_stream(side)
        x = batch
        x.record_stream(main)
        batch = load()  # the next batch, copied while this step computes
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        del loss
        if step % 8 == 7:
            loss_sum.item()
            loss_sum = None
    del batch
    torch.cuda.synchronize()


WORKLOADS["prefetch"] = prefetch


def d2h(device: torch.device, log_step: StepLogger, steps: int = 40) -> None:
    """A held-out two-stream program (written and recorded after round 9's range change): a
    transformer encoder trained on variable sequence lengths whose outputs an async writer
    copies to pinned host memory on a side stream (``record_stream`` on that stream, then
    ``del``), waiting on the last copy's event every 5 steps."""
    _set_determinism()
    rng = random.Random(17)
    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    layer = nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    host = torch.empty(32 * 512 * 512, dtype=torch.float32).pin_memory()
    for step in range(steps):
        log_step(step)
        batch, seq = rng.choice([16, 32]), rng.randint(64, 512)
        x = torch.randn(batch, seq, 512, device=device)
        y = model(x)
        loss = y.float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out = y.detach()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            out.record_stream(side)
            host[:out.numel()].view(out.shape).copy_(out, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        del out, y, loss, x
        if step % 5 == 4:
            done.synchronize()
    torch.cuda.synchronize()


WORKLOADS["d2h"] = d2h


def buckets(device: torch.device, log_step: StepLogger, steps: int = 40) -> None:
    """A two-stream program written after the timing-range code was last changed, to test it
    on held-out data (``record_edges.py --timing-only buckets,pipe2``): DDP-style gradient
    bucketing. After ``backward`` a communication stream flattens the gradients into ~25 MiB
    buckets (``torch.cat``), scales them as an all-reduce's average would, and copies them
    back; every gradient is ``record_stream``-ed on that stream, and
    ``zero_grad(set_to_none=True)`` drops them while those copies may still be queued. The
    optimizer waits for the stream (``wait_stream``, on the GPU only); the loss is read every
    4 steps (``.item()``), with batches of varying size."""
    _set_determinism()
    rng = random.Random(23)
    main = torch.cuda.current_stream(device)
    comm = torch.cuda.Stream(device)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))
                            for _ in range(6)]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    params = list(model.parameters())
    bucket_elems = 25 * 2**20 // 4
    for step in range(steps):
        log_step(step)
        x = torch.randn(rng.choice([64, 128, 256]) * rng.choice([4, 8]), 1024, device=device)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        comm.wait_stream(main)
        with torch.cuda.stream(comm):
            bucket: list[torch.Tensor] = []
            size = 0
            for p in reversed(params):
                g = p.grad
                assert g is not None
                g.record_stream(comm)
                bucket.append(g)
                size += g.numel()
                if size >= bucket_elems or p is params[0]:
                    flat = torch.cat([t.flatten() for t in bucket])
                    flat.mul_(0.5)
                    for t, v in zip(bucket, flat.split([t.numel() for t in bucket]), strict=True):
                        t.copy_(v.view_as(t))
                    del flat
                    bucket, size = [], 0
            del g
        main.wait_stream(comm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x
        if step % 4 == 3:
            loss.item()
        del loss
    torch.cuda.synchronize()


WORKLOADS["buckets"] = buckets


def pipe2(device: torch.device, log_step: StepLogger, steps: int = 48) -> None:
    """A two-stream program written after the timing-range code was last changed (as
    :func:`buckets`): a two-stage inference pipeline on one GPU. Stage one (a conv encoder)
    runs on one stream and stage two (a head) on another, so that one microbatch's stage two
    overlaps the next one's stage one; each stage-one output is ``record_stream``-ed on the
    stage-two stream and dropped by the CPU at once. The predictions are gathered to the host
    (``.cpu()`` on the stage-two stream, a sync) every 6 microbatches, whose shapes vary."""
    _set_determinism()
    rng = random.Random(29)
    first, second = torch.cuda.Stream(device), torch.cuda.Stream(device)
    encoder = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1, stride=2),
        nn.ReLU(), nn.Conv2d(128, 256, 3, padding=1, stride=2), nn.ReLU()).to(device).eval()
    head = nn.Sequential(nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(256, 1000)).to(device).eval()
    outputs: list[torch.Tensor] = []
    with torch.no_grad():
        for step in range(steps):
            log_step(step)
            batch, res = rng.choice([(32, 128), (64, 96), (16, 224), (48, 160)])
            with torch.cuda.stream(first):
                x = torch.randn(batch, 3, res, res, device=device)
                h = encoder(x)
                del x
            second.wait_stream(first)
            with torch.cuda.stream(second):
                h.record_stream(second)
                outputs.append(head(h))
            del h
            if step % 6 == 5:
                with torch.cuda.stream(second):
                    torch.cat(outputs).cpu()
                outputs.clear()
    torch.cuda.synchronize()


WORKLOADS["pipe2"] = pipe2


# ------------------------------------------------------------------ round 19: third-party code
# Programs written with libraries' own training and generation code, recorded after the simulator
# was last changed: detection with data-dependent proposal counts (torchvision), a ViT under
# activation checkpointing with fp16 autocast and a GradScaler (timm), LoRA fine-tuning of a Llama
# with gradient checkpointing (transformers + peft), and batched greedy generation with a growing
# KV cache (transformers). Each is seeded and deterministic, so every setting's run makes the same
# requests (benchmarks/fidelity.py checks that before it compares).


def _deterministic_kernels() -> None:
    import os

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)


def maskrcnn(device: torch.device, log_step: StepLogger, steps: int = 10) -> None:
    """torchvision's Mask R-CNN (random weights) trained on 2–4 images of 400–800 px with 1–6
    boxes each: proposal and mask counts decide many allocation sizes."""
    from torchvision.models.detection import maskrcnn_resnet50_fpn

    _set_determinism()
    _deterministic_kernels()
    rng = random.Random(31)
    gen = torch.Generator().manual_seed(31)
    model = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=11).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.002, momentum=0.9)
    for step in range(steps):
        log_step(step)
        images, targets = [], []
        for _ in range(rng.choice([2, 4])):
            h, w = rng.randint(400, 800), rng.randint(400, 800)
            images.append(torch.rand(3, h, w, generator=gen).to(device))
            boxes, masks = [], torch.zeros(rng.randint(1, 6), h, w, dtype=torch.uint8)
            for k in range(masks.shape[0]):
                x0, y0 = rng.randint(0, w - 64), rng.randint(0, h - 64)
                x1, y1 = rng.randint(x0 + 32, w), rng.randint(y0 + 32, h)
                boxes.append([x0, y0, x1, y1])
                masks[k, y0:y1, x0:x1] = 1
            targets.append({"boxes": torch.tensor(boxes, dtype=torch.float32, device=device),
                            "labels": torch.randint(1, 11, (len(boxes),), generator=gen).to(device),
                            "masks": masks.to(device)})
        opt.zero_grad(set_to_none=True)
        losses = model(images, targets)
        sum(losses.values()).backward()
        opt.step()
        del images, targets, losses
    torch.cuda.synchronize()


def vit_ckpt(device: torch.device, log_step: StepLogger, steps: int = 18) -> None:
    """timm's ViT-S/16 (random weights, ``dynamic_img_size``) under activation checkpointing,
    fp16 autocast and a ``GradScaler``, on batches of 16–48 images at 160–288 px."""
    import timm

    _set_determinism()
    _deterministic_kernels()
    rng = random.Random(37)
    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=100,
                              dynamic_img_size=True).to(device).train()
    model.set_grad_checkpointing(True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda")
    for step in range(steps):
        log_step(step)
        batch, res = rng.choice([16, 32, 48]), rng.choice([160, 224, 288])
        x = torch.randn(batch, 3, res, res, device=device)
        y = torch.randint(0, 100, (batch,), device=device)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        del x, y, loss
    torch.cuda.synchronize()


def _small_llama(device: torch.device) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                         num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096)
    return LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16)


def llama_lora(device: torch.device, log_step: StepLogger, steps: int = 14) -> None:
    """LoRA (peft, r=16 on q/v) fine-tuning of a small bf16 Llama (random weights) with gradient
    checkpointing, batches of 2–8 sequences of 256–1024 tokens."""
    from peft import LoraConfig, get_peft_model

    _set_determinism()
    _deterministic_kernels()
    rng = random.Random(41)
    model = _small_llama(device)
    model.gradient_checkpointing_enable()
    model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"],
                                             task_type="CAUSAL_LM"))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    for step in range(steps):
        log_step(step)
        ids = torch.randint(0, 32000, (rng.choice([2, 4, 8]), rng.choice([256, 512, 1024])), device=device)
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        del ids
    torch.cuda.synchronize()


def llama_generate(device: torch.device, log_step: StepLogger, requests: int = 10) -> None:
    """Batched greedy generation from a small bf16 Llama (random weights): 1–8 prompts of 16–512
    tokens, 32–128 new tokens each (``min_new_tokens`` fixes the length), the KV cache growing."""
    _set_determinism()
    _deterministic_kernels()
    rng = random.Random(43)
    model = _small_llama(device).eval()
    with torch.no_grad():
        for request in range(requests):
            log_step(request)
            prompt = torch.randint(0, 32000, (rng.choice([1, 4, 8]), rng.randint(16, 512)), device=device)
            new = rng.choice([32, 64, 128])
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                 min_new_tokens=new, do_sample=False, pad_token_id=0)
            del prompt, out
    torch.cuda.synchronize()


WORKLOADS.update({
    "maskrcnn": maskrcnn,
    "vit_ckpt": vit_ckpt,
    "llama_lora": llama_lora,
    "llama_generate": llama_generate,
})


def offload(device: torch.device, log_step: StepLogger, steps: int = 40, host: str = "ahead") -> None:
    """A two-stream program written in round 19, after the timing-range code was last changed
    (held out, as :func:`buckets`): layer weights streamed from pinned host memory, one layer
    ahead, as model-offloading libraries do for models larger than the GPU. A copy stream
    uploads layer ``i + 1``'s weights while the default stream computes layer ``i``; each
    uploaded weight is ``record_stream``-ed on the default stream and dropped by the CPU right
    after its layer is queued. Inputs of varying batch and sequence length; the output is read
    (``.item()``) every 5 steps.

    ``host`` (round 20) sets how far the CPU runs ahead of the GPU, nothing else: ``ahead``
    queues as fast as Python goes; ``slow`` sleeps 5 ms after queuing each layer (a host
    slower than the uploads, as under a debugger or a busy notebook); ``synced`` waits for the
    GPU after each layer, so every free completes at its request (the early timing bound's
    order, :mod:`allocconf_widget.core.sim.timing`). The allocations are the same in all
    three."""
    _set_determinism()
    rng = random.Random(47)
    main = torch.cuda.current_stream(device)
    copy = torch.cuda.Stream(device)
    gen = torch.Generator().manual_seed(47)
    layers = [(torch.randn(4096, 1536, generator=gen).mul_(0.02).pin_memory(),
               torch.randn(1536, 4096, generator=gen).mul_(0.02).pin_memory()) for _ in range(10)]

    def upload(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.cuda.stream(copy):
            up, down = (w.to(device, non_blocking=True) for w in layers[i])
        return up, down

    with torch.no_grad():
        for step in range(steps):
            log_step(step)
            x = torch.randn(rng.choice([4, 8, 16]), rng.randint(128, 1024), 1536, device=device)
            ahead = upload(0)
            for i in range(len(layers)):
                up, down = ahead
                main.wait_stream(copy)
                up.record_stream(main)
                down.record_stream(main)
                if i + 1 < len(layers):
                    ahead = upload(i + 1)
                x = x + nn.functional.linear(nn.functional.gelu(nn.functional.linear(x, up)), down)
                del up, down
                if host == "synced":
                    torch.cuda.synchronize(device)
                elif host == "slow":
                    time.sleep(0.005)
            if step % 5 == 4:
                x.float().mean().item()
            del x
    torch.cuda.synchronize()


WORKLOADS["offload"] = offload
WORKLOADS["offload_slow"] = functools.partial(offload, host="slow")
WORKLOADS["offload_synced"] = functools.partial(offload, host="synced")
