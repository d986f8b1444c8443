"""Is the Settings tab's prediction fast enough for a slider? (target: ≤ 300 ms per update)

The panel answers every staged draft with ``app.draft_prediction.predict_staged``: the draft
and the applied settings replayed on the session's recording (decoded once, kept by the
session's trace cache). This puts the bundled H200 recording (``allocconf_widget/data/
demo_cnn_h200``, 13,991 events) in a Session as if ``%%allocconf record`` had made it, moves
one slider through its positions (each a first visit: two replays plus the recorded one),
then back (each answered from the memo), and prints each update beside the 300 ms budget::

    python benchmarks/bench_predict.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from allocconf_widget.adapters.recorder import CellRecording
from allocconf_widget.app.draft_prediction import predict_staged
from allocconf_widget.app.session import Session
from allocconf_widget.core.config.conf import parse_conf
from allocconf_widget.core.memory.recording import load_demo
from allocconf_widget.views.text.forecast import draft_lines

BUDGET_MS = 300.0
SLIDER = ["", "max_split_size_mb:64", "max_split_size_mb:128", "max_split_size_mb:512",
          "roundup_power2_divisions:2", "roundup_power2_divisions:4", "roundup_power2_divisions:8",
          "expandable_segments:True", "garbage_collection_threshold:0.6,max_split_size_mb:256"]


def _session() -> Session:
    demo = load_demo()
    total = demo.device_total_bytes or 0
    session = Session()
    session.set_recording(CellRecording(snapshot=demo.snapshot(), torch_version=demo.torch_version or "",
                                        device_total=total,
                                        free_at_start=total - (demo.non_pytorch_bytes or 0)))
    return session


def _move(session: Session, confs: list[str]) -> list[float]:
    times = []
    for conf in confs:
        session.stage(parse_conf(conf, session.state().version, warn=False), eager=False)
        t0 = time.perf_counter()
        prediction = predict_staged(session)
        ms = (time.perf_counter() - t0) * 1000
        times.append(ms)
        assert prediction is not None and prediction.problem is None, prediction
        print(f"{ms:7.1f} ms  ({ms / BUDGET_MS:.2f} of the budget)  {draft_lines(prediction)[0]}")
    return times


def main() -> None:
    session = _session()
    t0 = time.perf_counter()
    session.trace_cache.get(session)
    decode_ms = (time.perf_counter() - t0) * 1000
    print("first visit of each position:")
    first = _move(session, SLIDER)
    print("back again (memo):")
    again = _move(session, SLIDER[::-1])
    print(f"decode once: {decode_ms:.0f} ms; first visits: median {statistics.median(first):.1f} ms, "
          f"max {max(first):.1f} ms = {max(first) / BUDGET_MS:.2f} × the {BUDGET_MS:.0f} ms budget; "
          f"revisits: max {max(again):.2f} ms")


if __name__ == "__main__":
    main()
