"""Note the program's ``set_per_process_memory_fraction`` calls while a trace is recorded.

The allocator writes no trace entry when the limit changes, so a replay cannot know the
program lowered it mid-run unless the recorder says so (core/sim/limits.py reads the notes).
While recording, torch's public function is wrapped: the call goes through unchanged and
its time, device and fraction are noted; the original is put back afterwards. Both recorders
use it: ``%%allocconf record`` for one cell (:func:`noting_fraction_calls`) and the OOM flight
recorder for as long as it records (:class:`FractionCallLog`). Only the public function is
covered: the ``per_process_memory_fraction`` allocator option of 2.10+ set mid-run through
torch's setter changes no limit, only the one the ``throw_on_cudamalloc_oom`` check uses
(docs/simulator.md says so).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_NAME = "set_per_process_memory_fraction"
#: the flight recorder runs for hours: it keeps the newest calls only (a replay needs the
#: last call before its window and those inside it; a notebook makes a handful)
DEFAULT_KEEP = 10_000


class FractionCallLog:
    """Wraps torch's ``set_per_process_memory_fraction`` (under both of its names) while
    installed and keeps the newest ``keep`` successful calls as
    ``{"device", "fraction", "time_us"}`` (time in the trace's clock, epoch µs)."""

    def __init__(self, keep: int = DEFAULT_KEEP) -> None:
        self._calls: deque[dict[str, Any]] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._restore: list[tuple[Any, Any, Any]] = []  # (owner, original, ours)

    @property
    def installed(self) -> bool:
        return bool(self._restore)

    def install(self, torch: Any) -> bool:
        """Start noting calls; False when this torch has no such function. Idempotent."""
        if self._restore:
            return True
        memory = getattr(getattr(torch, "cuda", None), "memory", None)
        original = getattr(memory, _NAME, None)
        if original is None:
            return False
        calls, lock = self._calls, self._lock

        def noted(fraction: float, device: Any = None) -> Any:
            result = original(fraction, device)  # a call that raises changed no limit
            with lock:
                calls.append({"device": _device_index(torch, device), "fraction": float(fraction),
                              "time_us": time.time_ns() // 1000})
            return result

        noted.__doc__, noted.__name__ = original.__doc__, _NAME
        for owner in (torch.cuda, memory):
            if getattr(owner, _NAME, None) is original:
                setattr(owner, _NAME, noted)
                self._restore.append((owner, original, noted))
        return True

    def remove(self) -> None:
        """Put torch's function back (a patch somebody made over ours stays theirs)."""
        for owner, original, ours in self._restore:
            if getattr(owner, _NAME, None) is ours:
                setattr(owner, _NAME, original)
        self._restore.clear()

    def calls(self) -> list[dict[str, Any]]:
        """The noted calls, oldest first (a copy: safe to store in a snapshot)."""
        with self._lock:
            return [dict(call) for call in self._calls]

    def clear(self) -> None:
        with self._lock:
            self._calls.clear()


@contextmanager
def noting_fraction_calls(torch: Any) -> Iterator[list[dict[str, Any]]]:
    """Within the block, every call of ``torch.cuda.set_per_process_memory_fraction`` (under
    either of its names) is noted in the yielded list (filled when the block ends)."""
    log = FractionCallLog()
    log.install(torch)
    noted: list[dict[str, Any]] = []
    try:
        yield noted
    finally:
        log.remove()
        noted.extend(log.calls())


def _device_index(torch: Any, device: Any) -> int:
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    index = getattr(device, "index", None)
    if isinstance(device, str):
        index = torch.device(device).index
    return int(index) if isinstance(index, int) else int(torch.cuda.current_device())
