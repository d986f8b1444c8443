"""Memory-fraction changes the program made mid-run, placed into a decoded trace.

A notebook that calls ``torch.cuda.set_per_process_memory_fraction`` after its first
allocations changes the allocator's limit from that moment on; the allocator writes no
trace entry for it. When the limit never bit in the recorded run, the trace alone cannot
show it, yet under other settings it may decide whether memory is released or an OOM
happens. Our recorders (``%%allocconf record``, the flight recorder, and
``benchmarks/gpu/record.py``) therefore note each call with its time in the snapshot under
:data:`FRACTION_CHANGES_KEY`; this module turns those notes into ``limit`` rows at the place
in the trace where the call happened (the first row recorded after it), so every setting
replays the program's own call (docs/simulator.md, "Memory fraction changed mid-run").

The key is read like everything else in a snapshot: untrusted, checked field by field.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, ClassVar, Protocol, TypeVar

from allocconf_widget._errors import SnapshotError
from allocconf_widget.core.memory.snapshot_fields import short_repr

#: snapshot key: ``[{"device": int, "fraction": float, "time_us": int}, …]`` in call order
FRACTION_CHANGES_KEY = "allocconf_fraction_changes"
#: a ``limit`` row stores its fraction as an integer number of billionths
FRACTION_SCALE = 1_000_000_000
#: more calls than this is not a notebook habit but a hostile file
MAX_CHANGES = 100_000
OP_SET_LIMIT = 6


class _DecodedTrace(Protocol):
    """What this module reads of a :class:`.trace.Trace` (which imports this module)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def device(self) -> int: ...

    @property
    def num_addresses(self) -> int: ...

    @property
    def ops(self) -> array[int]: ...

    @property
    def addr_ids(self) -> array[int]: ...

    @property
    def sizes(self) -> array[int]: ...

    @property
    def lanes(self) -> array[int]: ...

    @property
    def op_index(self) -> array[int]: ...

    @property
    def op_time_us(self) -> array[int]: ...


T = TypeVar("T", bound=_DecodedTrace)


@dataclass(frozen=True)
class FractionChange:
    """One ``set_per_process_memory_fraction(fraction, device)`` call, at ``time_us``."""

    device: int
    fraction: float
    time_us: int


def read_fraction_changes(snapshot: Mapping[str, Any]) -> tuple[FractionChange, ...]:
    """The recorded calls, checked; none when the snapshot has no such key.

    Raises:
        SnapshotError: the key is there but malformed (the message names the field).
    """
    raw = snapshot.get(FRACTION_CHANGES_KEY)
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)):
        raise SnapshotError(f"{FRACTION_CHANGES_KEY} must be a list, not {type(raw).__name__}")
    if len(raw) > MAX_CHANGES:
        raise SnapshotError(f"{FRACTION_CHANGES_KEY} has {len(raw):,} entries; at most "
                            f"{MAX_CHANGES:,} are read")
    out: list[FractionChange] = []
    for i, item in enumerate(raw):
        where = f"{FRACTION_CHANGES_KEY}[{i}]"
        if not isinstance(item, Mapping):
            raise SnapshotError(f"{where} must be a dict, not {type(item).__name__}")
        device, fraction, time_us = item.get("device", 0), item.get("fraction"), item.get("time_us")
        if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < 1024:
            raise SnapshotError(f"{where}.device must be a device index, not {short_repr(device)}")
        if (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
                or not math.isfinite(fraction) or not 0.0 <= fraction <= 1.0):
            raise SnapshotError(f"{where}.fraction must be a number from 0 to 1, not {short_repr(fraction)}")
        if isinstance(time_us, bool) or not isinstance(time_us, int) or not 0 <= time_us < 1 << 62:
            raise SnapshotError(f"{where}.time_us must be a time in microseconds, not {short_repr(time_us)}")
        out.append(FractionChange(device, float(fraction), time_us))
    return tuple(out)


def with_fraction_changes(trace: T, changes: Sequence[FractionChange]) -> T:
    """``trace`` with a ``limit`` row before the first row recorded after each call.

    Rows keep their recorded times; a call made before the trace's first row applies from
    the start, one made after its last row changes nothing the replay can see.
    """
    mine = [c for c in changes if c.device == trace.device]
    if not mine or not trace.ops or trace.num_addresses == 0:
        return trace
    latest = list(accumulate(trace.op_time_us, max))  # times may step back a little
    columns = (trace.ops, trace.addr_ids, trace.sizes, trace.lanes, trace.op_index, trace.op_time_us)
    new = [array(col.typecode) for col in columns]
    start = placed = 0
    for change in sorted(mine, key=lambda c: c.time_us):
        pos = bisect_left(latest, change.time_us)
        if pos >= len(latest) or latest[-1] <= 0:
            continue  # after the last row, or a trace without times: nothing to place it by
        for col, out in zip(columns, new, strict=True):
            out.extend(col[start:pos])
        row = (OP_SET_LIMIT, trace.addr_ids[pos], round(change.fraction * FRACTION_SCALE),
               trace.lanes[pos], trace.op_index[pos], change.time_us)
        for out, value in zip(new, row, strict=True):
            out.append(value)
        start, placed = pos, placed + 1
    if not placed:
        return dataclasses.replace(trace, unplaced_limit_changes=len(mine))
    for col, out in zip(columns, new, strict=True):
        out.extend(col[start:])
    return dataclasses.replace(trace, ops=new[0], addr_ids=new[1], sizes=new[2], lanes=new[3],
                               op_index=new[4], op_time_us=new[5], limit_changes=placed,
                               unplaced_limit_changes=len(mine) - placed)
