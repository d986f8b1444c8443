"""The compiled replay engine gives exactly what the Python engine gives.

Every field of every result but the time it took (peaks, counters, OOM facts, the series, the
segment events, a self-check's fidelity, a timing-dependent peak's range) is compared between
the two engines on: every recording in ``tests/data`` under its own settings and the what-ifs of
``tests/engine_agreement.py``; the same recordings cut mid-run (a start state, reconstructed);
the hostile shapes; property-generated traces with streams, frees that wait on other streams,
recorded OOMs, memory-fraction changes and free lists in chunks of a few keys. The archived
recordings of ``benchmarks/data`` are compared through their digests
(``tests/unit/test_engine_digests.py``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocconf_widget.core.memory.snapshot import load_snapshot
from allocconf_widget.core.sim import native, sorted_keys, timing
from allocconf_widget.core.sim.limits import FractionChange, with_fraction_changes
from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.trace.decode import decode_entries
from allocconf_widget.core.sim.trace.extract import extract_trace
from allocconf_widget.core.sim.trace.model import Trace
from allocconf_widget.core.versions import TorchVersion
from tests.engine_agreement import ROOT, data_recordings, outcome, replays, served_natively
from tests.hostile import replay_shapes
from tests.trace_builder import TraceBuilder

MiB = 1 << 20
RECORDINGS = list(data_recordings())


def _needs_native() -> None:
    if native.engine_name() != "native":
        if os.environ.get("CI") == "true" or os.environ.get("ALLOCCONF_REQUIRE_NATIVE") == "1":
            pytest.fail("the compiled replay engine is not built: `pip install -e .` builds it "
                        "(or python setup.py build_ext --inplace)")
        pytest.skip("the compiled replay engine is not built (python setup.py build_ext --inplace)")


@pytest.fixture(autouse=True)
def _native() -> None:
    _needs_native()


def assert_alike(trace: Trace, s: SimSettings, **kwargs: Any) -> dict[str, Any]:
    py = outcome(trace, s, engine="python", **kwargs)
    nat = outcome(trace, s, engine="native", **kwargs)
    differ = [k for k in py if py[k] != nat[k]]
    assert not differ, f"the engines differ in {differ}: python {[py[k] for k in differ][:2]}, " \
                       f"native {[nat[k] for k in differ][:2]}"
    return py


@pytest.mark.parametrize("rec", RECORDINGS, ids=lambda r: r.name.rsplit("/", 1)[-1])
def test_every_recording_replays_alike_under_every_setting(rec: Any) -> None:
    for _, s, kwargs in replays(rec):
        assert_alike(rec.trace, s, **kwargs)
    assert served_natively(rec.trace, rec.settings, device_total=rec.device_total)


@pytest.mark.parametrize("name", ["cnn__expandable", "transformer__default", "streams__default",
                                  "mempool__default", "resnet_ec__expandable"])
@pytest.mark.parametrize("cut", [0.3, 0.7])
def test_a_recording_cut_mid_run_replays_alike_from_its_start_state(name: str, cut: float) -> None:
    snap = load_snapshot(str(ROOT / "tests" / "data" / f"{name}.pickle.gz"))
    cut_snap = copy.copy(snap)
    entries = snap["device_traces"][0]
    cut_snap["device_traces"] = [entries[int(len(entries) * cut):]]
    trace = extract_trace(cut_snap)
    assert trace.initial_state is not None
    for conf in ("", "expandable_segments:True", "max_split_size_mb:128"):
        for version in ("2.11", "2.12"):
            s = SimSettings.from_string(conf, version)
            assert_alike(trace, s, stop_at_oom=False, check=True, record_segments=True)
            assert_alike(trace, s, device_total=trace.initial_reserved_bytes + 3 << 30)
    assert served_natively(trace, SimSettings.from_string("", "2.11"))


@pytest.mark.parametrize("shape", sorted(replay_shapes.SHAPES))
def test_the_hostile_shapes_replay_alike(shape: str) -> None:
    trace = decode_entries(replay_shapes.SHAPES[shape][0](3000))
    for conf in ("", "expandable_segments:True", "max_split_size_mb:64", "garbage_collection_threshold:0.5"):
        s = SimSettings.from_string(conf, "2.11")
        if conf.startswith("garbage"):
            s = dataclasses.replace(s, per_process_memory_fraction=0.5)
        assert_alike(trace, s, device_total=4 << 30, stop_at_oom=False, record_segments=True)
        assert_alike(trace, s, series_points=7)


def test_a_trace_beyond_the_compiled_bounds_replays_in_python_alike() -> None:
    b = TraceBuilder()
    big = b.alloc(1 << 60)  # three of them add up past the 2^61 the compiled engine keeps to
    b.alloc(1 << 60)
    b.free(big)
    b.alloc(1 << 60)
    b.alloc(3 * MiB)
    trace = b.build()
    s = SimSettings.from_string("", "2.11")
    assert not served_natively(trace, s)
    assert_alike(trace, s, record_segments=True)


# ------------------------------------------------------------------ property-generated traces
sizes = st.one_of(st.integers(1, MiB), st.integers(MiB + 1, 10 * MiB), st.integers(10 * MiB, 90 * MiB),
                  st.sampled_from([512, 4096, MiB, 2 * MiB, 20 * MiB, 64 * MiB]))
step = st.one_of(
    st.tuples(st.just("alloc"), sizes, st.sampled_from([0, 0, 0, 5, 9])),
    st.tuples(st.just("free"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("request"), st.integers(0, 10_000), st.just(0)),  # record_stream: completes later
    st.tuples(st.just("complete"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("oom"), sizes, st.sampled_from([0, 5])),
)
versions = st.sampled_from([TorchVersion(2, minor) for minor in (0, 3, 5, 6, 9, 10, 11, 12, 13, 15)])


@st.composite
def configs(draw: st.DrawFn) -> tuple[SimSettings, int | None]:
    device = draw(st.sampled_from([None, 48 * MiB, 96 * MiB, 160 * MiB, 320 * MiB]))
    fraction = draw(st.sampled_from([None, None, 0.5, 0.9, 1.0])) if device else None
    s = SimSettings(
        max_split_bytes=draw(st.sampled_from([None, None, 64 * MiB, 128 * MiB])),
        max_non_split_rounding_bytes=draw(st.sampled_from([None, None, 0, 40 * MiB])),
        roundup_slots=(draw(st.sampled_from([0, 0, 1, 2, 4, 8])),) * 16,
        gc_threshold=draw(st.sampled_from([0.0, 0.5, 0.8])) if fraction else 0.0,
        expandable_segments=draw(st.booleans()),
        large_segment_bytes=draw(st.sampled_from([20 * MiB, 20 * MiB, 40 * MiB])),
        per_process_memory_fraction=fraction,
        throw_on_cudamalloc_oom=draw(st.booleans()) if device else False,
        torch_version=draw(versions),
    )
    return s, device


def build(steps: list[tuple[str, int, int]]) -> TraceBuilder:
    b = TraceBuilder(reuse_addresses=True)
    live: list[tuple[int, int]] = []
    waiting: list[tuple[int, int]] = []
    for kind, value, stream in steps:
        if kind == "alloc":
            live.append((b.alloc(value, stream=stream), stream))
        elif kind == "oom":
            b.oom(-(-value // 512) * 512, stream=stream)
        elif kind == "complete" and waiting:
            addr, s = waiting.pop(value % len(waiting))
            b.free_completed(addr, stream=s)
        elif kind in ("free", "request") and live:
            addr, s = live.pop(value % len(live))
            if kind == "free":
                b.free(addr, stream=s)
            else:
                b.free_requested(addr, stream=s)
                waiting.append((addr, s))
    return b


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=4, max_size=120), config=configs(), load=st.sampled_from([1, 4, 512]),
       fractions=st.lists(st.sampled_from([0.3, 0.6, 1.0]), max_size=2))
def test_generated_traces_replay_alike(steps: list[tuple[str, int, int]],
                                       config: tuple[SimSettings, int | None], load: int,
                                       fractions: list[float]) -> None:
    s, device = config
    trace = build(steps).build()
    if fractions and trace.num_ops > 2:
        changes = [FractionChange(0, f, trace.op_time_us[(k + 1) * trace.num_ops // (len(fractions) + 1)])
                   for k, f in enumerate(fractions)]
        trace = with_fraction_changes(trace, changes)
    with mock.patch.object(sorted_keys, "LOAD", load):
        assert_alike(trace, s, device_total=device, stop_at_oom=False, record_segments=True)
        assert_alike(trace, s, device_total=device, series_points=5)


def assert_orders_alike(trace: Trace) -> None:
    """The GPU-timing orders (:mod:`.timing`), built from the raw columns by the compiled module
    and by the Python code, are the same arrays."""
    built = {}
    for engine in ("native", "python"):
        fresh = dataclasses.replace(trace)  # no orders cached yet
        with native.python_engine() if engine == "python" else contextlib.nullcontext():
            built[engine] = timing._build(fresh)
    for order in ("early", "late"):
        ours, theirs = getattr(built["native"], order), getattr(built["python"], order)
        for name in ("ops", "addr_ids", "sizes", "lanes", "op_index", "op_time_us"):
            a, b = getattr(ours, name), getattr(theirs, name)
            assert a == b and a.typecode == b.typecode, f"the {order} order's {name} differs"
        assert ours.num_addresses == theirs.num_addresses


@pytest.mark.parametrize("name", ["streams__default", "streams2__frac_default", "transformer_nb__default"])
def test_recordings_timing_orders_are_built_alike(name: str) -> None:
    rec = next(r for r in RECORDINGS if name in r.name)
    assert rec.trace.deferred_frees or name == "transformer_nb__default"
    assert_orders_alike(rec.trace)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=4, max_size=150))
def test_generated_timing_orders_are_built_alike(steps: list[tuple[str, int, int]]) -> None:
    assert_orders_alike(build(steps).build())


# ------------------------------------------------------------------ the decoder's common rows
def assert_decoded_alike(snapshot: dict[str, Any]) -> None:
    """``extract_trace`` with the compiled loop over common entries and without: every field."""
    from allocconf_widget.core.sim.trace.model import Trace as TraceType

    fast = extract_trace(snapshot)
    with native.python_engine():
        plain = extract_trace(snapshot)
    for name in TraceType.__dataclass_fields__:
        assert getattr(fast, name) == getattr(plain, name), name


@pytest.mark.parametrize("rec", RECORDINGS[:6], ids=lambda r: r.name.rsplit("/", 1)[-1])
def test_recordings_decode_alike(rec: Any) -> None:
    snap = load_snapshot(str(ROOT / rec.name))
    assert_decoded_alike(dict(snap))
    cut = dict(snap)
    entries = snap["device_traces"][0]
    cut["device_traces"] = [entries[len(entries) // 2:]]  # a start state, reconstructed
    assert_decoded_alike(cut)


ODD = st.sampled_from([None, "x", 1.5, True, -1, 1 << 70, [1], 0])
entry_values = st.fixed_dictionaries(
    {"action": st.sampled_from(["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                                "oom", "snapshot", "weird"])},
    optional={"addr": st.one_of(st.sampled_from([0x1000, 0x2000, 0x3000, 0x4000]), ODD),
              "size": st.one_of(st.sampled_from([512, 4096, 3 << 20, 30 << 20]), ODD),
              "stream": st.one_of(st.sampled_from([0, 0, 7, 1 << 64 - 1]), ODD),
              "time_us": st.one_of(st.integers(0, 10**6), ODD,
                                   st.floats(allow_nan=False, allow_infinity=False)),
              "pool_id": st.sampled_from([(0, 0), (1, 2), None]),
              "device_free": st.integers(0, 1 << 30)})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(entry_values, entry_values, entry_values, ODD), max_size=60))
def test_generated_entries_decode_alike(entries: list[Any]) -> None:
    outcomes = []
    for engine in ("native", "python"):
        with native.python_engine() if engine == "python" else contextlib.nullcontext():
            try:
                trace = extract_trace({"segments": [], "device_traces": [entries]})
            except Exception as exc:
                outcomes.append((type(exc).__name__, str(exc)))
            else:
                outcomes.append(tuple(getattr(trace, name) for name in Trace.__dataclass_fields__))
    assert outcomes[0] == outcomes[1]
