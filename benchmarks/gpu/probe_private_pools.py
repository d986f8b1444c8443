"""Which private pools get expandable segments on this torch (docs/simulator.md, release table).

Runs in a fresh process with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``: allocations
routed to a ``torch.cuda.MemPool`` with ``use_mem_pool``, and allocations made while capturing a
CUDA graph (``torch.cuda.graph``, its own pool), then prints each segment of the final snapshot:
pool id, size and whether it is expandable. Usage (on a CUDA machine)::

    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python benchmarks/gpu/probe_private_pools.py
"""

from __future__ import annotations

import json

import torch

MiB = 1 << 20


def main() -> None:
    device = torch.device("cuda", 0)
    keep = [torch.empty(64 * MiB, dtype=torch.uint8, device=device)]  # default pool
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        keep.append(torch.empty(96 * MiB, dtype=torch.uint8, device=device))
    x = torch.randn(4096, 4096, device=device)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        (x @ x).sum()  # warm-up outside the capture
    torch.cuda.current_stream(device).wait_stream(side)
    with torch.cuda.graph(graph):
        y = (x @ x) * 2  # 64 MiB made during the capture
    torch.cuda.synchronize()
    rows = [{"pool": list(seg.get("segment_pool_id", (0, 0))), "bytes": seg["total_size"],
             "expandable": bool(seg.get("is_expandable")), "stream": seg.get("stream")}
            for seg in torch.cuda.memory._snapshot()["segments"]]
    print("PROBE", json.dumps({"torch": torch.__version__,
                               "conf": torch.cuda.memory._snapshot().get("allocator_settings", {}).get(
                                   "PYTORCH_CUDA_ALLOC_CONF"),
                               "mempool_id": list(pool.id), "graph_pool": list(graph.pool()),
                               "segments": rows}))
    del y, keep


if __name__ == "__main__":
    main()
