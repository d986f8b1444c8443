"""Every archived recording replays on the compiled engine exactly as on the Python engine.

``tests/data/engine_digests.json`` holds the Python engine's digest of each replay
(``benchmarks/engine_digests.py --write``): every recording of ``benchmarks/data``, held-out
ones included, under its own settings with the self-check and under the what-ifs of
``tests/engine_agreement.py``. Here every one of them is replayed on the compiled engine and
held to that digest; a few are replayed on the Python engine too, so a change to the Python
engine that the file does not know of fails here rather than passing unnoticed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from allocconf_widget.core.sim import native
from tests.engine_agreement import DIGESTS, archives, digest, outcome, recordings, replays

pytestmark = pytest.mark.slow

#: archives whose recordings are also replayed on the Python engine here (one of each kind:
#: a plain run, side streams, expandable segments and private pools, a held-out program)
PYTHON_TOO = ("cnn.tar.xz", "streams2.tar.xz", "mempool.tar.xz", "vit_ckpt.tar.xz")


def test_every_archived_recording_replays_as_the_python_engine_did(tmp_path: Path) -> None:
    if native.engine_name() != "native":
        if os.environ.get("CI") == "true" or os.environ.get("ALLOCCONF_REQUIRE_NATIVE") == "1":
            pytest.fail("the compiled replay engine is not built: `pip install -e .` builds it")
        pytest.skip("the compiled replay engine is not built")
    stored: dict[str, str] = json.loads(DIGESTS.read_text())
    seen: set[str] = set()
    differ: list[str] = []
    for n, archive in enumerate(archives()):
        for rec in recordings(archive, tmp_path / str(n)):
            for label, settings, kwargs in replays(rec):
                key = f"{rec.name} | {label}"
                seen.add(key)
                engines = ["native", "python"] if archive.name in PYTHON_TOO else ["native"]
                for engine in engines:
                    got = digest(outcome(rec.trace, settings, engine=engine, **kwargs))
                    if got != stored.get(key):
                        differ.append(f"{engine}: {key}")
    assert not differ, (f"{len(differ)} replays differ from the Python engine's digests (a bug in one "
                        f"engine, or benchmarks/engine_digests.py --write not run after a change of "
                        f"the Python engine): {differ[:5]}")
    assert seen == set(stored), \
        "the digests are of other recordings: run benchmarks/engine_digests.py --write"
