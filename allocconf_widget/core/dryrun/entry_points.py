"""Every public name of ``torch.cuda``, ``torch.cuda.memory`` and ``torch.accelerator``, and what a
dry run does when the step calls it.

A dry run must never start CUDA (that fixes the allocator settings the user is still choosing),
yet training code asks the GPU questions, moves between devices and streams, seeds generators
and empties the cache. Each name is one of:

* **answered**: the dry run replies from the GPU profile or from its own recording (memory
  statistics are the dry run's allocations; ``empty_cache()`` becomes an entry of the trace,
  which the replay releases the cache at);
* **harmless**: the real function runs; it starts nothing (a type, a submodule, a flag), or what
  it changes is put back when the dry run ends (a seed);
* **refused**: the dry run stops with one line naming the call and the user's line.

A name of a newer torch that this table does not list is refused if it can be called. The
table is rendered in docs/dryrun.md ("Every torch.cuda entry point"); ``tests/unit/
test_dryrun_entry_points.py`` holds both to the installed torch, and ``tests/gpu/
test_dryrun_entry_points_gpu.py`` checks every row on a GPU (CUDA stays down, a later setting
takes effect). Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

ANSWERED, HARMLESS, REFUSED = "answered", "harmless", "refused"
CUDA, MEMORY, ACCELERATOR = "torch.cuda", "torch.cuda.memory", "torch.accelerator"


@dataclass(frozen=True)
class EntryPoint:
    """One public name and what a dry run does when it is called."""

    module: str
    name: str
    kind: str
    what: str

    @property
    def qualified(self) -> str:
        return f"{self.module}.{self.name}"


_LEGACY_TYPES = tuple(f"{kind}{suffix}" for kind in ("BFloat16", "Bool", "Byte", "Char", "Double", "Float",
                                                     "Half", "Int", "Long", "Short")
                      for suffix in ("Storage", "Tensor"))
_LEGACY_TYPES = (*_LEGACY_TYPES, "ComplexDoubleStorage", "ComplexFloatStorage")

#: (kind, what, names) for torch.cuda; torch.cuda.memory's names are the same functions
_CUDA_GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (ANSWERED, "from the GPU profile", (
        "get_device_properties", "get_device_capability", "get_device_name", "is_bf16_supported",
        "is_tf32_supported", "get_arch_list", "get_gencode_flags", "mem_get_info")),
    (ANSWERED, "True: the step runs as on the profiled GPU", ("is_available",)),
    (ANSWERED, "one GPU, device 0 (another index is refused: a dry run predicts one GPU)", (
        "device_count", "current_device", "set_device", "device", "device_of", "can_device_access_peer")),
    (ANSWERED, "from the dry run's allocations (reserved memory is the replay's to predict: "
               "it answers allocated)", (
        "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
        "memory_cached", "max_memory_cached", "memory_stats", "memory_stats_as_nested_dict",
        "memory_summary", "memory_snapshot", "device_memory_used", "list_gpu_processes")),
    (ANSWERED, "starts the peak statistics again", (
        "reset_peak_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached",
        "reset_accumulated_memory_stats")),
    (ANSWERED, "an entry in the trace: the replay releases the cache there, under every setting", (
        "empty_cache",)),
    (ANSWERED, "an entry in the trace: the replay applies the fraction from there", (
        "set_per_process_memory_fraction",)),
    (ANSWERED, "the fraction the step set, else 1.0", ("get_per_process_memory_fraction",)),
    (ANSWERED, "a stand-in stream or event: waits and records do nothing, timings read 0.0 "
               "(noted); the trace puts every allocation on the default stream", (
        "Stream", "Event", "StreamContext", "stream", "current_stream", "default_stream", "set_stream",
        "is_current_stream_capturing")),
    (ANSWERED, "does nothing: fake tensors have no work in flight", (
        "synchronize", "ipc_collect", "set_sync_debug_mode")),
    (ANSWERED, "0: no work in flight", ("get_sync_debug_mode",)),
    (ANSWERED, "a fixed state; setting one leaves the real generators as they are", (
        "get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all", "initial_seed")),
    (ANSWERED, "empty statistics: the dry run pins no host memory", (
        "host_memory_stats", "host_memory_stats_as_nested_dict", "reset_accumulated_host_memory_stats",
        "reset_peak_host_memory_stats")),
    (ANSWERED, "0 (noted): a dry run has no GPU to measure", (
        "utilization", "memory_usage", "temperature", "power_draw", "clock_rate")),
    (ANSWERED, "the settings in the environment (cudaMallocAsync or native)", ("get_allocator_backend",)),
    (HARMLESS, "seeds the generators CUDA will start with; put back when the dry run ends", (
        "manual_seed", "manual_seed_all", "seed", "seed_all")),
    (HARMLESS, "reads a flag; starts nothing", (
        "is_initialized", "has_half", "has_magma", "default_generators")),
    (HARMLESS, "a submodule (its calls are listed where public)", (
        "amp", "graphs", "jiterator", "memory", "nccl", "nvtx", "profiler", "random", "sparse", "streams",
        "tunable")),
    (HARMLESS, "a type; making or raising it touches no device", (
        "CudaError", "DeferredCudaCallError", "cudaStatus")),
    (ANSWERED, "raises for a nonzero CUDA status, as torch does", ("check_error",)),
    (REFUSED, "CUDA graphs need a real device", (
        "CUDAGraph", "graph", "graph_pool_handle", "make_graphed_callables")),
    (REFUSED, "a private pool or another allocator changes what the replay models", (
        "MemPool", "use_mem_pool", "CUDAPluggableAllocator", "change_current_allocator",
        "caching_allocator_alloc", "caching_allocator_delete", "caching_allocator_disabled",
        "caching_allocator_enable")),
    (REFUSED, "needs the driver (starts CUDA)", (
        "init", "cudart", "current_blas_handle", "current_solver_handle", "ExternalStream",
        "get_stream_from_external", "GreenContext")),
    (REFUSED, "a legacy CUDA tensor or storage type: make tensors with device=\"cuda\"", _LEGACY_TYPES),
)

_ACCELERATOR_GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (ANSWERED, "True: the step runs as on the profiled GPU", ("is_available",)),
    (ANSWERED, "cuda", ("current_accelerator",)),
    (ANSWERED, "from the GPU profile", ("get_device_capability", "get_memory_info")),
    (ANSWERED, "one GPU, device 0 (another index is refused: a dry run predicts one GPU)", (
        "device_count", "current_device_idx", "current_device_index", "set_device_idx", "set_device_index",
        "device_index")),
    (ANSWERED, "from the dry run's allocations (reserved memory is the replay's to predict: "
               "it answers allocated)", (
        "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
        "memory_stats")),
    (ANSWERED, "starts the peak statistics again", (
        "reset_peak_memory_stats", "reset_accumulated_memory_stats")),
    (ANSWERED, "an entry in the trace: the replay releases the cache there, under every setting", (
        "empty_cache",)),
    (ANSWERED, "does nothing: the dry run pins no host memory", ("empty_host_cache",)),
    (ANSWERED, "a stand-in stream: the trace puts every allocation on the default stream", (
        "current_stream", "set_stream")),
    (ANSWERED, "does nothing: fake tensors have no work in flight", ("synchronize",)),
    (REFUSED, "CUDA graphs need a real device", ("Graph",)),
)


#: private names of torch.cuda.memory that notebooks call all the same (the memory viewer's)
_PRIVATE_GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (ANSWERED, "does nothing (noted): the dry run records every allocation anyway", (
        "_record_memory_history",)),
    (REFUSED, "the dry run's trace is the step's snapshot: save it with run.save() or --save", (
        "_snapshot", "_dump_snapshot")),
)


def _rows() -> tuple[EntryPoint, ...]:
    rows = [EntryPoint(CUDA, name, kind, what) for kind, what, names in _CUDA_GROUPS for name in names]
    by_name = {row.name: row for row in rows}
    memory_names = (
        "CUDAPluggableAllocator", "MemPool", "caching_allocator_alloc", "caching_allocator_delete",
        "caching_allocator_disabled", "caching_allocator_enable", "change_current_allocator", "empty_cache",
        "get_allocator_backend", "get_per_process_memory_fraction", "host_memory_stats",
        "host_memory_stats_as_nested_dict", "list_gpu_processes", "max_memory_allocated", "max_memory_cached",
        "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_cached", "memory_reserved",
        "memory_snapshot", "memory_stats", "memory_stats_as_nested_dict", "memory_summary",
        "reset_accumulated_host_memory_stats", "reset_accumulated_memory_stats", "reset_max_memory_allocated",
        "reset_max_memory_cached", "reset_peak_host_memory_stats", "reset_peak_memory_stats",
        "set_per_process_memory_fraction", "use_mem_pool")
    rows += [EntryPoint(MEMORY, name, by_name[name].kind, by_name[name].what) for name in memory_names]
    rows += [EntryPoint(ACCELERATOR, name, kind, what) for kind, what, names in _ACCELERATOR_GROUPS
             for name in names]
    rows += [EntryPoint(MEMORY, name, kind, what) for kind, what, names in _PRIVATE_GROUPS for name in names]
    return tuple(rows)


#: every row, in the order docs/dryrun.md lists them
TABLE: tuple[EntryPoint, ...] = _rows()
_BY_NAME = {(row.module, row.name): row for row in TABLE}


def lookup(module: str, name: str) -> EntryPoint | None:
    """The row for ``module.name``, or None for a name this table does not know."""
    return _BY_NAME.get((module, name))
