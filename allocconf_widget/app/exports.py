"""Exports of what the monitor saw: the timeline as CSV / JSON, a snapshot as a viewer pickle.

The timeline is bounded (older samples are decimated, see
:mod:`allocconf_widget.core.memory.timeline`), so an export row covers ``samples``
raw samples from ``x_start`` to ``x_end`` and holds their **maxima**: the peak
memory of every stretch survives, however long the run was. Snapshots are
written by :func:`allocconf_widget.core.memory.snapshot.save_snapshot`, in the plain
pickle (protocol 4) that pytorch.org/memory_viz and
``python -m torch.cuda._memory_viz`` open.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocconf_widget.core.memory.recording import Recording
from allocconf_widget.core.memory.snapshot import Snapshot, save_snapshot
from allocconf_widget.core.memory.timeline import Timeline

FORMAT = "allocconf-timeline/1"
EXPORT_DIR = "allocconf-exports"
"""Every export without an explicit path lands in this folder of the working directory
(the notebook's folder in Jupyter), not scattered next to the notebooks."""
_BYTE_COLUMNS = {"reserved", "allocated", "active", "requested", "non_pytorch"}


def default_name(kind: str, suffix: str, when: float | None = None) -> str:
    """``allocconf-<kind>-YYYYmmdd-HHMMSS<suffix>`` in local time (sorts by time)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if when is None else when))
    return f"allocconf-{kind}-{stamp}{suffix}"


def _column(name: str) -> str:
    return f"{name}_bytes" if name in _BYTE_COLUMNS else name


def _x_names(timeline: Timeline) -> tuple[str, str]:
    if "step" in timeline.x_label:
        return "step_start", "step_end"
    return "t_start_s", "t_end_s"


def _cell(value: float | None, name: str) -> str:
    if value is None:
        return ""
    return str(int(value)) if name in _BYTE_COLUMNS else f"{value:.6g}"


def timeline_csv(timeline: Timeline) -> str:
    """Every stored point of every device: ``device, x_start, x_end, samples, <series>...``."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    start, end = _x_names(timeline)
    writer.writerow(["device", start, end, "samples", *(_column(n) for n in timeline.series_names)])
    for device in timeline.devices:
        for x0, x1, count, maxima in timeline.rows(device):
            writer.writerow([
                "" if device is None else device, f"{x0:.6g}", f"{x1:.6g}", count,
                *(_cell(v, n) for v, n in zip(maxima, timeline.series_names, strict=True)),
            ])
    return out.getvalue()


def timeline_document(timeline: Timeline, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON export: rows per device (maxima), peaks, markers, steps and ``meta``."""
    devices = {}
    for device in timeline.devices:
        key = "none" if device is None else str(device)
        devices[key] = {
            "samples": timeline.samples(device),
            "peaks": timeline.peaks(device),
            "columns": ["x_start", "x_end", "samples", *timeline.series_names],
            "rows": [[x0, x1, n, *vals] for x0, x1, n, vals in timeline.rows(device)],
        }
    payload = timeline.render(timeline.devices[0], max_steps=10_000) if timeline.devices else None
    return {
        "format": FORMAT,
        "x_label": timeline.x_label,
        "series": list(timeline.series_names),
        "row_values": "maximum over the samples the row covers",
        "devices": devices,
        "markers": [m.to_dict() for m in timeline.markers()],
        "steps": [list(s) for s in payload.steps] if payload else [],
        "meta": dict(meta or {}),
    }


def timeline_json(timeline: Timeline, meta: Mapping[str, Any] | None = None) -> str:
    return json.dumps(timeline_document(timeline, meta), indent=1)


class ExportError(OSError):
    """An export that was refused (a planted link, a folder of another user), with the reason."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "export refused"


def export_dir() -> Path:
    """``./allocconf-exports`` (created on first use), refused unless it is this user's real folder.

    In a shared working directory someone else could plant ``allocconf-exports`` as a link
    to a folder of theirs (or of ours they want overwritten); exports are never written
    through it.
    """
    folder = Path.cwd() / EXPORT_DIR
    with contextlib.suppress(FileExistsError):
        folder.mkdir(parents=True)
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode):
        raise ExportError(f"{folder} is a symbolic link (to {str(folder.readlink())!r}); exports are "
                          "never written through a link someone may have planted there. Remove "
                          "it (or move it away) and export again")
    if not stat.S_ISDIR(info.st_mode):
        raise ExportError(f"{folder} exists and is not a folder; remove it and export again")
    getuid = getattr(os, "geteuid", None)
    if getuid is not None and info.st_uid != getuid():
        raise ExportError(f"{folder} belongs to another user (id {info.st_uid}); exports are not "
                          "written into it. Remove it, or export from a folder of your own")
    return folder


def _reserve(folder: Path, kind: str, suffix: str) -> Path:
    """A fresh name in ``folder``, created empty with ``O_EXCL`` so no other export takes it.

    Names have one-second resolution; a second export of the same kind within that second
    gets ``-2``, ``-3``… instead of overwriting the first.
    """
    from allocconf_widget.core.untrusted import check_write_target

    stem = default_name(kind, "")
    # the folder's checks before the name is created: an export "into" /dev left an empty
    # reserved file there, then the writer refused the folder and said nothing was written
    check_write_target(folder / f"{stem}{suffix}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for n in range(1, 10_000):
        target = folder / f"{stem}{'' if n == 1 else f'-{n}'}{suffix}"
        try:
            os.close(os.open(target, flags, 0o644))
        except FileExistsError:
            continue
        return target
    raise ExportError(f"{folder} already holds 10,000 exports named {stem}*{suffix}")


def _target(path: str | os.PathLike[str] | None, kind: str, suffix: str) -> Path:
    if path is None:
        return _reserve(export_dir(), kind, suffix)
    target = Path(path)
    if target.is_dir():
        return _reserve(target, kind, suffix)
    return target


def write_text_atomically(target: Path, text: str) -> None:
    """:func:`~allocconf_widget.core.untrusted.replace_file_atomically` for text (UTF-8)."""
    from allocconf_widget.core.untrusted import replace_file_atomically

    replace_file_atomically(target, text.encode("utf-8"))


def write_timeline_csv(timeline: Timeline, path: str | os.PathLike[str] | None = None) -> Path:
    """Write :func:`timeline_csv` (default: ``./allocconf-exports/allocconf-timeline-<time>.csv``)."""
    target = _target(path, "timeline", ".csv")
    write_text_atomically(target, timeline_csv(timeline))
    return target


def write_timeline_json(
    timeline: Timeline, path: str | os.PathLike[str] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """Write :func:`timeline_json` (default: ``./allocconf-exports/allocconf-timeline-<time>.json``)."""
    target = _target(path, "timeline", ".json")
    write_text_atomically(target, timeline_json(timeline, meta))
    return target


def write_snapshot(snapshot: Snapshot, path: str | os.PathLike[str] | None = None,
                   kind: str = "snapshot") -> Path:
    """Save a snapshot for PyTorch's viewers; returns the path.

    Default: ``./allocconf-exports/allocconf-<kind>-<time>.pickle``. The layout is the one
    the installed torch's own ``_memory_viz`` reads (see
    :func:`~allocconf_widget.core.memory.snapshot.save_snapshot`).
    """
    target = _target(path, kind, ".pickle")
    save_snapshot(snapshot, target, for_torch=viewer_torch())
    return target


def viewer_torch() -> tuple[int, int] | None:
    """(major, minor) of the installed torch, whose own viewer will open saved snapshots."""
    from allocconf_widget.core.versions import installed_torch_version

    version = installed_torch_version()
    return None if version is None else version.key


@dataclass(frozen=True)
class SavedSnapshot:
    """A snapshot written for PyTorch's viewer and ``allocconf simulate``, and its sidecar (the
    replay facts the file cannot say; None when the device's size is unknown)."""

    path: Path
    sidecar: Path | None

    def sidecar_note(self) -> str:
        """The line that names the sidecar, or says why there is none."""
        if self.sidecar is None:
            return ("no replay facts beside it (the device's memory is unknown): give "
                    "`allocconf simulate` --device-total and --torch-version")
        return f"its replay facts (torch, device, memory fraction): {self.sidecar.name}"


def write_live_snapshot(path: str | os.PathLike[str] | None = None, kind: str = "snapshot",
                        device: int | None = None) -> SavedSnapshot:
    """Save ``torch.cuda.memory._snapshot()`` of this process, once, on demand, with its replay
    sidecar for ``device`` (default: the current one): the torch release, the device's memory,
    the memory outside PyTorch now and the memory fraction in force.

    With stack recording on, torch can take seconds to build it (docs/internals/allocator_facts.md §8),
    which is why nothing calls this on a timer. Raises RuntimeError without CUDA.
    """
    from allocconf_widget.adapters import torch_private

    torch = torch_private.imported_torch()
    if torch is None:
        raise RuntimeError("torch is not imported: there is no GPU memory to save")
    snapshot: Any = torch_private.full_snapshot(torch)
    target = write_snapshot(snapshot, path, kind)
    device = torch_private.current_device(torch) if device is None else device
    info = torch_private.mem_get_info(torch, device)
    if info is None:
        return SavedSnapshot(target, None)
    free, total = info
    reserved = sum(int(seg.get("total_size", 0)) for seg in snapshot.get("segments", ())
                   if seg.get("device", 0) == device)
    fraction = torch_private.memory_fraction(torch, device)
    sidecar = write_replay_sidecar(target, torch_version=str(getattr(torch, "__version__", "")) or None,
                                   device_total=total, non_pytorch_bytes=max(0, total - free - reserved),
                                   fraction=fraction if fraction is not None and fraction < 1.0 else None)
    return SavedSnapshot(target, sidecar)


def write_recording_snapshot(recording: Recording, path: str | os.PathLike[str] | None = None
                             ) -> SavedSnapshot:
    """Save a bundled recording's snapshot (the monitor's replay), with the recording's own
    replay facts beside it, so ``allocconf simulate`` on the file replays it as the What-if does."""
    target = write_snapshot(recording.snapshot(), path, kind="recording")
    sidecar = write_replay_sidecar(target, torch_version=recording.torch_version,
                                   device_total=recording.device_total_bytes,
                                   non_pytorch_bytes=recording.non_pytorch_bytes,
                                   fraction=recording.fraction, conf=recording.conf,
                                   name=recording.name)
    return SavedSnapshot(target, sidecar)


def write_replay_sidecar(snapshot_path: Path, *, torch_version: str | None, device_total: int | None,
                         non_pytorch_bytes: int | None = None, fraction: float | None = None,
                         conf: str = "", name: str = "") -> Path | None:
    """Write ``<name>.json`` beside a saved snapshot: what its replay needs and the file cannot say.

    The torch release (whose allocator rules the replay follows), the device's memory and
    the memory fraction in force: without them ``allocconf simulate`` on the file guessed
    (LOW CONFIDENCE, no OOM) where the OOM card that saved it was sure. Read back by
    :func:`~allocconf_widget.core.memory.recording.sidecar_facts`. Nothing to write
    (no device size known) gives None.
    """
    if device_total is None or device_total <= 0:
        return None
    stem = snapshot_path.name.removesuffix(".gz").removesuffix(".pickle")
    meta: dict[str, Any] = {"name": name or stem, "torch": torch_version, "conf": conf,
                            "device_total_bytes": int(device_total),
                            "written_by": "allocconf_widget (the replay facts of " + snapshot_path.name + ")"}
    if non_pytorch_bytes is not None:
        meta["free_at_start_bytes"] = max(0, int(device_total) - int(non_pytorch_bytes))
    if fraction is not None:
        meta["fraction"] = float(fraction)
    target = snapshot_path.with_name(stem + ".json")
    write_text_atomically(target, json.dumps(meta, indent=1))
    return target
