"""How a step calls each entry point of the dry run's table (``core/dryrun/entry_points``), as code.

Shared by the CPU test of every row (``tests/unit/test_dryrun_entry_points.py``) and the GPU
test that checks each row leaves CUDA down and the allocator settings open
(``tests/gpu/test_dryrun_entry_points_gpu.py``). Each snippet runs inside a dry run with
``torch`` imported; the default calls the name without arguments.
"""

from __future__ import annotations

from allocconf_widget.core.dryrun.entry_points import HARMLESS, EntryPoint

_ARGUMENTS = {
    "set_device": "(0)", "device_of": "(torch.empty(1, device='cuda'))", "can_device_access_peer": "(0, 0)",
    "set_per_process_memory_fraction": "(0.5)", "set_rng_state": "(torch.cuda.get_rng_state())",
    "set_rng_state_all": "(torch.cuda.get_rng_state_all())", "set_stream": "(torch.cuda.current_stream())",
    "set_sync_debug_mode": "(0)", "manual_seed": "(1)", "manual_seed_all": "(1)", "check_error": "(0)",
    "set_device_idx": "(0)", "set_device_index": "(0)", "StreamContext": "(None)", "stream": "(None)",
    "_record_memory_history": "(max_entries=1000)", "_dump_snapshot": "('unused.pickle')",
}
#: names used as a context manager
_CONTEXTS = {"device": "(0)", "device_of": "(torch.empty(1, device='cuda'))", "stream": "(None)",
             "StreamContext": "(None)", "device_index": "(0)"}
#: names that are not called: a submodule, a flag, a type that is raised, not made
_ATTRIBUTES = {"amp", "graphs", "jiterator", "memory", "nccl", "nvtx", "profiler", "random", "sparse",
               "streams",
               "tunable", "has_half", "has_magma", "default_generators", "CudaError", "DeferredCudaCallError",
               "cudaStatus"}


def call(row: EntryPoint) -> str:
    """One statement that uses ``row`` the way a training step would."""
    target = f"{row.module}.{row.name}"
    if row.name in _ATTRIBUTES and row.kind == HARMLESS:
        return f"_ = {target}"
    if (row.name in _CONTEXTS and row.module != "torch.accelerator") or row.name == "device_index":
        return f"with {target}{_CONTEXTS[row.name]}:\n    torch.empty(8, device='cuda')"
    return f"_ = {target}{_ARGUMENTS.get(row.name, '()')}"
