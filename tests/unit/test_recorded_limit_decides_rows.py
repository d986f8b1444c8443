"""A row under another memory fraction than the recording's: the recording's limit decides which
release bursts were malloc's out-of-memory path.

A run under a fraction releases its cache when a new segment does not fit under the limit; the
trace shows only the releases before that segment. Replayed under a row's own limit (no fraction,
say) those bursts fitted, so they were taken for ``empty_cache()`` and every such row freed the
cache where the real run without the fraction never would: 43 of 94 rows replayed from archived
fraction runs missed their real peak by more than 2 % (cnn: −27 %), 5 after.
"""

from __future__ import annotations

from allocconf_widget.app.simulate import SimulationRequest, simulate
from allocconf_widget.app.sources import TraceSource
from allocconf_widget.core.versions import TorchVersion
from tests.trace_builder import TraceBuilder

MiB, GiB = 1 << 20, 1 << 30


def _under_a_tenth() -> TraceBuilder:
    """Under a fraction of 0.1 of 1 GiB (102.4 MiB): 60 MiB cached, then a 70 MiB request does
    not fit beside it, so malloc releases the cache and makes the 70 MiB segment."""
    b = TraceBuilder()
    b.segment("segment_alloc", 0x10000000, 60 * MiB)
    b.free(b.alloc(60 * MiB))
    b.segment("segment_free", 0x10000000, 60 * MiB)
    b.segment("segment_alloc", 0x20000000, 70 * MiB)
    b.free(b.alloc(70 * MiB))
    return b


def _rows(fraction: float | None) -> tuple[int, bool]:
    source = TraceSource(_under_a_tenth().snapshot(), "sidecar knows 0.1", TorchVersion(2, 11),
                         1 * GiB, 0, fraction=0.1, limit_known=True)
    report = simulate(source, SimulationRequest(confs=("",), fraction=fraction, workers=1))
    assert report.fidelity is not None
    return report.rows[0].result.peak_reserved_bytes, report.fidelity.exact


def test_the_recordings_fraction_replays_its_release():
    assert _rows(None) == (70 * MiB, True)


def test_without_the_fraction_the_cache_stays():
    """torch without the limit keeps the 60 MiB segment and adds 70 MiB; the self-check still
    replays the recording under its own fraction."""
    assert _rows(1.0) == (130 * MiB, True)
