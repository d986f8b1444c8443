"""The What-if's decoded-trace cache answers for the recording it was asked about, never an older one.

It used to be keyed by ``id()`` of the recording: a new ``%%allocconf record`` whose object sat at
a freed one's address (280 of 300 tries on the H200) was answered with the first cell's trace.
Here the same object is reused on purpose — the worst case of address reuse — and the cache
must still decode the new snapshot.
"""

from __future__ import annotations

from pathlib import Path

from allocconf_widget.adapters.recorder import CellRecording
from allocconf_widget.app.session import Session
from allocconf_widget.core.memory.snapshot import load_snapshot

DATA = Path(__file__).resolve().parents[1] / "data"


def test_a_new_recording_at_the_same_address_is_decoded_again():
    session = Session()
    rec = CellRecording(snapshot=dict(load_snapshot(DATA / "cnn__default.pickle.gz")),
                        torch_version="2.11.0", device_total=150109880320, free_at_start=149557477376)
    session.set_recording(rec)
    _source, first = session.trace_cache.get(session)
    assert session.trace_cache.get(session)[1] is first  # asked again: decoded once
    rec.snapshot = dict(load_snapshot(DATA / "growing__default.pickle.gz"))  # same id(), new cell
    session.set_recording(rec)
    _source, second = session.trace_cache.get(session)
    assert second is not first
    assert second.num_events != first.num_events  # the new cell's trace, not the old one


def test_without_a_recording_the_bundled_one_is_used_and_kept():
    session = Session()
    source, trace = session.trace_cache.get(session)
    assert source.label.startswith("the bundled H200 recording")
    assert session.trace_cache.get(session)[1] is trace
