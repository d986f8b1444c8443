"""Free address ranges with first-fit searches in logarithmic time (the driver model's index).

:class:`~.engine.AddressSpace` asks two questions of its free ranges whenever a segment is
created: the *lowest* range at least ``size`` long (bottom-up first fit), and the *highest*
range holding ``size`` bytes from a ``align``-aligned start (top-down first fit). Scanning a
sorted list answers them in time proportional to the free ranges, so a trace that frees and
creates many segments would replay in quadratic time. Here the ranges are the nodes of a treap
keyed by start address; every node also holds the largest length and the largest aligned room
in its subtree, so each search walks
one root-to-leaf path. Expected depth is logarithmic whatever the order of operations
(the priorities come from a seeded generator, so replays stay deterministic).

Standard library only; no engine imports.
"""

from __future__ import annotations

import random


class _Node:
    __slots__ = ("al", "key", "left", "ln", "mal", "mln", "pr", "right")

    def __init__(self, key: int, ln: int, al: int, pr: float) -> None:
        self.key = key
        self.ln = ln
        self.al = al
        self.pr = pr
        self.left: _Node | None = None
        self.right: _Node | None = None
        self.mln = ln
        self.mal = al


def _pull(t: _Node) -> None:
    # comparisons, not max(): a builtin call each was half of a release-heavy replay
    ln, al = t.ln, t.al
    a, b = t.left, t.right
    if a is not None:
        if a.mln > ln:  # noqa: PLR1730
            ln = a.mln
        if a.mal > al:  # noqa: PLR1730
            al = a.mal
    if b is not None:
        if b.mln > ln:  # noqa: PLR1730
            ln = b.mln
        if b.mal > al:  # noqa: PLR1730
            al = b.mal
    t.mln, t.mal = ln, al


def _split(t: _Node | None, key: int) -> tuple[_Node | None, _Node | None]:
    """(nodes with key < ``key``, nodes with key ≥ ``key``)."""
    if t is None:
        return None, None
    if t.key < key:
        a, b = _split(t.right, key)
        t.right = a
        _pull(t)
        return t, b
    a, b = _split(t.left, key)
    t.left = b
    _pull(t)
    return a, t


def _merge(a: _Node | None, b: _Node | None) -> _Node | None:
    """Join two treaps, every key of ``a`` below every key of ``b``."""
    if a is None:
        return b
    if b is None:
        return a
    if a.pr > b.pr:
        a.right = _merge(a.right, b)
        _pull(a)
        return a
    b.left = _merge(a, b.left)
    _pull(b)
    return b


class FreeRanges:
    """Disjoint free ranges ``[start, start + length)``; ``align`` is the top-down alignment."""

    __slots__ = ("_ends", "_rng", "align", "lengths", "root")

    def __init__(self, align: int) -> None:
        self.align = align
        self.root: _Node | None = None
        self.lengths: dict[int, int] = {}  # start -> length
        self._ends: dict[int, int] = {}  # end -> start
        self._rng = random.Random(0x5EED)

    def __len__(self) -> int:
        return len(self.lengths)

    def _aligned_room(self, start: int, length: int) -> int:
        """Bytes from the first ``align``-aligned address in the range to its end."""
        first = -(-start // self.align) * self.align
        return start + length - first

    def add(self, start: int, length: int) -> None:
        """Insert a range that overlaps and touches no other (see :meth:`release`).

        The node goes where its priority puts it: the walk down raises the subtree maxima
        of the nodes above (they can only grow), and only the subtree it lands on is split,
        a few nodes on average. Splitting the whole treap and merging it back recomputed
        every node on two paths: 60-100 µs a range, which a trace releasing 200,000
        separate segments per replay paid nine times over."""
        al = self._aligned_room(start, length)
        pr = self._rng.random()
        node = _Node(start, length, al, pr)
        parent: _Node | None = None
        t = self.root
        while t is not None and t.pr > pr:  # _merge keeps the higher priority on top
            if t.mln < length:  # noqa: PLR1730 - a builtin call per level costs more
                t.mln = length
            if t.mal < al:  # noqa: PLR1730
                t.mal = al
            parent = t
            t = t.left if start < t.key else t.right
        node.left, node.right = _split(t, start)
        _pull(node)
        if parent is None:
            self.root = node
        elif start < parent.key:
            parent.left = node
        else:
            parent.right = node
        self.lengths[start] = length
        self._ends[start + length] = start

    def remove(self, start: int) -> int:
        """Take the range starting at ``start`` out; returns its length."""
        a, b = _split(self.root, start)
        _, c = _split(b, start + 1)
        self.root = _merge(a, c)
        length = self.lengths.pop(start)
        del self._ends[start + length]
        return length

    def _resize(self, key: int, start: int, length: int) -> None:
        """Give the range at ``key`` a new start and length that keep its place in address
        order (no other range lies between the old and the new start): one path, no split."""
        path = []
        t = self.root
        while t is not None and t.key != key:
            path.append(t)
            t = t.left if key < t.key else t.right
        assert t is not None
        old = self.lengths.pop(key)
        del self._ends[key + old]
        t.key, t.ln, t.al = start, length, self._aligned_room(start, length)
        self.lengths[start] = length
        self._ends[start + length] = start
        _pull(t)
        for node in reversed(path):
            _pull(node)

    def release(self, addr: int, size: int) -> None:
        """Return ``[addr, addr + size)``, merged with the free ranges it touches."""
        end = addr + size
        below = self._ends.get(addr)
        above_len = self.lengths.get(end)
        if below is not None:
            if above_len is not None:
                self.remove(end)
                end += above_len
            self._resize(below, below, end - below)
        elif above_len is not None:
            self._resize(end, addr, end + above_len - addr)
        else:
            self.add(addr, size)

    def take(self, start: int, addr: int, size: int) -> None:
        """Cut ``[addr, addr + size)`` out of the free range that starts at ``start``."""
        end = start + self.lengths[start]
        if start < addr:
            self._resize(start, start, addr - start)
            if addr + size < end:
                self.add(addr + size, end - addr - size)
        elif addr + size < end:
            self._resize(start, addr + size, end - addr - size)
        else:
            self.remove(start)

    def lowest_fit(self, size: int) -> int | None:
        """Start of the lowest range at least ``size`` long, or None."""
        t = self.root
        if t is None or t.mln < size:
            return None
        while True:
            a = t.left
            if a is not None and a.mln >= size:
                t = a
            elif t.ln >= size:
                return t.key
            else:
                b = t.right
                assert b is not None  # the subtree maximum says it is there
                t = b

    def highest_aligned_fit(self, size: int) -> int | None:
        """Start of the highest range holding ``size`` bytes from an aligned start, or None."""
        t = self.root
        if t is None or t.mal < size:
            return None
        while True:
            b = t.right
            if b is not None and b.mal >= size:
                t = b
            elif t.al >= size:
                return t.key
            else:
                a = t.left
                assert a is not None  # the subtree maximum says it is there
                t = a

    def items(self) -> list[tuple[int, int]]:
        """(start, length) in address order (for tests and state export)."""
        return sorted(self.lengths.items())
