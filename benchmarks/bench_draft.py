"""The Settings tab's prediction per draft on a 1M-entry recording, beside ``pickle.loads`` of it.

    python benchmarks/bench_draft.py [--events 1000000] [--repeat 3]

A recording of ``--events`` trace entries (``bench_simulator.training_loop``: a transformer-like
training loop with 1 % frees that wait on another stream) is pickled, loaded as
``%%allocconf record`` keeps it, and put in a session; then each draft a slider move stages is
predicted (``app.draft_prediction.predict_staged``: the draft and the applied settings, each with
its GPU-timing range), alternating with ``pickle.loads`` of the same file's bytes, in this one
process. The first draft also decodes the recording and builds its GPU-timing orders (once per
recording); it is printed apart. The issue's target: a draft in no longer than ``pickle.loads``.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_simulator import training_loop

from allocconf_widget.adapters.recorder import CellRecording
from allocconf_widget.app.draft_prediction import predict_staged
from allocconf_widget.app.session import Session
from allocconf_widget.core.config.conf import parse_conf
from allocconf_widget.core.memory.snapshot import load_snapshot
from allocconf_widget.core.sim.native import describe_engine
from allocconf_widget.core.units import format_bytes

DRAFTS = ("expandable_segments:True", "max_split_size_mb:128", "roundup_power2_divisions:4",
          "max_split_size_mb:512", "expandable_segments:True,max_split_size_mb:256",
          "roundup_power2_divisions:8",
          "garbage_collection_threshold:0.6,max_split_size_mb:128", "max_split_size_mb:64")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="pickle.loads timings per draft")
    args = parser.parse_args()
    data = pickle.dumps({"segments": [], "device_traces": [training_loop(args.events)]}, protocol=4)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "step.pickle"
        path.write_bytes(data)
        snapshot = dict(load_snapshot(path))
    session = Session()
    session.set_recording(CellRecording(snapshot=snapshot, torch_version="2.11.0", device_total=80 * 10**9,
                                        free_at_start=80 * 10**9 - 527 * 2**20))
    version = session.state().version
    print(f"{args.events:,} trace entries, {len(data) / 2**20:.1f} MiB pickled; "
          f"replay engine: {describe_engine()}")
    loads: list[float] = []
    drafts: list[float] = []
    for n, text in enumerate(DRAFTS):
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            pickle.loads(data)
            loads.append(time.perf_counter() - t0)
        session.stage(parse_conf(text, version, warn=False), eager=False)
        t0 = time.perf_counter()
        prediction = predict_staged(session)
        seconds = time.perf_counter() - t0
        assert prediction is not None and prediction.draft is not None, prediction
        peak = format_bytes(prediction.draft.result.peak_reserved_bytes)
        what = "first draft (decodes the recording)" if n == 0 else "draft"
        print(f"{what:36} {text:55} {seconds:6.2f} s  peak {peak}", flush=True)
        if n:
            drafts.append(seconds)
    print(f"pickle.loads: min {min(loads):.2f} s, median {statistics.median(loads):.2f} s "
          f"({len(loads)} runs)")
    print(f"per draft:    min {min(drafts):.2f} s, median {statistics.median(drafts):.2f} s "
          f"({len(drafts)} drafts)")
    print(f"draft / pickle.loads (medians): {statistics.median(drafts) / statistics.median(loads):.2f}")


if __name__ == "__main__":
    main()
