"""The what-if use case: which trace to replay, under which torch's rules, and the result.

``allocconf simulate``, ``%allocconf simulate`` and the panel's What if? tab all go through
here: :func:`simulate` turns a :class:`TraceSource` and a :class:`SimulationRequest` into one
:class:`SimulationReport`, which ``views/text/simulate.py`` prints for the CLI and the magic
alike; the tab renders :func:`what_if`'s ranking. The trace's torch release is decided once,
by :func:`trace_torch_version`, so one file replays under the same rules everywhere.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from allocconf_widget._errors import AllocConfError, AllocConfWarning
from allocconf_widget.core.sim.recommend import Recommendation
from allocconf_widget.core.versions import TorchVersion, installed_torch_version, simulated_release

if TYPE_CHECKING:
    from allocconf_widget.core.sim.result import Fidelity, SimResult

RECORDING_KEY = "recording"


@dataclass(frozen=True)
class TraceSource:
    """A trace to replay and what is known about the run that produced it."""

    snapshot: Any
    label: str
    torch_version: TorchVersion | None  # None: infer from the trace
    device_total: int | None = None
    non_pytorch_bytes: int | None = 0  # None: estimate it from the trace (core/sim/capacity.py)
    device: int | None = None  # CUDA device whose trace to use (None: the one with a trace)
    notes: tuple[str, ...] = ()  # where facts came from (a recording's sidecar), for the report


def file_source(path: str, *, torch_version: TorchVersion | None = None,
                device_total: int | None = None, non_pytorch_bytes: int | None = None,
                device: int | None = None) -> TraceSource:
    """A snapshot file, with what its recording's sidecar knows (``<name>.json`` beside it:
    the device's memory and the torch it ran) where the caller does not say it. The CLI and
    ``%allocconf simulate FILE`` both come here, so both replay a file the same way.

    Raises:
        SnapshotError: the file cannot be read safely or is not a snapshot.
    """
    from allocconf_widget.core.memory.recording import sidecar_facts
    from allocconf_widget.core.memory.snapshot import load_snapshot
    from allocconf_widget.core.units import format_bytes

    snapshot = load_snapshot(path)
    notes: list[str] = []
    known = sidecar_facts(path) if device_total is None or torch_version is None else None
    if known is not None:
        used = []
        if device_total is None:
            device_total = known.device_total_bytes
            if non_pytorch_bytes is None:
                non_pytorch_bytes = known.non_pytorch_bytes
            used.append(f"device capacity {format_bytes(device_total or 0)} (--device-total)")
        if torch_version is None and known.torch_version:
            torch_version = _release(known.torch_version)
            if torch_version is not None:
                used.append(f"torch {known.torch_version} (--torch-version)")
        if used:
            notes.append(f"from the recording's sidecar {known.path.name}: {' and '.join(used)}; "
                         "the option in brackets overrides it")
    label = path
    from allocconf_widget.core.dryrun_facts import GAPS, LABEL, SNAPSHOT_MARK

    if isinstance(snapshot.get(SNAPSHOT_MARK), dict):  # written by app/dryrun: an estimate
        label = f"{path} ({LABEL})"
        notes.extend(GAPS)
    return TraceSource(snapshot, label, torch_version, device_total, non_pytorch_bytes, device,
                       tuple(notes))


@dataclass(frozen=True)
class VersionChoice:
    """The torch release whose rules the replay follows, and why (for a note)."""

    version: TorchVersion
    note: str | None = None


@dataclass(frozen=True)
class WhatIfReport:
    """The ranked candidates for one trace, with the lines every front end heads them with."""

    source_label: str
    num_events: int
    recommendation: Recommendation
    notes: tuple[str, ...] = field(default=())

    def headline(self) -> list[str]:
        rec = self.recommendation
        lines = [f"What if? Replaying {self.source_label} ({self.num_events:,} events) under "
                 f"{len(rec.candidates)} settings."]
        if rec.fidelity is not None:
            lines.append(f"Model check on the recorded settings: {rec.fidelity.summary()}")
        return lines


def trace_torch_version(snapshot: Any, trace: Any, *, device_total: int | None,
                        non_pytorch_bytes: int, fraction: float | None) -> VersionChoice:
    """The release whose rules best reproduce ``trace`` (snapshots do not record their torch)."""
    from allocconf_widget.core.sim.simulator import infer_torch_version
    from allocconf_widget.core.sim.trace import guess_torch_version

    floor, why = guess_torch_version(snapshot)
    installed = installed_torch_version()
    prefer = installed if installed is not None and installed.known else None
    readback = snapshot.get("allocator_settings")
    version, fidelity = infer_torch_version(
        trace, readback if isinstance(readback, dict) else None, floor=floor, prefer=prefer,
        device_total=device_total, non_pytorch_bytes=non_pytorch_bytes, fraction=fraction)
    shown = str(version)
    if fidelity is None:
        return VersionChoice(version, f"snapshots do not record the torch version and this trace "
                             f"has no segment events to infer it from; assuming {shown} ({why})")
    return VersionChoice(version, f"snapshots do not record the torch version; using the rules "
                         f"of torch {shown}, which reproduce this trace best ({fidelity.summary()})")


def _non_pytorch(source: TraceSource, trace: Any, notes: list[str]) -> int:
    """Memory outside the allocator: as given, else estimated when the device total is known
    (a run that fills the card must stop below the device total, as the real one does)."""
    if source.non_pytorch_bytes is not None:
        return source.non_pytorch_bytes
    if source.device_total is None:
        return 0
    from allocconf_widget.core.sim.capacity import estimate_non_pytorch

    estimate = estimate_non_pytorch(trace, source.device_total)
    notes.append(estimate.note)
    return estimate.bytes


def trace_source(session: Any, path: str | None = None, demo: bool = False) -> TraceSource:
    """A file, the session's last ``%%allocconf record``, or the bundled recording."""
    if path:
        return file_source(path)
    rec = session.extras.get(RECORDING_KEY)
    if rec is not None and rec.snapshot is not None and not demo:
        # Memory in use when recording started, less what the allocator already held (the
        # replay starts from those segments), is memory outside PyTorch's allocator.
        from allocconf_widget.core.sim.state import INITIAL_SEGMENTS_KEY

        held = sum(int(seg.get("total_size", 0)) for seg in rec.snapshot.get(INITIAL_SEGMENTS_KEY) or ()
                   if isinstance(seg, dict) and seg.get("device", 0) == 0)
        return TraceSource(rec.snapshot, "the last %%allocconf record",
                           _release(rec.torch_version), rec.device_total,
                           max((rec.device_total or 0) - (rec.free_at_start or 0) - held, 0))
    dry = session.extras.get("dryrun")  # app/dryrun.DRYRUN_KEY: an estimate, labelled so
    if dry is not None and not demo:
        return dry.source()  # type: ignore[no-any-return]
    from allocconf_widget.core.memory.recording import load_demo

    demo_rec = load_demo()
    return TraceSource(demo_rec.snapshot(), f"the bundled recording ({demo_rec.description})",
                       _release(demo_rec.torch_version), demo_rec.device_total_bytes,
                       demo_rec.non_pytorch_bytes or 0)


def _release(version: Any) -> TorchVersion | None:
    """The recorded torch release; None (infer from the trace) if unknown or unmodelled."""
    if not isinstance(version, str):
        return None
    try:
        return simulated_release(version)
    except AllocConfError:
        return None


def what_if(source: TraceSource, *, extra_confs: list[str] | tuple[str, ...] = (),
            fraction: float | None = None, current_conf: str | None = None,
            trace: Any = None, progress: Callable[[int, int], None] | None = None,
            offer_release: TorchVersion | None = None) -> WhatIfReport:
    """Replay ``source`` under the candidate grid (plus ``extra_confs``) and rank the results.

    ``current_conf`` is the configuration the caller runs now (the What if? tab passes
    this kernel's effective settings): it becomes the "current" row every other row is
    compared with, and the recording's own settings get a row of their own (the model
    self-check still replays those). Without it, the recording's settings are "current".
    ``trace`` is ``source``'s already-decoded trace, if the caller has it (see
    :class:`TraceCache`); ``progress(done, total)`` follows the replays. ``offer_release`` is
    the torch the rows would be applied to (the kernel's): settings it does not take are not
    offered.

    Raises:
        SnapshotError: the snapshot has no usable trace.
        AllocConfError: an extra configuration is not valid for the trace's torch.
    """
    from allocconf_widget.core.memory.snapshot import allocator_settings
    from allocconf_widget.core.sim.recommend import recommend
    from allocconf_widget.core.sim.simulator import SimSettings, extract_trace

    if trace is None:
        trace = extract_trace(source.snapshot)
    notes: list[str] = []
    non_pytorch = _non_pytorch(source, trace, notes)
    version = source.torch_version
    if version is None:
        choice = trace_torch_version(source.snapshot, trace, device_total=source.device_total,
                                     non_pytorch_bytes=non_pytorch, fraction=fraction)
        version = choice.version
        if choice.note:
            notes.append(choice.note)
    settings = allocator_settings(source.snapshot)
    recorded = SimSettings.from_allocator_settings(settings, version) if settings else None
    if current_conf is None:
        result = recommend(trace, torch_version=version, current_settings=recorded,
                           current_conf=(settings or {}).get("PYTORCH_CUDA_ALLOC_CONF"),
                           extra_confs=list(extra_confs), fraction=fraction,
                           device_total=source.device_total,
                           non_pytorch_bytes=non_pytorch, progress=progress,
                           offer_release=offer_release)
        return WhatIfReport(source.label, trace.num_events, result, tuple(notes))
    result = against_kernel(trace, version, current_conf,
                            recorded or SimSettings(torch_version=version), notes,
                            extra_confs=list(extra_confs), fraction=fraction,
                            device_total=source.device_total, non_pytorch_bytes=non_pytorch,
                            progress=progress, offer_release=offer_release)
    return WhatIfReport(source.label, trace.num_events, result, tuple(notes))


def against_kernel(trace: Any, version: TorchVersion, current_conf: str, recorded: Any,
                   notes: list[str], **options: Any) -> Any:
    """Rank the candidates against this kernel's settings (``current_conf``); the recording's
    own settings (``recorded``) get a row and the self-check. What the kernel's string holds
    that the replay cannot model is said in ``notes``. ``options`` go to ``recommend``."""
    from allocconf_widget.core.sim.recommend import recommend

    current, note = kernel_settings(current_conf, version)
    if note:
        notes.append(note)
    return recommend(trace, torch_version=version, current_settings=current,
                     current_conf=current_conf, recorded_settings=recorded, **options)


def kernel_settings(conf_text: str, version: TorchVersion) -> tuple[Any, str | None]:
    """This kernel's settings as the replay models them under the trace's torch, and a note.

    The kernel's torch may accept options the trace's release does not (and the replay
    models only the native allocator's memory options), so the string is read
    tolerantly: what the model knows is replayed, the rest is said in the note.
    """
    from allocconf_widget.core.sim.settings import SimSettings

    shown = conf_text or "torch's defaults"
    try:
        return SimSettings.from_string(conf_text, version), None
    except AllocConfError as exc:
        lenient = SimSettings.from_allocator_settings({"PYTORCH_CUDA_ALLOC_CONF": conf_text}, version)
        return lenient, (f"this kernel runs {shown}; the replay (torch {version} rules) "
                         f"models only its memory options ({exc.reason})")


@dataclass
class TraceCache:
    """The last trace source and its decoded trace, so a second Compare does not decode again.

    Keyed by the object that produced it (a recording, or the bundled file), so a new
    ``%%allocconf record`` is never answered from the old trace.
    """

    key: Any = None
    source: TraceSource | None = None
    trace: Any = None

    def get(self, session: Any) -> tuple[TraceSource, Any]:
        """The session's trace source and its decoded trace (decoded once per source)."""
        from allocconf_widget.core.sim.simulator import extract_trace

        key = _source_key(session)
        if self.source is None or key != self.key:
            source = trace_source(session)
            trace = extract_trace(source.snapshot)
            self.key, self.source, self.trace = key, source, trace
        assert self.source is not None
        return self.source, self.trace


def _source_key(session: Any) -> Any:
    rec = session.extras.get(RECORDING_KEY)
    if rec is not None and rec.snapshot is not None:
        return ("recording", id(rec))
    dry = session.extras.get("dryrun")
    return ("dryrun", id(dry)) if dry is not None else ("demo",)


# ---------------------------------------------------------------- one simulation, every front end

@dataclass(frozen=True)
class SimulationRequest:
    """What to replay besides the recorded settings: extra settings, or the ranked grid."""

    confs: tuple[str, ...] = ()
    rank: bool = False  # replay and rank the candidate grid (plus ``confs``)
    fraction: float | None = None  # torch.cuda.set_per_process_memory_fraction in force
    continue_after_oom: bool = False
    workers: int | None = None
    #: the settings the caller's kernel runs (the magic passes the session's): the ranked rows
    #: compare with them and the recording's own settings get a "[recorded]" row; None (the
    #: CLI, which has no kernel): the recording's settings are current
    current_conf: str | None = None


@dataclass(frozen=True)
class SimulationRow:
    """One replayed configuration, as every front end shows it."""

    label: str  # what the row is called ("recorded: …", the option string, "(torch defaults)")
    conf: str  # the option string replayed ("" = torch defaults)
    result: SimResult
    reason: str | None = None  # ranked rows: why it ranks where it does
    is_current: bool = False  # the settings the trace was recorded with
    rank: int | None = None

    def to_json(self) -> dict[str, Any]:
        doc = self.result.to_json()
        doc.pop("series", None)
        doc["conf"] = self.conf
        doc["recorded_settings"] = self.is_current
        if self.rank is not None:
            doc["rank"] = self.rank
            doc["reason"] = self.reason
            doc["is_current"] = self.is_current
        return doc


@dataclass(frozen=True)
class SimulationReport:
    """Everything a front end prints about one simulation: header facts, rows, notes."""

    source_label: str
    trace_summary: str
    num_events: int
    torch_version: TorchVersion
    device_total: int | None
    fidelity: Fidelity | None
    rows: tuple[SimulationRow, ...]
    ranked: bool
    start_state: str | None = None  # where the replay starts, when not from an empty allocator
    version_note: str | None = None  # how the torch release was chosen, when it was inferred
    notes: tuple[str, ...] = ()

    def to_json(self) -> list[dict[str, Any]]:
        docs = []
        for row in self.rows:
            doc = row.to_json()
            if self.ranked:
                doc["fidelity"] = self.fidelity.to_json() if self.fidelity is not None else None
            docs.append(doc)
        return docs


def simulate(source: TraceSource, request: SimulationRequest = SimulationRequest()) -> SimulationReport:
    """Replay ``source`` under its recorded settings and the requested others.

    Raises:
        SnapshotError: the snapshot has no usable trace.
        AllocConfError: a requested configuration or fraction is not valid for this trace.
    """
    from allocconf_widget.core.memory.snapshot import allocator_settings
    from allocconf_widget.core.sim.settings import SimSettings
    from allocconf_widget.core.sim.simulator import simulate_many
    from allocconf_widget.core.sim.trace import extract_trace
    from allocconf_widget.core.units import format_bytes

    trace = extract_trace(source.snapshot, source.device)
    notes: list[str] = list(source.notes)
    device_total, non_pytorch = source.device_total, _non_pytorch(source, trace, notes)
    fraction = request.fraction
    if fraction is not None and not 0.0 <= fraction <= 1.0:
        raise AllocConfError(f"a memory fraction must be between 0 and 1, not {fraction}",
                             fix="pass e.g. 0.5 for half of the device")
    if device_total is None and fraction is None:
        usable = trace.inferred_usable_bytes()
        if usable is not None:
            device_total, non_pytorch = usable, 0
            notes.append(f"device capacity: {format_bytes(usable)} usable, inferred from the OOM "
                         "recorded in the trace")
    if fraction is not None and device_total is None:
        raise AllocConfError("a memory fraction is a share of the device's memory, which is not known "
                             "for this trace", fix="give the device's total memory (--device-total)")
    if device_total is None:
        notes.append("device capacity unknown: the device is treated as unlimited, so no OOM can "
                     "be predicted (give --device-total)")
    version, version_note = source.torch_version, None
    if version is None:
        choice = trace_torch_version(source.snapshot, trace, device_total=device_total,
                                     non_pytorch_bytes=non_pytorch, fraction=fraction)
        version, version_note = choice.version, choice.note
    readback = allocator_settings(source.snapshot)
    if not readback:
        notes.append("the snapshot has no allocator_settings (torch < 2.3): assuming the trace ran "
                     "with torch's defaults")
    recorded = SimSettings.from_allocator_settings(readback or None, version)
    if fraction is not None:
        recorded = dataclasses.replace(recorded, per_process_memory_fraction=fraction)
    start_state = None
    if trace.initial_state is not None:
        state = trace.initial_state
        start_state = (f"the replay starts from {state.provenance()} ({state.describe()}); "
                       "other settings are replayed as if switched now, keeping these segments")
    elif trace.initial_note:
        notes.append(trace.initial_note)
    if trace.partial:
        notes.append(f"the trace is partial: {trace.unknown_frees:,} frees of memory allocated before "
                     "it began (ring buffer full); predictions cover only the recorded window")
    head = SimulationReport(source.label, trace.describe(), trace.num_events, version, device_total,
                            fidelity=None, rows=(), ranked=False, start_state=start_state,
                            version_note=version_note)
    if request.rank:
        from allocconf_widget.core.sim.recommend import recommend

        extra = _checked_confs(request.confs, version, notes)
        if request.current_conf is None:
            described = recorded.describe()
            rec = recommend(trace, torch_version=version, current_settings=recorded,
                            current_conf="" if described == "(defaults)" else described,
                            device_total=device_total,
                            non_pytorch_bytes=non_pytorch, fraction=fraction,
                            extra_confs=extra, workers=request.workers)
        else:  # the kernel's settings are "current"; the recording's keep a row of their own
            rec = against_kernel(trace, version, request.current_conf, recorded, notes,
                                 device_total=device_total, non_pytorch_bytes=non_pytorch,
                                 fraction=fraction, extra_confs=extra, workers=request.workers)
        rows = tuple(SimulationRow(_row_label(c), c.conf, c.result, c.reason, c.is_current, rank)
                     for rank, c in enumerate(rec.candidates, 1))
        notes.extend(n for n in rec.notes if not n.startswith("the replays start from")
                     and n != trace.initial_note and not n.startswith("the trace is partial"))
        return dataclasses.replace(head, fidelity=rec.fidelity, rows=rows, ranked=True,
                                   notes=tuple(notes))
    confs = _checked_confs(request.confs, version, notes)
    others = []
    for conf in confs:
        s = SimSettings.from_string(conf, version)
        others.append(dataclasses.replace(s, per_process_memory_fraction=fraction)
                      if fraction is not None else s)
    configs = [recorded, *others]
    results = simulate_many(trace, configs, device_total=device_total, non_pytorch_bytes=non_pytorch,
                            stop_at_oom=not request.continue_after_oom, workers=request.workers,
                            check=[True] + [False] * len(others))
    fidelity = results[0].fidelity
    if confs:
        rows = tuple(SimulationRow(conf or "(torch defaults)", conf, r.with_fidelity(fidelity))
                     for conf, r in zip(confs, results[1:], strict=True))
    else:
        rows = (SimulationRow(f"recorded: {recorded.describe()}", recorded.label or "",
                              results[0].with_fidelity(fidelity), is_current=True),)
    return dataclasses.replace(head, fidelity=fidelity, rows=rows, notes=tuple(notes))


def _row_label(candidate: Any) -> str:
    label = candidate.conf or "(torch defaults)"
    if candidate.is_current:
        return label + " [current]"
    return label + " [recorded]" if candidate.kind == "recorded" else label


def _checked_confs(confs: tuple[str, ...], version: TorchVersion, notes: list[str]) -> list[str]:
    """Validate each requested configuration for ``version``; its warnings become notes."""
    from allocconf_widget.core.config.conf import parse_conf

    out = []
    for conf in confs:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", AllocConfWarning)
            try:
                parse_conf(conf, torch_version=version)
            except AllocConfError as exc:
                raise AllocConfError(f"{conf!r}: {exc}") from None
        notes.extend(f"{conf!r}: {w.message}" for w in caught)
        out.append(conf)
    return out


#: Options a replay says nothing about (host memory, locking, graph capture): a What-if row's
#: Apply keeps them as they are rather than unsetting them behind the user's back.
_NOT_REPLAYED = ("release_lock_on_cudamalloc", "graph_capture_record_stream_reuse")


@dataclass(frozen=True)
class RowApply:
    """What applying one What-if row would do to this kernel's configuration."""

    conf: str  # the row's string ("" = torch's defaults)
    target: Any  # the complete AllocConf Apply will make
    changes: tuple[Any, ...]  # core.config.conf.Change, in canonical order
    kept: tuple[str, ...]  # options the replay does not model, carried over unchanged

    @property
    def sets(self) -> tuple[str, ...]:
        return tuple(f"{c.option}:{_shown(c.after)}" for c in self.changes if c.after is not None)

    @property
    def unsets(self) -> tuple[str, ...]:
        return tuple(f"{c.option}:{_shown(c.before)}" for c in self.changes if c.after is None)

    def describe(self) -> str:
        """One sentence for the confirm step: what will be set and what will be unset."""
        if not self.changes:
            return "this kernel already runs these settings: nothing to change"
        return "Apply will " + self._sentence("set", "unset", "keeps")

    def done(self) -> str:
        """The same sentence once applied: what was set and what was unset."""
        if not self.changes:
            return "This kernel already ran these settings: nothing changed"
        text = self._sentence("set", "unset", "kept")
        return text[:1].upper() + text[1:]

    def _sentence(self, set_verb: str, unset_verb: str, keep_verb: str) -> str:
        parts = []
        if self.sets:
            parts.append(f"{set_verb} " + ", ".join(self.sets))
        if self.unsets:
            parts.append(f"{unset_verb} " + ", ".join(self.unsets))
        text = " and ".join(parts)
        if self.kept:
            text += f"; {keep_verb} {', '.join(self.kept)} (the replay does not model them)"
        return text


def _shown(value: Any) -> str:
    from allocconf_widget.core.config.conf import format_value

    return format_value(value)


def plan_row_apply(session: Any, conf: str) -> RowApply:
    """The complete configuration a What-if row's Apply makes from what this kernel applied.

    The row's options replace the memory options; options the replay does not model
    (pinned host memory, the cudaMalloc lock, graph-capture reuse) are kept.

    Raises:
        AllocConfError: the row's string is not valid for the installed torch.
    """
    return row_apply_from(session.view().applied, conf)


def row_apply_from(base: Any, conf: str) -> RowApply:
    """:func:`plan_row_apply` from a given applied configuration (one read for many rows)."""
    from allocconf_widget.core.config import options as opt
    from allocconf_widget.core.config.conf import parse_conf

    row = parse_conf(conf, base.torch_version, warn=False)
    kept = {name: value for name, value in base.items()
            if (name.startswith("pinned_") or name in _NOT_REPLAYED) and name not in row
            and opt.spec_for(name) is not None}
    target = row.merge(kept) if kept else row
    return RowApply(conf, target, base.diff(target), tuple(kept))
