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
import logging
import os
import re
import secrets
import socket
import stat
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from allocconf_widget._errors import AllocConfWarning, SnapshotError
from allocconf_widget.adapters import torch_private
from allocconf_widget.core.config.envvars import ALL_VARS
from allocconf_widget.core.memory.ranks import (
    MAX_RECORD_BYTES,
    RankDevice,
    RankOom,
    RankRecord,
    parse_rank_record,
)
from allocconf_widget.core.untrusted import NotRegularFileError, read_regular_file

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
    if (current and Path(current).name.endswith(f"-{os.getpid()}")
            and channel_problem(Path(current)) is None):
        return Path(current)
    root = base or runtime_base()
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="allocconf-ranks-", suffix=f"-{os.getpid()}", dir=root))
    env[CHANNEL_VARIABLE] = str(folder)
    return folder


def channel_problem(folder: Path) -> str | None:
    """Why ``folder`` is not a safe rank channel, or None when it is.

    A channel must be a real directory (not a link to one) owned by this user with no
    access for anyone else (mode 0700): in a shared folder (a mode-0777 team directory,
    another user's) anyone could plant a link where a rank writes, or records it reads.
    """
    try:
        info = os.lstat(folder)
    except OSError as exc:
        return f"{folder} cannot be used ({exc.strerror or type(exc).__name__})"
    if stat.S_ISLNK(info.st_mode):
        return f"{folder} is a symbolic link, not the private folder the notebook created"
    if not stat.S_ISDIR(info.st_mode):
        return f"{folder} is not a directory"
    getuid = getattr(os, "geteuid", None)
    if getuid is not None and info.st_uid != getuid():
        return f"{folder} belongs to user id {info.st_uid}, not to this user ({getuid()})"
    if info.st_mode & 0o077:
        return (f"{folder} has mode {stat.S_IMODE(info.st_mode):04o}; a rank channel must be "
                "private (0700): others could plant links or records in it")
    return None


def close_channel(folder: Path, *, environ: Any = None) -> None:
    """Stop exporting the channel and remove its files (ranks still running stop reporting).

    Every entry goes, however many ranks wrote there and whatever a killed rank left
    half-written (its ``.rank-…tmp`` file), so the folder itself can go too. Only files and
    links are removed (a link is removed, never followed); the folder is the notebook's own.
    """
    env = os.environ if environ is None else environ
    if env.get(CHANNEL_VARIABLE) == str(folder):
        del env[CHANNEL_VARIABLE]
    if channel_problem(folder) is None:
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.startswith((FILE_PREFIX, f".{FILE_PREFIX}")) and not entry.is_dir(
                        follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        Path(entry.path).unlink()
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
            # never blocks (a FIFO is refused unopened) and never follows a planted link
            data = read_regular_file(path, MAX_RECORD_BYTES, follow_links=False)
            records.append(parse_rank_record(data, path.name))
        except FileNotFoundError:
            continue  # replaced or removed between listing and reading
        except NotRegularFileError as exc:
            problems.append(f"{path.name}: {exc.strerror}")
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
        self._exit_code: _ExitCodeWatch | None = None
        self._final: str | None = None  # the status close() wrote; a later close() does nothing

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
            self._final = None
            if not self._atexit:
                atexit.register(self._close_at_exit)
                # a multiprocessing child (spawn, torch.multiprocessing.spawn) runs its
                # finalizers while the target's exception is still propagating: that is the
                # one moment a failed rank can be told from a finished one
                from multiprocessing import util

                util.Finalize(self, self._close_at_exit, exitpriority=100)
                self._exit_code = _watch_exit_code()
                self._atexit = True
        # the first record here, not by the thread: the rank is on the board once this returns
        # (the thread's first write lagged the caller's next step on a busy machine)
        self._write()
        return self

    def close(self, status: str = "finished") -> None:
        """Stop the thread and write a last record saying how this rank ended.

        ``status`` is "finished" (the default: an explicit call means the work is done) or
        "failed". Only the first call writes: the one at exit does not overwrite it.
        """
        if self._final is not None:
            return
        self._final = status
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)
        self._write(status_override=status)
        if self._oom_listening:
            torch_private.remove_oom_listener(self._on_oom)

    def _close_at_exit(self) -> None:
        """At exit: "failed" when an exception is ending the process (or a multiprocessing
        child's bootstrap said it exits with a code other than 0), else "finished"."""
        status = ending_status(sys.exc_info()[1] or getattr(sys, "last_exc", None)
                               or getattr(sys, "last_value", None))
        watch = self._exit_code
        if status == "finished" and watch is not None and watch.code not in (None, 0):
            status = "failed"
        self.close(status)

    def __enter__(self) -> RankReporter:
        return self.start()

    def __exit__(self, _type: object, exc: BaseException | None, _tb: object) -> None:
        self.close(ending_status(exc))

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    # -- the work
    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._write()

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
                write_record(self.path, text.encode("utf-8"))
        except Exception:  # a report must never break the training loop
            self.write_errors += 1
        finally:
            self.cost_s += time.perf_counter() - t0

    def _on_oom(self, device: int, alloc: int, limit: int, free: int) -> None:
        torch = torch_private.imported_torch()
        figures = self._figures(torch, device) if torch is not None else None
        self._oom = RankOom(device, int(alloc), int(limit), int(free), time.time(), figures)
        self._write()


class _ExitCodeWatch(logging.Handler):
    """The exit code a multiprocessing child's bootstrap logs ("process exiting with exitcode
    N", at INFO) before the process ends.

    Up to Python 3.12 the child runs its finalizers while the target's exception still
    propagates, so the exception itself says the rank failed. From 3.13 they run at exit,
    after the bootstrap handled it: this line is then what is left to tell a rank that died
    of an exception (exit code 1) from one that finished.
    """

    _LINE = re.compile(r"process exiting with exitcode (-?\d+)")

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.code: int | None = None

    def emit(self, record: logging.LogRecord) -> None:
        match = self._LINE.fullmatch(record.getMessage())
        if match is not None:
            self.code = int(match.group(1))


def _watch_exit_code() -> _ExitCodeWatch | None:
    """Watch for the bootstrap's exit code in a multiprocessing child (None elsewhere). Where
    nobody set multiprocessing's logger up, it is set to INFO with this watch as its only
    handler (it does not propagate, so nothing is printed); a logger set up by the program is
    left at its level."""
    import multiprocessing
    from multiprocessing import util

    if multiprocessing.parent_process() is None:
        return None
    logger = util.get_logger()
    untouched = not logger.handlers and logger.level == logging.NOTSET
    watch = _ExitCodeWatch()
    logger.addHandler(watch)
    if untouched:
        logger.setLevel(logging.INFO)
    return watch


def ending_status(exc: BaseException | None) -> str:
    """"finished", unless ``exc`` (the exception ending the rank) says it failed.

    ``SystemExit`` with code 0 or None is a normal end; any other code (torch's
    ``spawn`` turns the function's exception into ``sys.exit(1)``), a ``KeyboardInterrupt``
    or any other exception is a failure.
    """
    if exc is None:
        return "finished"
    if isinstance(exc, SystemExit) and exc.code in (None, 0):
        return "finished"
    return "failed"


def write_record(path: Path, payload: bytes) -> None:
    """Replace ``path`` with ``payload`` atomically, never writing through a link.

    The temporary file gets a fresh random name and is created with
    ``O_CREAT|O_EXCL|O_NOFOLLOW`` (mode 0600): if anything already sits at that name (a
    link planted to make us overwrite its target) the creation fails instead of
    following it. ``rename`` then replaces ``path`` itself, a link there included,
    never the link's target.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(
        os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


_reporter: RankReporter | None = None
_reporter_lock = threading.Lock()


def start_reporter(*, rank: int | None = None, interval: float = 0.5,
                   devices: Sequence[int] | None = None) -> RankReporter | None:
    """The process's reporter, started; None when no notebook channel was exported to it."""
    global _reporter  # noqa: PLW0603  (one reporter per process, like the sampler's registry)
    folder = os.environ.get(CHANNEL_VARIABLE)
    if not folder:
        return None
    problem = channel_problem(Path(folder))
    if problem is not None:
        warnings.warn(f"allocconf rank_reporter: not reporting: {CHANNEL_VARIABLE}: {problem}. "
                      "Open the channel from the notebook (%allocconf ranks open) and launch the "
                      "ranks from there.", AllocConfWarning, stacklevel=3)
        return None
    with _reporter_lock:
        if _reporter is None:
            _reporter = RankReporter(Path(folder), rank=rank, interval=interval, devices=devices)
        return _reporter.start()
