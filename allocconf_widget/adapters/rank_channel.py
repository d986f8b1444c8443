"""The rank channel: ranks launched from the notebook report their allocator to its monitor.

The notebook opens a private folder under the kernel's runtime directory and puts
its path in ``ALLOCCONF_RANK_DIR``; processes launched afterwards inherit the
environment (``torch.multiprocessing.spawn``, ``notebook_launcher``, ``!torchrun``),
so a rank that calls :func:`allocconf_widget.rank_reporter` finds it. Each rank
keeps exactly one file, ``rank-<rank>-<pid>.json``, which it replaces atomically
(write, then rename) every ``interval`` seconds: the notebook never reads half a
record, the folder never grows with the run, and a rank that dies leaves its
last word behind.

Same rules as the sampler: nothing here initialises CUDA (a rank that has not
used the GPU yet reports "waiting"), reading costs one ``memory_stats()`` per
device per interval on a daemon thread, and a failure to write is counted and
skipped, never raised into the training loop. The OOM observer writes a record
at once, with the figures at the moment of the OOM.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from allocconf_widget._errors import SnapshotError
from allocconf_widget.adapters import torch_private
from allocconf_widget.core.config.envvars import ALL_VARS
from allocconf_widget.core.memory.ranks import (
    MAX_RECORD_BYTES,
    RankDevice,
    RankOom,
    RankRecord,
    parse_rank_record,
)

CHANNEL_VARIABLE = "ALLOCCONF_RANK_DIR"
FILE_PREFIX = "rank-"
MAX_FILES = 256  # ranks one notebook follows; more files are ignored and said so
MIN_INTERVAL_S = 0.05
MAX_INTERVAL_S = 60.0


# ---------------------------------------------------------------- the notebook's side

def runtime_base() -> Path:
    """Where channels live: Jupyter's runtime directory, else the system's temporary one."""
    with contextlib.suppress(Exception):
        from jupyter_core.paths import jupyter_runtime_dir

        return Path(jupyter_runtime_dir())
    return Path(tempfile.gettempdir())


def open_channel(base: Path | None = None, *, environ: Any = None) -> Path:
    """Create this kernel's channel folder (mode 0700) and export it to future child processes.

    Reuses the folder already exported by this process, so calling it twice is harmless.
    """
    env = os.environ if environ is None else environ
    current = env.get(CHANNEL_VARIABLE)
    if current and Path(current).is_dir() and Path(current).name.endswith(f"-{os.getpid()}"):
        return Path(current)
    root = base or runtime_base()
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="allocconf-ranks-", suffix=f"-{os.getpid()}", dir=root))
    env[CHANNEL_VARIABLE] = str(folder)
    return folder


def close_channel(folder: Path, *, environ: Any = None) -> None:
    """Stop exporting the channel and remove its files (ranks still running stop reporting)."""
    env = os.environ if environ is None else environ
    if env.get(CHANNEL_VARIABLE) == str(folder):
        del env[CHANNEL_VARIABLE]
    for path in _record_files(folder)[0]:
        with contextlib.suppress(OSError):
            path.unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()


@dataclass(frozen=True)
class ChannelRead:
    """Every record in the channel, the files that could not be read, and what was left out."""

    records: tuple[RankRecord, ...]
    problems: tuple[str, ...] = ()


def _record_files(folder: Path) -> tuple[list[Path], int]:
    try:
        names = sorted(p for p in folder.iterdir() if p.name.startswith(FILE_PREFIX)
                       and p.name.endswith(".json"))
    except OSError:
        return [], 0
    return names[:MAX_FILES], max(len(names) - MAX_FILES, 0)


def read_channel(folder: Path) -> ChannelRead:
    """Read every rank's latest record; each file is bounded and checked, none can raise."""
    files, left_out = _record_files(folder)
    records: list[RankRecord] = []
    problems: list[str] = []
    for path in files:
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_RECORD_BYTES + 1)
            records.append(parse_rank_record(data, path.name))
        except FileNotFoundError:
            continue  # replaced or removed between listing and reading
        except (OSError, SnapshotError) as exc:
            problems.append(str(exc))
    if left_out:
        problems.append(f"{left_out} more rank files than the {MAX_FILES} followed were left out")
    return ChannelRead(tuple(records), tuple(problems))


def process_alive(pid: int, host: str) -> bool | None:
    """Whether ``pid`` still runs (None when the rank is on another host, which cannot be told)."""
    if host and host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    except OSError:
        return None
    return True


# ---------------------------------------------------------------- the rank's side

def _rank_from_environment() -> int | None:
    for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def _world_size() -> int | None:
    value = os.environ.get("WORLD_SIZE", "")
    return int(value) if value.isdigit() else None


class RankReporter:
    """Writes this rank's allocator figures into the notebook's channel from a daemon thread.

    Args:
        folder: the channel (default: ``ALLOCCONF_RANK_DIR``).
        rank: this process's rank (default: ``RANK`` / ``LOCAL_RANK`` from the launcher, else 0).
        interval: seconds between reports.
        devices: CUDA devices to report (default: the current device once CUDA is up).
    """

    def __init__(self, folder: Path, *, rank: int | None = None, interval: float = 0.5,
                 devices: Sequence[int] | None = None) -> None:
        if not MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S:
            raise ValueError(f"interval={interval} s is outside {MIN_INTERVAL_S}–{MAX_INTERVAL_S} s")
        self.folder = folder
        self.rank = rank if rank is not None else (_rank_from_environment() or 0)
        self.interval = float(interval)
        self.devices = tuple(devices) if devices is not None else None
        self.path = folder / f"{FILE_PREFIX}{self.rank}-{os.getpid()}.json"
        self.host = socket.gethostname()
        self.seq = 0
        self.write_errors = 0
        self.cost_s = 0.0  # time spent producing and writing reports, for the overhead figure
        self._oom: RankOom | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._oom_listening = False
        self._atexit = False

    # -- lifecycle
    def start(self) -> RankReporter:
        """Start reporting (idempotent); writes a first record at once."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"allocconf-rank-{self.rank}",
                                            daemon=True)
            self._thread.start()
            if not self._atexit:
                atexit.register(self.close)
                self._atexit = True
        return self

    def close(self) -> None:
        """Stop the thread and write a last record saying this rank finished."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)
        self._write(status_override="finished")
        if self._oom_listening:
            torch_private.remove_oom_listener(self._on_oom)

    def __enter__(self) -> RankReporter:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    # -- the work
    def _run(self) -> None:
        while not self._stop.is_set():
            self._write()
            self._stop.wait(self.interval)

    def _torch(self) -> ModuleType | None:
        torch = torch_private.imported_torch()
        if torch is None or not torch_private.cuda_built(torch) or not torch_private.cuda_initialized(torch):
            return None
        if not self._oom_listening:
            self._oom_listening = torch_private.add_oom_listener(torch, self._on_oom)
        return torch

    def _figures(self, torch: ModuleType, device: int) -> RankDevice:
        stats = torch_private.memory_stats(torch, device) or {}

        def stat(key: str) -> int | None:
            value = stats.get(key)
            return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

        return RankDevice(device, stat("reserved_bytes.all.current"), stat("allocated_bytes.all.current"),
                          stat("active_bytes.all.current"), stat("requested_bytes.all.current"),
                          stat("reserved_bytes.all.peak"), stat("allocated_bytes.all.peak"),
                          stat("num_alloc_retries"), stat("num_ooms"))

    def _device_list(self, torch: ModuleType) -> tuple[int, ...]:
        if self.devices is not None:
            return self.devices
        return (torch_private.current_device(torch),)

    def _record(self, status_override: str | None = None) -> RankRecord:
        torch = self._torch()
        devices: tuple[RankDevice, ...] = ()
        effective = None
        note = None
        if torch is not None:
            devices = tuple(self._figures(torch, d) for d in self._device_list(torch))
            effective = torch_private.effective_settings(torch)
            if torch_private.load_time_backend(torch) == "cudaMallocAsync":
                note = "backend:cudaMallocAsync: only reserved/allocated are meaningful"
        variable = next((v for v in ALL_VARS if v in os.environ), None)
        self.seq += 1
        return RankRecord(
            rank=self.rank, pid=os.getpid(), host=self.host, seq=self.seq, wall=time.time(),
            interval=self.interval, status=status_override or ("sampling" if torch else "waiting"),
            devices=devices, world_size=_world_size(), settings_variable=variable,
            settings_text=os.environ.get(variable) if variable else None,
            effective=effective, oom=self._oom, note=note)

    def _write(self, status_override: str | None = None) -> None:
        t0 = time.perf_counter()
        try:
            with self._lock:
                text = self._record(status_override).to_json()
                tmp = self.path.with_name(f".{self.path.name}.tmp")
                tmp.write_text(text, encoding="utf-8")
                tmp.replace(self.path)
        except Exception:  # a report must never break the training loop
            self.write_errors += 1
        finally:
            self.cost_s += time.perf_counter() - t0

    def _on_oom(self, device: int, alloc: int, limit: int, free: int) -> None:
        torch = torch_private.imported_torch()
        figures = self._figures(torch, device) if torch is not None else None
        self._oom = RankOom(device, int(alloc), int(limit), int(free), time.time(), figures)
        self._write()


_reporter: RankReporter | None = None
_reporter_lock = threading.Lock()


def start_reporter(*, rank: int | None = None, interval: float = 0.5,
                   devices: Sequence[int] | None = None) -> RankReporter | None:
    """The process's reporter, started; None when no notebook channel was exported to it."""
    global _reporter  # noqa: PLW0603  (one reporter per process, like the sampler's registry)
    folder = os.environ.get(CHANNEL_VARIABLE)
    if not folder or not Path(folder).is_dir():
        return None
    with _reporter_lock:
        if _reporter is None:
            _reporter = RankReporter(Path(folder), rank=rank, interval=interval, devices=devices)
        return _reporter.start()
