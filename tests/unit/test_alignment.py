"""The self-check's alignment: difflib's count within a work budget, a greedy count past it.

A crafted trace of two segment sizes alternating 1,000 times made ``allocconf simulate`` run for
minutes (an attack pass): difflib's longest-run search walks every equal pair, and its
recursion repeats that per block, once per release the version inference tries.
"""

from __future__ import annotations

import random
from difflib import SequenceMatcher

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocconf_widget.core.sim import alignment
from allocconf_widget.core.sim.alignment import matched_in_order

events = st.lists(st.sampled_from([(0, 20), (0, 2), (1, 20), (2, 40), (3, 40)]), max_size=60)


def _difflib(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    return sum(m.size for m in SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks())


@given(events, events)
@settings(max_examples=300, deadline=None)
def test_within_the_budget_the_count_is_difflibs(a, b):
    assert matched_in_order(a, b) == _difflib(a, b)


@given(events, events)
@settings(max_examples=300, deadline=None)
def test_past_the_budget_no_more_is_claimed_than_an_alignment_holds(a, b):
    greedy = matched_in_order(a, b, budget=0)
    assert greedy <= _lcs(a, b)


def test_two_sizes_repeated_thousands_of_times_search_a_bounded_number_of_times(monkeypatch):
    """Counted, not timed: each longest-run search over such a stretch walks ~n² pairs."""
    searches = 0
    real = SequenceMatcher.find_longest_match

    def counted(self, *args):
        nonlocal searches
        searches += 1
        return real(self, *args)

    monkeypatch.setattr(SequenceMatcher, "find_longest_match", counted)
    rng = random.Random(5)
    rec = [(0, 32 if i % 2 else 30) for i in range(4000)]
    sim = [(0, rng.choice((30, 32))) for _ in range(4000)]
    got = matched_in_order(rec, sim)
    assert searches <= 1 + alignment.SEARCH_BUDGET // 4000
    assert 2000 <= got <= 4000  # half of them line up even by chance


@pytest.mark.parametrize("n", [0, 1, 50])
def test_identical_sequences_match_whole(n):
    seq = [(0, i % 3) for i in range(n)]
    assert matched_in_order(seq, list(seq)) == n
    assert matched_in_order(seq, list(seq), budget=0) == n


def _lcs(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]
