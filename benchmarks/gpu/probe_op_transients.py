"""What does each op allocate beyond its outputs on the GPU? (H200 probe for the dry run's rules)

A dry run sees every op's outputs but not the memory a kernel borrows while it runs (cuDNN
convolution workspaces, attention-backend buffers, library temporaries). This probe runs a
workload for real with a ``TorchDispatchMode`` that, around every op, resets the allocator's
peak counter and reads it back: ``transient = peak during the op - allocated after it`` is what
the op held only while it ran. One JSON line per op with a transient (and its operands'
shapes, dtypes, strides and the convolution's parameters), for fitting the rules in
``core/dryrun/profiles.py``::

    python benchmarks/gpu/probe_op_transients.py --out results/ [--workloads resnet18,lightning]

With ``--marked`` it also dry-runs each workload (CUDA untouched) with the cuBLAS rule but
no cuDNN workspaces, and saves the trace with, per convolution op, the trace position after
its outputs and its operands: a cuDNN rule can then be tried offline, inserting its
workspaces at those positions and replaying against the real peaks of ``bench_dryrun.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))


def child(workload: str, out: str) -> None:
    import threading

    import torch
    from dryrun_workloads import DEFAULT_BATCH, WORKLOADS
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    fn, batch = WORKLOADS[workload], DEFAULT_BATCH[workload]
    rows: list[dict] = []
    main_thread = threading.get_ident()

    def describe(a: object) -> object:
        if isinstance(a, torch.Tensor):
            return {"shape": list(a.shape), "stride": list(a.stride()), "dtype": str(a.dtype).split(".")[-1],
                    "bytes": a.numel() * a.element_size()}
        if isinstance(a, (list, tuple)) and len(a) <= 8 and all(isinstance(x, (int, bool, float)) for x in a):
            return list(a)
        if isinstance(a, (int, bool, float)):
            return a
        return None

    class Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = func(*args, **(kwargs or {}))
            after = torch.cuda.memory_allocated()
            peak = torch.cuda.max_memory_allocated()
            transient = peak - after
            outs = sum(t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
            named = "conv" in str(func) or "attention" in str(func)
            if transient > 0 or named or after - before > outs * 1.05 + 4096:
                rows.append({"op": str(func), "transient": transient, "grew": after - before, "outs": outs,
                             "backward": threading.get_ident() != main_thread,
                             "args": [describe(a) for a in args[:10]]})
            return out

    torch.cuda.init()
    with Probe():
        fn("cuda", batch)
    torch.cuda.synchronize()
    Path(out).write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    print("RESULT", json.dumps({"workload": workload, "ops_logged": len(rows),
                                "peak_reserved": torch.cuda.max_memory_reserved(),
                                "cudnn": torch.backends.cudnn.version()}))


def child_marked(workload: str, out: str) -> None:

    import torch
    from dryrun_workloads import DEFAULT_BATCH, WORKLOADS

    import allocconf_widget
    from allocconf_widget.adapters.dryrun import rules as dr
    from allocconf_widget.adapters.dryrun.tensors import tree_leaves

    marks: list[dict] = []

    def after(self, func, args, out_) -> dict:  # the conv rule, replaced by a marker
        if dr.op_name(func) not in dr._CONVS or not self._on_gpu(args):
            return {}
        desc = []
        for a in args[:10]:
            if isinstance(a, torch.Tensor):
                desc.append({"shape": list(a.shape), "stride": list(a.stride()),
                             "dtype": str(a.dtype).split(".")[-1], "bytes": dr.nbytes(a)})
            elif isinstance(a, (list, tuple)) and all(isinstance(x, (int, bool)) for x in a):
                desc.append(list(a))
            else:
                desc.append(a if isinstance(a, (int, bool, float)) else None)
        outs = [dr.nbytes(t) for t in tree_leaves(out_) if isinstance(t, torch.Tensor)]
        marks.append({"at": len(self.log.entries), "op": dr.op_name(func), "args": desc, "outs": outs})
        return {}

    dr.Rules.after = after
    with allocconf_widget.dry_run("h200") as run:
        WORKLOADS[workload]("cuda", DEFAULT_BATCH[workload])
    run.save(out)
    Path(out + ".marks.json").write_text(json.dumps(marks))
    print("RESULT", json.dumps({"workload": workload, "marks": len(marks),
                                "cuda_initialized": torch.cuda.is_initialized()}))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", default="resnet18,lightning,lm,llama,timm_vit,resnet50,mobilenet,"
                                                "vgg11,resnet18_bf16,resnet18_cl")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--marked", action="store_true")
    parser.add_argument("--child", nargs=3)
    args = parser.parse_args()
    if args.child:
        {"real": child, "marked": child_marked}[args.child[0]](*args.child[1:])
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [("real", w, str(args.out / f"transients_{w}.jsonl")) for w in args.workloads.split(",")]
    if args.marked:
        jobs += [("marked", w, str(args.out / f"dry_marked_{w}.pickle")) for w in args.workloads.split(",")]
    procs = {job: subprocess.Popen([sys.executable, __file__, "--out", str(args.out), "--child", *job],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for job in jobs}
    for w, p in procs.items():
        stdout, stderr = p.communicate(timeout=500)
        line = next((x for x in stdout.splitlines() if x.startswith("RESULT")), None)
        print(line or f"{w} failed: {stderr[-1500:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
