"""The live allocator of this process as data, for the use cases (never freezing or starting CUDA)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from allocconf_widget.adapters import torch_private


@dataclass(frozen=True)
class LiveSnapshot:
    """``{"segments": [...], "allocator_settings": ...}`` of this process, or why there is none."""

    snapshot: dict[str, Any] | None
    why_not: str = ""


def live_snapshot() -> LiveSnapshot:
    """This process's segments (trace-free) and effective settings, if CUDA is already up."""
    torch = torch_private.imported_torch()
    if torch is None:
        return LiveSnapshot(None, "torch is not imported")
    if not torch_private.cuda_built(torch):
        return LiveSnapshot(None, "this torch build has no CUDA")
    if not torch_private.cuda_initialized(torch):
        return LiveSnapshot(None, "CUDA is not initialised yet (looking now would freeze the "
                                  "allocator settings)")
    try:
        segments = torch_private.trace_free_snapshot(torch)
    except RuntimeError as exc:  # backend:cudaMallocAsync
        return LiveSnapshot(None, f"memory_snapshot() is not available: {exc}")
    snapshot: dict[str, Any] = {"segments": segments}
    settings = torch_private.effective_settings(torch)
    if settings is not None:
        snapshot["allocator_settings"] = settings
    return LiveSnapshot(snapshot)
