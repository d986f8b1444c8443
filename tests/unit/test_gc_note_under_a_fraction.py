"""``allocconf simulate --fraction F --conf garbage_collection_threshold:0.6`` must not say the GC
does nothing without a fraction: the replay has one. Without a fraction the note stays."""

from __future__ import annotations

from pathlib import Path

from allocconf_widget.app.simulate import SimulationRequest, file_source, simulate

TRACE = Path(__file__).resolve().parents[1] / "data" / "growing__frac_default.pickle.gz"
GC = "garbage_collection_threshold:0.6"


def _notes(fraction: float | None, trace: Path = TRACE) -> str:
    report = simulate(file_source(str(trace)), SimulationRequest(confs=(GC,), fraction=fraction))
    return " ".join(report.notes)


def test_no_gc_trap_note_when_the_replay_has_a_memory_fraction():
    assert "does nothing" not in _notes(0.5)


def test_the_fraction_the_files_sidecar_records_counts_as_one():
    notes = _notes(None)
    assert "memory fraction 0.000429 (--fraction)" in notes and "does nothing" not in notes


def test_the_note_stays_without_a_fraction(tmp_path):
    import shutil

    alone = tmp_path / TRACE.name  # without its sidecar: no fraction known
    shutil.copy(TRACE, alone)
    assert "does nothing unless a memory fraction" in _notes(None, alone)
