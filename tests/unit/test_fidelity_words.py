"""The self-check's line in the units a user reads: a divergence once said "expected
segment_free 12582912, got None" and "peak reserved differs" without by how much."""

from __future__ import annotations

from allocconf_widget.core.sim.result import Divergence, Fidelity


def _fidelity(expected: str | None, got: str | None) -> Fidelity:
    return Fidelity(recorded_events=10, simulated_events=9, matched_events=8, exact=False,
                    first_divergence=Divergence(3, 40, None, expected, got),
                    recorded_peak_reserved_bytes=12 << 20, simulated_peak_reserved_bytes=14 << 20,
                    partial_trace=False)


def test_a_divergence_names_sizes_in_binary_units_and_a_missing_event_in_words():
    text = _fidelity("segment_free 12582912", None).summary()
    assert "expected a segment_free of 12.00 MiB, got no event (one side ended)" in text
    assert "12582912" not in text and "None" not in text
    assert "peak reserved differs (14.00 MiB replayed, 12.00 MiB recorded)" in text


def test_the_json_keeps_the_machine_form():
    divergence = _fidelity("segment_alloc 20971520", "segment_alloc 2097152").first_divergence
    assert divergence is not None and divergence.to_json()["expected"] == "segment_alloc 20971520"
