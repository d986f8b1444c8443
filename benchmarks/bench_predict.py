"""Is ``app.dryrun.predict`` fast enough for a Settings slider? (target: ≤ 300 ms per update)

Replays the bundled H200 recording (``allocconf_widget/data/demo_cnn_h200``, 13,991 events)
under the settings a user reaches by moving one slider, with the decoded trace shared the way
the panel would keep it, and prints each update's time beside the 300 ms budget::

    python benchmarks/bench_predict.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from allocconf_widget.app.dryrun import predict
from allocconf_widget.app.simulate import trace_source
from allocconf_widget.core.sim.trace import extract_trace

BUDGET_MS = 300.0
SLIDER = ["", "max_split_size_mb:64", "max_split_size_mb:128", "max_split_size_mb:512",
          "roundup_power2_divisions:2", "roundup_power2_divisions:4", "roundup_power2_divisions:8",
          "expandable_segments:True", "garbage_collection_threshold:0.6,max_split_size_mb:256"]


def main() -> None:
    source = trace_source(SimpleNamespace(extras={}))
    t0 = time.perf_counter()
    trace = extract_trace(source.snapshot)
    decode_ms = (time.perf_counter() - t0) * 1000
    times = []
    for conf in SLIDER:
        t0 = time.perf_counter()
        pred = predict(source, conf, trace=trace)
        ms = (time.perf_counter() - t0) * 1000
        times.append(ms)
        print(f"{ms:7.1f} ms  ({ms / BUDGET_MS:.2f} of the budget)  {pred.describe()}")
    print(f"decode once: {decode_ms:.0f} ms; per update: median {statistics.median(times):.1f} ms, "
          f"max {max(times):.1f} ms = {max(times) / BUDGET_MS:.2f} × the {BUDGET_MS:.0f} ms budget")


if __name__ == "__main__":
    main()
