"""The driver model's free-range treap, checked node by node against a plain list.

Round 21 made :meth:`FreeRanges.add` insert where the node's priority puts it instead of
splitting and merging the whole treap (a start state of 200,000 separate segments released
one by one took minutes). Every operation here is followed by a check of every node (key
order, heap order of priorities, subtree maxima) and of both searches against a scan.
"""

from __future__ import annotations

import random

from allocconf_widget.core.sim.ranges import FreeRanges, _Node

ALIGN = 1 << 21


def _check(ranges: FreeRanges) -> None:
    def walk(t: _Node | None, low: float, high: float) -> tuple[int, int]:
        if t is None:  # below any range's length or aligned room (an unaligned one's is negative)
            return -(1 << 80), -(1 << 80)
        assert low <= t.key < high
        for child in (t.left, t.right):
            assert child is None or child.pr <= t.pr
        lm, la = walk(t.left, low, t.key)
        rm, ra = walk(t.right, t.key + 1, high)
        assert t.mln == max(t.ln, lm, rm) and t.mal == max(t.al, la, ra)
        return t.mln, t.mal

    walk(ranges.root, float("-inf"), float("inf"))
    items = ranges.items()
    for size in (1, ALIGN // 2, ALIGN, 3 * ALIGN, 17 * ALIGN):
        low = next((start for start, length in items if length >= size), None)
        assert ranges.lowest_fit(size) == low
        rooms = [start for start, length in items
                 if start + length - -(-start // ALIGN) * ALIGN >= size]
        assert ranges.highest_aligned_fit(size) == (rooms[-1] if rooms else None)


def test_every_node_holds_after_random_adds_releases_and_takes() -> None:
    rng = random.Random(21)
    for _ in range(30):
        ranges = FreeRanges(ALIGN)
        taken: list[tuple[int, int]] = []
        for _ in range(300):
            if taken and rng.random() < 0.5:
                addr, size = taken.pop(rng.randrange(len(taken)))
                ranges.release(addr, size)
            else:
                slot = rng.randrange(4096)
                addr = slot * 8 * ALIGN + rng.randrange(4) * ALIGN + rng.choice((0, 0, 4096))  # unaligned too
                size = rng.randrange(1, 5) * ALIGN // 2
                if all(addr + size <= a or a + s <= addr for a, s in taken) and not any(
                        start <= addr < start + length or addr <= start < addr + size
                        for start, length in ranges.items()):
                    ranges.add(addr, size)  # a range nothing touches: the add path itself
                    start, _ = next((s, n) for s, n in ranges.items() if s == addr)
                    ranges.take(start, addr, size)
                    taken.append((addr, size))
            _check(ranges)
