"""The sorted int keys of one free list, kept in short sorted chunks.

A free list's keys (``size << 64 | tiebreak``, see :mod:`.blocks`) were one sorted Python
``list``: best fit was one :func:`bisect.bisect_left`, but every insertion and deletion moved
the list's tail (a memmove), so a free list holding hundreds of thousands of cached pieces
(a valid trace with many expandable holes) made each cache and take cost
time proportional to the list. :class:`SortedKeys` keeps up to ``2 * LOAD`` keys in one
sorted list (:attr:`SortedKeys.one`: every free list of an ordinary trace, on which the
replay's hot loop works directly, as fast as before) and more in chunks of at most
``2 * LOAD`` sorted ints plus the list of each chunk's largest key (the design of
``sortedcontainers.SortedList``, standard library only): a search bisects the maxima and then
one chunk, an insertion or deletion moves at most one chunk's tail, so every operation costs
O(log n + LOAD) whatever the size.

The keys are distinct ints (a free list's keys are; equal keys would be kept, in no
particular order among themselves).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator

#: a chunk is split in two when it grows past ``2 * LOAD`` keys and merged with a neighbour
#: when it shrinks below ``LOAD // 2``
LOAD = 512


class SortedKeys:
    """A sorted multiset of ints with insertion, deletion and ordered neighbour queries."""

    __slots__ = ("_chunks", "_maxes", "one")

    def __init__(self) -> None:
        #: every key, sorted, while they fit in one chunk (at most ``2 * LOAD``, the usual
        #: case), else None. The replay's hot loop works on this list itself (a method call
        #: per operation cost an ordinary replay a third more): it may search it, delete from
        #: it, and insert into it while it holds fewer than ``2 * LOAD`` keys (else :meth:`add`)
        self.one: list[int] | None = []
        self._chunks: list[list[int]] = []  # when one is None: ≥ 2 non-empty sorted chunks
        self._maxes: list[int] = []  # the last (largest) key of each chunk

    def __iter__(self) -> Iterator[int]:
        """Every key in ascending order."""
        if self.one is not None:
            yield from self.one
        for chunk in self._chunks:
            yield from chunk

    def add(self, key: int) -> None:
        """Insert ``key``."""
        one = self.one
        if one is not None:
            insort(one, key)
            if len(one) > 2 * LOAD:
                half = len(one) >> 1
                self._chunks = [one[:half], one[half:]]
                self._maxes = [one[half - 1], one[-1]]
                self.one = None
            return
        maxes = self._maxes
        pos = bisect_left(maxes, key)
        if pos == len(maxes):
            pos -= 1
            chunk = self._chunks[pos]
            chunk.append(key)
            maxes[pos] = key
        else:
            chunk = self._chunks[pos]
            insort(chunk, key)
        if len(chunk) > 2 * LOAD:
            self._split(pos)

    def remove(self, key: int) -> None:
        """Delete ``key``; KeyError if it is not there."""
        one = self.one
        if one is not None:
            idx = bisect_left(one, key)
            if idx == len(one) or one[idx] != key:
                raise KeyError(key)
            del one[idx]
            return
        maxes = self._maxes
        pos = bisect_left(maxes, key)
        if pos == len(maxes):
            raise KeyError(key)
        chunks = self._chunks
        chunk = chunks[pos]
        idx = bisect_left(chunk, key)  # < len(chunk): its last key is ≥ key
        if chunk[idx] != key:
            raise KeyError(key)
        del chunk[idx]
        if not chunk:
            del chunks[pos]
            del maxes[pos]
        else:
            if idx == len(chunk):
                maxes[pos] = chunk[-1]
            if len(chunk) < LOAD // 2:
                self._merge(pos)
        if len(chunks) == 1:
            self.one = chunks.pop()
            maxes.clear()

    def ceiling(self, x: int) -> int | None:
        """The smallest key ≥ ``x``, or None."""
        chunk = self.one
        if chunk is None:
            maxes = self._maxes
            pos = bisect_left(maxes, x)
            if pos == len(maxes):
                return None
            chunk = self._chunks[pos]
        idx = bisect_left(chunk, x)
        return chunk[idx] if idx < len(chunk) else None

    def lower(self, x: int) -> int | None:
        """The largest key < ``x``, or None."""
        one = self.one
        if one is not None:
            idx = bisect_left(one, x)
            return one[idx - 1] if idx else None
        maxes = self._maxes
        pos = bisect_left(maxes, x)  # the chunks before pos hold only keys < x
        if pos < len(maxes):
            chunk = self._chunks[pos]
            idx = bisect_left(chunk, x)
            if idx:
                return chunk[idx - 1]
        return maxes[pos - 1] if pos else None

    def iter_from(self, x: int) -> Iterator[int]:
        """The keys ≥ ``x`` in ascending order, lazily; the keys must not change meanwhile."""
        chunks = [self.one] if self.one is not None else self._chunks
        pos = bisect_left(self._maxes, x) if self.one is None else 0
        if pos == len(chunks):
            return
        chunk = chunks[pos]
        for idx in range(bisect_left(chunk, x), len(chunk)):
            yield chunk[idx]
        for pos2 in range(pos + 1, len(chunks)):
            yield from chunks[pos2]

    def _split(self, pos: int) -> None:
        chunk = self._chunks[pos]
        half = len(chunk) >> 1
        upper = chunk[half:]
        del chunk[half:]
        self._chunks.insert(pos + 1, upper)
        self._maxes[pos] = chunk[-1]
        self._maxes.insert(pos + 1, upper[-1])

    def _merge(self, pos: int) -> None:
        """Join the short chunk at ``pos`` with a neighbour (splitting again if too long)."""
        if pos == 0:
            pos = 1
        chunks, maxes = self._chunks, self._maxes
        before = chunks[pos - 1]
        before.extend(chunks[pos])
        maxes[pos - 1] = before[-1]
        del chunks[pos]
        del maxes[pos]
        if len(before) > 2 * LOAD:
            self._split(pos - 1)
