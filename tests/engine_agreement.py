"""Replays under both engines, compared field for field.

The compiled engine (``core/sim/_replay.c``) must give exactly what the Python engine
(``core/sim/engine.py``) gives: every :class:`~allocconf_widget.core.sim.result.SimResult`
field but the time it took, the segment events, the fidelity of a self-check and the range of
a timing-dependent peak. Used by ``tests/unit/test_native_engine.py``,
``tests/unit/test_engine_digests.py`` and ``benchmarks/engine_digests.py``.

A *digest* is a short hash of one replay's fields: ``tests/data/engine_digests.json`` holds the
Python engine's digest of every archived recording under a grid of settings, so CI can hold
the compiled engine to the Python one on every recording without replaying each in Python.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tarfile
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from allocconf_widget.core.memory.snapshot import load_snapshot
from allocconf_widget.core.sim import native
from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.simulator import simulate
from allocconf_widget.core.sim.trace.extract import extract_trace
from allocconf_widget.core.sim.trace.model import Trace

ROOT = Path(__file__).resolve().parents[1]
DIGESTS = ROOT / "tests" / "data" / "engine_digests.json"
#: the what-ifs every recording is replayed under besides its own settings (torch 2.11 rules,
#: and 2.12's counter tie-break for the first)
WHAT_IFS = ("", "expandable_segments:True", "max_split_size_mb:128", "roundup_power2_divisions:4",
            "garbage_collection_threshold:0.6")


def outcome(trace: Trace, settings: SimSettings, *, engine: str, **kwargs: Any) -> dict[str, Any]:
    """``simulate(trace, settings, **kwargs)`` on one engine, as a dict of its fields (no time)."""
    forced = native.python_engine() if engine == "python" else nullcontext()
    with forced:
        if engine == "native" and native.engine_name() != "native":
            raise RuntimeError("the compiled engine is not built (python setup.py build_ext --inplace)")
        result = simulate(trace, settings, **kwargs)
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    del fields["seconds"]
    # the settings by what they say: a TorchVersion's text is whichever spelling of the release
    # was parsed first in the process (equal versions share one object), not part of the replay
    v = result.settings.torch_version
    fields["settings"] = (result.settings.describe(), v.major, v.minor, v.build,
                          dataclasses.replace(result.settings, torch_version=v, label=None).describe())
    return fields


def served_natively(trace: Trace, settings: SimSettings, **kwargs: Any) -> bool:
    """Whether the compiled engine replayed this itself (rather than handing it to Python)."""
    engine = native.new_engine(trace, settings, **kwargs)
    engine.run()
    return isinstance(engine, native.NativeEngine) and engine.used_native


def digest(fields: dict[str, Any]) -> str:
    """A short hash of one replay's fields (``repr`` of every value, in field order)."""
    text = repr(sorted(fields.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclasses.dataclass(frozen=True)
class Recording:
    """One archived recording: its name, its trace, and what its sidecar says of the device."""

    name: str
    trace: Trace
    settings: SimSettings
    device_total: int | None
    non_pytorch_bytes: int


def archives() -> list[Path]:
    """Every archive of recordings in ``benchmarks/data`` (held-out ones included)."""
    return sorted((ROOT / "benchmarks" / "data").rglob("*.tar.xz"))


def recordings(archive: Path, workdir: Path) -> Iterator[Recording]:
    """The recordings of one archive, extracted into ``workdir``."""
    with tarfile.open(archive) as tar:
        tar.extractall(workdir, filter="data")
    for pickle in sorted(workdir.rglob("*.pickle")):
        yield _recording(f"{archive.relative_to(ROOT)}:{pickle.name}", pickle)


def data_recordings() -> Iterator[Recording]:
    """The recordings in ``tests/data``."""
    for path in sorted((ROOT / "tests" / "data").glob("*.pickle.gz")):
        yield _recording(str(path.relative_to(ROOT)), path)


def _recording(name: str, path: Path) -> Recording:
    meta_path = Path(str(path).removesuffix(".gz").removesuffix(".pickle") + ".json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    snap = load_snapshot(str(path))
    settings = SimSettings.from_allocator_settings(snap.get("allocator_settings"), (2, 11))
    if meta.get("fraction"):
        settings = dataclasses.replace(settings, per_process_memory_fraction=float(meta["fraction"]))
    total = meta.get("device_total_bytes")
    free = meta.get("free_at_start_bytes")
    non_pytorch = total - free if isinstance(total, int) and isinstance(free, int) and free <= total else 0
    device = total if isinstance(total, int) else None
    return Recording(name, extract_trace(snap), settings, device, non_pytorch)


def replays(rec: Recording) -> Iterator[tuple[str, SimSettings, dict[str, Any]]]:
    """The replays a recording is compared under: (label, settings, simulate's keywords)."""
    device = {"device_total": rec.device_total, "non_pytorch_bytes": rec.non_pytorch_bytes}
    yield "recorded", rec.settings, {**device, "stop_at_oom": False, "check": True, "record_segments": True}
    for conf in WHAT_IFS:
        s = SimSettings.from_string(conf, "2.11")
        if conf.startswith("garbage"):
            s = dataclasses.replace(s, per_process_memory_fraction=0.5)
        yield conf or "defaults", s, {**device, "stop_at_oom": True}
    yield "defaults 2.12", SimSettings.from_string("", "2.12"), {**device, "stop_at_oom": True}
