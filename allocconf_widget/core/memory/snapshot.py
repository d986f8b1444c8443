"""Reading and writing torch memory snapshots safely.

A snapshot (``torch.cuda.memory._dump_snapshot``) is a pickle. Unpickling
runs arbitrary code, so we never hand a file to :func:`pickle.load`: the
restricted unpickler below refuses every global, which leaves exactly the
plain types a snapshot holds (dict, list, tuple, str, int, float, bool, None).
A pickle that names a class or function is refused before anything in it runs.

The TypedDicts mirror the schema in torch's ``_snapshot`` docstring
(docs/internals/allocator_facts.md §7). torch keeps adding keys, and 2.0 snapshots lack some, so
only the keys every release writes are required; readers use ``.get``.
"""

from __future__ import annotations

import gzip
import io
import itertools
import os
import pickle
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Generic, TypedDict, TypeVar, cast

from allocconf_widget._errors import SnapshotError, printable
from allocconf_widget.core.memory.gcpause import paused_gc
from allocconf_widget.core.memory.snapshot_fields import check_fields, compiled_scalar_dicts, short_repr
from allocconf_widget.core.memory.unpickle_guard import load_checked
from allocconf_widget.core.units import format_bytes
from allocconf_widget.core.untrusted import (
    LoadLimits,
    NotRegularFileError,
    check_structure,
    gunzip_bounded,
    read_regular_file,
    replace_file_atomically,
    too_large,
)

T = TypeVar("T")

ACTIVE_ALLOCATED = "active_allocated"
"""Block state: handed out to a tensor."""
ACTIVE_PENDING_FREE = "active_pending_free"
"""Block state: freed by Python, waiting for another stream (record_stream) to finish."""
INACTIVE = "inactive"
"""Block state: cached and free for reuse."""

LARGE_SNAPSHOT_BYTES = 1 << 30
"""Above this, pytorch.org/memory_viz tends to crash the browser (pytorch/pytorch PR #176290)."""

_GZIP_MAGIC = b"\x1f\x8b"
_SMALL_SEGMENT_MAX = 2 << 20  # kSmallBuffer: the size of every classic small-pool segment
_VIEWER_PICKLE_PROTOCOL = 4  # MemoryViz.js's unpickler accepts protocols 2-4 only
_DUMP_HINT = "write one with torch.cuda.memory._dump_snapshot(path)"


class Frame(TypedDict, total=False):
    """One stack frame of an allocation (FX keys appear with ``augment_with_fx_traces``)."""

    filename: str
    line: int
    name: str
    fx_node_op: str
    fx_node_name: str
    fx_original_trace: str
    fx_node_info: object


class HistoryEntry(TypedDict, total=False):
    """torch 2.0 (legacy) per-block history: ``real_size`` is the requested size."""

    addr: int
    real_size: int
    frames: list[Frame]


class _BlockEssentials(TypedDict):
    size: int
    state: str


class SnapshotBlock(_BlockEssentials, total=False):
    """A piece of a segment; ``requested_size`` is meaningful only while the block is active."""

    address: int
    requested_size: int
    frames: list[Frame]
    history: list[HistoryEntry]
    cpp_frames: list[Frame]


class _SegmentEssentials(TypedDict):
    total_size: int
    blocks: list[SnapshotBlock]


class Segment(_SegmentEssentials, total=False):
    """One ``cudaMalloc`` (or one contiguous mapped run of an expandable segment)."""

    device: int
    address: int
    allocated_size: int
    active_size: int
    requested_size: int
    stream: int
    segment_type: str
    segment_pool_id: tuple[int, int]
    is_expandable: bool
    frames: list[Frame]


class TraceEntry(TypedDict, total=False):
    """One allocator event from the history ring buffer (``device_traces``)."""

    action: str
    addr: int
    size: int
    stream: int
    time_us: int
    frames: list[Frame]
    device_free: int
    pool_id: tuple[int, int]
    compile_context: object
    user_metadata: object


class _SnapshotEssentials(TypedDict):
    segments: list[Segment]


class Snapshot(_SnapshotEssentials, total=False):
    """What ``torch.cuda.memory._snapshot()`` returns; only ``segments`` is always there."""

    device_traces: list[list[TraceEntry]]
    allocator_settings: dict[str, Any]
    external_annotations: list[dict[str, Any]]
    host_segments: list[Segment]
    host_traces: list[list[TraceEntry]]


class _PlainDataUnpickler(pickle.Unpickler):
    """Unpickler that admits no classes or functions at all."""

    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotError(
            f"refused to load {module}.{name}: a memory snapshot holds only plain data "
            "(dicts, lists, numbers, strings), and loading other objects could run code. "
            "Nothing in the file was executed; only open snapshots written by torch"
        )


# ----------------------------------------------------------------- reading


def _describe(source: object) -> str:
    if isinstance(source, str | os.PathLike):
        return f"snapshot file {os.fspath(source)!r}"
    return "snapshot data"


def _read_path(path: str | os.PathLike[str], limit: int) -> bytes:
    name = os.fspath(path)
    try:
        data = read_regular_file(path, limit)
        if len(data) > limit:
            raise too_large(f"snapshot file {name!r}", limit)
        return data
    except FileNotFoundError:
        raise SnapshotError(
            f"snapshot file {name!r} does not exist; check the path, or {_DUMP_HINT}"
        ) from None
    except IsADirectoryError:
        raise SnapshotError(f"{name!r} is a directory; pass the snapshot .pickle file") from None
    except PermissionError:
        raise SnapshotError(f"no permission to read snapshot file {name!r}") from None
    except NotRegularFileError as exc:
        raise SnapshotError(f"cannot read snapshot file: {exc}; pass the .pickle file") from None
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot file {name!r}: {exc}") from exc


def _read_bytes(source: str | os.PathLike[str] | bytes | IO[bytes], limit: int) -> bytes:
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
    elif isinstance(source, str | os.PathLike):
        return _read_path(source, limit)
    else:
        data = source.read(limit + 1)
    if not isinstance(data, bytes):
        raise SnapshotError("the snapshot file object is open in text mode; open it with 'rb'")
    if len(data) > limit:
        raise too_large("snapshot data", limit)
    return data


#: leading bytes of archives and compressors a snapshot is sometimes sent in, besides gzip
_CONTAINERS = ((b"BZh", "bzip2-compressed"), (b"\xfd7zXZ\x00", "xz-compressed"),
               (b"\x28\xb5\x2f\xfd", "zstd-compressed"), (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"))


def _other_container(data: bytes) -> str | None:
    """What compressed or archived ``data`` is, where it is one of those, else None. (No pickle
    of a snapshot starts so: its first opcode is PROTO, or a dict's or list's.)"""
    for magic, name in _CONTAINERS:
        if data.startswith(magic):
            return name
    return "a tar archive" if data[257:262] == b"ustar" else None


def _not_a_pickle_hint(data: bytes) -> str:
    head = data[:64].lstrip()
    if head[:2] == b"PK":
        return (
            "; it looks like a zip archive (torch.save output?), not a memory snapshot: "
            + _DUMP_HINT
        )
    if head[:1] == b"<":
        return (
            "; it looks like an HTML page (trace_plot/segment_plot output?): "
            "pass the .pickle file it was made from"
        )
    if head[:1] in (b"{", b"["):
        return ("; it looks like JSON text, not a pickle (a recording's sidecar? its snapshot is "
                "the .pickle or .pickle.gz of the same name): " + _DUMP_HINT)
    return "; " + _DUMP_HINT


def _unpickle(data: bytes, what: str) -> object:
    try:
        return _PlainDataUnpickler(io.BytesIO(data)).load()
    except SnapshotError:
        raise
    except EOFError as exc:
        raise SnapshotError(
            f"the {what} is truncated: the pickle ends before its last object "
            "(was the dump interrupted?); dump it again"
        ) from exc
    except pickle.UnpicklingError as exc:
        # a file of another kind is said as such first: Python 3.13's unpickler calls a zip
        # archive's bytes (PERSID without its newline) "truncated", 3.11's an invalid load key
        if "truncated" in str(exc) and _not_a_pickle_hint(data) == f"; {_DUMP_HINT}":
            raise SnapshotError(
                f"the {what} is truncated ({exc}); was the dump interrupted? dump it again"
            ) from exc
        raise SnapshotError(
            f"the {what} is not a readable pickle ({exc}){_not_a_pickle_hint(data)}"
        ) from exc
    except MemoryError as exc:
        raise SnapshotError(
            f"the {what} takes more memory to unpickle than this process can get; "
            "torch's snapshots take 6 to 9 times their size (docs/limits.md)") from exc
    except (ValueError, TypeError, IndexError, KeyError, AttributeError,
            RecursionError, OverflowError) as exc:
        raise SnapshotError(
            f"the {what} is not a readable pickle ({type(exc).__name__}: {printable(str(exc), 200)})"
            f"{_not_a_pickle_hint(data)}"
        ) from exc


def _shape_error(where: str, problem: str) -> SnapshotError:
    return SnapshotError(
        f"this pickle is not a memory snapshot: {where} {problem}; {_DUMP_HINT}"
    )


def _check_block(block: object, where: str) -> None:
    if not isinstance(block, dict):
        raise _shape_error(where, f"is of type {type(block).__name__!r}, not a dict")
    if not isinstance(block.get("size"), int):
        raise _shape_error(where, "has no integer 'size'")
    if not isinstance(block.get("state"), str):
        raise _shape_error(where, "has no 'state' string")
    if block["state"] not in BLOCK_STATES:  # any other state would be counted as active
        raise _shape_error(where, f"has the state {short_repr(block['state'])}; torch writes "
                           f"one of {', '.join(BLOCK_STATES)}")


#: the block states torch writes (1.13 to 2.11 alike)
BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")
#: the pools a segment belongs to
SEGMENT_TYPES = ("large", "small")


def _is_int_pair(value: object) -> bool:
    return (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(item, int) for item in value)
    )


def _check_segment(segment: object, index: int) -> None:
    where = f"segment {index}"
    if not isinstance(segment, dict):
        raise _shape_error(where, f"is of type {type(segment).__name__!r}, not a dict")
    if not isinstance(segment.get("total_size"), int):
        raise _shape_error(where, "has no integer 'total_size'")
    blocks = segment.get("blocks")
    if not isinstance(blocks, list):
        raise _shape_error(where, "has no 'blocks' list")
    if not isinstance(segment.get("device", 0), int):
        raise _shape_error(where, "has a 'device' that is not an integer")
    if segment.get("device", 0) < 0:
        raise _shape_error(where, f"has the device {segment['device']}; GPU indices start at 0")
    if "segment_type" in segment and segment["segment_type"] not in SEGMENT_TYPES:
        raise _shape_error(where, f"has the segment_type {short_repr(segment['segment_type'])}; "
                           "torch writes 'large' or 'small'")
    pool = segment.get("segment_pool_id", (0, 0))
    if not _is_int_pair(pool):
        raise _shape_error(where, f"has a 'segment_pool_id' that is not a pair of integers: "
                           f"{short_repr(pool)}")
    for block_index, block in enumerate(blocks):
        _check_block(block, f"block {block_index} of {where}")
    if segment["total_size"] < 0 or any(block["size"] < 0 for block in blocks):
        return  # a negative size: the field checks name that field (snapshot_fields)
    held = sum(block["size"] for block in blocks)
    # torch adds the segment's total_size up from its blocks, which follow one another from its
    # address: any other sum gives impossible figures or reserved memory no block accounts for
    if blocks and held != segment["total_size"]:
        raise _shape_error(where, f"has blocks adding up to {format_bytes(held)}, not its "
                           f"total_size of {format_bytes(segment['total_size'])} (torch adds the "
                           "total up from the blocks)")
    at = segment.get("address")
    for block_index, block in enumerate(blocks):
        if not isinstance(at, int) or not isinstance(block.get("address"), int) or at < 0:
            break  # torch < 2.0 wrote no block addresses; a negative one is the field checks' to name
        if block["address"] != at:
            raise _shape_error(f"block {block_index} of {where}", f"starts at {block['address']:#x}, not "
                               f"at {at:#x} where the block before it ends (a segment's blocks "
                               "follow one another)")
        at += block["size"]


def _check_segments_apart(segments: list[Any]) -> None:
    """No two segments of one device share memory: a segment listed twice would count its
    memory twice."""
    spans: dict[int, list[tuple[int, int, int]]] = {}
    for index, segment in enumerate(segments):
        address = segment.get("address")
        if isinstance(address, int):
            spans.setdefault(segment.get("device", 0), []).append(
                (address, address + segment["total_size"], index))
    for listed in spans.values():
        listed.sort()
        for (_, end, first), (start, _, second) in itertools.pairwise(listed):
            if start < end:
                raise _shape_error(f"segment {second}", f"overlaps segment {first} (each byte of "
                                   "the device belongs to one segment at most)")


def _as_snapshot(obj: object) -> Snapshot:
    if isinstance(obj, list):  # torch.cuda.memory_snapshot() returns the segments alone
        obj = {"segments": obj}
    if not isinstance(obj, dict):
        raise _shape_error("the pickle", f"holds {type(obj).__name__!r} data, not a dict")
    if not isinstance(obj.get("segments"), list):
        if any(isinstance(key, str) and key.endswith(".all.current") for key in obj):
            raise SnapshotError(
                "this pickle holds torch.cuda.memory_stats() counters, not a memory snapshot; "
                + _DUMP_HINT
            )
        raise _shape_error("the pickle", "has no 'segments' list")
    for index, segment in enumerate(obj["segments"]):
        _check_segment(segment, index)
    _check_segments_apart(obj["segments"])
    return cast(Snapshot, obj)


def load_snapshot(source: str | os.PathLike[str] | bytes | IO[bytes]) -> Snapshot:
    """Load a snapshot or trace written by torch, without executing anything in it.

    Accepts a path, raw bytes or a binary file object; gzip-compressed data is
    recognised by its magic bytes. A bare list of segments (what
    ``torch.cuda.memory_snapshot()`` returns) is wrapped as ``{"segments": ...}``.
    Large files load normally; see :func:`large_snapshot_note` for the warning
    worth showing about them.

    Raises:
        SnapshotError: missing, unreadable, empty, truncated, corrupt gzip, not a
            pickle, holding objects other than plain data, or not shaped like a
            snapshot. The message says what is wrong and how to get a good file.
    """
    return _load(source, None, None).snapshot


#: the key :func:`load_snapshot_deriving` adds to a snapshot whose trace entries it did not
#: keep (see :func:`trace_cut`): each device trace's length
TRACES_CUT_KEY = "allocconf_traces_cut"


@dataclass(frozen=True)
class DerivedLoad(Generic[T]):
    """A loaded snapshot and what the caller's ``derive`` made of it (None: derive it now).

    Where ``derived`` is there, ``snapshot`` holds every key but only the first entry of each
    device trace (:func:`trace_cut`): the decode stands for the entries, and this process
    never held a copy of them.
    """

    snapshot: Snapshot
    derived: T | None


def load_snapshot_deriving(source: str | os.PathLike[str] | bytes | IO[bytes],
                           derive: Callable[[Snapshot], T],
                           read_derived: Callable[[bytes], T]) -> DerivedLoad[T]:
    """:func:`load_snapshot`, and ``derive`` of the snapshot computed beside its checks.

    The what-if decodes every file it loads: the decode runs in a child process while the
    checks run in another (``unpickle_guard.load_checked``), and its pickled result, read by
    ``read_derived`` (a restricted unpickler), is kept only for a file that passed them.
    The child sends the snapshot's other keys too, each trace cut to its first entry, so this
    process unpickles nothing more (:class:`DerivedLoad`): one unpickle fewer on the CPUs while
    the children work, and no copy of the trace's dicts held here for as long as the caller
    keeps the snapshot.
    ``derived`` is None where that could not be done (a file over
    ``unpickle_guard.OVERLAP_MAX_BYTES``, no fork, the decode failed): the caller derives it
    itself and meets any error there, worded as always.
    """
    return _load(source, derive, read_derived)


def _load(source: str | os.PathLike[str] | bytes | IO[bytes], derive: Callable[[Snapshot], T] | None,
          read_derived: Callable[[bytes], T] | None) -> DerivedLoad[T]:
    what = _describe(source)
    limits = LoadLimits.from_env()
    data = _read_bytes(source, limits.max_bytes)
    if not data:
        raise SnapshotError(
            f"the {what} is empty (0 bytes): the process writing it was probably "
            "stopped before the dump finished; dump it again"
        )
    if data[:2] == _GZIP_MAGIC:
        data = gunzip_bounded(data, what, limits.max_bytes)
        if not data:
            raise SnapshotError(f"the gzip-compressed {what} contains nothing (0 bytes)")
    container = _other_container(data)
    if container is not None:  # before the unpickler reads "BZh9" as a huge bytes object
        raise SnapshotError(f"the {what} is {container}, not a pickle: decompress it first "
                            "(a gzip-compressed .pickle.gz is read as it is)")

    def check(obj: object) -> None:
        check_structure(obj, what, limits, scalar_dicts=compiled_scalar_dicts())
        check_fields(_as_snapshot(obj))

    def derive_with_head(obj: object) -> bytes:  # in the deriving child
        assert derive is not None
        snapshot = _as_snapshot(obj)
        derived = pickle.dumps(derive(snapshot), protocol=pickle.HIGHEST_PROTOCOL)
        head = pickle.dumps(_with_traces_cut(snapshot), protocol=pickle.HIGHEST_PROTOCOL)
        return len(head).to_bytes(8, "little") + head + derived

    def read_head_and_derived(payload: bytes) -> tuple[Snapshot, T]:
        assert read_derived is not None
        packed = _PlainDataUnpickler(io.BytesIO(payload)).load()
        if not isinstance(packed, bytes) or len(packed) < 8:
            raise ValueError("not a head and a derived result")
        size = int.from_bytes(packed[:8], "little")
        head = _PlainDataUnpickler(io.BytesIO(packed[8:8 + size])).load()
        if not isinstance(head, dict):
            raise ValueError("not a snapshot's head")
        return cast(Snapshot, head), read_derived(packed[8 + size:])

    with paused_gc():  # millions of plain dicts, no cycles (core/memory/gcpause.py)
        # in a forked child first: some pickles crash or exhaust the unpickler itself
        if derive is None:
            loaded = load_checked(data, what, lambda raw: _unpickle(raw, what), check)
        else:
            loaded = load_checked(data, what, lambda raw: _unpickle(raw, what), check,
                                  derive=derive_with_head, read_derived=read_head_and_derived,
                                  derived_suffices=True)
        del data
        if loaded.derived is None:
            whole = _as_snapshot(loaded.obj)
            # the mark is this process's word for a cut trace: a file that carries it is whole
            cast("dict[str, Any]", whole).pop(TRACES_CUT_KEY, None)
            return DerivedLoad(whole, None)
        head, derived = cast("tuple[Snapshot, T]", loaded.derived)
        return DerivedLoad(head, derived)  # checked data: the checking child passed all of it


def _with_traces_cut(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with each device's trace cut to its first entry (what a reader of the
    snapshot's facts looks at: ``core.sim.trace.guess_torch_version`` reads its keys), and
    :data:`TRACES_CUT_KEY` giving each trace's length: what the parent of the deriving child
    keeps, the decoded trace standing for the entries."""
    head: dict[str, Any] = {key: value for key, value in snapshot.items() if key != "device_traces"}
    traces: object = snapshot.get("device_traces")  # unchecked yet: the checks run beside this
    if isinstance(traces, list):
        listed: list[object] = traces
        head["device_traces"] = [trace[:1] if isinstance(trace, list) else trace for trace in listed]
        head[TRACES_CUT_KEY] = [len(trace) if isinstance(trace, list) else 0 for trace in listed]
    return cast(Snapshot, head)


def trace_cut(snapshot: Mapping[str, Any], device: int | None) -> bool:
    """Whether :func:`load_snapshot_deriving` left entries of ``device``'s trace (any
    device's: None) in the child that decoded them, its ``derived`` standing for them."""
    lengths = snapshot.get(TRACES_CUT_KEY)
    if not isinstance(lengths, list):
        return False
    counts = lengths if device is None else lengths[device:device + 1] if device >= 0 else []
    return any(isinstance(n, int) and n > 1 for n in counts)


def large_snapshot_note(size_bytes: int) -> str | None:
    """Say why a big snapshot file may be a problem, or ``None`` when it is not big.

    Loading it here works (it is plain data); the browser viewer is what struggles.
    """
    if size_bytes <= LARGE_SNAPSHOT_BYTES:
        return None
    return (
        f"this snapshot is {format_bytes(size_bytes)}: pytorch.org/memory_viz can crash "
        "the browser on files over 1 GiB (pytorch/pytorch PR #176290). Record fewer events "
        "(_record_memory_history(max_entries=...)) or view it with a desktop tool "
        "such as SnapViewer"
    )


# ----------------------------------------------------------------- helpers


def devices_in(snapshot: Snapshot) -> list[int]:
    """Devices the snapshot says anything about: with segments or with trace events.

    This matches the device list pytorch.org/memory_viz offers, so users see the
    same devices in both tools.
    """
    found = {seg.get("device", 0) for seg in snapshot["segments"]}
    for index, trace in enumerate(snapshot.get("device_traces") or []):
        if trace:
            found.add(index)
    return sorted(found)


def has_trace(snapshot: Snapshot) -> bool:
    """Whether allocation history was recorded (needed for replay and timelines)."""
    return any(trace for trace in snapshot.get("device_traces") or [])


def allocator_settings(snapshot: Mapping[str, Any]) -> dict[str, Any] | None:
    """The effective allocator settings torch recorded (2.3+), or ``None`` for older snapshots.

    This is the only reliable read-back of what the allocator actually used.
    """
    settings = snapshot.get("allocator_settings")
    return dict(settings) if isinstance(settings, dict) else None


def requested_size_of(block: SnapshotBlock) -> int:
    """Bytes the caller asked for, read the way ``torch.cuda._memory_viz._block_extra`` does.

    Snapshots from 2.1+ carry ``frames`` and ``requested_size``; 2.0 blocks keep
    the requested size as ``history[0]["real_size"]``. When neither is there the
    block's own size is the best figure (no rounding loss can be shown).
    """
    size = block["size"]
    if "frames" in block:
        return block.get("requested_size", size)
    history = block.get("history")
    if history:
        return history[0].get("real_size", size)
    return block.get("requested_size", size)


def segment_type_of(segment: Segment) -> str:
    """``"large"`` or ``"small"``; inferred from the size for 2.0 snapshots that lack the key.

    Classic small-pool segments are exactly ``kSmallBuffer`` and large-pool ones at least
    ``kMinLargeAlloc``, so the size tells them apart when the key is missing.
    """
    kind = segment.get("segment_type")
    if isinstance(kind, str):
        return kind
    return "small" if segment["total_size"] <= _SMALL_SEGMENT_MAX else "large"


def pool_id_of(segment: Segment) -> tuple[int, int]:
    """The private pool owning the segment; ``(0, 0)`` is the default pool (also before 2.1)."""
    pool = segment.get("segment_pool_id")
    if pool is None:
        return (0, 0)
    first, second = pool
    return (int(first), int(second))


# ----------------------------------------------------------------- writing

_PLAIN_SCALARS = (str, int, float, bool, type(None))


def _plain_data_error(path: str, value: object) -> SnapshotError:
    return SnapshotError(
        f"cannot save the snapshot: {path or 'the snapshot'} is a {type(value).__name__}, "
        "but the memory viewers read only dicts, lists, tuples, strings, numbers, "
        "booleans and None; convert it first (e.g. int(x) for numpy integers)"
    )


def _children(value: object, path: str) -> Iterable[tuple[str, object]]:
    if type(value) is dict:
        for key, item in value.items():
            if type(key) not in (str, int):
                raise _plain_data_error(f"{path} key {key!r}", key)
            yield f"{path}[{key!r}]", item
    elif type(value) in (list, tuple):
        for index, item in enumerate(cast("list[object]", value)):
            yield f"{path}[{index}]", item


def _check_plain_data(root: object) -> None:
    """Walk the object graph once; refuse any type a viewer's unpickler cannot read."""
    seen: set[int] = set()
    stack: list[tuple[str, object]] = [("", root)]
    while stack:
        path, value = stack.pop()
        kind = type(value)
        if kind in _PLAIN_SCALARS:
            continue
        if kind not in (dict, list, tuple):
            raise _plain_data_error(path, value)
        if id(value) in seen:
            continue
        seen.add(id(value))
        stack.extend(_children(value, path))


def _for_viewer(snapshot: Snapshot) -> dict[str, Any]:
    """A shallow copy with a ``device_traces`` list long enough for every device.

    MemoryViz.js iterates ``device_traces`` to list devices and fails without it.
    """
    out: dict[str, Any] = dict(snapshot)
    traces = list(out.get("device_traces") or [])
    devices = [seg.get("device", 0) for seg in snapshot["segments"]]
    needed = max(devices, default=-1) + 1
    traces.extend([] for _ in range(needed - len(traces)))
    out["device_traces"] = traces
    return out


def save_snapshot(snapshot: Snapshot, path: str | os.PathLike[str],
                  for_torch: tuple[int, int] | None = None) -> int:
    """Write a snapshot as a plain pickle that PyTorch's viewers open; returns bytes written.

    Uses pickle protocol 4, the newest that MemoryViz.js (pytorch.org/memory_viz)
    reads, and adds an empty ``device_traces`` if missing. ``for_torch`` is the
    (major, minor) of the torch whose ``python -m torch.cuda._memory_viz`` will
    open the file: torch 1.13's viewer reads the list of segments that 1.13's
    ``memory_snapshot()`` returns and crashes on the 2.x dict, so below 2.0 the
    file holds the segments alone -- unless the snapshot has a trace (one recorded under a
    newer torch, such as the bundled recordings): the file then keeps the 2.x layout, which
    pytorch.org/memory_viz and ``allocconf simulate`` read, rather than drop the trace that
    makes it replayable. A name ending in
    ``.gz`` is gzip-compressed: :func:`load_snapshot` reads that directly, but the
    viewers need it decompressed first (``gunzip``). The file is written to a
    temporary name and renamed, so a failure never leaves a truncated snapshot.

    Raises:
        SnapshotError: the snapshot holds a type the viewers cannot read, or the
            file cannot be written.
    """
    target = Path(path)
    _check_plain_data(snapshot)
    segments_only = (for_torch is not None and for_torch < (2, 0)
                     and not any(snapshot.get("device_traces") or ()))
    layout: Any = list(snapshot["segments"]) if segments_only else _for_viewer(snapshot)
    payload = pickle.dumps(layout, protocol=_VIEWER_PICKLE_PROTOCOL)
    if target.name.endswith(".gz"):
        payload = gzip.compress(payload, mtime=0)
    try:
        replace_file_atomically(target, payload)
    except OSError as exc:  # NotRegularFileError (a FIFO, a device) among them
        raise SnapshotError(f"cannot write snapshot file {os.fspath(path)!r}: {exc}") from exc
    return len(payload)
