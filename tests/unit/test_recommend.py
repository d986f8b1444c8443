"""The settings recommender (core/sim/recommend.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocconf_widget._errors import AllocConfError
from allocconf_widget.core.memory.snapshot import load_snapshot
from allocconf_widget.core.sim.recommend import candidate_confs, recommend
from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.trace.extract import extract_trace
from allocconf_widget.core.units import format_bytes
from allocconf_widget.core.versions import TorchVersion
from tests.reasons import candidate_reason
from tests.trace_builder import TraceBuilder

MiB = 1 << 20
DATA = Path(__file__).resolve().parents[1] / "data"


def _varying_batches() -> TraceBuilder:
    """Activations whose sizes grow step by step: classic segments pile up."""
    b = TraceBuilder(reuse_addresses=True)
    for step in range(40):
        acts = [b.alloc((30 + step) * MiB + k * 3 * MiB) for k in range(4)]
        for a in acts:
            b.free(a)
    return b


def test_grid_respects_the_release_and_the_fraction() -> None:
    old = dict(candidate_confs(TorchVersion(2, 0), with_fraction=False))
    assert "expandable_segments:True" not in old
    assert not any("max_non_split_rounding_mb" in c for c in old)
    new = dict(candidate_confs(TorchVersion(2, 11), with_fraction=False))
    assert new["expandable_segments:True"] == "expandable"
    assert new["max_split_size_mb:256,max_non_split_rounding_mb:512"] == "combo"
    assert not any("garbage_collection_threshold" in c for c in new)
    with_gc = dict(candidate_confs(TorchVersion(2, 11), with_fraction=True))
    assert with_gc["garbage_collection_threshold:0.6"] == "gc"


def test_ranking_puts_the_smallest_peak_first_with_reasons() -> None:
    rec = recommend(_varying_batches().build(), torch_version="2.11", workers=1)
    peaks = [c.result.peak_reserved_bytes for c in rec.candidates]
    assert peaks == sorted(peaks)
    assert rec.best.conf == "expandable_segments:True"
    assert "expandable segments map memory in pages" in candidate_reason(rec, rec.best)
    assert "vs" in candidate_reason(rec, rec.best) and "now (−" in candidate_reason(rec, rec.best)
    assert rec.current.is_current and candidate_reason(rec, rec.current).startswith("current settings")
    assert sum(c.is_current for c in rec.candidates) == 1
    # a synthetic trace records no segment events: the model check says so, once
    assert rec.fidelity is not None and not rec.fidelity.checked
    assert "records no segment events" in rec.fidelity.summary()
    assert not any("segment events" in note.text for note in rec.notes)


def test_no_oom_ranks_before_any_peak_and_the_reason_says_so() -> None:
    # GIVEN a device that the current settings overflow through fragmentation
    b = _varying_batches()
    rec = recommend(b.build(), torch_version="2.11", device_total=300 * MiB, workers=1)
    assert rec.current.result.oom is not None
    first = rec.best
    assert first.result.oom is None
    assert candidate_reason(rec, first).startswith("avoids the OOM at event")
    failing = [c for c in rec.candidates if c.result.oom is not None]
    assert rec.candidates[-len(failing):] == tuple(failing)
    for c in failing:
        if not c.is_current:
            assert "runs out of memory at event" in candidate_reason(rec, c)


def test_gc_candidates_appear_only_with_a_fraction() -> None:
    trace = _varying_batches().build()
    plain = recommend(trace, torch_version="2.11", device_total=8000 * MiB, workers=1)
    assert not any(c.kind == "gc" for c in plain.candidates)
    limited = recommend(trace, torch_version="2.11", device_total=8000 * MiB, fraction=0.5,
                        workers=1)
    gcs = [c for c in limited.candidates if c.kind == "gc"]
    assert gcs and all(c.settings.per_process_memory_fraction == 0.5 for c in limited.candidates)


def test_current_settings_and_duplicates() -> None:
    trace = _varying_batches().build()
    current = SimSettings(expandable_segments=True, torch_version=TorchVersion(2, 11))
    rec = recommend(trace, torch_version="2.11", current_settings=current,
                    current_conf="expandable_segments:True", workers=1)
    # the grid's identical candidate is folded into the current one
    assert [c.conf for c in rec.candidates].count("expandable_segments:True") == 1
    assert rec.current.conf == "expandable_segments:True"


def test_extra_confs_are_validated() -> None:
    trace = _varying_batches().build()
    rec = recommend(trace, torch_version="2.11", extra_confs=["large_segment_size_mb:32"],
                    workers=1)
    assert any(c.kind == "extra" for c in rec.candidates)
    with pytest.raises(AllocConfError):
        recommend(trace, torch_version="2.11", extra_confs=["max_split_size_mb:1"], workers=1)


def test_format_bytes() -> None:
    assert format_bytes(21_500_000_000) == "20.02 GiB"  # one unit system: binary everywhere
    assert format_bytes(20 * MiB) == "20.00 MiB"
    assert format_bytes(1_500_000) == "1.43 MiB"


def test_recorded_cnn_trace_prefers_expandable_segments() -> None:
    # measured on the H200 (tests/data/README.md): default 11.5 GB, expandable 5.7 GB
    snap = load_snapshot(DATA / "cnn__default.pickle.gz")
    recorded = SimSettings.from_allocator_settings(snap.get("allocator_settings"), (2, 11))
    rec = recommend(extract_trace(snap), torch_version=(2, 11), current_settings=recorded,
                    workers=1)
    assert rec.fidelity is not None and rec.fidelity.exact
    assert rec.best.conf == "expandable_segments:True"
    assert rec.best.result.peak_reserved_bytes == 5_674_893_312
    assert rec.current.result.peak_reserved_bytes == 11_479_810_048
    split128 = next(c for c in rec.candidates if c.conf == "max_split_size_mb:128")
    assert split128.result.peak_reserved_bytes == 26_625_441_792  # measured: 26.6 GB
    assert "reused only for requests within" in candidate_reason(rec, split128)


def test_settings_the_kernels_torch_does_not_take_are_not_offered() -> None:
    """A 2.11 recording looked at from a torch 1.13 kernel: the replays follow 2.11, but a row
    the user could not apply (expandable segments, the 2.6 rounding combination) is not offered,
    and a note says why."""
    from allocconf_widget.core.versions import parse_version

    trace = _varying_batches().build()
    both = recommend(trace, torch_version="2.11", current_conf="")
    old = recommend(trace, torch_version="2.11", current_conf="", offer_release=parse_version("1.13"))
    offered = {c.conf for c in old.candidates}
    assert "expandable_segments:True" in {c.conf for c in both.candidates}
    assert "expandable_segments:True" not in offered
    assert not any("max_non_split_rounding_mb" in c for c in offered)
    assert "max_split_size_mb:256" in offered  # what 1.13 takes stays
    note = next(n.text for n in old.notes if n.text.startswith("not offered"))
    assert "torch 1.13" in note and "expandable_segments:True" in note


def test_a_settings_mechanism_does_not_flip_with_what_runs_now() -> None:
    """The same row, the same peak, opposite explanations: max_split_size_mb:128 was "large
    requests keep adding segments" beside expandable segments and "small requests cannot
    fragment the big cached blocks" beside max_split_size_mb:64 (it was said against "now")."""
    from allocconf_widget.core.memory.recording import load_demo

    trace = extract_trace(load_demo().snapshot())
    v = TorchVersion(2, 11)

    def why(current: str) -> str:
        rec = recommend(trace, torch_version=v, current_conf=current,
                        extra_confs=["max_split_size_mb:128"], workers=1)
        row = next(c for c in rec.candidates if c.conf == "max_split_size_mb:128")
        return candidate_reason(rec, row).split("): ", 1)[1]

    beside_expandable, beside_split64 = why("expandable_segments:True"), why("max_split_size_mb:64")
    assert beside_expandable == beside_split64
    assert "large requests keep adding segments" in beside_split64  # 24.80 GiB vs 10.69 default
