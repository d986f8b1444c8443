"""A synthetic trace writer for tests and benchmarks: snapshot-format entries, by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from allocconf_widget.core.sim.trace.decode import decode_entries
from allocconf_widget.core.sim.trace.model import Trace


class TraceBuilder:
    """Write a synthetic trace in the snapshot's entry format (tests, benchmarks, docs).

    Handles returned by :meth:`alloc` are fake, never-reused addresses unless
    ``reuse_addresses`` is set, in which case freed addresses are handed out
    again (LIFO), as real traces do.
    """

    def __init__(self, *, reuse_addresses: bool = False) -> None:
        self.entries: list[dict[str, Any]] = []
        self._next = 0x7F0000000000
        self._reuse = reuse_addresses
        self._freed: list[int] = []

    def _add(self, action: str, addr: int, size: int, stream: int, **extra: Any) -> None:
        entry: dict[str, Any] = {"action": action, "addr": addr, "size": size, "stream": stream,
                                 "time_us": len(self.entries)}
        entry.update(extra)
        self.entries.append(entry)

    def alloc(self, size: int, stream: int = 0, **extra: Any) -> int:
        """An ``alloc`` entry; returns the address to free later."""
        if self._reuse and self._freed:
            addr = self._freed.pop()
        else:
            addr = self._next
            self._next += 512 * (1 + size // 512)
        self._add("alloc", addr, size, stream, **extra)
        return addr

    def free(self, addr: int, stream: int = 0) -> None:
        """``free_requested`` immediately followed by ``free_completed``."""
        self.free_requested(addr, stream)
        self.free_completed(addr, stream)

    def free_requested(self, addr: int, stream: int = 0) -> None:
        """A free whose block waits on record_stream events."""
        self._add("free_requested", addr, 0, stream)

    def free_completed(self, addr: int, stream: int = 0) -> None:
        """The block re-enters the cache."""
        self._add("free_completed", addr, 0, stream)
        if self._reuse:
            self._freed.append(addr)

    def oom(self, rounded_size: int, device_free: int = 0, stream: int = 0) -> None:
        """An ``oom`` entry (the size torch records is the rounded request)."""
        self.entries.append({"action": "oom", "size": rounded_size, "device_free": device_free,
                             "stream": stream, "time_us": len(self.entries)})

    def segment(self, action: str, addr: int, size: int, stream: int = 0) -> None:
        """A recorded ``segment_*`` entry (for fidelity tests)."""
        self._add(action, addr, size, stream)

    def build(self, device: int = 0) -> Trace:
        """Decode the entries written so far."""
        return decode_entries(self.entries, device=device)

    def snapshot(self, allocator_settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A minimal snapshot dict holding this trace."""
        snap: dict[str, Any] = {"segments": [], "device_traces": [list(self.entries)]}
        if allocator_settings is not None:
            snap["allocator_settings"] = dict(allocator_settings)
        return snap
