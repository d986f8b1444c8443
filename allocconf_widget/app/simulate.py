"""The what-if use case: which trace to replay, under which torch's rules, and the result.

``allocconf simulate``, ``%allocconf simulate``, the panel's What if? tab and the OOM card's
verdict all go through here: :func:`simulate` turns a :class:`TraceSource` and a
:class:`SimulationRequest` into one :class:`SimulationReport`. There is one way to rank: the
request says which kernel's settings the rows compare with (and so which torch must take
them), and every front end draws the same rows (``views/text/simulate.py`` prints them, the tab
charts them, the verdict splits them into "avoids the OOM" and "does not"). The trace's torch
release is decided once, by :func:`trace_torch_version`, so one file replays under the same
rules everywhere.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from allocconf_widget._errors import AllocConfError, SnapshotError, one_line, printable
from allocconf_widget.core.units import MIB
from allocconf_widget.core.versions import TorchVersion, installed_torch_version, simulated_release

if TYPE_CHECKING:
    from allocconf_widget.adapters.recorder import CellRecording
    from allocconf_widget.core.config.conf import AllocConf
    from allocconf_widget.core.sim.result import Fidelity, SimResult
    from allocconf_widget.core.sim.settings import SimSettings
    from allocconf_widget.core.sim.trace import Trace

T = TypeVar("T")


@dataclass(frozen=True)
class TraceSource:
    """A trace to replay and what is known about the run that produced it."""

    snapshot: Mapping[str, Any]  # torch's snapshot dict (``core.memory.snapshot.Snapshot``)
    label: str
    torch_version: TorchVersion | None  # None: infer from the trace
    device_total: int | None = None
    non_pytorch_bytes: int | None = 0  # None: estimate it from the trace (core/sim/capacity.py)
    device: int | None = None  # CUDA device whose trace to use (None: the one with a trace)
    notes: tuple[str, ...] = ()  # where facts came from (a recording's sidecar), for the report
    #: the memory fraction in force when the run was recorded; a request's own fraction wins
    fraction: float | None = None
    #: whether ``fraction`` is known, None included (a sidecar, the session's own recording):
    #: where it is not, a limit the trace's OOMs show is read off them (``capacity.held_limit``)
    limit_known: bool = False
    #: ``snapshot``'s trace for ``device`` where it is decoded already (a dry run's, which its
    #: predictions share; a file's, decoded beside the load's checks): not decoded again
    decoded: Trace | None = field(default=None, compare=False, repr=False)

    def trace(self) -> Trace:
        """The decoded trace of ``device`` (decoded now, unless the load did it already)."""
        if self.decoded is not None and self.device in (None, self.decoded.device):
            return self.decoded
        from allocconf_widget.core.memory.snapshot import trace_cut
        from allocconf_widget.core.sim.trace import extract_trace

        if trace_cut(self.snapshot, self.device):  # file_source kept its own device's decode only
            held = "another device" if self.decoded is None else f"device {self.decoded.device}"
            raise SnapshotError(f"{self.label} was decoded for {held} when it was loaded; load it "
                                f"again for device {self.device}")

        return extract_trace(self.snapshot, self.device)


@dataclass(frozen=True)
class SourceOptions:
    """What a user may tell a replay that the file cannot: the torch release that recorded it,
    the device's memory, the memory outside PyTorch and the device whose trace to use. Each
    given one overrides a sidecar's; the CLI and ``%allocconf simulate`` read their flags
    through :meth:`parse`, so both accept and refuse the same things."""

    torch_version: TorchVersion | None = None
    device_total: int | None = None
    non_pytorch_bytes: int | None = None
    device: int | None = None

    @classmethod
    def parse(cls, *, torch_version: str | None = None, device_total: str | None = None,
              non_pytorch: str | None = None, device: int | None = None) -> SourceOptions:
        """The options as typed (``--torch-version 2.11 --device-total 79.2GiB``).

        Raises:
            AllocConfError: one is not what it should be; the message names the flag.
        """
        from allocconf_widget.core.memory.recording import MIN_DEVICE_BYTES
        from allocconf_widget.core.units import parse_size

        version = None
        if torch_version:
            try:
                if not torch_version.isprintable():  # read as its prefix, "2.4\x1b[2J" was 2.4
                    raise AllocConfError(f"{printable(torch_version, 40)} is not a release such as 2.11")
                version = simulated_release(torch_version)
            except AllocConfError as exc:
                raise AllocConfError(f"--torch-version: {exc}") from None
        sizes: list[int | None] = []
        for flag, text in (("--device-total", device_total), ("--non-pytorch", non_pytorch)):
            try:
                sizes.append(parse_size(text) if text is not None else None)  # '' too
            except ValueError as exc:
                raise AllocConfError(f"{flag}: {exc}") from None
        total, other = sizes
        if total is not None and total < MIN_DEVICE_BYTES:  # every replay "OOM at event 0"
            raise AllocConfError(f"--device-total {printable(device_total or '', 40)!r} is less than "
                                 "1 MiB", fix="give the GPU's memory, e.g. 15GiB or 79.2GiB")
        if device is not None and device < 0:
            raise AllocConfError(f"--device {device} is not a CUDA device",
                                 fix="give 0 for the first device")
        return cls(version, total, other, device)

    def file(self, path: str) -> TraceSource:
        """:func:`file_source` of ``path`` with these options."""
        return file_source(path, torch_version=self.torch_version, device_total=self.device_total,
                           non_pytorch_bytes=self.non_pytorch_bytes, device=self.device)

    def over(self, source: TraceSource) -> TraceSource:
        """``source`` (a session's recording, the bundled one) with what these options say
        instead of what it knew."""
        changed: dict[str, Any] = {}
        if self.torch_version is not None:
            changed["torch_version"] = self.torch_version
        if self.device_total is not None:
            changed["device_total"] = self.device_total
            if source.fraction is not None and source.device_total is not None:
                changed["fraction"] = _same_limit(source.fraction, source.device_total,
                                                  self.device_total)
        if self.non_pytorch_bytes is not None:
            changed["non_pytorch_bytes"] = self.non_pytorch_bytes
        if self.device is not None:
            changed["device"] = self.device
        return dataclasses.replace(source, **changed) if changed else source


def _same_limit(fraction: float, recorded_total: int, total: int | None) -> float | None:
    """The fraction of ``total`` whose limit is the one ``fraction`` of ``recorded_total`` set
    (the recording's limit, told in another device size); None where that limit is the whole
    device or more. Applying the share to the new size once replayed an H200 run under a limit
    it never had (44/89 instead of 89/89)."""
    if total is None or total == recorded_total:
        return fraction
    from allocconf_widget.core.sim.capacity import fraction_for

    limit = int(fraction * recorded_total)
    return None if limit >= total else fraction_for(limit, total)


def file_source(path: str, *, torch_version: TorchVersion | None = None,
                device_total: int | None = None, non_pytorch_bytes: int | None = None,
                device: int | None = None) -> TraceSource:
    """A snapshot file, with what its recording's sidecar knows (``<name>.json`` beside it:
    the device's memory, the memory fraction in force and the torch it ran) where the caller
    does not say it. The CLI and
    ``%allocconf simulate FILE`` both come here, so both replay a file the same way.

    Raises:
        SnapshotError: the file cannot be read safely or is not a snapshot.
    """
    from allocconf_widget.core.memory.recording import read_sidecar
    from allocconf_widget.core.memory.snapshot import load_snapshot_deriving
    from allocconf_widget.core.sim.trace import extract_trace, read_pickled_trace
    from allocconf_widget.core.units import format_bytes

    # decoded in a child beside the checks (every caller replays it next); None: decoded later
    loaded = load_snapshot_deriving(path, lambda snap: extract_trace(snap, device), read_pickled_trace)
    snapshot = loaded.snapshot
    notes: list[str] = []
    # every fact the sidecar holds counts unless its own option is given: giving the device's
    # size must not throw away the fraction the run had or the memory outside PyTorch
    sidecar = read_sidecar(path)
    decoded = loaded.derived
    if sidecar.facts is not None:  # facts the trace proves wrong are left out, each named
        from allocconf_widget.core.sim.sidecar_check import check_sidecar

        decoded = decoded if decoded is not None else _decoded_or_none(snapshot, device)
        sidecar = check_sidecar(sidecar, decoded, snapshot)
    known = sidecar.facts
    notes.extend(sidecar.notes)
    fraction = None
    if known is not None:
        used = []
        if known.device_total_bytes is None:
            pass  # ignored above, with a note
        elif device_total is None:
            device_total = known.device_total_bytes
            used.append(f"device capacity {format_bytes(device_total)} (--device-total)")
        elif device_total != known.device_total_bytes:
            notes.append(f"the recording's sidecar {one_line(known.path.name, 120)} says the device had "
                         f"{format_bytes(known.device_total_bytes or 0)}; replayed with "
                         f"--device-total {format_bytes(device_total)}")
        if non_pytorch_bytes is None and known.non_pytorch_bytes is not None:
            non_pytorch_bytes = known.non_pytorch_bytes
            used.append(f"memory outside PyTorch {format_bytes(non_pytorch_bytes)} (--non-pytorch)")
        if known.fraction is not None and known.device_total_bytes is not None:
            # the run's own limit, in bytes: the self-check keeps it, --fraction or not, and on
            # another device size it is the same number of bytes, not the same share
            fraction = _same_limit(known.fraction, known.device_total_bytes, device_total)
            if device_total == known.device_total_bytes:
                used.append(f"the run's memory fraction {known.fraction:g} (--fraction for the rows)")
            else:
                limit = format_bytes(int(known.fraction * known.device_total_bytes))
                used.append(f"the run's memory limit {limit}, a fraction {known.fraction:g} of "
                            f"{format_bytes(known.device_total_bytes)} (--fraction for the rows)")
        if torch_version is None and known.torch_version:
            torch_version = recorded_release(known.torch_version)
            if torch_version is not None:
                used.append(f"torch {one_line(known.torch_version, 40)} (--torch-version)")
        if used:
            notes.append(f"from the recording's sidecar {one_line(known.path.name, 120)}: "
                         f"{', '.join(used)}; "
                         "the option in brackets overrides it")
    label = one_line(path, 300)  # a name with a newline or an escape must not shape a report
    from allocconf_widget.core.dryrun_facts import GAPS, LABEL, SNAPSHOT_MARK

    mark = snapshot.get(SNAPSHOT_MARK)
    if isinstance(mark, dict):  # written by app/dryrun: an estimate, named as the session names it
        gpu = mark.get("gpu_name")
        on = f" of a step on {one_line(gpu, 60)}" if isinstance(gpu, str) and gpu else ""
        label = f"{label} (a {LABEL}{on})"
        notes.extend(GAPS)
    return TraceSource(snapshot, label, torch_version, device_total, non_pytorch_bytes, device,
                       tuple(notes), fraction=fraction,
                       limit_known=known is not None and known.limit_known, decoded=decoded)


def _decoded_or_none(snapshot: Mapping[str, Any], device: int | None) -> Trace | None:
    """The trace of ``device`` decoded here (the load could not do it beside its checks), or
    None where it cannot be: the replay then meets the error, worded as always."""
    from allocconf_widget.core.sim.trace import extract_trace

    try:
        return extract_trace(snapshot, device)
    except SnapshotError:
        return None


@dataclass(frozen=True)
class VersionChoice:
    """The torch release whose rules the replay follows, and why (for a note)."""

    version: TorchVersion
    note: str | None = None


def trace_torch_version(snapshot: Mapping[str, Any], trace: Trace, *, device_total: int | None,
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


def _non_pytorch(source: TraceSource, trace: Trace, notes: list[str]) -> int:
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


class DryRunSource(Protocol):
    """A dry run's estimate (``app/dryrun.DryRunResult``), as a trace to replay."""

    @property
    def label(self) -> str: ...

    def source(self) -> TraceSource: ...


class RecordingHolder(Protocol):
    """What a trace source needs of the Session: its last recording or dry run, and their key."""

    @property
    def recording(self) -> CellRecording | None: ...

    @property
    def dry_run(self) -> DryRunSource | None: ...

    def recording_key(self) -> tuple[str, int]: ...


RECORDING_LABEL = "the last %%allocconf record"
BUNDLED_LABEL = "the bundled H200 recording"


def source_label(session: RecordingHolder) -> str:
    """What :func:`trace_source` replays now, said without loading it: the What if? tab heads
    its Compare button with it (it said "the bundled recording" while a dry run was replayed)."""
    kind = session.recording_key()[0]
    dry = session.dry_run
    if kind == "recording":
        return RECORDING_LABEL
    if kind == "dryrun" and dry is not None:
        return dry.label
    return f"{BUNDLED_LABEL} (no %%allocconf record or dry run in this session yet)"


def trace_source(session: RecordingHolder, path: str | None = None, demo: bool = False,
                 options: SourceOptions | None = None) -> TraceSource:
    """A file, the session's last ``%%allocconf record``, or the bundled recording, with what
    ``options`` say about it.

    Raises:
        AllocConfError: both a file and ``demo``.
    """
    options = options or SourceOptions()
    if path and demo:
        raise AllocConfError("give a trace file or --demo, not both",
                             fix="drop --demo to replay the file, or the file to replay the bundled one")
    if path:
        return options.file(path)
    return options.over(_held_source(session, demo))


def _held_source(session: RecordingHolder, demo: bool) -> TraceSource:
    rec = session.recording
    if rec is not None and rec.snapshot is not None and not demo:
        # Memory in use when recording started, less what the allocator already held (the
        # replay starts from those segments), is memory outside PyTorch's allocator.
        from allocconf_widget.core.sim.state import INITIAL_SEGMENTS_KEY

        held = sum(int(seg.get("total_size", 0)) for seg in rec.snapshot.get(INITIAL_SEGMENTS_KEY) or ()
                   if isinstance(seg, dict) and seg.get("device", 0) == 0)
        return TraceSource(rec.snapshot, RECORDING_LABEL,
                           recorded_release(rec.torch_version), rec.device_total,
                           max((rec.device_total or 0) - (rec.free_at_start or 0) - held, 0),
                           fraction=rec.fraction, limit_known=True)
    dry = session.dry_run  # an estimate, labelled so
    if dry is not None and not demo:
        return dry.source()
    from allocconf_widget.core.memory.recording import load_demo

    demo_rec = load_demo()
    return TraceSource(demo_rec.snapshot(), f"{BUNDLED_LABEL} ({demo_rec.description})",
                       recorded_release(demo_rec.torch_version), demo_rec.device_total_bytes,
                       demo_rec.non_pytorch_bytes or 0, limit_known=True)


def recorded_release(version: object) -> TorchVersion | None:
    """The recorded torch release; None (infer from the trace) if unknown or unmodelled."""
    if not isinstance(version, str):
        return None
    try:
        return simulated_release(version)
    except AllocConfError:
        return None


class TraceCache:
    """The session's last trace source and its decoded trace, so a second Compare does not
    decode again.

    Keyed by the session's recording *token* (a counter the Session bumps for every new
    ``%%allocconf record``), never by ``id()``: a new recording can sit at a freed one's
    address, and an ``id()`` key then answered with the old cell's trace.
    """

    #: answers kept per trace (the Settings tab asks again for every slider position it revisits)
    MEMO_LIMIT = 64

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._key: tuple[str, int] | None = None
        self._source: TraceSource | None = None
        self._trace: Trace | None = None
        self._memo: dict[Hashable, object] = {}

    def get(self, session: RecordingHolder) -> tuple[TraceSource, Trace]:
        """The session's trace source and its decoded trace (decoded once per source)."""
        with self._lock:
            key = session.recording_key()
            if self._source is None or self._trace is None or key != self._key:
                source = trace_source(session)
                trace = source.trace()
                self._key, self._source, self._trace = key, source, trace
                self._memo.clear()  # answers about the old trace are not answers about this one
            return self._source, self._trace

    def memo(self, session: RecordingHolder, question: Hashable,
             answer: Callable[[TraceSource, Trace], T]) -> T:
        """``answer(source, trace)`` for the session's current trace, computed once per
        ``question`` while that trace stays (the oldest answers go past :attr:`MEMO_LIMIT`)."""
        with self._lock:
            source, trace = self.get(session)
            if question in self._memo:
                return cast(T, self._memo[question])
            value = answer(source, trace)
            if len(self._memo) >= self.MEMO_LIMIT:
                self._memo.pop(next(iter(self._memo)))
            self._memo[question] = value
            return value


# ---------------------------------------------------------------- one simulation, every front end

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class SimulationRequest:
    """What to replay besides the recorded settings: extra settings, or the ranked grid.

    The one request of every front end: ``allocconf simulate``, ``%allocconf simulate``, the
    What if? tab and the OOM card's verdict all rank through :func:`simulate` with one of these.
    """

    confs: tuple[str, ...] = ()
    rank: bool = False  # replay and rank the candidate grid (plus ``confs``)
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
    #: the kernel's staged, unapplied draft (``ConfigView.draft``): ranked as a row of its own,
    #: marked "[staged draft]", so "what would my draft do?" is answered where the grid is
    draft: str | None = None
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
    reason: str | None = None  # ranked rows: why it ranks where it does
    is_current: bool = False  # the settings "now" (the kernel's, else the recording's)
    rank: int | None = None
    kind: str = "extra"  # current, recorded, defaults, expandable, max_split, roundup, gc, combo, extra
    is_draft: bool = False  # the kernel's staged, unapplied draft (SimulationRequest.draft)

    @property
    def shown_conf(self) -> str:
        return self.conf or "(torch defaults)"

    @property
    def is_recorded(self) -> bool:
        """The recording's own settings (the row that must reproduce what was recorded)."""
        return self.kind == "recorded"

    def to_json(self) -> dict[str, Any]:
        doc = self.result.to_json()
        doc.pop("series", None)
        doc["conf"] = self.conf
        doc["recorded_settings"] = self.is_current
        if self.rank is not None:
            doc["rank"] = self.rank
            doc["reason"] = self.reason
            doc["is_current"] = self.is_current
            if self.is_draft:
                doc["is_staged_draft"] = True
        return doc


@dataclass(frozen=True)
class SimulationReport:
    """Everything a front end shows about one simulation: header facts, rows, notes."""

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
    compared_with: str | None = None  # the kernel's settings the ranked rows compare with
    #: the device memory the replay let the step use (total less the memory outside PyTorch,
    #: as given or estimated); None: the device's capacity is unknown
    usable_bytes: int | None = None
    #: the memory fraction's cap on reserved memory, where it is tighter than ``usable_bytes``
    limit_bytes: int | None = None
    #: where that cap was read off the trace's OOMs (no fraction known): the range they allow
    limit_range: tuple[int, int] | None = None
    #: whether the recorded CPU ever got ahead of its GPU at a free waiting on another stream
    #: (``core.sim.timing.host_ran_ahead``); False: the ranges hold only for a run paced like
    #: the recording (:data:`HOST_KEPT_PACE_NOTE`); None: no such frees
    host_ran_ahead: bool | None = None

    @property
    def current(self) -> SimulationRow | None:
        return next((row for row in self.rows if row.is_current), None)

    @property
    def recorded(self) -> SimulationRow | None:
        """The row replaying the recording's own settings (the current one when they agree)."""
        return next((row for row in self.rows if row.is_recorded), None) or self.current

    def headline(self) -> list[str]:
        """The lines the What if? tab heads its rows with."""
        lines = [f"What if? Replaying {self.source_label} ({self.num_events:,} events) under "
                 f"{len(self.rows)} settings."]
        if self.fidelity is not None:
            lines.append(f"Model check on the recorded settings: {self.fidelity.summary()}")
        return lines

    def all_notes(self) -> tuple[str, ...]:
        return tuple(n for n in (self.version_note, *self.notes) if n)

    def to_json(self) -> list[dict[str, Any]]:
        docs = []
        for row in self.rows:
            doc = row.to_json()
            if self.ranked:
                doc["fidelity"] = self.fidelity.to_json() if self.fidelity is not None else None
            doc["limit_bytes"] = self.limit_bytes  # the cap every row replayed under, or null
            doc["limit_read_off_ooms_bytes"] = None if self.limit_range is None else list(self.limit_range)
            doc["recorded_cpu_ran_ahead"] = self.host_ran_ahead
            docs.append(doc)
        return docs


#: said where every free that waited on another stream completed before the next allocation
#: (``core.sim.timing.host_ran_ahead``): the range cannot reach above the recorded order
HOST_KEPT_PACE_NOTE = (
    "every free that waited on another stream (record_stream) completed before the next "
    "allocation: the recorded run's CPU never got ahead of its GPU (a slow host, a debugger, "
    "code that waits on the GPU), so the peaks (and any range shown) hold only for a run paced "
    "like it. A run whose CPU does get ahead can peak higher: one weight-streaming program peaked "
    "3.1 times higher that way. Record a run at full speed to see how far its peak can move")


def recorded_window_note(num_events: int) -> str:
    """Said wherever a replay covers a run only up to the request that failed and ended it:
    a setting that serves that request gets past the crash, into what nobody recorded."""
    return (f"peaks cover the recorded window ({num_events:,} events, up to the request that "
            "failed); what the run needs after it was never seen")


def _undecided_releases_note(count: int, *, device_known: bool) -> str:
    """What a replay does with release bursts only the run's unknown limit could decide."""
    bursts = "release burst" if count == 1 else "release bursts"
    verb, pronoun = ("was", "it is") if count == 1 else ("were", "they are")
    full = ("the run was at a memory fraction this snapshot does not record" if device_known
            else "the device was full there")
    give = ("give --fraction if the run had one" if device_known
            else "give --device-total, and --fraction if the run had one")
    return (f"{count:,} {bursts} right before a new segment {verb} either malloc's out-of-memory path "
            f"({full}) or a call of empty_cache(); {pronoun} replayed as empty_cache() under every "
            "setting, which frees the cache there, so a setting that would not have reached that "
            f"limit can be predicted low ({give})")


def simulate(source: TraceSource, request: SimulationRequest = SimulationRequest(),
             trace: Trace | None = None) -> SimulationReport:
    """Replay ``source`` under its recorded settings and the requested others.

    ``trace`` is ``source``'s already-decoded trace when the caller has one
    (:class:`TraceCache`). With ``request.rank`` this is the one ranking of every front end.

    Raises:
        SnapshotError: the snapshot has no usable trace.
        AllocConfError: a requested configuration or fraction is not valid for this trace.
    """
    from allocconf_widget.core.memory.snapshot import allocator_settings
    from allocconf_widget.core.sim.settings import SimSettings
    from allocconf_widget.core.sim.simulator import simulate_many
    from allocconf_widget.core.sim.timing import host_ran_ahead
    from allocconf_widget.core.units import format_bytes

    if trace is None:
        trace = source.trace()
    notes: list[str] = list(source.notes)
    device_total, non_pytorch = source.device_total, _non_pytorch(source, trace, notes)
    fraction = request.fraction if request.fraction is not None else source.fraction
    if fraction is not None and not 0.0 <= fraction <= 1.0:
        raise AllocConfError(f"a memory fraction must be between 0 and 1, not {fraction}",
                             fix="pass e.g. 0.5 for half of the device")
    if fraction is not None and (fraction == 0.0 or (source.device_total is not None
                                                     and fraction * source.device_total < MIB)):
        raise AllocConfError(f"a memory fraction of {fraction:g} leaves less than 1 MiB of the device: "
                             "every allocation would fail", fix="pass e.g. 0.5 for half of the device")
    from allocconf_widget.core.sim.capacity import replay_room
    from allocconf_widget.core.sim.settings import readback_fraction

    readback = allocator_settings(source.snapshot)
    read_fraction = readback_fraction(readback)  # a fraction torch's settings string set
    if fraction is None and device_total is not None:
        fraction = read_fraction
    # the limit is read off the OOMs only where nothing says what the run was held to
    room = replay_room(trace, device_total, non_pytorch, fraction, read_limit=not source.limit_known)
    device_total, non_pytorch, fraction = room.device_total, room.non_pytorch_bytes, room.fraction
    if room.note is not None:
        notes.append(room.note)
    if source.device_total is None and source.non_pytorch_bytes:
        given = format_bytes(source.non_pytorch_bytes)
        notes.append(f"the memory outside PyTorch ({given}) is not used: " + (
            "it is a share of the device's memory, which is not known" if device_total is None
            else f"the room PyTorch had ({format_bytes(device_total)}) is read off the trace's OOM, "
            "which leaves it out already") + " (give the device's total, --device-total)")
    if device_total is not None and non_pytorch >= device_total:
        raise AllocConfError(f"the memory outside PyTorch ({format_bytes(non_pytorch)}) leaves nothing "
                             f"of the device's {format_bytes(device_total)} for PyTorch",
                             fix="--non-pytorch is the memory outside the allocator (CUDA context, "
                             "libraries), e.g. 600MiB")
    if fraction is not None and device_total is None:
        raise AllocConfError("a memory fraction is a share of the device's memory, which is not known "
                             "for this trace", fix="give the device's total memory (--device-total)")
    if device_total is None:
        notes.append("device capacity unknown: the device is treated as unlimited, so no OOM can "
                     "be predicted (give --device-total)")
    # the fraction the recording ran under: the one its sidecar or session knows (none
    # included), else the one in force; a row's fraction that differs is a what-if
    known_fraction = (source.fraction if source.fraction is not None else read_fraction) \
        if source.limit_known else fraction
    recording_fraction = _recording_fraction(trace, known_fraction, device_total, notes)
    recorded_limit = (None if device_total is None
                      else _limit_of(recording_fraction, device_total, non_pytorch))
    if recorded_limit is not None:  # every row tells malloc's OOM path by the recording's limit
        trace = trace.with_recorded_limit(recorded_limit)
    if not (source.limit_known or request.fraction is not None or read_fraction is not None
            or room.held is not None):  # nothing says what limit the run had
        undecided = trace.releases_a_limit_decides(up_to=recorded_limit)
        if undecided:
            notes.append(_undecided_releases_note(undecided, device_known=device_total is not None))
    version, version_note = source.torch_version, None
    if version is None:
        choice = trace_torch_version(source.snapshot, trace, device_total=device_total,
                                     non_pytorch_bytes=non_pytorch, fraction=recording_fraction)
        version, version_note = choice.version, choice.note
    if not readback:
        notes.append("the snapshot has no allocator_settings (torch < 2.3): assuming the trace ran "
                     "with torch's defaults")
    as_recorded = SimSettings.from_allocator_settings(readback or None, version)
    # the self-check replays the run as it was made; every row applies the fraction in force
    as_recorded = dataclasses.replace(as_recorded, per_process_memory_fraction=recording_fraction)
    recorded = dataclasses.replace(as_recorded, per_process_memory_fraction=fraction)
    # the recording's settings as a user would apply them: the fraction only where its settings
    # string set it (a fraction given, a sidecar's or one read off the OOMs is no option of it)
    recorded_conf = dataclasses.replace(recorded, per_process_memory_fraction=read_fraction).describe()
    start_state = None
    if trace.initial_state is not None:
        state = trace.initial_state
        start_state = (f"the replay starts from {state.provenance()} ({state.describe()}); "
                       "other settings are replayed as if switched now, keeping these segments")
    elif trace.initial_note:
        notes.append(trace.initial_note)
    if trace.ends_at_its_oom():
        notes.append("the recording ends at the OOM that ended the program: "
                     + recorded_window_note(trace.num_events))
    if trace.partial:
        notes.append(f"the trace is partial: {trace.unknown_frees:,} frees of memory allocated before "
                     "it began (ring buffer full); predictions cover only the recorded window")
    if trace.empty_cache_calls:
        notes.append(f"{trace.empty_cache_calls:,} torch.cuda.empty_cache() call(s) inferred from the "
                     "segments the run released; every row releases its cache at the same points")
    ran_ahead = host_ran_ahead(trace)
    if ran_ahead is False:
        notes.append(HOST_KEPT_PACE_NOTE)
    usable = device_total - non_pytorch if device_total is not None else None
    limit = int(fraction * device_total) if fraction is not None and device_total is not None else None
    head = SimulationReport(source.label, trace.describe(), trace.num_events, version, device_total,
                            fidelity=None, rows=(), ranked=False, start_state=start_state,
                            version_note=version_note, usable_bytes=usable,
                            limit_bytes=limit if limit is not None and (usable is None or limit < usable)
                            else None,
                            limit_range=None if room.held is None else (room.held.low, room.held.high),
                            host_ran_ahead=ran_ahead)
    if request.rank:
        ranked = _ranked(head, trace, request, recorded, version, notes, device_total=device_total,
                         non_pytorch=non_pytorch, fraction=fraction, as_recorded=as_recorded,
                         recorded_conf=recorded_conf)
        return _with_gc_start_note(ranked, trace)
    confs = _checked_confs(request.confs, version, notes, fraction)
    others = []
    for conf in confs:
        s = SimSettings.from_string(conf, version)
        others.append(dataclasses.replace(s, per_process_memory_fraction=fraction)
                      if fraction is not None else s)
    # the self-check is the recorded row's replay, or one of its own where the rows apply a
    # fraction the recording did not run under (it then gives the fidelity alone)
    configs = [recorded, *others] if as_recorded == recorded else [as_recorded, *others, recorded]
    # a self-check of its own gives the fidelity alone: no row shows its range, so its two
    # timing replays would be spent for nothing
    results = simulate_many(trace, configs, device_total=device_total, non_pytorch_bytes=non_pytorch,
                            stop_at_oom=not request.continue_after_oom, workers=request.workers,
                            check=[True] + [False] * (len(configs) - 1), progress=request.progress,
                            timing=[as_recorded == recorded] + [True] * (len(configs) - 1))
    fidelity = results[0].fidelity
    if as_recorded != recorded:
        results = [results[-1], *results[1:-1]]
    if confs:
        rows = tuple(SimulationRow(conf or "(torch defaults)", conf, r.with_fidelity(fidelity))
                     for conf, r in zip(confs, results[1:], strict=True))
    else:
        shown = recorded.label if recorded.label is not None else recorded_conf
        rows = (SimulationRow(f"recorded: {recorded_conf}", "" if shown == "(defaults)" else shown,
                              results[0].with_fidelity(fidelity), is_current=True, kind="recorded"),)
    return _with_gc_start_note(
        dataclasses.replace(head, fidelity=fidelity, rows=rows, notes=tuple(notes)), trace)


def _with_gc_start_note(report: SimulationReport, trace: Trace) -> SimulationReport:
    """``report`` with a note where its garbage-collection rows rest on a guess: the replay
    starts with cached segments the collector may release, in an order set by how long each
    had been idle before the recording, which no snapshot carries."""
    idle = trace.idle_start_segments()
    collects = any(row.result.settings.gc_threshold > 0.0
                   and (row.result.settings.per_process_memory_fraction is not None or trace.limit_changes)
                   for row in report.rows)
    if idle < 2 or not collects:
        return report
    note = (f"the recording starts with {idle} cached segments that garbage_collection_threshold may "
            "release, oldest first; how long each had been idle before the recording is not in the "
            "snapshot, so the replay takes them as idle equally long: rows with garbage collection "
            "may be a few percent off (docs/simulator.md, \"Traces that start mid-run\")")
    return dataclasses.replace(report, notes=(*report.notes, note))


def _limit_of(fraction: float | None, device_total: int, non_pytorch: int) -> int:
    """The memory a run could reserve: its fraction's share of the device, within what is
    usable beside the memory outside PyTorch (as the replay's rules take it)."""
    usable = max(device_total - non_pytorch, 0)
    return usable if fraction is None else min(int(fraction * device_total), usable)


def _recording_fraction(trace: Trace, fraction: float | None, device_total: int | None,
                        notes: list[str]) -> float | None:
    """The memory fraction the recorded run was made under, as far as the trace can tell: the
    one in force, unless the run reserved more than that fraction allows. Then the limit is a
    what-if (``--fraction`` on a run made without one): the self-check must replay the run as it
    was, or it measures the limit's effect and calls the model unreliable (it said LOW
    CONFIDENCE, "the replay reserves less than the real run did", on an exact model). A trace
    whose program changed its fraction mid-run keeps the one in force."""
    if fraction is None or device_total is None or trace.limit_changes:
        return fraction
    from allocconf_widget.core.units import format_bytes

    allowed, peak = int(fraction * device_total), trace.recorded_reserved_peak()
    if peak <= allowed:
        return fraction
    notes.append(f"the recording reserved up to {format_bytes(peak)}, more than a memory fraction of "
                 f"{fraction:g} allows ({format_bytes(allowed)}): it ran without that limit, so the "
                 "self-check replays it as it was, and every row applies the limit")
    return None


def _ranked(head: SimulationReport, trace: Trace, request: SimulationRequest, recorded: SimSettings,
            version: TorchVersion, notes: list[str], *, device_total: int | None,
            non_pytorch: int, fraction: float | None, as_recorded: SimSettings,
            recorded_conf: str) -> SimulationReport:
    """The candidate grid replayed and ranked against the kernel's settings (or the recording's)."""
    from allocconf_widget.core.sim.recommend import recommend

    extra = _checked_confs(request.confs, version, notes, fraction)
    draft = _draft_conf(request.draft, version, notes, fraction)
    if draft is not None and draft not in extra:
        extra.append(draft)
    options: dict[str, Any] = {"device_total": device_total, "non_pytorch_bytes": non_pytorch,
                               "fraction": fraction, "extra_confs": extra, "workers": request.workers,
                               "progress": request.progress, "offer_release": request.release_offered}
    compared_with = None
    if request.kernel is None:
        rec = recommend(trace, torch_version=version, current_settings=recorded,
                        current_conf="" if recorded_conf == "(defaults)" else recorded_conf,
                        self_check_settings=as_recorded, **options)
    else:  # the kernel's settings are "current"; the recording's keep a row of their own
        compared_with = request.kernel.to_string()
        current, note = _kernel_settings(compared_with, version)
        if note:
            notes.append(note)
        notes.extend(str(trap) for trap in request.kernel.warnings  # said once, as our note
                     if not (fraction is not None and trap.code == "gc-without-fraction"))
        rec = recommend(trace, torch_version=version, current_settings=current,
                        current_conf=compared_with, recorded_settings=recorded,
                        self_check_settings=as_recorded, **options)
    marked = _draft_row(rec.candidates, draft, version, fraction, notes)
    rows = tuple(SimulationRow(_row_label(c.conf, c.is_current, c.kind)
                               + (" [staged draft]" if c is marked else ""),
                               c.conf, c.result, c.reason, c.is_current, rank, c.kind,
                               is_draft=c is marked)
                 for rank, c in enumerate(rec.candidates, 1))
    notes.extend(n for n in rec.notes if not n.startswith("the replays start from")
                 and n != trace.initial_note and not n.startswith("the trace is partial"))
    return dataclasses.replace(head, fidelity=rec.fidelity, rows=rows, ranked=True,
                               notes=tuple(notes), compared_with=compared_with)


def _kernel_settings(conf_text: str, version: TorchVersion) -> tuple[SimSettings, str | None]:
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


def _row_label(conf: str, is_current: bool, kind: str) -> str:
    label = conf or "(torch defaults)"
    if is_current:
        return label + " [current]"
    return label + " [recorded]" if kind == "recorded" else label


def _draft_row(candidates: Any, draft: str | None, version: TorchVersion, fraction: float | None,
               notes: list[str]) -> Any:
    """The ranked candidate that is the staged draft: by what it replays, not its string (a
    draft of ``expandable_segments:False`` is the defaults' row), or None and a note when the
    draft replays the same as the current settings, whose row it shares."""
    if draft is None:
        return None
    import warnings

    from allocconf_widget.core.sim.settings import SimSettings

    with warnings.catch_warnings():  # its traps were said once, as notes (_checked_confs)
        warnings.simplefilter("ignore")
        wanted = dataclasses.replace(SimSettings.from_string(draft, version),
                                     per_process_memory_fraction=fraction)
    same = [c for c in candidates if c.settings == wanted]
    chosen = next((c for c in same if c.conf == draft), None) or next(
        (c for c in same if not c.is_current), None)
    if chosen is None and same:
        notes.append(f"your staged draft {draft or '(torch defaults)'} replays as the settings this "
                     "kernel runs: its row is the current one")
    return chosen


def _draft_conf(draft: str | None, version: TorchVersion, notes: list[str],
                fraction: float | None) -> str | None:
    """The staged draft, where the replay can take it; else None and a note saying why (a
    draft never stops the ranking: it may hold options this trace's torch rejects)."""
    if draft is None:
        return None
    try:
        return _checked_confs((draft,), version, notes, fraction)[0]
    except AllocConfError as exc:
        notes.append(f"your staged draft {draft} is not ranked: {exc.reason}")
        return None


def _checked_confs(confs: tuple[str, ...], version: TorchVersion, notes: list[str],
                   fraction: float | None) -> list[str]:
    """Validate each requested configuration for ``version``; its traps become notes (not the
    "GC does nothing without a memory fraction" one when the replay has a fraction)."""
    from allocconf_widget.core.config.conf import parse_conf

    out: list[str] = []
    seen: set[str] = set()
    for conf in confs:
        try:
            parsed = parse_conf(conf, torch_version=version, warn=False)
        except AllocConfError as exc:
            raise AllocConfError(f"{conf!r}: {exc}") from None
        if parsed.to_string() in seen:  # asked twice, in any spelling: one row in every front end
            continue
        seen.add(parsed.to_string())
        notes.extend(f"{conf!r}: {w.message}" for w in parsed.warnings
                     if not (fraction is not None and w.code == "gc-without-fraction"))
        out.append(conf)
    return out
