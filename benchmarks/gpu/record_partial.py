"""Record traces the way a notebook user does: the model exists before recording starts.

``%%allocconf record`` usually wraps a training cell that runs after earlier cells
built the model and warmed up, so the allocator already holds segments (live
parameters, cached free blocks) the trace never saw allocated. This script
reproduces that with our recorder adapter (which saves the initial segments
beside the trace), for several settings, each in a fresh process, and writes
``<workload>__<name>.pickle`` + ``.json`` (real peak reserved during the recorded
window, after ``reset_peak_memory_stats``). Used to check the simulator's
start-from-a-snapshot mode.

Usage: ``python benchmarks/gpu/record_partial.py --out DIR``
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

SETTINGS = {
    "default": "",
    "expandable": "expandable_segments:True",
    "split128": "max_split_size_mb:128",
    "round4": "roundup_power2_divisions:4",
}


def _child(name: str, out: Path) -> None:
    import torch
    from torch import nn

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from allocconf_widget.adapters.recorder import record

    torch.manual_seed(0)
    rng = random.Random(7)
    layer = nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).cuda()
    opt = torch.optim.AdamW(model.parameters())

    def step(seq: int) -> None:
        x = torch.randn(max(2, 8192 // seq), seq, 512, device="cuda")
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for seq in (256, 512, 128):  # "earlier cells": warm-up leaves cached segments behind
        step(seq)
    with record() as rec:
        for _ in range(20):
            step(rng.choice([96, 160, 256, 384, 512, 768, 1024]))
        torch.cuda.synchronize()
    with (out / f"transformer_nb__{name}.pickle").open("wb") as fh:
        pickle.dump(rec.snapshot, fh, protocol=4)
    (out / f"transformer_nb__{name}.json").write_text(json.dumps({
        "workload": "transformer_nb", "conf": SETTINGS[name], "torch": torch.__version__,
        "device_total_bytes": rec.device_total, "free_at_start_bytes": rec.free_at_start,
        "peak_reserved_in_window": rec.peak_reserved, "events": rec.events,
        "allocator_settings": rec.snapshot.get("allocator_settings"),
    }))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="recordings_nb")
    parser.add_argument("--child")
    args = parser.parse_args()
    out = Path(args.out)
    if args.child:
        _child(args.child, out)
        return
    out.mkdir(parents=True, exist_ok=True)
    for name, conf in SETTINGS.items():
        env = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        proc = subprocess.run([sys.executable, __file__, "--child", name, "--out", str(out)],
                              env=env, capture_output=True, text=True, check=False)
        print(name, proc.returncode, proc.stderr[-500:] if proc.returncode else "")


if __name__ == "__main__":
    main()
