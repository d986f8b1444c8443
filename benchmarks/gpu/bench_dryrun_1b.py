"""Dry-run cost of a 1B-parameter Llama training step on 2 CPU cores (issue 21's ≤ 20 s target).

A transformers Llama of TinyLlama's shape (1.1 B parameters: width 2048, 22 layers, 32 heads,
4 KV heads, MLP 5632, vocabulary 32,000), built on "cuda" inside the dry run (fake weights,
nothing on the CPU), then one bf16-autocast training step (batch 1 × 1024 tokens, AdamW).
Run pinned to two cores: ``taskset -c 0,1 python benchmarks/gpu/bench_dryrun_1b.py``. Prints the
wall and CPU seconds of the step and of the model build, the ops recorded, the predicted peak
reserved and whether CUDA stayed untouched.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    import torch

    torch.set_num_threads(2)
    t_import = time.perf_counter()
    from transformers import LlamaConfig, LlamaForCausalLM

    import allocconf_widget

    imports = time.perf_counter() - t_import
    config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                         num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                         max_position_embeddings=2048)
    t0, c0 = time.perf_counter(), time.process_time()
    with allocconf_widget.dry_run("h200") as run:
        with torch.device("cuda"):
            model = LlamaForCausalLM(config)
        t1, c1 = time.perf_counter(), time.process_time()
        params = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        tokens = torch.randint(0, 32000, (1, 1024), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    t2, c2 = time.perf_counter(), time.process_time()
    pred = run.predict("")
    print("RESULT " + json.dumps({
        "cores": len(os.sched_getaffinity(0)), "params": params, "imports_s": round(imports, 2),
        "build_wall_s": round(t1 - t0, 2), "build_cpu_s": round(c1 - c0, 2),
        "step_wall_s": round(t2 - t1, 2), "step_cpu_s": round(c2 - c1, 2),
        "total_wall_s": round(t2 - t0, 2), "ops": run.trace.ops,
        "ms_per_op": round(1000 * (c2 - c0) / max(run.trace.ops, 1), 3),
        "allocations": run.trace.allocations,
        "predicted_peak_reserved_gib": round(pred.peak_reserved / (1 << 30), 3),
        "cuda_initialized": torch.cuda.is_initialized()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
