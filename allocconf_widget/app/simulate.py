"""The one replay use case: what each setting would do to a recorded or dry-run step.

``allocconf simulate``, ``%allocconf simulate``, the What if? tab, the Settings tab's draft
prediction, ``%%allocconf dryrun`` and ``run.predict()``, the planner and the OOM card's verdict
all come here: :func:`simulate` turns a :class:`~allocconf_widget.app.sources.TraceSource` and
a :class:`SimulationRequest` into one :class:`SimulationReport`. Every row is replayed under one
capacity decision (:func:`~allocconf_widget.core.sim.capacity.decide_capacity`: the device, the
memory fraction, the memory outside PyTorch), and what it does to the step is its
:class:`~allocconf_widget.core.sim.outcome.Outcome`, which every view words the same way
(``views/text/forecast.py``). There is one way to rank: the request says which kernel's
settings the rows compare with (and so which torch must take them).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from allocconf_widget._errors import AllocConfError
from allocconf_widget.core.sim.notes import Note, NoteKind, unique
from allocconf_widget.core.sim.outcome import Outcome, outcome_of
from allocconf_widget.core.versions import TorchVersion

if TYPE_CHECKING:
    from allocconf_widget.app.sources import TraceSource
    from allocconf_widget.core.config.conf import AllocConf
    from allocconf_widget.core.sim.capacity import Capacity, Limit
    from allocconf_widget.core.sim.recommend import Comparison
    from allocconf_widget.core.sim.result import Fidelity, SimResult
    from allocconf_widget.core.sim.settings import SimSettings
    from allocconf_widget.core.sim.trace.model import Trace

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class SimulationRequest:
    """What to replay besides the recorded settings: more settings, or the ranked grid.

    The one request of every front end. Settings typed by a user (``--conf``) come as text and
    are validated once, for the trace's torch release; settings the session already holds (a
    staged draft, the applied settings) come parsed, as :class:`AllocConf`.
    """

    confs: tuple[str, ...] = ()  # option strings a user typed, validated for the trace's release
    configs: tuple[AllocConf, ...] = ()  # parsed settings to replay, in this order after ``confs``
    rank: bool = False  # replay and rank the candidate grid (plus the settings above)
    fraction: float | None = None  # torch.cuda.set_per_process_memory_fraction in force
    continue_after_oom: bool = False
    workers: int | None = None
    #: the settings this kernel runs, read from the Session (their ``torch_version`` is the
    #: kernel's torch): ranked rows compare with them, the recording's own settings get a
    #: "[recorded]" row, and only settings that torch takes are offered. None (the CLI, which
    #: has no kernel): the recording's settings are current.
    kernel: AllocConf | None = None
    #: without a kernel, the torch a user would apply a row to (the CLI: the installed one)
    offer_release: TorchVersion | None = None
    #: the kernel's staged, unapplied draft: ranked as a row of its own, marked "[staged draft]"
    draft: AllocConf | None = None
    progress: Progress | None = field(default=None, compare=False)

    @property
    def release_offered(self) -> TorchVersion | None:
        return self.kernel.torch_version if self.kernel is not None else self.offer_release


@dataclass(frozen=True)
class SimulationRow:
    """One replayed configuration, as every front end shows it."""

    label: str  # what the row is called ("recorded: …", the option string, "(torch defaults)")
    conf: str  # the option string replayed ("" = torch defaults)
    result: SimResult
    is_current: bool = False  # the settings "now" (the kernel's, else the recording's)
    rank: int | None = None
    kind: str = "extra"  # current, recorded, defaults, expandable, max_split, roundup, gc, combo, extra
    is_draft: bool = False  # the kernel's staged, unapplied draft (SimulationRequest.draft)
    limit: Limit | None = None  # the memory this row could reserve; None: the device is unknown

    @property
    def outcome(self) -> Outcome:
        """What this setting does to the step (the one verdict every view words)."""
        return outcome_of(self.result)

    @property
    def settings(self) -> SimSettings:
        return self.result.settings

    @property
    def shown_conf(self) -> str:
        return self.conf or "(torch defaults)"

    @property
    def is_recorded(self) -> bool:
        """The recording's own settings (the row that must reproduce what was recorded)."""
        return self.kind == "recorded"


@dataclass(frozen=True)
class SimulationReport:
    """Everything a front end shows about one simulation: header facts, rows, notes."""

    source_label: str
    trace_summary: str
    num_events: int
    torch_version: TorchVersion
    capacity: Capacity
    fidelity: Fidelity | None
    rows: tuple[SimulationRow, ...]
    ranked: bool
    start_state: str | None = None  # where the replay starts, when not from an empty allocator
    version_note: str | None = None  # how the torch release was chosen, when it was inferred
    notes: tuple[Note, ...] = ()
    compared_with: str | None = None  # the kernel's settings the ranked rows compare with
    #: whether the recorded CPU ever got ahead of its GPU at a free waiting on another stream
    #: (``core.sim.timing.host_ran_ahead``); None: no such frees
    host_ran_ahead: bool | None = None
    #: what ranked rows' reasons compare with (the current settings' and the defaults' replays)
    comparison: Comparison | None = None
    estimate: bool = False  # the trace is a dry run's estimate, not a recording

    @property
    def device_total(self) -> int | None:
        return self.capacity.device_total

    @property
    def usable_bytes(self) -> int | None:
        """The device memory the replay let the step use (total less the memory outside
        PyTorch, as given or estimated); None: the device's capacity is unknown."""
        return self.capacity.usable_bytes

    @property
    def limit_bytes(self) -> int | None:
        """The memory fraction's cap on reserved memory, where it is tighter than usable."""
        return self.capacity.limit_bytes

    @property
    def limit_range(self) -> tuple[int, int] | None:
        """Where that cap was read off the trace's OOMs: the range they allow."""
        return self.capacity.limit_range

    @property
    def current(self) -> SimulationRow | None:
        return next((row for row in self.rows if row.is_current), None)

    @property
    def recorded(self) -> SimulationRow | None:
        """The row replaying the recording's own settings (the current one when they agree)."""
        return next((row for row in self.rows if row.is_recorded), None) or self.current

    def all_notes(self) -> tuple[str, ...]:
        """Every note as a sentence, the release's first."""
        return tuple(n for n in (self.version_note, *(note.text for note in self.notes)) if n)


def simulate(source: TraceSource, request: SimulationRequest = SimulationRequest(),
             trace: Trace | None = None) -> SimulationReport:
    """Replay ``source`` under its recorded settings and the requested others.

    ``trace`` is ``source``'s already-decoded trace when the caller has one
    (:class:`~allocconf_widget.app.trace_cache.TraceCache`). With ``request.rank`` this is the
    one ranking of every front end.

    Raises:
        SnapshotError: the snapshot has no usable trace.
        AllocConfError: a requested configuration or fraction is not valid for this trace.
    """
    from allocconf_widget.core.sim.capacity import decide_capacity
    from allocconf_widget.core.sim.trace_notes import start_state_line, trace_notes

    trace = source.trace() if trace is None else trace
    capacity = decide_capacity(trace, source.known_capacity(request.fraction))
    if capacity.recorded_limit is not None:  # every row tells malloc's OOM path by it
        trace = trace.with_recorded_limit(capacity.recorded_limit)
    recorded = _RecordedSettings.of(source, trace, capacity)
    head = SimulationReport(
        source.label, trace.describe(), trace.num_events, recorded.version, capacity, fidelity=None,
        rows=(), ranked=False, start_state=start_state_line(trace), version_note=recorded.version_note,
        notes=(*source.notes, *capacity.notes, *trace_notes(trace, has_settings=recorded.has_readback)),
        host_ran_ahead=_host_ran_ahead(trace), estimate=source.estimate)
    report = (_ranked(head, trace, request, recorded) if request.rank
              else _listed(head, trace, request, recorded))
    return _with_gc_start_note(report, trace)


def _host_ran_ahead(trace: Trace) -> bool | None:
    from allocconf_widget.core.sim.timing import host_ran_ahead

    return host_ran_ahead(trace)


@dataclass(frozen=True)
class _RecordedSettings:
    """The recording's settings three ways: as the run was made (the self-check's), under the
    rows' limit (its own row) and as a user would apply them (its label)."""

    version: TorchVersion
    version_note: str | None
    as_recorded: SimSettings
    recorded: SimSettings
    conf: str
    has_readback: bool

    @classmethod
    def of(cls, source: TraceSource, trace: Trace, capacity: Capacity) -> _RecordedSettings:
        from allocconf_widget.app.sources import trace_torch_version
        from allocconf_widget.core.memory.snapshot import allocator_settings
        from allocconf_widget.core.sim.settings import SimSettings, readback_fraction

        version, note = source.torch_version, None
        if version is None:
            choice = trace_torch_version(source.snapshot, trace, device_total=capacity.device_total,
                                         non_pytorch_bytes=capacity.non_pytorch_bytes,
                                         fraction=capacity.recording_fraction)
            version, note = choice.version, choice.note
        readback = allocator_settings(source.snapshot)
        as_recorded = dataclasses.replace(SimSettings.from_allocator_settings(readback or None, version),
                                          per_process_memory_fraction=capacity.recording_fraction)
        recorded = dataclasses.replace(as_recorded, per_process_memory_fraction=capacity.fraction)
        # as a user would apply them: the fraction only where the settings string set it
        conf = dataclasses.replace(recorded, per_process_memory_fraction=readback_fraction(readback))
        return cls(version, note, as_recorded, recorded, conf.describe(), bool(readback))


def _listed(head: SimulationReport, trace: Trace, request: SimulationRequest,
            recorded: _RecordedSettings) -> SimulationReport:
    """The recorded settings (and the self-check) and the requested settings, in order."""
    from allocconf_widget.core.sim.simulator import simulate_many

    notes = list(head.notes)
    fraction = head.capacity.fraction
    labelled = _requested(request, recorded.version, notes, fraction)
    others = [_with_fraction(settings, fraction) for _, settings in labelled]
    same = recorded.as_recorded == recorded.recorded
    # the self-check is the recorded row's replay, or one of its own where the rows apply a
    # fraction the recording did not run under (it then gives the fidelity alone, no range)
    configs = [recorded.recorded, *others] if same else [recorded.as_recorded, *others, recorded.recorded]
    results = simulate_many(trace, configs, device_total=head.capacity.device_total,
                            non_pytorch_bytes=head.capacity.non_pytorch_bytes,
                            stop_at_oom=not request.continue_after_oom, workers=request.workers,
                            check=[True] + [False] * (len(configs) - 1), progress=request.progress,
                            timing=[same] + [True] * (len(configs) - 1))
    fidelity = results[0].fidelity
    if not same:
        results = [results[-1], *results[1:-1]]
    if labelled:
        rows = tuple(_row(head, label or "(torch defaults)", label, r.with_fidelity(fidelity))
                     for (label, _), r in zip(labelled, results[1:], strict=True))
    else:
        shown = recorded.recorded.label if recorded.recorded.label is not None else recorded.conf
        rows = (_row(head, f"recorded: {recorded.conf}", "" if shown == "(defaults)" else shown,
                     results[0].with_fidelity(fidelity), is_current=True, kind="recorded"),)
    return dataclasses.replace(head, fidelity=fidelity, rows=rows, notes=unique(notes))


def _row(head: SimulationReport, label: str, conf: str, result: SimResult, **kw: object) -> SimulationRow:
    limit = head.capacity.limit_for(result.settings.per_process_memory_fraction)
    return SimulationRow(label, conf, result, limit=limit, **kw)  # type: ignore[arg-type]


def _with_fraction(settings: SimSettings, fraction: float | None) -> SimSettings:
    """A row's settings under the replay's fraction, unless they set their own (a what-if)."""
    if fraction is None or settings.per_process_memory_fraction is not None:
        return settings
    return dataclasses.replace(settings, per_process_memory_fraction=fraction)


def _ranked(head: SimulationReport, trace: Trace, request: SimulationRequest,
            recorded: _RecordedSettings) -> SimulationReport:
    """The candidate grid replayed and ranked against the kernel's settings (or the recording's)."""
    from allocconf_widget.core.sim.recommend import recommend

    notes = list(head.notes)
    version, fraction, capacity = recorded.version, head.capacity.fraction, head.capacity
    extra = [label for label, _ in _requested(request, version, notes, fraction)]
    draft = _draft_settings(request.draft, version, notes)
    if draft is not None and draft[0] not in extra:
        extra.append(draft[0])
    compared_with, current = None, recorded.recorded
    if request.kernel is not None:  # the kernel's settings are "current"; the recording's keep a row
        compared_with = request.kernel.to_string()
        current = _kernel_settings(request.kernel, version, notes)
        notes.extend(Note(NoteKind.SETTINGS, str(trap)) for trap in request.kernel.warnings
                     if not (fraction is not None and trap.code == "gc-without-fraction"))
    rec = recommend(trace, torch_version=version, current_settings=current,
                    current_conf=compared_with if compared_with is not None
                    else ("" if recorded.conf == "(defaults)" else recorded.conf),
                    recorded_settings=recorded.recorded if request.kernel is not None else None,
                    self_check_settings=recorded.as_recorded, device_total=capacity.device_total,
                    non_pytorch_bytes=capacity.non_pytorch_bytes, fraction=fraction, extra_confs=extra,
                    workers=request.workers, progress=request.progress,
                    offer_release=request.release_offered)
    marked = _draft_row(rec.candidates, draft, fraction, notes)
    rows = tuple(_row(head, _row_label(c.conf, c.is_current, c.kind)
                      + (" [staged draft]" if c is marked else ""), c.conf, c.result,
                      is_current=c.is_current, rank=rank, kind=c.kind, is_draft=c is marked)
                 for rank, c in enumerate(rec.candidates, 1))
    notes.extend(rec.notes)
    return dataclasses.replace(head, fidelity=rec.fidelity, rows=rows, ranked=True,
                               notes=unique(notes), compared_with=compared_with,
                               comparison=rec.comparison)


def _with_gc_start_note(report: SimulationReport, trace: Trace) -> SimulationReport:
    from allocconf_widget.core.sim.trace_notes import gc_start_note

    note = gc_start_note(trace, [row.settings for row in report.rows])
    return report if note is None else dataclasses.replace(report, notes=(*report.notes, note))


def settings_for(conf: AllocConf, version: TorchVersion) -> SimSettings:
    """``conf`` as the replay models it under ``version``'s rules: converted as parsed where it
    was parsed for that release, each option checked for it otherwise (no string re-parsed).

    Raises:
        AllocConfError: ``version`` does not take ``conf`` (or the replay cannot model it).
    """
    from allocconf_widget.core.sim.settings import SimSettings

    if conf.torch_version.key != version.key:  # e.g. parsed for a kernel's 1.13, replayed as 2.11
        conf = conf.for_release(version)
    settings = SimSettings.from_conf(conf, label=conf.to_string())
    return dataclasses.replace(settings, torch_version=version)


def _kernel_settings(kernel: AllocConf, version: TorchVersion, notes: list[Note]) -> SimSettings:
    """This kernel's settings as the replay models them under the trace's torch.

    The kernel's torch may accept options the trace's release does not (and the replay
    models only the native allocator's memory options), so they are read tolerantly: what the
    model knows is replayed, the rest is said in a note.
    """
    from allocconf_widget.core.sim.settings import SimSettings

    try:
        return settings_for(kernel, version)
    except AllocConfError as exc:
        text = kernel.to_string()
        shown = text or "torch's defaults"
        notes.append(Note(NoteKind.SETTINGS, f"this kernel runs {shown}; the replay (torch {version} "
                          f"rules) models only its memory options ({exc.reason})"))
        return SimSettings.from_allocator_settings({"PYTORCH_CUDA_ALLOC_CONF": text}, version)


def _row_label(conf: str, is_current: bool, kind: str) -> str:
    label = conf or "(torch defaults)"
    if is_current:
        return label + " [current]"
    return label + " [recorded]" if kind == "recorded" else label


def _draft_settings(draft: AllocConf | None, version: TorchVersion,
                    notes: list[Note]) -> tuple[str, SimSettings] | None:
    """The staged draft, where the replay can take it; else None and a note saying why (a
    draft never stops the ranking: it may hold options this trace's torch rejects)."""
    if draft is None:
        return None
    try:
        return draft.to_string(), settings_for(draft, version)
    except AllocConfError as exc:
        shown = draft.to_string() or "(torch defaults)"
        notes.append(Note(NoteKind.SETTINGS, f"your staged draft {shown} is not ranked: {exc.reason}"))
        return None


def _draft_row(candidates: tuple[Candidate, ...], draft: tuple[str, SimSettings] | None,
               fraction: float | None, notes: list[Note]) -> Candidate | None:
    """The ranked candidate that is the staged draft: by what it replays, not its string (a
    draft of ``expandable_segments:False`` is the defaults' row), or None and a note when the
    draft replays the same as the current settings, whose row it shares."""
    if draft is None:
        return None
    text, settings = draft
    wanted = dataclasses.replace(settings, per_process_memory_fraction=fraction)
    same = [c for c in candidates if c.settings == wanted]
    chosen = next((c for c in same if c.conf == text), None) or next(
        (c for c in same if not c.is_current), None)
    if chosen is None and same:
        notes.append(Note(NoteKind.SETTINGS, f"your staged draft {text or '(torch defaults)'} replays as "
                          "the settings this kernel runs: its row is the current one"))
    return chosen


def _requested(request: SimulationRequest, version: TorchVersion, notes: list[Note],
               fraction: float | None) -> list[tuple[str, SimSettings]]:
    """The requested settings, each once in any spelling: typed text validated for ``version``
    (its traps become notes, not the "GC does nothing without a memory fraction" one when the
    replay has a fraction), then the parsed ones."""
    from allocconf_widget.core.config.conf import parse_conf
    from allocconf_widget.core.sim.settings import SimSettings

    out: list[tuple[str, SimSettings]] = []
    seen: set[str] = set()
    for text in request.confs:
        try:
            parsed = parse_conf(text, torch_version=version, warn=False)
        except AllocConfError as exc:
            raise AllocConfError(f"{text!r}: {exc}") from None
        if parsed.to_string() in seen:
            continue
        seen.add(parsed.to_string())
        notes.extend(Note(NoteKind.SETTINGS, f"{text!r}: {w.message}") for w in parsed.warnings
                     if not (fraction is not None and w.code == "gc-without-fraction"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out.append((text, SimSettings.from_conf(parsed, label=text)))
    for conf in request.configs:
        text = conf.to_string()
        if text not in seen:
            seen.add(text)
            out.append((text, settings_for(conf, version)))
    return out


if TYPE_CHECKING:
    from allocconf_widget.core.sim.recommend import Candidate
