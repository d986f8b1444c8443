"""Pools of a run recorded under expandable segments, read from where the memory lies
(core/sim/pools.attribute_expandable_pools): each pool maps inside its own reservation."""

from __future__ import annotations

from allocconf_widget.core.sim.pools import attribute_expandable_pools

MiB, GiB = 1 << 20, 1 << 30
DEFAULT_BASE, POOL_BASE = 0x5000000000, 0x5000000000 + 160 * GiB  # two reservations


def _entries() -> list[dict]:
    out: list[dict] = []
    for base in (DEFAULT_BASE, POOL_BASE):
        out.append({"action": "segment_map", "addr": base, "size": 20 * MiB, "stream": 0})
    for k in range(4):
        out.append({"action": "alloc", "addr": DEFAULT_BASE + k * 4 * MiB, "size": 4 * MiB, "stream": 0})
        out.append({"action": "alloc", "addr": POOL_BASE + k * 4 * MiB, "size": 4 * MiB, "stream": 0})
    return out


def _segment(address: int, pool: tuple[int, int]) -> dict:
    return {"address": address, "total_size": 20 * MiB, "is_expandable": True, "device": 0,
            "stream": 0, "segment_pool_id": pool, "blocks": []}


def test_allocations_inside_a_private_pools_reservation_are_that_pools() -> None:
    entries = _entries()
    got = attribute_expandable_pools(entries, [_segment(DEFAULT_BASE, (0, 0)), _segment(POOL_BASE, (0, 1))])
    assert got is not None
    private = {entries[i]["addr"] for i in got.alloc_pools}
    assert private == {POOL_BASE + k * 4 * MiB for k in range(4)}
    assert set(got.alloc_pools.values()) == {(0, 1)}


def test_two_pools_in_one_reservation_gives_up() -> None:
    entries = _entries()
    mixed = [_segment(POOL_BASE, (0, 1)), _segment(POOL_BASE + 40 * MiB, (0, 2))]
    assert attribute_expandable_pools(entries, mixed) is None


def test_a_reservation_that_lived_beside_the_defaults_is_a_lost_private_pool() -> None:
    # A MemPool destroyed before the end leaves no segment in the final snapshot. Its
    # reservation was mapped while the default pool's reservation of the same stream and size
    # class existed, and a pool keeps one reservation per stream and class: so it is another
    # pool's. Its unmapping (the pool destroyed) releases that pool.
    from allocconf_widget.core.sim.pools import INFERRED_POOL

    entries = [*_entries(), {"action": "segment_unmap", "addr": POOL_BASE, "size": 20 * MiB, "stream": 0}]
    got = attribute_expandable_pools(entries, [_segment(DEFAULT_BASE, (0, 0))])
    assert got is not None
    assert {entries[i]["addr"] for i in got.alloc_pools} == {POOL_BASE + k * 4 * MiB for k in range(4)}
    assert set(got.alloc_pools.values()) == {INFERRED_POOL}
    assert got.release_pools == {len(entries) - 1: INFERRED_POOL}


def test_the_default_pools_earlier_reservation_stays_the_defaults() -> None:
    # empty_cache() unmapped the default pool's reservation wholly; the next allocation made a
    # new one elsewhere. The old one did not live beside the new one: nothing proves it private.
    old = DEFAULT_BASE + 320 * GiB
    entries = [
        {"action": "segment_map", "addr": old, "size": 20 * MiB, "stream": 0},
        {"action": "alloc", "addr": old, "size": 4 * MiB, "stream": 0},
        {"action": "free_completed", "addr": old, "size": 4 * MiB, "stream": 0},
        {"action": "segment_unmap", "addr": old, "size": 20 * MiB, "stream": 0},
        {"action": "segment_map", "addr": DEFAULT_BASE, "size": 20 * MiB, "stream": 0},
        {"action": "alloc", "addr": DEFAULT_BASE, "size": 4 * MiB, "stream": 0},
    ]
    assert attribute_expandable_pools(entries, [_segment(DEFAULT_BASE, (0, 0))]) is None


def test_an_oom_with_nothing_unmapped_beside_spare_default_pages_is_the_captures() -> None:
    # torch releases cached memory before an OOM unless a capture is under way; here the
    # default reservation had 40 MiB mapped and unused and nothing was unmapped: the failed
    # request was the private pool's, like the allocation right before it.
    entries = [
        {"action": "segment_map", "addr": DEFAULT_BASE, "size": 60 * MiB, "stream": 0},
        {"action": "alloc", "addr": DEFAULT_BASE, "size": 20 * MiB, "stream": 0},
        {"action": "segment_map", "addr": POOL_BASE, "size": 20 * MiB, "stream": 0},
        {"action": "alloc", "addr": POOL_BASE, "size": 16 * MiB, "stream": 0},
        {"action": "oom", "addr": 0, "size": 32 * MiB, "stream": 0},
    ]
    final = [_segment(DEFAULT_BASE, (0, 0)), _segment(POOL_BASE, (0, 1))]
    got = attribute_expandable_pools(entries, final)
    assert got is not None and got.alloc_pools.get(4) == (0, 1)
    # the same OOM after the default pages were unmapped (torch's release ran: no capture)
    released = [*entries[:4], {"action": "segment_unmap", "addr": DEFAULT_BASE + 20 * MiB,
                               "size": 40 * MiB, "stream": 0}, entries[4]]
    got = attribute_expandable_pools(released, final)
    assert got is not None and 5 not in got.alloc_pools
