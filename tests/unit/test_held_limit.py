"""A memory limit below the device, read off a trace's OOMs (``capacity.held_limit``).

torch records the device's free memory at an OOM. Where it had room for the segment that
failed, the allocator's own limit (a memory fraction) refused the request: the replay then
holds every row to a limit the recording allows, where nobody said the fraction. Without it,
a raw snapshot of a batch finder under a fraction replayed with no limit and called every
setting's run OOM-free at peaks it could never reach.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allocconf_widget.app.simulate import SimulationReport, SimulationRequest, simulate
from allocconf_widget.app.sources import TraceSource, file_source
from allocconf_widget.core.memory.snapshot import load_snapshot
from allocconf_widget.core.sim.capacity import fraction_for, held_limit, replay_room
from allocconf_widget.core.sim.trace.extract import extract_trace
from allocconf_widget.core.versions import TorchVersion
from allocconf_widget.views.text.simulate import report_json
from tests.trace_builder import TraceBuilder

MiB, GiB = 1 << 20, 1 << 30
ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"


def _held_run(device_free: int) -> TraceBuilder:
    """A run that reserved 300 MiB, freed 100 MiB of it, then failed a 400 MiB request."""
    b = TraceBuilder()
    b.segment("segment_alloc", 1 << 40, 200 * MiB)
    a = b.alloc(200 * MiB)
    b.segment("segment_alloc", 2 << 40, 100 * MiB)
    c = b.alloc(100 * MiB)
    b.free(c)
    b.segment("segment_free", 2 << 40, 100 * MiB)
    b.oom(400 * MiB, device_free=device_free)
    b.free(a)
    return b


def test_an_oom_with_room_on_the_device_shows_the_limit_it_ran_under():
    held = held_limit(_held_run(device_free=50 * GiB).build())
    assert held is not None
    # it reserved 300 MiB, so the limit is at least that; 200 MiB held + 400 MiB did not fit
    assert (held.low, held.high, held.limit) == (300 * MiB, 600 * MiB, 450 * MiB)
    assert held.usable == 200 * MiB + 50 * GiB
    assert "300.00 MiB to 600.00 MiB" in held.note()


def test_an_oom_of_a_full_device_shows_no_limit_below_it():
    trace = _held_run(device_free=100 * MiB).build()  # less than the 400 MiB segment: it was full
    assert held_limit(trace) is None
    room = replay_room(trace, None, 0, None, read_limit=True)
    assert (room.device_total, room.fraction) == (200 * MiB + 100 * MiB, None)
    assert "inferred from the OOM" in (room.note or "")


def test_what_the_caller_says_wins():
    trace = _held_run(device_free=50 * GiB).build()
    given = replay_room(trace, 80 * GiB, 1 * GiB, 0.25, read_limit=True)
    said = (given.device_total, given.non_pytorch_bytes, given.fraction, given.note)
    assert said == (80 * GiB, GiB, 0.25, None)
    # a device total alone: the limit becomes a fraction of it
    sized = replay_room(trace, 80 * GiB, GiB, None, read_limit=True)
    assert sized.device_total == 80 * GiB and sized.fraction == pytest.approx(450 * MiB / (80 * GiB))
    # a limit above the device the caller gives is no limit: nothing is made up
    assert replay_room(trace, 400 * MiB, 0, None, read_limit=True).fraction is None


def test_bounds_that_contradict_each_other_give_no_limit():
    b = _held_run(device_free=50 * GiB)
    b.segment("segment_alloc", 3 << 40, 700 * MiB)  # reserved more after the OOM than it allows
    b.alloc(700 * MiB)
    assert held_limit(b.build()) is None


def _sidecar(path: Path) -> dict[str, float]:
    meta: dict[str, float] = json.loads(path.with_name(path.name.replace(".pickle.gz", ".json")).read_text())
    return meta


def _recordings() -> list[Path]:
    return sorted(p for p in DATA.glob("*frac*.pickle.gz") if _sidecar(p).get("fraction"))


@pytest.mark.parametrize("path", _recordings(), ids=lambda p: p.name.split(".")[0])
def test_the_true_limit_of_real_runs_lies_inside(path: Path):
    meta = _sidecar(path)
    trace = extract_trace(load_snapshot(path), None)
    held = held_limit(trace)
    if not trace.ooms:
        assert held is None
        return
    assert held is not None
    assert held.low <= int(meta["fraction"] * meta["device_total_bytes"]) < held.high


@pytest.mark.slow
def test_the_true_limit_of_every_archived_run_that_caught_an_oom_lies_inside(tmp_path: Path):
    """``benchmarks/data``'s runs under a fraction that OOMed (batch finders among them): 21."""
    checked = 0
    for archive in sorted((ROOT / "benchmarks" / "data").glob("*.tar.xz")):
        with tarfile.open(archive) as tar:
            tar.extractall(tmp_path / archive.name, filter="data")
    for path in sorted(tmp_path.rglob("*.pickle")):
        meta = json.loads(path.with_suffix(".json").read_text())
        if not meta.get("fraction"):
            continue
        trace = extract_trace(load_snapshot(path), None)
        if not trace.ooms:
            continue
        held = held_limit(trace)
        assert held is not None, path.name
        assert held.low <= int(meta["fraction"] * meta["device_total_bytes"]) < held.high, path.name
        checked += 1
    assert checked == 21


def test_a_raw_snapshot_replays_under_the_limit_its_ooms_show(tmp_path: Path):
    """The same recording with its sidecar (the fraction known) and without (read off the
    OOM): the self-check reproduces the run either way, and the default row's verdict is the
    same; without the limit it was called a run without an OOM."""
    original = DATA / "growing__frac_default.pickle.gz"
    bare = tmp_path / original.name
    shutil.copy(original, bare)
    request = SimulationRequest(confs=("",), workers=1)
    known = simulate(file_source(str(original)), request)
    read = simulate(file_source(str(bare)), request)
    assert read.fidelity is not None and read.fidelity.exact and read.fidelity.peak_matches
    assert any("held to a limit below the device" in note for note in read.all_notes())
    assert read.limit_bytes is not None and known.limit_bytes is not None
    want = [(r.result.oom is not None, r.result.oom_fatal) for r in known.rows]
    got = [(r.result.oom is not None, r.result.oom_fatal) for r in read.rows]
    assert got == want and want[0][0]


def test_a_batch_finder_recorded_by_torch_alone_replays_as_it_ran(tmp_path: Path):
    """An H100 recording made without this package (no sidecar): a batch finder under a
    fraction of 0.05 that caught one OOM. Replayed with no flag, the note's range holds the
    true limit, the self-check reproduces every segment event, and each row catches the OOM
    as the recording did."""
    original = DATA / "batchfind_raw__frac_default.pickle.gz"
    meta = _sidecar(original)
    raw = tmp_path / original.name
    shutil.copy(original, raw)
    report = simulate(file_source(str(raw)), SimulationRequest(confs=("", "expandable_segments:True"),
                                                               workers=1))
    held = held_limit(extract_trace(load_snapshot(raw), None))
    assert held is not None
    assert held.low <= int(meta["fraction"] * meta["device_total_bytes"]) < held.high
    assert report.fidelity is not None and report.fidelity.exact and report.fidelity.peak_matches
    assert report.limit_bytes == held.limit
    assert all(row.result.oom is not None and not row.result.oom_fatal for row in report.rows)


# ---------------------------------------------------------------- what says otherwise wins (an attack pass)

def _report(b: TraceBuilder, *, limit_known: bool = False, device_total: int | None = None,
            settings: dict[str, object] | None = None, non_pytorch: int = 0) -> SimulationReport:
    source = TraceSource(b.snapshot(settings), "built", TorchVersion(2, 11), device_total, non_pytorch,
                         limit_known=limit_known)
    return simulate(source, SimulationRequest(workers=1))


def _held_note(report: SimulationReport) -> bool:
    return any("held to a limit below the device" in note for note in report.all_notes())


def test_a_sidecar_that_says_there_was_no_fraction_is_believed():
    """A recording whose sidecar (or session) knows the run had no fraction: its OOMs are
    not read as one, whatever the device's free memory said."""
    report = _report(_held_run(device_free=50 * GiB), limit_known=True, device_total=80 * GiB)
    assert not _held_note(report) and report.limit_bytes is None and report.limit_range is None


def test_a_fraction_in_the_settings_string_wins_and_names_the_row():
    """torch's settings string set ``per_process_memory_fraction:0.5``: with the device's
    size known, the replay is held to half of it, not to a limit read off the OOM, and the
    recorded row is named by that string."""
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:0.5",
                "per_process_memory_fraction": 0.5}
    report = _report(_held_run(device_free=50 * GiB), device_total=2 * GiB, settings=settings)
    assert report.limit_bytes == GiB and not _held_note(report)
    assert report.rows[0].conf == "per_process_memory_fraction:0.5"


def test_a_limit_read_off_the_ooms_names_no_row_and_is_in_the_json():
    """The fraction read off the OOMs is a share of the room the OOM showed, not of the card:
    no row offers it as a setting to apply, and ``--json`` says the limit and its range."""
    report = _report(_held_run(device_free=50 * GiB))
    assert report.rows[0].conf == "" and "fraction" not in report.rows[0].label
    doc = report_json(report)[0]
    assert doc["limit_bytes"] == 450 * MiB and doc["limit_read_off_ooms_bytes"] == [300 * MiB, 600 * MiB]


def test_what_the_run_had_allocated_bounds_the_limit_too():
    """Allocations the segment events do not show (segments held before the trace): the
    bytes allocated at once bound the limit from below too; here above what the OOM allows,
    so no limit is read at all (it said 0 to 20 MiB and replayed an OOM that never was)."""
    b = TraceBuilder()
    b.oom(10 * MiB, device_free=10 * GiB)
    for _ in range(3):
        b.alloc(500 * MiB)
    assert held_limit(b.build()) is None


def test_a_limit_a_byte_above_the_peak_is_not_rounded_below_it():
    """The limit as a fraction, multiplied back, came out a byte short of a run that reserved
    exactly that much, and a second note said the run "ran without that limit"."""
    b = TraceBuilder()
    b.segment("segment_alloc", 1 << 40, 100 * MiB)
    b.alloc(100 * MiB)
    b.oom(MiB, device_free=10 * GiB)  # the high bound: 100 MiB held + a 2 MiB segment
    b.segment("segment_alloc", 2 << 40, 2 * MiB - 512)
    b.alloc(1000)
    report = _report(b)
    assert _held_note(report)
    assert not any("ran without that limit" in note for note in report.all_notes()), report.notes


@given(st.integers(1, 1 << 50), st.integers(1, 1 << 50))
def test_the_fraction_for_a_limit_gives_it_back(limit: int, extra: int):
    total = limit + extra
    fraction = fraction_for(limit, total)
    assert int(fraction * total) >= limit and fraction <= 1.0


def test_memory_outside_pytorch_that_leaves_less_than_the_limit_is_the_limit():
    room = replay_room(_held_run(device_free=50 * GiB).build(), 1 * GiB, 700 * MiB, None, read_limit=True)
    assert room.fraction is None and room.held is None  # 324 MiB usable: the 450 MiB limit never binds
