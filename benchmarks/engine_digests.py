"""The Python engine's answer on every archived recording, and the compiled engine held to it.

    python benchmarks/engine_digests.py --write          # Python engine: tests/data/engine_digests.json
    python benchmarks/engine_digests.py --check native   # compiled engine against the file
    python benchmarks/engine_digests.py --check both     # both engines, side by side, with timings

Every recording of ``benchmarks/data`` (held-out ones too) is replayed under its own settings
(with the self-check) and under the what-ifs of ``tests/engine_agreement.WHAT_IFS``; each
replay's fields (all but the time it took: peaks, counters, OOM facts, series, segment events,
the fidelity, the timing range) are hashed into a digest. ``--write`` stores the Python
engine's digests; CI's ``tests/unit/test_engine_digests.py`` replays every recording on
the compiled engine and compares. A disagreement is a bug in one of the engines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.engine_agreement import DIGESTS, archives, digest, outcome, recordings, replays


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="store the Python engine's digests")
    mode.add_argument("--check", choices=("native", "python", "both"))
    parser.add_argument("--archives", default="", help="comma-separated name parts (default: all)")
    args = parser.parse_args()
    wanted = [a for a in args.archives.split(",") if a]
    stored: dict[str, str] = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
    found: dict[str, str] = {}
    bad = 0
    per_replay: dict[str, list[float]] = {"python": [], "native": []}
    engines = ["python"] if args.write else (["python", "native"] if args.check == "both" else [args.check])
    for archive in archives():
        if wanted and not any(w in str(archive) for w in wanted):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            for rec in recordings(archive, Path(tmp)):
                for label, settings, kwargs in replays(rec):
                    key = f"{rec.name} | {label}"
                    for engine in engines:
                        t0 = time.perf_counter()
                        got = digest(outcome(rec.trace, settings, engine=engine, **kwargs))
                        per_replay[engine].append(time.perf_counter() - t0)
                        found[key] = got
                        if not args.write and stored.get(key) != got:
                            bad += 1
                            print(f"DIFFERS ({engine}): {key}: stored {stored.get(key)}, got {got}",
                                  flush=True)
        print(f"{archive.name}: {len(found)} replays so far, {bad} differ", flush=True)
    for engine, times in per_replay.items():
        if times:
            print(f"{engine}: {len(times)} replays, {sum(times):.1f} s, "
                  f"median {statistics.median(times) * 1e3:.1f} ms")
    if args.write:
        DIGESTS.write_text(json.dumps(dict(sorted(found.items())), indent=0) + "\n")
        print(f"wrote {len(found)} digests to {DIGESTS}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
