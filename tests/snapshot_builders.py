"""Small builders for hand-made memory snapshots, shaped like torch's ``_snapshot()``.

Each builder fills in the keys torch 2.11 writes, so tests state only what matters
to them. Sizes are bytes; ``MIB`` keeps them readable.
"""

from __future__ import annotations

import itertools
from typing import Any

MIB = 1 << 20
GIB = 1 << 30

_addresses = itertools.count(0x7F00_0000_0000, 1 << 32)


def block(
    size: int,
    state: str = "active_allocated",
    requested: int | None = None,
    *,
    legacy: bool = False,
) -> Any:
    """One block; ``requested`` defaults to ``size``. ``legacy`` gives the torch 2.0 form."""
    req = size if requested is None else requested
    if legacy:
        return {"size": size, "state": state, "history": [{"addr": 0, "real_size": req}]}
    return {"size": size, "requested_size": req, "state": state, "frames": []}


def segment(
    *blocks: dict[str, Any],
    device: int = 0,
    pool: tuple[int, int] = (0, 0),
    kind: str = "large",
    stream: int = 0,
    expandable: bool = False,
    address: int | None = None,
) -> Any:
    """A segment whose ``total_size`` is the sum of its blocks, addresses filled in."""
    start = next(_addresses) if address is None else address
    offset = start
    for b in blocks:
        if "history" not in b:
            b["address"] = offset
        offset += b["size"]
    active = [b for b in blocks if b["state"] != "inactive"]
    return {
        "device": device,
        "address": start,
        "total_size": offset - start,
        "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
        "active_size": sum(b["size"] for b in active),
        "requested_size": sum(b.get("requested_size", b["size"]) for b in active),
        "stream": stream,
        "segment_type": kind,
        "segment_pool_id": pool,
        "is_expandable": expandable,
        "frames": [],
        "blocks": list(blocks),
    }


def legacy_segment(*blocks: dict[str, Any], device: int = 0) -> Any:
    """A torch 2.0 segment: no ``segment_type``, ``segment_pool_id`` or ``is_expandable``."""
    seg = segment(*blocks, device=device)
    for key in ("segment_type", "segment_pool_id", "is_expandable", "frames", "requested_size"):
        del seg[key]
    return seg


def snapshot(
    *segments: dict[str, Any],
    traces: list[list[dict[str, Any]]] | None = None,
    settings: dict[str, Any] | None = None,
) -> Any:
    """A snapshot dict; ``device_traces`` has one (empty) list per device unless given."""
    devices = max((s.get("device", 0) for s in segments), default=0) + 1
    out: dict[str, Any] = {
        "segments": list(segments),
        "device_traces": traces if traces is not None else [[] for _ in range(devices)],
    }
    if settings is not None:
        out["allocator_settings"] = settings
    return out
