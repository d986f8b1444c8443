"""The synthetic driver layout used when a replay has no recorded addresses.

Rules from the recorded H200 runs (docs/simulator.md, "Addresses";
``benchmarks/address_model_study.py``): fresh memory top-down on 32 MiB
boundaries, segments below 80 MiB bottom-up into free ranges, larger ones top-down
at 32 MiB-aligned starts, freed ranges reused.
"""

from __future__ import annotations

from allocconf_widget.core.sim.engine import AddressSpace
from allocconf_widget.core.sim.trace.codes import SEG_ALLOC, SEG_FREE
from tests.trace_builder import TraceBuilder
from tests.unit.test_simulator import run, settings

MiB = 1 << 20
TOP = 1 << 40


def free_ranges(space: AddressSpace) -> list[tuple[int, int]]:
    """Free ranges as (offset below TOP of the start, length in MiB)."""
    return [((TOP - s) // MiB, space.lengths[s] // MiB) for s in space.starts]


def test_fresh_segments_go_top_down_on_32_mib_boundaries() -> None:
    space = AddressSpace(TOP)
    assert space.allocate(144 * MiB) == TOP - 160 * MiB  # 144 MiB in five 32 MiB units
    assert space.allocate(100 * MiB) == TOP - 288 * MiB
    # the unused ends of the units stay free: 28 MiB above the 100, 16 MiB above the 144
    assert free_ranges(space) == [(188, 28), (16, 16)]


def test_small_segments_fill_the_lowest_free_range_bottom_up() -> None:
    space = AddressSpace(TOP)
    big = space.allocate(144 * MiB)
    first = space.allocate(2 * MiB)
    second = space.allocate(2 * MiB)
    assert (first, second) == (big + 144 * MiB, big + 146 * MiB)  # packed after the 144 MiB
    for _ in range(6):
        space.allocate(2 * MiB)
    assert space.allocate(2 * MiB) == big - 32 * MiB  # the 16 MiB are full: a fresh unit


def test_freed_ranges_are_reused_bottom_up_below_80_mib() -> None:
    space = AddressSpace(TOP)
    a = space.allocate(20 * MiB)
    b = space.allocate(20 * MiB)
    assert b == a - 32 * MiB
    space.release(a, 20 * MiB)  # merges with the 12 MiB left above it: 32 MiB free
    assert space.allocate(12 * MiB) == b + 20 * MiB  # the lowest range that fits: b's rest
    assert space.allocate(16 * MiB) == a  # too big for anything lower: a's old range
    assert space.allocate(24 * MiB) == b - 32 * MiB  # 16 MiB left at a: too small


def test_freed_ranges_are_reused_top_down_from_80_mib() -> None:
    space = AddressSpace(TOP)
    a = space.allocate(96 * MiB)
    b = space.allocate(96 * MiB)
    space.release(b, 96 * MiB)
    space.release(a, 96 * MiB)
    assert free_ranges(space) == [(192, 192)]  # neighbours merge
    assert space.allocate(100 * MiB) == TOP - 128 * MiB  # the highest 32 MiB-aligned start
    assert space.allocate(40 * MiB) == b  # a smaller one goes to the bottom
    assert free_ranges(space) == [(152, 24), (28, 28)]


def test_a_segment_made_after_cudafree_reuses_the_range_and_wins_ties_accordingly() -> None:
    """A segment re-created after ``empty_cache`` lies in the freed range, above a segment
    made in between, so 2.11's lower-address tie-break prefers the one between (as in the
    GC run ``streams__frac_gc06``; the old layout put every new segment lowest)."""
    b = TraceBuilder()
    a = b.alloc(40 * MiB)  # segment A
    m = b.alloc(40 * MiB)  # segment M, below A
    b.free(a)
    b.segment("segment_free", 0xDEAD, 40 * MiB)  # empty_cache(): A is released
    r = b.alloc(40 * MiB)  # segment R, in A's old range
    b.free(m)
    b.free(r)
    b.alloc(40 * MiB)  # tie between the cached M and R: the lower address, M
    b.segment("segment_free", 0xBEEF, 40 * MiB)  # empty_cache(): releases what is still cached
    result = run(b, settings(torch_version=(2, 11)))
    events = [(kind, addr) for _, kind, addr, _ in result.segment_events]
    (_, a_addr), (_, m_addr), released, (kind, r_addr) = events[:4]
    assert released == (SEG_FREE, a_addr)
    assert kind == SEG_ALLOC
    assert m_addr < r_addr <= a_addr  # in the range A and M's leftover left, above M
    assert events[4] == (SEG_FREE, r_addr)  # M was taken, R stayed cached
    assert len(events) == 5


class _ListSpace:
    """The driver model as it was before the free-range index: a sorted list scanned per
    segment (quadratic on traces that free many segments, but plainly right)."""

    def __init__(self, top: int) -> None:
        self.low = top
        self.ranges: dict[int, int] = {}

    def allocate(self, size: int) -> int:
        from allocconf_widget.core.sim.engine import VA_ALIGN, VA_TOP_DOWN_FROM

        starts = sorted(self.ranges)
        order = starts if size < VA_TOP_DOWN_FROM else list(reversed(starts))
        for start in order:
            end = start + self.ranges[start]
            addr = start if size < VA_TOP_DOWN_FROM else (end - size) // VA_ALIGN * VA_ALIGN
            if addr >= start and addr + size <= end:
                del self.ranges[start]
                if start < addr:
                    self.ranges[start] = addr - start
                if addr + size < end:
                    self.ranges[addr + size] = end - addr - size
                return addr
        addr = (self.low - size) // VA_ALIGN * VA_ALIGN
        if addr + size < self.low:
            self.release(addr + size, self.low - addr - size)
        self.low = addr
        return addr

    def release(self, addr: int, size: int) -> None:
        end = addr + size
        if end in self.ranges:
            end += self.ranges.pop(end)
        below = next((s for s, n in self.ranges.items() if s + n == addr), None)
        if below is not None:
            addr = below
        self.ranges[addr] = end - addr


def test_the_indexed_driver_model_places_every_segment_where_the_plain_scan_did() -> None:
    """Random segment sizes (2 MiB to 300 MiB, both sides of the 80 MiB rule) created and
    released in random order: every address equals the one the plain list scan gives."""
    import random

    rng = random.Random(7)
    fast, plain = AddressSpace(TOP), _ListSpace(TOP)
    live: list[tuple[int, int]] = []
    for _ in range(3000):
        if live and rng.random() < 0.45:
            addr, size = live.pop(rng.randrange(len(live)))
            fast.release(addr, size)
            plain.release(addr, size)
        else:
            size = rng.choice([2, 2, 20, 22, 30, 42, 64, 78, 80, 100, 144, 300]) * MiB
            addr = fast.allocate(size)
            assert addr == plain.allocate(size)
            live.append((addr, size))
        assert sorted(fast.lengths.items()) == sorted(plain.ranges.items())
