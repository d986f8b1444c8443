"""A recorded GPU run (a JSON sidecar plus its memory snapshot), for replay without a GPU.

``benchmarks/gpu/record.py`` writes, per run, ``<name>.json`` (what the process
measured: real ``memory_stats()`` peaks, device total, the settings read back,
per-step timestamps and a 20 Hz ``memory_stats()`` timeline) and
``<name>.pickle.gz`` (the final ``torch.cuda.memory._snapshot()``). A
:class:`Recording` exposes both so the monitor can replay the run on a
CPU-only machine (the demo notebook) and the charts can draw it, always
labelled as a recording, never passed off as live data.

Standard library only; the snapshot is loaded lazily through the restricted
unpickler of :mod:`allocconf_widget.core.memory.snapshot`.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from allocconf_widget._errors import SnapshotError, printable
from allocconf_widget.core.memory.metrics import cached_share
from allocconf_widget.core.memory.snapshot import Snapshot, load_snapshot
from allocconf_widget.core.numbers import int_or_none
from allocconf_widget.core.units import format_bytes
from allocconf_widget.core.untrusted import read_regular_file

DEMO_NAME = "demo_cnn_h200"


class Traversable(Protocol):
    """What we need of a package-data file (``importlib.resources``) or a ``Path``."""

    def read_bytes(self) -> bytes: ...

_KEY_TO_SERIES = {
    "reserved_bytes.all.current": "reserved",
    "allocated_bytes.all.current": "allocated",
    "active_bytes.all.current": "active",
    "requested_bytes.all.current": "requested",
    "inactive_split_bytes.all.current": "inactive_split",
}


@dataclass(frozen=True)
class RecordedSample:
    """One row of the recorded timeline (bytes; ``None`` where the recording lacks the key)."""

    t: float
    reserved: int | None
    allocated: int | None
    active: int | None
    requested: int | None
    inactive_split: int | None

    @property
    def cached_share(self) -> float | None:
        """Share of reserved memory not allocated: ``(reserved − allocated) / reserved``."""
        return cached_share(self.reserved, self.allocated)

    def values(self) -> dict[str, float | None]:
        """The series values as the monitor's :class:`~.timeline.Timeline` names them."""
        return {
            "reserved": _f(self.reserved),
            "allocated": _f(self.allocated),
            "active": _f(self.active),
            "requested": _f(self.requested),
            "cached_share": self.cached_share,
        }


@dataclass(frozen=True)
class RecordedStep:
    """Optimizer step ``step`` finished ``t`` seconds into the run (``epoch_us`` wall clock)."""

    step: int
    t: float
    epoch_us: float | None


@dataclass(frozen=True)
class Recording:
    """A recorded run: metadata, the sampled timeline, steps, and (lazily) the snapshot."""

    name: str
    description: str
    samples: tuple[RecordedSample, ...]
    steps: tuple[RecordedStep, ...] = ()
    workload: str | None = None
    conf: str = ""
    fraction: float | None = None
    torch_version: str | None = None
    device_name: str | None = None
    device_total_bytes: int | None = None
    free_at_start_bytes: int | None = None
    wall_s: float | None = None
    oom_message: str | None = None
    stats: Mapping[str, Any] = field(default_factory=dict)
    allocator_settings: Mapping[str, Any] | None = None
    trace_events: int | None = None
    snapshot_path: Path | Traversable | None = None
    _cache: dict[str, Snapshot] = field(default_factory=dict, repr=False, compare=False)
    _derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    _lock: Any = field(default_factory=threading.Lock, repr=False, compare=False)

    # ------------------------------------------------------------- derived facts
    @property
    def label(self) -> str:
        """What every view shows so a replay is never mistaken for live data."""
        return f"Recording: {self.description}"

    @property
    def non_pytorch_bytes(self) -> int | None:
        """Memory the process held outside the allocator at the start (mostly the CUDA context)."""
        if self.device_total_bytes is None or self.free_at_start_bytes is None:
            return None
        return max(0, self.device_total_bytes - self.free_at_start_bytes)

    def peak(self, key: str) -> int | None:
        """A real ``memory_stats()`` counter of the run, e.g. ``reserved_bytes.all.peak``."""
        value = self.stats.get(key)
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    def snapshot(self) -> Snapshot:
        """The end-of-run snapshot (loaded once; raises SnapshotError if it is missing)."""
        with self._lock:
            if "snapshot" not in self._cache:
                if self.snapshot_path is None:
                    raise SnapshotError(f"recording {self.name!r} has no snapshot file")
                source = self.snapshot_path
                self._cache["snapshot"] = load_snapshot(
                    source if isinstance(source, Path) else source.read_bytes()
                )
            return self._cache["snapshot"]

    @property
    def epoch_origin_us(self) -> float | None:
        """Wall-clock µs of ``t = 0`` (from the steps' timestamps), to place trace entries."""
        for step in self.steps:
            if step.epoch_us is not None:
                return step.epoch_us - step.t * 1e6
        return None

    def fragmentation(self) -> tuple[float | None, ...]:
        """External fragmentation at each sample, rebuilt from the snapshot's allocation history.

        All ``None`` when the recording has no snapshot, no history, or no wall-clock steps to
        align the history with its timeline (the chart then leaves the ratio line out).
        Computed once (a few tenths of a second for the bundled recording).
        """
        from allocconf_widget.core.memory.trace_fragmentation import HistoryMismatchError, fragmentation_at

        with self._lock:
            cached = self._derived.get("fragmentation")
        if cached is not None:
            return tuple(cached)
        values: tuple[float | None, ...] = (None,) * len(self.samples)
        origin = self.epoch_origin_us
        if origin is not None:
            try:
                points = fragmentation_at(self.snapshot(), [origin + s.t * 1e6 for s in self.samples])
                values = tuple(p.external_fragmentation for p in points)
            except (SnapshotError, HistoryMismatchError):
                pass  # no history to rebuild it from: no figure, never a made-up one
        with self._lock:
            self._derived["fragmentation"] = values
        return values


def _f(value: int | None) -> float | None:
    return None if value is None else float(value)


def _samples(keys: Sequence[str], rows: Sequence[Sequence[Any]], where: str) -> tuple[RecordedSample, ...]:
    if not keys or keys[0] != "t_s":
        raise SnapshotError(f"{where}: 'timeline_keys' must start with 't_s' (got {list(keys)[:3]})")
    columns = {_KEY_TO_SERIES.get(k, k): i for i, k in enumerate(keys)}

    def pick(row: Sequence[Any], name: str) -> int | None:
        i = columns.get(name)
        return int_or_none(row[i]) if i is not None and i < len(row) else None

    out = []
    for n, row in enumerate(rows):
        if not row or not isinstance(row[0], int | float):
            raise SnapshotError(f"{where}: timeline row {n} has no time value")
        out.append(RecordedSample(
            float(row[0]), pick(row, "reserved"), pick(row, "allocated"), pick(row, "active"),
            pick(row, "requested"), pick(row, "inactive_split"),
        ))
    return tuple(sorted(out, key=lambda s: s.t))


def _steps(rows: Sequence[Sequence[Any]]) -> tuple[RecordedStep, ...]:
    steps = []
    for row in rows:
        if len(row) >= 2 and isinstance(row[0], int | float) and isinstance(row[1], int | float):
            epoch = float(row[2]) if len(row) > 2 and isinstance(row[2], int | float) else None
            steps.append(RecordedStep(int(row[0]), float(row[1]), epoch))
    return tuple(steps)


def _describe(meta: Mapping[str, Any], name: str) -> str:
    text = meta.get("description")
    if isinstance(text, str) and text.strip():
        return text.strip()
    parts = [str(meta.get("workload") or name)]
    if meta.get("device_name"):
        parts.append(f"on {meta['device_name']}")
    if meta.get("torch"):
        parts.append(f"with torch {meta['torch']}")
    parts.append(f"({meta.get('conf') or 'default settings'})")
    return " ".join(parts)


def recording_from_dict(
    meta: Mapping[str, Any],
    name: str = "recording",
    snapshot_path: str | os.PathLike[str] | Traversable | None = None,
) -> Recording:
    """Build a :class:`Recording` from a parsed JSON sidecar."""
    where = f"recording {name!r}"
    if not isinstance(meta, Mapping):
        raise SnapshotError(f"{where}: expected a JSON object, got {type(meta).__name__}")
    stats = meta.get("stats")
    settings = meta.get("allocator_settings")
    fraction = meta.get("fraction")
    return Recording(
        name=str(meta.get("name") or name),
        description=_describe(meta, name),
        samples=_samples(meta.get("timeline_keys") or ["t_s"], meta.get("timeline") or [], where),
        steps=_steps(meta.get("steps") or []),
        workload=meta.get("workload") if isinstance(meta.get("workload"), str) else None,
        conf=str(meta.get("conf") or ""),
        fraction=float(fraction) if isinstance(fraction, int | float) else None,
        torch_version=str(meta["torch"]) if meta.get("torch") else None,
        device_name=str(meta["device_name"]) if meta.get("device_name") else None,
        device_total_bytes=int_or_none(meta.get("device_total_bytes")),
        free_at_start_bytes=int_or_none(meta.get("free_at_start_bytes")),
        wall_s=float(meta["wall_s"]) if isinstance(meta.get("wall_s"), int | float) else None,
        oom_message=meta.get("oom") if isinstance(meta.get("oom"), str) else None,
        stats=dict(stats) if isinstance(stats, Mapping) else {},
        allocator_settings=dict(settings) if isinstance(settings, Mapping) else None,
        trace_events=int_or_none(meta.get("trace_events")),
        snapshot_path=(
            Path(snapshot_path) if isinstance(snapshot_path, str | os.PathLike) else snapshot_path
        ),
    )


#: a recording's sidecar is a few hundred KiB at most (its timeline); more is not ours
SIDECAR_MAX_BYTES = 8 << 20


def is_recording_sidecar(data: bytes) -> bool:
    """Whether ``data`` (a file's bytes) is a recording's JSON sidecar, one this package would
    write or read: a JSON object with ``device_total_bytes``. Anything else beside a snapshot
    is the user's, and a save never replaces it."""
    try:
        meta = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except Exception:  # untrusted bytes: any failure means "not a sidecar"
        return False
    return isinstance(meta, dict) and "device_total_bytes" in meta


@dataclass(frozen=True)
class SidecarFacts:
    """What a recording's JSON sidecar tells a replay of its snapshot: the device, the torch.

    A fact the file gives but that cannot be right (out of range, or contradicted by the trace:
    :mod:`allocconf_widget.core.sim.sidecar_check`) is None here, with an :class:`IgnoredFact`
    beside it in :class:`SidecarRead`.
    """

    path: Path
    device_total_bytes: int | None
    non_pytorch_bytes: int | None
    torch_version: str | None
    fraction: float | None = None  # set_per_process_memory_fraction in force, if below 1
    #: whether the run's memory limit is known: its device total stands and its fraction (None
    #: included: no fraction) was not ignored. Where it is not, the replay reads a limit off the
    #: trace's OOMs as for a file without a sidecar.
    limit_known: bool = True


@dataclass(frozen=True)
class IgnoredFact:
    """One fact of a sidecar left out of the replay, and why."""

    key: str  # the sidecar's key, e.g. "fraction"
    value: str  # as the file gave it, exact
    why: str  # says what it contradicts, for people

    def note(self, sidecar: str) -> str:
        """The note every view shows (one line, the file's text escaped)."""
        return (f"ignored the sidecar {printable(sidecar, 120, newlines=False)}'s {self.key} "
                f"{printable(self.value, 40, newlines=False)}: {self.why}; the replay goes on "
                "without it")


#: the largest device a sidecar may claim (1 PiB): more is not a GPU, it is a broken file
SIDECAR_MAX_DEVICE_BYTES = 1 << 50
#: the smallest device memory a replay accepts, from a sidecar or ``--device-total``: less made
#: every replay "OOM at event 1"
MIN_DEVICE_BYTES = 1 << 20


@dataclass(frozen=True)
class SidecarRead:
    """What reading a snapshot's sidecar gave: its facts, or why a file there was ignored."""

    facts: SidecarFacts | None
    problem: str | None = None  # set when a sidecar exists but is unusable (the note to show)
    ignored: tuple[IgnoredFact, ...] = ()  # facts left out, the others kept
    path: Path | None = None  # the sidecar read, where it had facts to ignore

    @property
    def notes(self) -> tuple[str, ...]:
        """Every line the replay's report shows about this sidecar's problems."""
        path = self.facts.path if self.facts is not None else self.path
        name = path.name if path is not None else "beside the snapshot"
        return (*((self.problem,) if self.problem else ()),
                *(fact.note(name) for fact in self.ignored))


def read_sidecar(snapshot_path: str | os.PathLike[str]) -> SidecarRead:
    """``<name>.json`` beside ``<name>.pickle[.gz]``, read as untrusted optional data.

    Never raises: a missing file gives no facts and no problem; a FIFO, an oversized file,
    malformed JSON, a field of the wrong type (an object where a list is expected, ``1e999``,
    a 400-digit integer) gives no facts and a ``problem`` that names the file, so the replay
    goes on without it and says so. A well-typed value out of range (a device of 1 KiB, a
    fraction of 5, free memory above the device's) drops that fact alone, with an
    :class:`IgnoredFact`; :func:`allocconf_widget.core.sim.sidecar_check.check_sidecar` then
    drops what the trace contradicts.
    """
    path = Path(snapshot_path)
    stem = path.name
    for suffix in (".pickle.gz", ".pickle", ".gz"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    sidecar = path.with_name(stem + ".json")
    try:
        data = read_regular_file(sidecar, SIDECAR_MAX_BYTES)
    except FileNotFoundError:
        return SidecarRead(None)
    except OSError as exc:
        return _bad_sidecar(sidecar, f"it cannot be read ({exc})")
    if len(data) > SIDECAR_MAX_BYTES:
        return _bad_sidecar(sidecar, f"it is larger than {SIDECAR_MAX_BYTES >> 20} MiB")
    try:
        meta = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
        rec = recording_from_dict(meta, stem)
    except SnapshotError as exc:
        return _bad_sidecar(sidecar, printable(str(exc), 200))
    except Exception as exc:  # optional untrusted data: any failure means "ignore it"
        return _bad_sidecar(sidecar, f"it is not a recording's sidecar ({type(exc).__name__}: "
                            f"{printable(str(exc), 120)})")
    total = rec.device_total_bytes
    if total is None and meta.get("device_total_bytes") is not None:
        return _bad_sidecar(sidecar, "'device_total_bytes' "
                            f"{printable(repr(meta.get('device_total_bytes')), 40)} is not a number "
                            "of bytes")
    if total is None:
        return SidecarRead(None)  # a JSON file of something else: nothing to say about it
    ignored: list[IgnoredFact] = []
    version = rec.torch_version if rec.torch_version and len(rec.torch_version) <= 64 else None
    if rec.torch_version and version is None:
        ignored.append(IgnoredFact("torch", rec.torch_version, "it is not a torch release"))
    if not MIN_DEVICE_BYTES <= total <= SIDECAR_MAX_DEVICE_BYTES:
        ignored.append(IgnoredFact("device_total_bytes", str(total), "it is not a device's memory "
                                   "(1 MiB to 1 PiB); the free memory and fraction read against it "
                                   "go with it"))
        facts = (SidecarFacts(sidecar, None, None, version, None, limit_known=False) if version
                 else None)
        return SidecarRead(facts, ignored=tuple(ignored), path=sidecar)
    non_pytorch, fraction, limit_known = _values_in_range(meta, rec, total, ignored)
    return SidecarRead(SidecarFacts(sidecar, total, non_pytorch, version, fraction, limit_known),
                       ignored=tuple(ignored), path=sidecar)


def _values_in_range(meta: Mapping[str, Any], rec: Recording, total: int,
                     ignored: list[IgnoredFact]) -> tuple[int | None, float | None, bool]:
    """The memory outside PyTorch and the fraction, where the sidecar's values can be right."""
    free = rec.free_at_start_bytes
    non_pytorch = rec.non_pytorch_bytes
    if free is not None and not 0 < free <= total:
        ignored.append(IgnoredFact("free_at_start_bytes", str(free), (
            "it leaves nothing of the device to PyTorch" if free <= 0 else
            f"it is more than the device's {format_bytes(total)}")))
        non_pytorch = None
    raw = meta.get("fraction")
    fraction = rec.fraction
    if raw is not None and fraction is None:
        ignored.append(IgnoredFact("fraction", printable(repr(raw), 40),
                                   "it is not a number"))
        return non_pytorch, None, False
    if fraction is not None and not 0.0 < fraction <= 1.0:
        ignored.append(IgnoredFact("fraction", repr(fraction), "a memory fraction lies in (0, 1]"))
        return non_pytorch, None, False
    return non_pytorch, (fraction if fraction is not None and fraction < 1.0 else None), True


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number a recording writes")


def _bad_sidecar(sidecar: Path, why: str) -> SidecarRead:
    return SidecarRead(None, f"ignored the sidecar {printable(sidecar.name, 120, newlines=False)}: "
                       f"{printable(why, 400, newlines=False)}; the "
                       "snapshot is replayed without it")


def load_demo() -> Recording:
    """The bundled real recording (a CNN on an H200) used when no GPU is available."""
    data = resources.files("allocconf_widget").joinpath("data")
    meta_file = data.joinpath(f"{DEMO_NAME}.json")
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    return recording_from_dict(meta, DEMO_NAME, data.joinpath(f"{DEMO_NAME}.pickle.gz"))
