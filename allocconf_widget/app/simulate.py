"""The what-if use case: which trace to replay, under which torch's rules, and the ranked result.

``%allocconf simulate``, the panel's What if? tab and ``allocconf simulate`` all decide
the trace's torch release with :func:`trace_torch_version`, so one file replays under
the same rules everywhere. The magic and the tab share :func:`what_if`; the tab renders
its :class:`WhatIfReport` directly, without calling the magic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from allocconf_widget.core.sim.recommend import Recommendation

RECORDING_KEY = "recording"


@dataclass(frozen=True)
class TraceSource:
    """A trace to replay and what is known about the run that produced it."""

    snapshot: Any
    label: str
    torch_version: tuple[int, int] | None  # None: infer from the trace
    device_total: int | None = None
    non_pytorch_bytes: int = 0


@dataclass(frozen=True)
class VersionChoice:
    """The torch release whose rules the replay follows, and why (for a note)."""

    version: tuple[int, int]
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


def installed_torch_release() -> tuple[int, int] | None:
    """The installed torch's (major, minor) from package metadata, without importing torch."""
    from importlib import metadata

    try:
        text = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None
    parts = re.findall(r"\d+", text)
    return (int(parts[0]), int(parts[1])) if len(parts) >= 2 else None


def trace_torch_version(snapshot: Any, trace: Any, *, device_total: int | None,
                        non_pytorch_bytes: int, fraction: float | None) -> VersionChoice:
    """The release whose rules best reproduce ``trace`` (snapshots do not record their torch)."""
    from allocconf_widget.core.sim.settings import NEWEST_SUPPORTED
    from allocconf_widget.core.sim.simulator import infer_torch_version
    from allocconf_widget.core.sim.trace import guess_torch_version

    floor, why = guess_torch_version(snapshot)
    installed = installed_torch_release()
    prefer = installed if installed is not None and installed <= NEWEST_SUPPORTED else None
    readback = snapshot.get("allocator_settings")
    version, fidelity = infer_torch_version(
        trace, readback if isinstance(readback, dict) else None, floor=floor, prefer=prefer,
        device_total=device_total, non_pytorch_bytes=non_pytorch_bytes, fraction=fraction)
    shown = f"{version[0]}.{version[1]}"
    if fidelity is None:
        return VersionChoice(version, f"snapshots do not record the torch version and this trace "
                             f"has no segment events to infer it from; assuming {shown} ({why})")
    return VersionChoice(version, f"snapshots do not record the torch version; using the rules "
                         f"of torch {shown}, which reproduce this trace best ({fidelity.summary()})")


def trace_source(session: Any, path: str | None = None, demo: bool = False) -> TraceSource:
    """A file, the session's last ``%%allocconf record``, or the bundled recording."""
    if path:
        from allocconf_widget.core.memory.snapshot import load_snapshot

        return TraceSource(load_snapshot(path), path, None)
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
    from allocconf_widget.core.memory.recording import load_demo

    demo_rec = load_demo()
    return TraceSource(demo_rec.snapshot(), f"the bundled recording ({demo_rec.description})",
                       _release(demo_rec.torch_version), demo_rec.device_total_bytes,
                       demo_rec.non_pytorch_bytes or 0)


def _release(version: Any) -> tuple[int, int] | None:
    """The recorded torch as (major, minor); None (infer from the trace) if unknown or unmodelled."""
    from allocconf_widget.core.sim.settings import parse_torch_version

    if version is None:
        return None
    try:
        return parse_torch_version(version)
    except ValueError:
        return None


def what_if(source: TraceSource, *, extra_confs: list[str] | tuple[str, ...] = (),
            fraction: float | None = None) -> WhatIfReport:
    """Replay ``source`` under the candidate grid (plus ``extra_confs``) and rank the results.

    Raises:
        SnapshotError: the snapshot has no usable trace.
        AllocConfError: an extra configuration is not valid for the trace's torch.
    """
    from allocconf_widget.core.memory.snapshot import allocator_settings
    from allocconf_widget.core.sim.recommend import recommend
    from allocconf_widget.core.sim.simulator import SimSettings, extract_trace

    trace = extract_trace(source.snapshot)
    notes: list[str] = []
    version = source.torch_version
    if version is None:
        choice = trace_torch_version(source.snapshot, trace, device_total=source.device_total,
                                     non_pytorch_bytes=source.non_pytorch_bytes, fraction=fraction)
        version = choice.version
        if choice.note:
            notes.append(choice.note)
    settings = allocator_settings(source.snapshot)
    current = SimSettings.from_allocator_settings(settings, version) if settings else None
    result = recommend(trace, torch_version=version, current_settings=current,
                       current_conf=(settings or {}).get("PYTORCH_CUDA_ALLOC_CONF"),
                       extra_confs=list(extra_confs), fraction=fraction,
                       device_total=source.device_total, non_pytorch_bytes=source.non_pytorch_bytes)
    return WhatIfReport(source.label, trace.num_events, result, tuple(notes))
