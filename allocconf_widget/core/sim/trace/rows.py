"""Row searches over a trace's operation column, at C speed (``bytes.translate``,
``itertools.compress``): the replay's passes over a million rows use them where a Python loop
over every row would cost a large share of a replay."""

from __future__ import annotations

from array import array
from itertools import compress

from allocconf_widget.core.sim.trace.codes import OP_ALLOC, OP_ALLOC_FREED_NEXT, OP_FREE


def code_mask(ops: array[int], codes: tuple[int, ...]) -> bytes:
    """One byte per row of ``ops``: 1 where its operation is one of ``codes``, else 0
    (a ``bytes.translate``, at C speed)."""
    table = bytes(1 if code in codes else 0 for code in range(256))
    return (ops.tobytes() if ops.itemsize == 1 else bytes(ops)).translate(table)


def rows_with(ops: array[int], codes: tuple[int, ...], *also: bytes) -> list[int]:
    """Rows whose operation is one of ``codes`` and whose byte is 1 in every ``also`` mask
    (one byte per row), in order, found at C speed: :func:`code_mask`, ANDed with the masks
    as integers, and ``itertools.compress``. The replay's passes over a million rows use it
    where a Python loop over every row would cost a large share of a replay."""
    mask = code_mask(ops, codes)
    if also:
        joined = int.from_bytes(mask, "little")
        for other in also:
            joined &= int.from_bytes(other, "little")
        mask = joined.to_bytes(len(mask), "little")
    return list(compress(range(len(mask)), mask))


def ops_marking_temporaries(ops: array[int], addr_ids: array[int]) -> list[int]:
    """``ops`` as a list, each ``OP_ALLOC`` whose ``OP_FREE`` of the same address is the next
    row turned into ``OP_ALLOC_FREED_NEXT``."""
    out = list(ops)
    if len(out) < 2:
        return out
    same_address_next = bytes(map(int.__eq__, addr_ids, addr_ids[1:]))
    for row in rows_with(ops[:-1], (OP_ALLOC,), code_mask(ops[1:], (OP_FREE,)), same_address_next):
        out[row] = OP_ALLOC_FREED_NEXT
    return out
