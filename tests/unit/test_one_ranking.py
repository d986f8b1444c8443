"""One way to rank, below the front ends: the What if? tab's source (a recording in the session)
and ``allocconf simulate``'s (the file and its sidecar) rank a recording made under a memory
fraction identically. The front ends themselves: tests/shell/test_one_ranking.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from allocconf_widget.adapters.recorder import CellRecording
from allocconf_widget.app.session import Session
from allocconf_widget.core.memory.snapshot import load_snapshot


def test_a_recording_made_under_a_fraction_ranks_as_its_file_does(tmp_path, monkeypatch):
    """``%%allocconf record`` in a kernel whose memory fraction was set in an earlier cell: the
    What if? tab replays the run under that fraction, as ``allocconf simulate`` does from the
    file's sidecar (it replayed without it: a LOW CONFIDENCE self-check, a 4.12 GiB "peak now"
    where the run peaked at 2.87 GiB, and no garbage-collection rows)."""
    import tarfile

    from allocconf_widget.app.simulate import SimulationRequest, simulate
    from allocconf_widget.app.sources import file_source, trace_source

    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    archive = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "batchfind.tar.xz"
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, members=[m for m in tar.getmembers() if "default_f3g" in m.name],
                       filter="data")
    path = tmp_path / "batchfind__default_f3g.pickle"
    meta = json.loads(path.with_suffix(".json").read_text())
    session = Session()
    session.set_recording(CellRecording(snapshot=dict(load_snapshot(path)), torch_version=meta["torch"],
                                        device_total=meta["device_total_bytes"],
                                        free_at_start=meta["free_at_start_bytes"], fraction=meta["fraction"]))
    tab = simulate(trace_source(session), SimulationRequest(rank=True, workers=1))
    cli = simulate(file_source(str(path)), SimulationRequest(rank=True, workers=1, fraction=meta["fraction"]))
    assert tab.fidelity is not None and tab.fidelity.confident
    assert [(r.conf, r.result.peak_reserved_bytes) for r in tab.rows] == \
        [(r.conf, r.result.peak_reserved_bytes) for r in cli.rows]
    assert any("garbage_collection_threshold" in r.conf for r in tab.rows)
