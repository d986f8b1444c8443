"""Where a trace comes from, and what is known about the run that made it.

A :class:`TraceSource` is a snapshot with the facts a replay needs beside it: the torch
release, the device's memory, the memory outside PyTorch, the memory fraction in force. It
comes from a file (with its sidecar, :func:`file_source`), the session's step (its last
``%%allocconf record`` or dry run, whichever is newer: :func:`trace_source`), or the bundled
recording. What a user tells a replay that the file cannot is a :class:`SourceOptions`, read
once for the CLI and the magic alike. The replay itself is :mod:`.simulate`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from allocconf_widget._errors import AllocConfError, SnapshotError, one_line, printable
from allocconf_widget.core.sim.notes import Note, NoteKind
from allocconf_widget.core.versions import TorchVersion, installed_torch_version, simulated_release

if TYPE_CHECKING:
    from allocconf_widget.adapters.recorder import CellRecording
    from allocconf_widget.core.sim.capacity import KnownCapacity
    from allocconf_widget.core.sim.trace.model import Trace


@dataclass(frozen=True)
class TraceSource:
    """A trace to replay and what is known about the run that produced it."""

    snapshot: Mapping[str, Any]  # torch's snapshot dict (``core.memory.snapshot.Snapshot``)
    label: str
    torch_version: TorchVersion | None  # None: infer from the trace
    device_total: int | None = None
    non_pytorch_bytes: int | None = 0  # None: estimate it from the trace (core/sim/capacity.py)
    device: int | None = None  # CUDA device whose trace to use (None: the one with a trace)
    notes: tuple[Note, ...] = ()  # where facts came from (a recording's sidecar), for the report
    #: the memory fraction in force when the run was recorded; a request's own fraction wins
    fraction: float | None = None
    #: whether ``fraction`` is known, None included (a sidecar, the session's own recording):
    #: where it is not, a limit the trace's OOMs show is read off them (``capacity.held_limit``)
    limit_known: bool = False
    #: ``snapshot``'s trace for ``device`` where it is decoded already (a dry run's, which its
    #: predictions share; a file's, decoded beside the load's checks): not decoded again
    decoded: Trace | None = field(default=None, compare=False, repr=False)
    #: a dry run's trace: an estimate of the step, not a recording of it
    estimate: bool = False

    def known_capacity(self, fraction: float | None = None) -> KnownCapacity:
        """What this source knows of the memory its run had, with ``fraction`` asked for."""
        from allocconf_widget.core.memory.snapshot import allocator_settings
        from allocconf_widget.core.sim.capacity import KnownCapacity
        from allocconf_widget.core.sim.settings import readback_fraction

        return KnownCapacity(self.device_total, self.non_pytorch_bytes, fraction_given=fraction,
                             source_fraction=self.fraction, limit_known=self.limit_known,
                             settings_fraction=readback_fraction(allocator_settings(self.snapshot)))

    def trace(self) -> Trace:
        """The decoded trace of ``device`` (decoded now, unless the load did it already)."""
        if self.decoded is not None and self.device in (None, self.decoded.device):
            return self.decoded
        from allocconf_widget.core.memory.snapshot import trace_cut
        from allocconf_widget.core.sim.trace.extract import extract_trace

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
    device or more. The share applied to the new size would be a limit the run never had."""
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
    from allocconf_widget.core.sim.trace.extract import extract_trace, read_pickled_trace
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
                         f"{', '.join(used)}; the option in brackets overrides it")
    label = one_line(path, 300)  # a name with a newline or an escape must not shape a report
    from allocconf_widget.core.dryrun.facts import GAPS, LABEL, SNAPSHOT_MARK

    mark = snapshot.get(SNAPSHOT_MARK)
    if isinstance(mark, dict):  # written by app/dryrun: an estimate, named as the session names it
        gpu = mark.get("gpu_name")
        on = f" of a step on {one_line(gpu, 60)}" if isinstance(gpu, str) and gpu else ""
        label = f"{label} (a {LABEL}{on})"
    typed = tuple(Note(NoteKind.SOURCE, n) for n in notes)
    if isinstance(mark, dict):
        typed += tuple(Note(NoteKind.ESTIMATE, gap) for gap in GAPS)
    return TraceSource(snapshot, label, torch_version, device_total, non_pytorch_bytes, device,
                       typed, fraction=fraction, limit_known=known is not None and known.limit_known,
                       decoded=decoded, estimate=isinstance(mark, dict))


def _decoded_or_none(snapshot: Mapping[str, Any], device: int | None) -> Trace | None:
    """The trace of ``device`` decoded here (the load could not do it beside its checks), or
    None where it cannot be: the replay then meets the error, worded as always."""
    from allocconf_widget.core.sim.trace.extract import extract_trace

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
    from allocconf_widget.core.sim.trace.extract import guess_torch_version

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


class DryRunSource(Protocol):
    """A dry run's estimate (``app/dryrun.DryRunResult``), as a trace to replay."""

    @property
    def label(self) -> str: ...

    def source(self) -> TraceSource: ...


class RecordingHolder(Protocol):
    """What a trace source needs of the Session: its last recording and dry run, and which of
    them is the step every view predicts from (``recording_key``: the newer, unless pinned)."""

    @property
    def recording(self) -> CellRecording | None: ...

    @property
    def dry_run(self) -> DryRunSource | None: ...

    def recording_key(self) -> tuple[str, int]: ...


RECORDING_LABEL = "the last %%allocconf record"


BUNDLED_LABEL = "the bundled H200 recording"


def source_label(session: RecordingHolder) -> str:
    """What :func:`trace_source` replays now, said without loading it (every view names the
    step it predicts from with these words)."""
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
    kind = "demo" if demo else session.recording_key()[0]
    rec = session.recording
    if kind == "recording" and rec is not None and rec.snapshot is not None:
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
    if kind == "dryrun" and dry is not None:
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
