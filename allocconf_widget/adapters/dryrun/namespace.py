"""The namespace a dry-run cell runs in: the notebook's names, with what the cell reads copied.

Names the cell assigns stay out of the notebook (a shallow copy of the namespace), and the
tensors, models and optimizers the cell reads are deep-copied (one memo, so an optimizer still
points at its model's copy), so ``.to("cuda")`` or a hand-made change in the cell works on the
copy. Only what the cell reads is copied: a 1 GiB dataset the cell never names costs nothing.
What is reached otherwise (a function from an earlier cell reading the notebook's globals, an
object inside a copied one) is the user's own, and the dry run puts it back as it was
(:mod:`.isolation`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CopyReport:
    """What the namespace copy took: the names copied, their tensors' bytes, the time."""

    names: tuple[str, ...]
    host_bytes: int
    gpu_bytes: int  # copies of tensors already on a GPU (CUDA had started): GPU memory
    seconds: float
    left: tuple[str, ...] = ()  # read, but torch could not copy them: the user's own, restored afterwards


def _tensor_bytes(torch: Any, values: Iterable[Any]) -> tuple[int, int]:
    seen: set[int] = set()
    host = gpu = 0

    def add(tensor: Any) -> None:
        nonlocal host, gpu
        try:
            storage = tensor.untyped_storage()
            key = storage.data_ptr() or id(storage)
            size = int(storage.nbytes())
        except (RuntimeError, NotImplementedError):
            return
        if key in seen:
            return
        seen.add(key)
        if tensor.device.type == "cuda":
            gpu += size
        else:
            host += size

    for value in values:
        if isinstance(value, torch.Tensor):
            add(value)
        elif isinstance(value, torch.nn.Module):
            for tensor in (*value.parameters(), *value.buffers()):
                add(tensor)
        elif isinstance(value, torch.optim.Optimizer):
            for state in value.state.values():
                for tensor in state.values() if isinstance(state, dict) else ():
                    if isinstance(tensor, torch.Tensor):
                        add(tensor)
    return host, gpu


def isolated_namespace(user_ns: dict[str, Any],
                       reads: set[str] | None = None) -> tuple[dict[str, Any], CopyReport]:
    """The cell's namespace (see the module docstring). ``reads``: the names the cell reads
    (``core/dryrun/cell.global_reads``); None copies every tensor, module and optimizer."""
    import torch

    started = time.perf_counter()
    ns = dict(user_ns)
    memo: dict[int, Any] = {}
    copied: list[str] = []
    left: list[str] = []
    kinds = (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)
    for name, value in ns.items():
        if (reads is not None and name not in reads) or not isinstance(value, kinds):
            continue
        try:
            ns[name] = copy.deepcopy(value, memo)
            copied.append(name)
        except Exception:  # torch refuses some: a loss left by an earlier cell, weight_norm
            # a tensor's view: ops in the dry run's fake mode never write to it; a module or
            # optimizer stays the user's own, which the dry run restores (UserObjectsRestored)
            ns[name] = value.detach() if isinstance(value, torch.Tensor) else value
            left.append(name)
    host, gpu = _tensor_bytes(torch, (ns[n] for n in copied))
    return ns, CopyReport(tuple(copied), host, gpu, time.perf_counter() - started, tuple(left))
