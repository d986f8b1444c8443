"""``allocconf simulate --fraction F --conf garbage_collection_threshold:0.6`` must not say the GC
does nothing without a fraction: the replay has one (given, a sidecar's, or the one a trace's OOMs
show). Without a fraction the note stays."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocconf_widget.app.simulate import SimulationRequest, simulate
from allocconf_widget.app.sources import TraceSource, file_source
from allocconf_widget.core.versions import TorchVersion
from tests.snapshot_builders import block, segment
from tests.unit.test_simulator_start_state import BASE, MiB, entry, seeded

TRACE = Path(__file__).resolve().parents[1] / "data" / "growing__frac_default.pickle.gz"
GC = "garbage_collection_threshold:0.6"


def _notes(fraction: float | None, trace: Path = TRACE) -> str:
    report = simulate(file_source(str(trace)), SimulationRequest(confs=(GC,), fraction=fraction))
    return " ".join(report.all_notes())


def test_no_gc_trap_note_when_the_replay_has_a_memory_fraction():
    assert "does nothing" not in _notes(0.5)


def test_the_fraction_the_files_sidecar_records_counts_as_one():
    notes = _notes(None)
    assert "the run's memory fraction 0.000429" in notes and "does nothing" not in notes


def test_the_note_stays_without_a_fraction(tmp_path):
    import shutil

    unlimited = TRACE.with_name("growing__default.pickle.gz")  # no fraction, no OOM
    alone = tmp_path / unlimited.name  # and without its sidecar
    shutil.copy(unlimited, alone)
    assert "does nothing unless a memory fraction" in _notes(None, alone)


def test_a_limit_read_off_the_ooms_counts_as_one(tmp_path):
    """Without its sidecar the fraction run's OOM still shows the limit it ran under
    (``capacity.held_limit``): the collector has a limit to act at, so no note."""
    import shutil

    alone = tmp_path / TRACE.name
    shutil.copy(TRACE, alone)
    notes = _notes(None, alone)
    assert "held to a limit below the device" in notes and "does nothing" not in notes


@pytest.mark.parametrize(("fraction", "noted"), [(0.5, True), (None, False)])
def test_gc_rows_from_a_start_with_idle_segments_say_their_order_is_a_guess(
        fraction: float | None, noted: bool) -> None:
    """Two cached segments at the start: how long each was idle decides which the collector
    releases first, and no snapshot says; a report with garbage-collection rows under a limit
    says so (without a limit the collector never runs, and nothing is said)."""
    idle = [segment(block(size, "inactive"), address=BASE + offset)
            for size, offset in ((64 * MiB, 0), (80 * MiB, 128 * MiB))]
    entries = [entry("alloc", BASE + 512 * MiB, 150 * MiB)]
    source = TraceSource(seeded(idle, entries), "cut mid-run", TorchVersion(2, 11),
                         device_total=400 * MiB, non_pytorch_bytes=0)
    report = simulate(source, SimulationRequest(
        confs=("", "garbage_collection_threshold:0.6"), fraction=fraction))
    said = [n for n in report.all_notes() if "idle" in n]
    assert bool(said) == noted, report.notes
    if noted:
        assert "2 cached segments" in said[0] and "garbage_collection_threshold" in said[0]
