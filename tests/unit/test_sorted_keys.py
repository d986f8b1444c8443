"""SortedKeys (a free list's keys in sorted chunks) answers as a plain sorted list does."""

from __future__ import annotations

from bisect import bisect_left, insort
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocconf_widget.core.sim import sorted_keys
from allocconf_widget.core.sim.sorted_keys import SortedKeys

keys = st.one_of(st.integers(0, 300), st.integers(0, 40).map(lambda size: size << 64 | 7))
operations = st.lists(
    st.tuples(st.sampled_from(["add", "remove", "remove_present", "remove_present", "remove_present",
                               "ceiling", "lower", "iter_from"]), keys),
    min_size=10,
    max_size=400,
)


def _check_shape(sk: SortedKeys, load: int) -> None:
    chunks, maxes = sk._chunks, sk._maxes
    if sk.one is not None:
        assert len(sk.one) <= 2 * load
        assert chunks == [] and maxes == []
        return
    assert len(chunks) == len(maxes) >= 2
    for chunk, top in zip(chunks, maxes, strict=True):
        assert chunk, "no empty chunk is kept"
        assert len(chunk) <= 2 * load
        assert chunk[-1] == top


@settings(max_examples=300, deadline=None)
@given(fill=st.lists(keys, min_size=10, max_size=200), ops=operations,
       load=st.sampled_from([1, 4, 5, 6, 8, 512]))
def test_same_answers_as_a_sorted_list(fill: list[int], ops: list[tuple[str, int]], load: int) -> None:
    """Random insertions, deletions and searches (after a fill, so that chunks split, shrink
    and merge), with chunks as short as one key."""
    model: list[int] = []
    sk = SortedKeys()
    with mock.patch.object(sorted_keys, "LOAD", load):
        for op, value in [("add", k) for k in fill] + ops:
            x = model[value % len(model)] if op == "remove_present" and model else value
            if op == "add":
                insort(model, x)
                sk.add(x)
            elif op in ("remove", "remove_present"):
                if x in model:
                    del model[bisect_left(model, x)]
                    sk.remove(x)
                else:
                    with pytest.raises(KeyError):
                        sk.remove(x)
            elif op == "ceiling":
                j = bisect_left(model, x)
                assert sk.ceiling(x) == (model[j] if j < len(model) else None)
            elif op == "lower":
                j = bisect_left(model, x)
                assert sk.lower(x) == (model[j - 1] if j else None)
            else:
                assert list(sk.iter_from(x)) == model[bisect_left(model, x):]
            _check_shape(sk, load)
            assert list(sk) == model


def test_many_keys_stay_in_many_short_chunks() -> None:
    """The point of the chunks: 100k keys inserted in the middle and taken out again."""
    sk = SortedKeys()
    n = 100_000
    order = [(i * 7919) % n for i in range(n)]  # a permutation: inserts land all over
    for k in order:
        sk.add(k << 64)
    _check_shape(sk, sorted_keys.LOAD)
    assert len(sk._chunks) > n // (2 * sorted_keys.LOAD)
    assert list(sk) == [k << 64 for k in range(n)]
    assert sk.ceiling((n // 2 << 64) + 1) == (n // 2 + 1) << 64
    assert sk.lower(n // 2 << 64) == (n // 2 - 1) << 64
    for k in order[::2]:
        sk.remove(k << 64)
    _check_shape(sk, sorted_keys.LOAD)
    assert list(sk) == sorted(k << 64 for k in order[1::2])
    for k in order[1::2]:
        sk.remove(k << 64)
    assert list(sk) == [] and sk.ceiling(0) is None and sk.lower(1 << 80) is None
