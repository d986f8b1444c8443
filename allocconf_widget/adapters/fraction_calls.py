"""Note the program's ``set_per_process_memory_fraction`` calls while a trace is recorded.

The allocator writes no trace entry when the limit changes, so a replay cannot know the
program lowered it mid-run unless the recorder says so (core/sim/limits.py reads the notes).
While recording, torch's public function is wrapped: the call goes through unchanged and
its time, device and fraction are noted; the original is put back afterwards. Only the
public function is covered (the ``per_process_memory_fraction`` allocator option of 2.10+
set mid-run is not), which docs/simulator.md says.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_NAME = "set_per_process_memory_fraction"


@contextmanager
def noting_fraction_calls(torch: Any) -> Iterator[list[dict[str, Any]]]:
    """Within the block, every call of ``torch.cuda.set_per_process_memory_fraction`` (under
    either of its names) is noted as ``{"device", "fraction", "time_us"}`` in the yielded list."""
    memory = torch.cuda.memory
    original = getattr(memory, _NAME, None)
    if original is None:
        yield []
        return
    calls: list[dict[str, Any]] = []

    def noted(fraction: float, device: Any = None) -> Any:
        result = original(fraction, device)
        calls.append({"device": _device_index(torch, device), "fraction": float(fraction),
                      "time_us": time.time_ns() // 1000})  # the trace's clock: epoch µs
        return result

    noted.__doc__, noted.__name__ = original.__doc__, _NAME
    owners = [m for m in (torch.cuda, memory) if getattr(m, _NAME, None) is original]
    for owner in owners:
        setattr(owner, _NAME, noted)
    try:
        yield calls
    finally:
        for owner in owners:
            if getattr(owner, _NAME, None) is noted:  # someone else's patch stays theirs
                setattr(owner, _NAME, original)


def _device_index(torch: Any, device: Any) -> int:
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    index = getattr(device, "index", None)
    if isinstance(device, str):
        index = torch.device(device).index
    return int(index) if isinstance(index, int) else int(torch.cuda.current_device())
