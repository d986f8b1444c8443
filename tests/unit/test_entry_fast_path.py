"""The trace-entry field check's inline path passes exactly what the generic checks pass.

``check_fields`` decides a common trace entry inline (a million of them in a long recording)
and sends anything else through the generic per-field checks, which word the error. A hostile
file must get the same verdict and the same message either way: random entries of assorted
types and edge values are checked both ways.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocconf_widget._errors import SnapshotError
from allocconf_widget.core.memory import snapshot_fields as sf

U64, I64 = 1 << 64, 1 << 63
EDGE_VALUES: list[object] = [0, -1, 1, U64 - 1, U64, -U64, -U64 + 1, I64 - 1, I64, -I64, -I64 - 1,
                             True, False, None, 0.5, -0.0, math.inf, -math.inf, math.nan, 1e300,
                             "alloc", "", b"x", [], [{}], {}, (1, 2), 3 + 0j]
EDGES = st.sampled_from(EDGE_VALUES)
VALUES = st.one_of(EDGES, st.integers(), st.floats(allow_nan=True), st.text(max_size=3))
ANY_KEYS = st.dictionaries(st.sampled_from((*sf.INLINE_ENTRY_FIELDS, "other")), VALUES, max_size=8)
# the keys torch always writes present (else the entry is refused for them, whatever the values)
ACTIONS = st.one_of(EDGES, st.sampled_from(["alloc", "oom"]))
WITH_REQUIRED = st.builds(lambda required, rest: {**rest, **required},
                          st.fixed_dictionaries({"action": ACTIONS, "size": VALUES, "addr": VALUES}),
                          ANY_KEYS)
ENTRY = st.one_of(ANY_KEYS, WITH_REQUIRED)


def _generic(entry: object) -> str | None:
    try:
        sf._fields(entry, "device_traces[0][0]", sf._ENTRY)
        assert isinstance(entry, dict)
        sf._required(entry, "device_traces[0][0]")
    except SnapshotError as exc:
        return str(exc)
    return None


def _inline(entry: object, compiled: bool = False) -> str | None:
    """The verdict of ``_entries`` on its Python inline path, or on the compiled one."""
    saved = sf._COMPILED
    sf._COMPILED = sf._compiled_check() if compiled else None
    try:
        sf._entries([{"action": "alloc", "addr": 0, "size": 1}, entry, entry], 0)
    except SnapshotError as exc:
        return str(exc).replace("device_traces[0][1]", "device_traces[0][0]")
    finally:
        sf._COMPILED = saved
    return None


def _paths() -> list[bool]:
    return [False, True] if sf._compiled_check() is not None else [False]


@settings(max_examples=3000, deadline=None)
@given(ENTRY)
def test_same_verdict_and_message_as_the_generic_checks(entry):
    for compiled in _paths():
        assert _inline(entry, compiled) == _generic(entry), f"compiled: {compiled}"


@pytest.mark.parametrize("entry", [None, [], "alloc", 7, {"addr": True}, {"time_us": math.nan},
                                   {"frames": ()}, {"size": I64}, {"stream": -I64 - 1},
                                   {"action": "alloc", "addr": 0, "size": 0, "stream": U64 - 1},
                                   {"action": "alloc", "addr": 0, "size": 0, "stream": U64},
                                   {"action": "alloc", "addr": 0, "size": 0, "time_us": -I64},
                                   {"action": "alloc", "addr": 0, "size": 0, "time_us": float(I64)},
                                   {"action": "alloc", "addr": 0, "size": -1},
                                   {"action": "alloc", "addr": -1, "size": 0},
                                   {"action": "alloc", "addr": 0, "size": 0, "device_free": -1},
                                   {"action": "alloc", "addr": 0, "size": True},
                                   {"action": "alloc", "addr": I64, "size": 0},
                                   {"action": "alloc", "addr": 0, "size": 0, "frames": ()},
                                   {"action": "alloc", "addr": 0, "size": 0, "time_us": math.nan}])
def test_edge_entries(entry):
    for compiled in _paths():
        assert _inline(entry, compiled) == _generic(entry), f"compiled: {compiled}"
    required = {"action", "addr", "size"} <= set(entry) if isinstance(entry, dict) else False
    assert _generic(entry) is not None or required  # {} too: an entry without action, size and addr


def test_the_compiled_path_is_built_where_ci_builds_it():
    import os

    if sf._compiled_check() is None and (os.environ.get("CI") == "true"
                                         or os.environ.get("ALLOCCONF_REQUIRE_NATIVE") == "1"):
        pytest.fail("core/memory/_entrycheck is not built: `pip install -e .` builds it")


def test_a_plain_entry_passes():
    assert _inline({"action": "alloc", "addr": 1 << 40, "size": 512, "stream": 0, "time_us": 12,
                    "device_free": 0, "frames": []}) is None


# ---------------------------------------------------------------- the structure walk's leaf dicts

from allocconf_widget.core.untrusted import LoadLimits, check_structure  # noqa: E402

_SCALARS = st.one_of(st.integers(), st.text(max_size=2), st.none(), st.booleans(), st.floats())
_TREES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(st.text(max_size=2), inner, max_size=4)),
    max_leaves=30)


def _reference(obj: object, limits: LoadLimits) -> bool:
    """Refused? A plain recursive walk: every container at depth < max_depth (the root at 0),
    and the root's expanded element count (each reference counted) within max_items."""
    def walk(node: object, depth: int) -> int:
        if not isinstance(node, list | tuple | dict):
            return 0
        if depth >= limits.max_depth:
            raise OverflowError
        children = node.values() if isinstance(node, dict) else node
        return len(node) + sum(walk(child, depth + 1) for child in children)

    try:
        return walk(obj, 0) > limits.max_items
    except OverflowError:
        return True


def _refused(obj: object, limits: LoadLimits) -> bool:
    """The verdict of the walk, the same with the compiled leaf rule as without."""
    verdicts: list[str | None] = []
    for scalar_dicts in {None, sf.compiled_scalar_dicts()}:
        try:
            check_structure(obj, "test", limits, scalar_dicts=scalar_dicts)
        except SnapshotError as exc:
            verdicts.append(str(exc))
        else:
            verdicts.append(None)
    assert len(set(verdicts)) == 1, verdicts
    return verdicts[0] is not None


@settings(max_examples=2000, deadline=None)
@given(_TREES, st.integers(1, 6), st.integers(0, 40), st.booleans())
def test_the_structure_walk_refuses_what_a_plain_walk_refuses(tree, depth, items, shared):
    if shared:  # the same object at two places: counted at both, as a walk over it would
        tree = [tree, {"again": tree}]
    limits = LoadLimits(max_depth=depth, max_items=items)
    assert _refused(tree, limits) == _reference(tree, limits)
