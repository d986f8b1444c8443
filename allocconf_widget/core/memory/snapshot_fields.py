"""Type checks for every snapshot field the readers use, done once at the door.

After :func:`check_fields` a reader may rely on the types below and never meet
``None`` where a size should be, a string where an address should be, or a
float infinity in a time stamp; a file that breaks one gets a
:class:`SnapshotError` naming the field's path (``device_traces[0][17].size``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from allocconf_widget._errors import SnapshotError, printable

_U64 = 1 << 64
_I64 = 1 << 63
Check = Callable[[object], str | None]


def short_repr(value: object) -> str:
    """A bounded description of untrusted ``value``: never a repr of a whole container."""
    if isinstance(value, list | tuple | dict | set | frozenset):
        return f"a {type(value).__name__} of {len(value)} items"
    if isinstance(value, str | bytes):
        return printable(repr(value[:60]) + ("…" if len(value) > 60 else ""), 100)
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    return printable(repr(value), 100)


def _int_in(low: int, high: int) -> Check:
    def check(value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"is {short_repr(value)}, not an integer"
        if not low <= value < high:
            return f"is {short_repr(value)}, outside {low}..{high - 1}"
        return None
    return check


def _number(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"is {short_repr(value)}, not a number"
    if isinstance(value, float) and not math.isfinite(value):
        return f"is {value}, not a finite number"
    if isinstance(value, int) and abs(value) >= _U64:
        return f"is {short_repr(value)}, too large"
    return None


def _of(kind: type | tuple[type, ...], label: str) -> Check:
    def check(value: object) -> str | None:
        return None if isinstance(value, kind) else f"is {short_repr(value)}, not {label}"
    return check


ADDRESS = _int_in(0, _U64)
SIZE = _int_in(0, _I64)
SMALL_INT = _int_in(-_I64, _U64)  # stream handles are pointers
TEXT = _of(str, "a string")
LIST = _of(list, "a list")

_BLOCK = {"size": SIZE, "requested_size": SIZE, "address": ADDRESS, "state": TEXT, "frames": LIST,
          "history": LIST}
_SEGMENT = {"address": ADDRESS, "total_size": SIZE, "allocated_size": SIZE, "active_size": SIZE,
            "requested_size": SIZE, "device": SMALL_INT, "stream": SMALL_INT,
            "segment_type": TEXT, "blocks": LIST, "frames": LIST}
def _stamp(value: object) -> str | None:
    """A trace entry's ``time_us``: a number within a signed 64-bit count of microseconds, as
    the decoder keeps it (torch writes an int of about 2^50; 2^63 would overflow the decoder's
    column)."""
    problem = _number(value)
    if problem is None and isinstance(value, int | float) and not -_I64 < value < _I64:
        return f"is {short_repr(value)}, outside ±2^63 microseconds"
    return problem


#: a trace entry's address, kept in a signed 64-bit column by the decoder: CUDA's virtual
#: addresses stay far below 2^63 (2^48 on today's GPUs)
ENTRY_ADDRESS = _int_in(0, _I64)
_ENTRY = {"action": TEXT, "addr": ENTRY_ADDRESS, "size": SIZE, "stream": SMALL_INT, "time_us": _stamp,
          "device_free": SIZE, "frames": LIST}
_TOP = {"segments": LIST, "device_traces": LIST, "allocconf_initial_segments": LIST,
        "host_segments": LIST, "host_traces": LIST, "allocconf_cell_start": _of(dict, "a dict")}


def _bytes_or_unlimited(floor: int) -> Check:
    """A byte count torch reports: an integer from ``floor``, or -1 / SIZE_MAX for "no limit"."""
    def check(value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"is {short_repr(value)}, not an integer number of bytes"
        if value == -1 or floor <= value < _U64:
            return None
        return (f"is {short_repr(value)}; torch reports at least {floor:,} bytes here, or -1 for "
                "no limit")
    return check


def _fraction_in(low: float, high: float, *, high_open: bool) -> Check:
    def check(value: object) -> str | None:
        problem = _number(value)
        if problem:
            return problem
        number = float(value)  # type: ignore[arg-type]  # _number checked it
        if number < low or number > high or (high_open and number == high):
            return f"is {value}, outside {low}..{high}{' (exclusive)' if high_open else ''}"
        return None
    return check


def _flag(value: object) -> str | None:
    return None if isinstance(value, bool | int) and value in (0, 1) else (
        f"is {short_repr(value)}, not True or False")


def _roundup(value: object) -> str | None:
    items = list(value.values()) if isinstance(value, dict) else value
    if isinstance(items, list | tuple):
        bad = next((v for v in items if isinstance(v, bool) or not isinstance(v, int)
                    or not 0 <= v < _I64), None)
        return None if bad is None else f"holds {short_repr(bad)}, not a count of divisions"
    return _int_in(0, _I64)(value)


#: every allocator_settings field a reader uses, with the range torch can report: a value
#: outside it (max_split_size 0 or 0.5, a threshold of 7) is refused here, with the field's
#: name, instead of failing later inside a replay
_SETTING_RANGES: dict[str, Check] = {
    "max_split_size": _bytes_or_unlimited(1 << 20),  # torch: max_split_size_mb above 20
    "max_non_split_rounding_size": _bytes_or_unlimited(0),
    "max_non_split_rounding": _bytes_or_unlimited(0),
    "large_segment_size": _bytes_or_unlimited(1 << 20),
    "garbage_collection_threshold": _fraction_in(0.0, 1.0, high_open=True),
    "per_process_memory_fraction": _fraction_in(0.0, 1.0, high_open=False),
    "expandable_segments": _flag,
    "throw_on_cudamalloc_oom": _flag,
    "release_lock_on_cudamalloc": _flag,
    "pinned_use_cuda_host_register": _flag,
    "roundup_power2_divisions": _roundup,
    "PYTORCH_CUDA_ALLOC_CONF": _of(str, "a string"),
}


def _fields(record: object, where: str, checks: Mapping[str, Check]) -> None:
    if not isinstance(record, dict):
        raise _error(where, f"is {short_repr(record)}, not a dict")
    for name, check in checks.items():
        if name in record:
            problem = check(record[name])
            if problem:
                raise _error(f"{where}.{name}", problem)


def _segments(segments: list[Any], where: str) -> None:
    for i, segment in enumerate(segments):
        _fields(segment, f"{where}[{i}]", _SEGMENT)
        for j, block in enumerate(segment.get("blocks", ())):
            _fields(block, f"{where}[{i}].blocks[{j}]", _BLOCK)
            _requested_within(block, f"{where}[{i}].blocks[{j}]")


def _requested_within(block: dict[str, Any], where: str) -> None:
    """An active block holds at least what was asked of it (``requested_size <= size``); more
    would read as negative fragmentation. An inactive block keeps the
    request of its last use, and torch's split leaves it on the smaller remainder: genuine
    snapshots have inactive blocks with more requested than their size."""
    requested, size, state = block.get("requested_size"), block.get("size"), block.get("state")
    if (isinstance(state, str) and state.startswith("active") and type(requested) is int
            and type(size) is int and requested > size):
        raise _error(f"{where}.requested_size", f"is {requested:,}, more than the active block's "
                     f"size {size:,}")


#: the fields :func:`_entries` decides inline: every field of :data:`_ENTRY`, or a field added
#: there would pass unchecked on the inline path
INLINE_ENTRY_FIELDS = ("action", "addr", "size", "stream", "time_us", "device_free", "frames")
if frozenset(INLINE_ENTRY_FIELDS) != frozenset(_ENTRY):
    raise AssertionError("snapshot_fields: _entries must decide every field of _ENTRY inline")
_NO_FRAMES: list[Any] = []


def _compiled_check() -> Any:
    """The compiled inline path (``_entrycheck.c``), where it is built and the replay engine is
    not forced to Python (``ALLOCCONF_REPLAY_ENGINE=python``: no compiled code at all)."""
    if os.environ.get("ALLOCCONF_REPLAY_ENGINE", "").strip().lower() == "python":
        return None
    try:
        from allocconf_widget.core.memory import _entrycheck  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _entrycheck


_COMPILED = _compiled_check()


def compiled_scalar_dicts() -> Any:
    """The structure walk's leaf rule at compiled speed (``check_structure``'s ``scalar_dicts``),
    or None where the module is not there."""
    return None if _COMPILED is None else _COMPILED.scalar_dicts


def _entries(trace: list[Any], device: int) -> None:
    """:data:`_ENTRY` on every trace entry, a million of them in a long recording.

    The common entry is decided inline, with exact types (``type(x) is int`` leaves out
    ``bool``, which the checks refuse): every field present is of the checked type and in
    range. Anything else -- another type, a subclass, a value out of range, not a dict --
    goes through the generic checks, which name the first field that is wrong: the fast path
    passes only what they pass and never words a message of its own. The compiled module runs
    the same inline test where it is built (a list of a million entries in tens of milliseconds).
    """
    compiled = _COMPILED
    if compiled is not None and type(trace) is list:
        i = compiled.first_irregular(trace, 0)
        while i < len(trace):
            where = f"device_traces[{device}][{i}]"
            _fields(trace[i], where, _ENTRY)
            _required(trace[i], where)
            i = compiled.first_irregular(trace, i + 1)
        return
    u64, i64 = _U64, _I64
    for i, entry in enumerate(trace):
        if type(entry) is dict:
            get = entry.get
            # action, addr and size are required (an OOM entry's addr aside): a missing one
            # reads None here and fails its type, and the generic checks word it
            addr = get("addr")
            size = get("size")
            stream = get("stream", 0)
            stamp = get("time_us", 0)
            free = get("device_free", 0)
            if (type(get("action")) is str and type(addr) is int and 0 <= addr < i64
                    and type(size) is int and 0 <= size < i64
                    and type(stream) is int and -i64 <= stream < u64
                    and type(free) is int and 0 <= free < i64
                    and (type(stamp) is int or type(stamp) is float) and -i64 < stamp < i64
                    and type(get("frames", _NO_FRAMES)) is list):
                continue
        where = f"device_traces[{device}][{i}]"
        _fields(entry, where, _ENTRY)
        _required(entry, where)


def _required(entry: dict[str, Any], where: str) -> None:
    """The keys torch writes in every trace entry: without them an entry would replay as a
    0-byte allocation, at address 0, or as an action ``None``, and give wrong peaks with no
    error."""
    missing = [key for key in ("action", "size") if key not in entry]
    if "addr" not in entry and entry.get("action") != "oom":  # an OOM entry has device_free instead
        missing.append("addr")
    if missing:
        names = " and ".join(repr(key) for key in missing)
        raise _error(where, f"has no {names} (torch writes {'it' if len(missing) == 1 else 'them'} "
                     "in every trace entry)")


def check_fields(snapshot: Mapping[str, Any]) -> None:
    """Raise :class:`SnapshotError` naming the first field whose type or range is wrong."""
    _fields(dict(snapshot), "snapshot", _TOP)
    _segments(snapshot["segments"], "segments")
    if "allocconf_initial_segments" in snapshot:
        _segments(snapshot["allocconf_initial_segments"], "allocconf_initial_segments")
    for d, trace in enumerate(snapshot.get("device_traces", ())):
        if not isinstance(trace, list):
            raise _error(f"device_traces[{d}]", f"is {short_repr(trace)}, not a list")
        _entries(trace, d)
    settings = snapshot.get("allocator_settings")
    if settings is not None:
        if not isinstance(settings, dict):
            raise _error("allocator_settings", f"is {short_repr(settings)}, not a dict")
        for key, value in settings.items():
            problem = None
            ranged = _SETTING_RANGES.get(key) if isinstance(key, str) else None
            if ranged is not None:
                problem = ranged(value)
            elif isinstance(value, list):
                problem = next((p for p in map(_number, value) if p), None)
            elif isinstance(value, int | float) and not isinstance(value, bool):
                problem = _number(value) or (
                    f"is {value}, negative" if value < 0 and value != -1 else None)  # -1: unlimited
            if problem:
                raise _error(f"allocator_settings.{printable(str(key), 60)}", problem)


def _error(where: str, problem: str) -> SnapshotError:
    return SnapshotError(
        f"this file is not a memory snapshot torch wrote: {where} {problem}. Dump it again with "
        "torch.cuda.memory._dump_snapshot(...), or pass the file torch wrote unchanged")
