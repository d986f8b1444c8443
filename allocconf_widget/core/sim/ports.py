"""The part of the replay engine that its helpers (expandable segments, reclaim) may touch.

:mod:`.expandable` and :mod:`.reclaim` are the engine's slow paths. They need a
handful of the engine's counters and callbacks, not the whole :class:`~.engine.Engine`;
typing them against this Protocol keeps the import graph a tree (engine → helpers,
never back) and states, in one place, what a helper may read or change.
A Protocol costs nothing at run time: the hot loop still passes the engine itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from allocconf_widget.core.sim.blocks import Block, ExpSegment, FreeList, Pool
    from allocconf_widget.core.sim.settings import EngineRules
    from allocconf_widget.core.sim.trace.model import Trace


class EngineCore(Protocol):
    """Counters and callbacks of the engine that its slow paths use."""

    rules: EngineRules
    trace: Trace
    reservations: list[ExpSegment]
    reserved: int
    active: int
    requested: int
    map_pos: int
    num_device_alloc: int
    num_device_free: int
    num_sync_all_streams: int
    pending: dict[int, Block]
    fresh: list[Block]
    live: list[Block | None]
    default_small: Pool
    default_large: Pool
    small_lists: list[FreeList]
    large_lists: list[FreeList]

    def new_tb(self, ptr: int) -> int:
        """Tie-break value for a newly created block."""

    def to_cache(self, blk: Block) -> None:
        """Return a freed block to its pool's free list, merging neighbours."""

    def grow_reserved(self, nbytes: int) -> None:
        """Account a new segment or mapping."""

    def segment_event(self, i: int, kind: int, addr: int, size: int) -> None:
        """Remember a segment event for the fidelity comparison."""

    def release_address(self, addr: int, size: int) -> None:
        """A classic segment was freed: its range can be reused."""

    def expandable_base(self, size: int) -> int:
        """Base address of a new expandable reservation."""
