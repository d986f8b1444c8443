"""A release burst right before a new segment, replayed without the device's memory.

Only the run's memory limit tells malloc's out-of-memory path (the device was full: torch
released the cache itself) from a call of ``empty_cache()`` there. Without the device's size
the replay takes it as ``empty_cache()`` under every setting; a user is told so, once, unless
the recording itself decides it (the new segment stayed within the recorded peak, which fitted
under any limit the run had).
"""

from __future__ import annotations

from allocconf_widget.app.simulate import SimulationReport, SimulationRequest, simulate
from allocconf_widget.app.sources import TraceSource
from allocconf_widget.core.versions import TorchVersion
from tests.trace_builder import TraceBuilder

MiB = 1 << 20


def _burst_then_segment(later_peak: int = 0) -> TraceBuilder:
    """40 MiB cached, released, then a 60 MiB segment (40 + 60 MiB needed); optionally a
    later segment that takes reserved memory to ``later_peak``."""
    b = TraceBuilder()
    b.segment("segment_alloc", 0x10000000, 40 * MiB)
    b.free(b.alloc(40 * MiB))
    b.segment("segment_free", 0x10000000, 40 * MiB)
    b.segment("segment_alloc", 0x20000000, 60 * MiB)
    kept = b.alloc(60 * MiB)
    if later_peak:
        b.segment("segment_alloc", 0x40000000, later_peak - 60 * MiB)
        b.free(b.alloc(later_peak - 60 * MiB))
    b.free(kept)
    return b


def _report(b: TraceBuilder, device_total: int | None, *, limit_known: bool = False,
            fraction: float | None = None) -> SimulationReport:
    source = TraceSource(b.snapshot(), "built", TorchVersion(2, 11), device_total, 0,
                         limit_known=limit_known)
    return simulate(source, SimulationRequest(confs=("", "max_split_size_mb:20"), fraction=fraction,
                                              workers=1))


def _said(report: SimulationReport) -> list[str]:
    return [note.text for note in report.notes if "out-of-memory path" in note.text]


def test_without_the_device_a_user_is_told_the_burst_was_taken_as_empty_cache():
    report = _report(_burst_then_segment(), device_total=None)
    (note,) = _said(report)
    assert note.startswith("1 release burst right before a new segment was either")
    assert "(the device was full there)" in note and "replayed as empty_cache()" in note
    assert "give --device-total, and --fraction if the run had one" in note
    assert report.fidelity is not None and report.fidelity.exact  # the recording replays as it was


def test_with_the_device_only_an_unrecorded_fraction_could_have_made_it_mallocs():
    (note,) = _said(_report(_burst_then_segment(), device_total=1 << 40))
    assert "a memory fraction this snapshot does not record" in note and "give --fraction" in note
    # 100 MiB did not fit on an 80 MiB device: malloc's own, decided, nothing to say
    assert not _said(_report(_burst_then_segment(), device_total=80 * MiB))


def test_a_known_limit_decides_it_and_nothing_is_said():
    """A sidecar or session that knows the run's fraction (none included), or a fraction given."""
    assert not _said(_report(_burst_then_segment(), device_total=1 << 40, limit_known=True))
    assert not _said(_report(_burst_then_segment(), device_total=1 << 40, fraction=0.5))


def test_a_burst_the_recorded_peak_decides_needs_no_note():
    """The run later reserved 200 MiB: 100 MiB fitted under its limit, so the burst was
    empty_cache() whatever the device."""
    report = _report(_burst_then_segment(later_peak=200 * MiB), device_total=None)
    assert not _said(report)
