"""The trace a dry run records, in ``torch.cuda.memory._snapshot()``'s entry format, and the
user's lines each entry and each message names.

Every allocation gets a fake address (never reused, so every free names exactly one
allocation) and the user's innermost frames; the entries are what the replay decodes
(``core/sim/trace/decode``). Parts of the dry run may record from the threads a step starts,
so each change of the log holds a lock.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from allocconf_widget._errors import DryRunError

#: fake addresses start here and grow by each block's 512-byte-aligned size
_BASE_ADDRESS = 0x7F00_0000_0000
_ALIGN = 512
#: a dry run's trace ends there (a bounded host memory): one step makes far fewer calls
MAX_ENTRIES = 1_000_000
#: entries past this one carry no call stack (each entry with one holds about a kibibyte)
FRAMES_UNTIL = 200_000
#: the frame name an entry added by a rule carries (viewers and the flight recorder show it)
RULE_FILE = "<allocconf dry-run rule>"


def _now_us() -> int:
    return time.time_ns() // 1000


@dataclass
class Log:
    """The recorder's state, shared with the storages' finalizers (see :class:`.ports.TraceLog`)."""

    frames: bool = True
    entries: list[dict[str, Any]] = field(default_factory=list)
    live: dict[int, tuple[int, int]] = field(default_factory=dict)  # storage key → (addr, size)
    finalizers: dict[int, weakref.finalize[Any, Any]] = field(default_factory=dict)
    fraction_changes: list[dict[str, Any]] = field(default_factory=list)
    next_addr: int = _BASE_ADDRESS
    current: int = 0
    peak: int = 0
    ops: int = 0
    open: bool = True
    empty_cache_calls: int = 0
    _since_reset: int = 0
    _keys: int = -1  # synthetic keys are negative: never an id()
    _lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def peak_since_reset(self) -> int:
        return self._since_reset

    def synthetic_key(self) -> int:
        with self._lock:
            self._keys -= 1
            return self._keys

    def alloc(self, key: int, size: int, synthetic: str | None = None) -> int:
        frames = _user_frames() if self.frames and len(self.entries) < FRAMES_UNTIL else []
        if synthetic is not None:
            frames.insert(0, {"filename": RULE_FILE, "line": 0, "name": synthetic})
        with self._lock:
            if len(self.entries) >= MAX_ENTRIES:
                raise DryRunError(f"the step made more than {MAX_ENTRIES:,} allocator calls; a dry run "
                                  "is for one step (or a few) of the loop: run one step in the cell")
            addr = self.next_addr
            self.next_addr += (size + _ALIGN - 1) // _ALIGN * _ALIGN
            self.live[key] = (addr, size)
            self.current += size
            self.peak = max(self.peak, self.current)
            self._since_reset = max(self._since_reset, self.current)
            self.entries.append({"action": "alloc", "addr": addr, "size": size, "stream": 0,
                                 "time_us": _now_us(), "frames": frames})
            return addr

    def free(self, key: int) -> None:
        with self._lock:
            self.finalizers.pop(key, None)
            held = self.live.pop(key, None)
            if held is None or not self.open:
                return
            addr, size = held
            self.current -= size
            now = _now_us()
            self.entries.append({"action": "free_requested", "addr": addr, "size": size, "stream": 0,
                                 "time_us": now, "frames": []})
            self.entries.append({"action": "free_completed", "addr": addr, "size": size, "stream": 0,
                                 "time_us": now, "frames": []})

    def empty_cache(self) -> None:
        """A ``segment_free`` of no bytes at no address: torch never releases an empty segment,
        so the decoder reads it as the program's own ``empty_cache()`` (certain, not inferred
        from a release burst) and the replay releases the cache there under every setting."""
        with self._lock:
            if not self.open:
                return
            self.empty_cache_calls += 1
            self.entries.append({"action": "segment_free", "addr": 0, "size": 0, "stream": 0,
                                 "time_us": _now_us(), "frames": _user_frames(1) if self.frames else []})

    def memory_fraction(self, fraction: float) -> None:
        with self._lock:
            if self.open:
                self.fraction_changes.append({"device": 0, "fraction": float(fraction),
                                              "time_us": _now_us()})

    def reset_peak(self) -> None:
        with self._lock:
            self._since_reset = self.current

    def close(self) -> None:
        """Stop recording: later frees (storages the user keeps) are not the step's."""
        with self._lock:
            self.open = False
            for fin in list(self.finalizers.values()):
                fin.detach()
            self.finalizers.clear()


class NoteList:
    """The notes of one dry run, each said once (see :class:`.ports.Notes`)."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self._keys: set[str] = set()
        self._lock = threading.Lock()

    def add(self, text: str, key: str | None = None) -> None:
        with self._lock:
            mark = text if key is None else key
            if mark not in self._keys:
                self._keys.add(mark)
                self.items.append(text)


# ---------------------------------------------------------------- the user's lines

_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent.parent)
_STDLIB_DIR = str(Path(os.__file__).parent)


def _is_library(filename: str, torch_dir: str) -> bool:
    """Frames that are not the user's: torch, installed packages, the standard library, us."""
    return (filename.startswith((torch_dir, _PACKAGE_DIR, _STDLIB_DIR, "<frozen"))
            or "site-packages" in filename or "dist-packages" in filename)


def _torch_dir() -> str:
    torch = sys.modules.get("torch")
    where = getattr(torch, "__file__", None)
    return str(Path(where).parent) if where else "\0"


def _user_frames(limit: int = 3) -> list[dict[str, Any]]:
    """The innermost frames outside torch and this package (the user's lines)."""
    torch_dir = _torch_dir()
    frame: FrameType | None = sys._getframe(2)
    out: list[dict[str, Any]] = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        if not _is_library(code.co_filename, torch_dir):
            out.append({"filename": code.co_filename, "line": frame.f_lineno, "name": code.co_name})
        frame = frame.f_back
    return out


def _describe(filename: str, line: int) -> str:
    """``file, line N: source``; a notebook cell (IPython's or a kernel's file for it) is named as
    the cell a user sees, not by its temporary file."""
    source = linecache.getline(filename, line).strip()
    where = (f"the cell's line {line}" if filename.startswith(("<ipython-input-", "<dry-run cell"))
             or "/ipykernel_" in filename else f"{filename}, line {line}")
    return where + (f": {source}" if source else "")


def user_line(tb: TracebackType | None) -> str | None:
    """``file, line N: source`` of the innermost traceback frame in the user's code."""
    torch_dir = _torch_dir()
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if not _is_library(code.co_filename, torch_dir):
            found = (code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return None if found is None else _describe(*found)


def caller_line() -> str:
    """The user's innermost line on this thread's stack now."""
    frames = _user_frames(1)
    if not frames:
        return "an unknown line"
    return _describe(frames[0]["filename"], frames[0]["line"])


def frame_line(frame: FrameType | None) -> str:
    """The user's innermost line at or above ``frame`` (another thread's stack)."""
    torch_dir = _torch_dir()
    while frame is not None:
        if not _is_library(frame.f_code.co_filename, torch_dir):
            return _describe(frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return "an unknown line"
