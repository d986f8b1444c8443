"""Record a batch finder under a memory fraction the way a user of torch alone would: no sidecar.

``tests/data/batchfind_raw__frac_default.pickle.gz`` comes from this script (NVIDIA H100 80GB,
torch 2.11.0+cu130): four ``nn.Linear`` layers and SGD tried at doubling batch sizes under
``torch.cuda.set_per_process_memory_fraction(0.05)``; the first size that runs out of memory is
caught, the cache emptied, and the size halved until one fits, then two more steps. The snapshot
is written by ``torch.cuda.memory._dump_snapshot`` alone, so a what-if of it must read the limit
off the OOM (``core/sim/capacity.held_limit``). The process prints the true limit; the test
data's JSON holds it. (A tidied copy of the script that recorded the file: the same steps.)

    python benchmarks/gpu/record_raw_batchfind.py OUT.pickle
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import torch
from torch import nn

FRACTION = 0.05


def step(model: nn.Module, opt: torch.optim.Optimizer, batch: int) -> None:
    x = torch.randn(batch, 4096, device="cuda")
    model(x).float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def fits(model: nn.Module, opt: torch.optim.Optimizer, batch: int) -> bool:
    try:
        step(model, opt, batch)
    except torch.cuda.OutOfMemoryError:
        opt.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()
        print("OOM at", batch, flush=True)
        return False
    print("fits", batch, flush=True)
    return True


def main(out: str) -> None:
    torch.cuda.set_per_process_memory_fraction(FRACTION)
    total = torch.cuda.get_device_properties(0).total_memory
    print(f"device total {total} B; true limit {int(FRACTION * total)} B", flush=True)
    torch.cuda.memory._record_memory_history(max_entries=100000)
    model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                          nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = 512
    while fits(model, opt, batch):
        batch *= 2
    batch //= 2
    while not fits(model, opt, batch):
        batch //= 2
    for _ in range(2):
        step(model, opt, batch)
    print(f"kept batch {batch}; max_memory_reserved {torch.cuda.max_memory_reserved()} B", flush=True)
    torch.cuda.memory._dump_snapshot(out)
    torch.cuda.memory._record_memory_history(enabled=None)
    print("dumped", out, Path(out).stat().st_size, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
