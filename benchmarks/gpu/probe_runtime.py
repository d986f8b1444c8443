"""Probe, on a real GPU, the runtime facts our lifecycle logic depends on.

Each scenario runs in a fresh Python process (the allocator configuration is a
process-wide, read-once singleton, so scenarios cannot share a process). It
prints one JSON line per scenario; the questions are those marked
open when docs/internals/allocator_facts.md §4.2–§5 was written, plus cheap timings:

* which calls freeze the configuration (a variable set afterwards is ignored),
* whether ``torch._C._accelerator_isAllocatorInitialized()`` notices a freeze,
* whether a set-but-empty variable shadows a lower-priority one,
* what ``_cuda_memorySnapshot((0, 0, False))`` returns (cheap read-back?),
* call costs with ~20k live blocks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

_READBACK = textwrap.dedent(
    """
    import json, torch
    def readback():
        x = torch.empty(3 << 20, device="cuda")
        snap = torch._C._cuda_memorySnapshot(None)
        s = snap.get("allocator_settings", {})
        segs = snap["segments"]
        return {"expandable_in_settings": s.get("expandable_segments"),
                "any_expandable_segment": any(g.get("is_expandable") for g in segs),
                "conf_string": s.get("PYTORCH_CUDA_ALLOC_CONF"),
                "max_split_size": s.get("max_split_size")}
    def init_flags():
        f = getattr(torch._C, "_accelerator_isAllocatorInitialized", None)
        return {"is_initialized": torch.cuda.is_initialized(),
                "allocator_initialized": f() if f else None}
    """
)

# name -> (environment before the interpreter starts, code run after _READBACK)
_SCENARIOS: dict[str, tuple[dict[str, str], str]] = {
    "env_after_import_only": ({}, """
import os
r = init_flags()
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
out = {"before": r, **readback()}
"""),
    "env_after_memory_snapshot": ({}, """
import os
torch.cuda.memory_snapshot()
r = init_flags()
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
out = {"after_snapshot": r, **readback()}
"""),
    "env_after_get_allocator_backend": ({}, """
import os
b = torch.cuda.get_allocator_backend()
r = init_flags()
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
out = {"backend": b, "after": r, **readback()}
"""),
    "env_after_is_allocator_initialized": ({}, """
import os
r = init_flags()
r2 = init_flags()
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
out = {"after": r2, **readback()}
"""),
    "env_after_memory_stats_and_device_count": ({}, """
import os
torch.cuda.is_available(); torch.cuda.device_count(); torch.cuda.memory_stats()
r = init_flags()
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
out = {"after": r, **readback()}
"""),
    "env_after_mem_get_info": ({}, """
import os
torch.cuda.mem_get_info()
r = init_flags()
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
out = {"after": r, **readback()}
"""),
    "setter_before_init": ({}, """
setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
setter("expandable_segments:True,max_split_size_mb:256")
r = init_flags()
out = {"after_setter": r, **readback()}
"""),
    "empty_cuda_var_shadows_alloc_conf": (
        {"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": "expandable_segments:True"},
        "out = readback()"),
    "alloc_conf_alone": ({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, "out = readback()"),
    "both_vars_cuda_wins": (
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",
         "PYTORCH_ALLOC_CONF": "expandable_segments:True"}, "out = readback()"),
    "setter_reset_pitfall": ({}, """
setter = torch._C._accelerator_setAllocatorSettings
x = torch.empty(1, device="cuda")
setter("max_split_size_mb:256,garbage_collection_threshold:0.6")
a = torch._C._cuda_memorySnapshot(None)["allocator_settings"]
setter("expandable_segments:True")
b = torch._C._cuda_memorySnapshot(None)["allocator_settings"]
setter("max_split_size_mb:256,garbage_collection_threshold:0.6,expandable_segments:True")
c = torch._C._cuda_memorySnapshot(None)["allocator_settings"]
out = {"first": a, "after_one_key": b, "after_full": c,
       "stats_max_split": torch.cuda.memory_stats()["max_split_size"]}
"""),
    "snapshot_shapes_and_costs": ({}, """
import time
torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=100000)
xs = [torch.empty(4096, device="cuda") for _ in range(20000)]
def t(f, n=20):
    f(); s = time.perf_counter()
    for _ in range(n): f()
    return round((time.perf_counter() - s) / n * 1e3, 3)
full = torch._C._cuda_memorySnapshot(None)
def cheap():
    try:
        return torch._C._cuda_memorySnapshot((0, 0, False))
    except Exception as e:
        return {"error": repr(e)}
c = cheap()
out = {"full_keys": sorted(full), "settings": full.get("allocator_settings"),
       "trace_entry_keys": sorted(full["device_traces"][0][-1]) if full["device_traces"][0] else None,
       "cheap_keys": sorted(c) if isinstance(c, dict) else None,
       "cheap_traces_len": len(c.get("device_traces", [[]])[0]) if "device_traces" in c else None,
       "ms_memory_stats": t(torch.cuda.memory_stats),
       "ms_memory_snapshot_no_traces": t(lambda: torch.cuda.memory_snapshot(include_traces=False)),
       "ms_cuda_memorySnapshot_cheap": t(cheap),
       "ms_snapshot_full": t(torch.cuda.memory._snapshot, 5),
       "blocks": sum(len(s["blocks"]) for s in full["segments"]),
       "segment_keys": sorted(full["segments"][0]), "block_keys": sorted(full["segments"][0]["blocks"][0])}
"""),
    "backend_async_after_import": ({}, """
import os
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
try:
    out = readback()
except Exception as e:
    out = {"error": type(e).__name__ + ": " + str(e).splitlines()[0][:300]}
"""),
    "backend_async_at_start": ({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, """
x = torch.empty(1 << 20, device="cuda")
st = torch.cuda.memory_stats()
try:
    torch.cuda.memory_snapshot(); snap_err = None
except Exception as e:
    snap_err = type(e).__name__ + ": " + str(e).splitlines()[0][:200]
out = {"backend": torch.cuda.get_allocator_backend(),
       "nonzero_stats": sorted(k for k, v in st.items() if v)[:40], "snapshot_error": snap_err}
"""),
    "oom_observer_args": ({}, """
calls = []
torch._C._cuda_attach_out_of_memory_observer(lambda *a: calls.append(a))
torch.cuda.set_per_process_memory_fraction(0.01)
try:
    torch.empty(4 << 30, dtype=torch.uint8, device="cuda"); msg = None
except torch.OutOfMemoryError as e:
    msg = str(e)
out = {"observer_calls": calls, "message": msg}
"""),
}


def _run(name: str) -> dict[str, object]:
    env_extra, body = _SCENARIOS[name]
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")}
    env.update(env_extra)
    code = _READBACK + body + "\nprint('RESULT ' + json.dumps(out, default=repr))\n"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    result: dict[str, object] = {"scenario": name, "rc": proc.returncode}
    if line:
        result["result"] = json.loads(line[7:])
    else:
        result["stderr"] = proc.stderr[-2000:]
    return result


def main() -> None:
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        for result in pool.map(_run, _SCENARIOS):
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
