"""Hostile snapshot files: pickle bombs and wrong shapes, built small and fast for the tests.

Each builder returns the bytes of a file an attacker (or an unlucky user) could hand to
``allocconf report`` / ``simulate`` / ``%allocconf simulate FILE``.
"""

from __future__ import annotations

import copy
import gzip
import pickle
import zlib
from collections.abc import Callable

MiB = 1 << 20


def deep_nesting(depth: int = 100_000) -> bytes:
    """A ~200 KB list nested ``depth`` levels (EMPTY_LIST pushes, then APPENDs)."""
    return b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."


def billion_laughs(levels: int = 30, fan: int = 10) -> bytes:
    """~300 bytes whose memo-shared lists expand to fan**levels elements."""
    node: list[object] = ["lol"]
    for _ in range(levels):
        node = [node] * fan
    return pickle.dumps({"segments": [], "device_traces": [node]}, protocol=4)


def memo_fan_out(n: int = 100_000) -> bytes:
    """n segments sharing one n-block list: 10¹⁰ block visits from a few hundred KB."""
    blocks = [{"size": 512, "state": "active_allocated", "address": 0}] * n
    segment = {"address": 0, "total_size": 512 * n, "blocks": blocks, "device": 0, "stream": 0}
    return pickle.dumps({"segments": [segment] * n}, protocol=4)


def gzip_bomb(expanded: int = 1024 * MiB) -> bytes:
    """A few MB of gzip that expands to ``expanded`` bytes of zeros."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(16 * MiB)
    parts = [deflate.compress(zeros) for _ in range(expanded // len(zeros))]
    parts.append(deflate.flush())
    return b"".join(parts)


def deep_tuple_key(depth: int = 200_000) -> bytes:
    """~200 KB: a dict whose key is a tuple nested ``depth`` levels (TUPLE1 over and over).
    Hashing that key while unpickling overflows the C stack: the interpreter crashes."""
    return b"\x80\x04}N" + b"\x85" * depth + b"K\x01s."


def memo_index(index: int = 0x10000000) -> bytes:
    """9 bytes: store into memo slot ``index``; the C unpickler grows its memo table to it
    (4 GiB at 2**28)."""
    return b"\x80\x02]r" + index.to_bytes(4, "little") + b"."


def dup_run(count: int = 120 * MiB) -> bytes:
    """~120 KB of gzip: ``count`` DUP opcodes, 8 bytes of unpickler stack each."""
    return gzip.compress(b"\x80\x04]" + b"2" * count + b".", 9)


def gzip_members(size: int = 4 * MiB) -> bytes:
    """``size`` bytes of empty gzip members joined together (each copy of the rest of the
    input per member once made this quadratic)."""
    member = gzip.compress(b"")
    return member * (size // len(member))


def _valid() -> dict[str, object]:
    block = {"size": 2 * MiB, "requested_size": 2 * MiB, "address": 1 << 40,
             "state": "active_allocated", "frames": []}
    segment = {"address": 1 << 40, "total_size": 2 * MiB, "allocated_size": 2 * MiB,
               "active_size": 2 * MiB, "requested_size": 2 * MiB, "device": 0, "stream": 0,
               "segment_type": "large", "segment_pool_id": (0, 0), "blocks": [block],
               "frames": []}
    trace = [{"action": "segment_alloc", "addr": 1 << 40, "size": 2 * MiB, "stream": 0,
              "time_us": 1, "frames": []},
             {"action": "alloc", "addr": 1 << 40, "size": 2 * MiB, "stream": 0, "time_us": 2,
              "frames": []}]
    return {"segments": [segment], "device_traces": [trace],
            "allocator_settings": {"max_split_size": -1, "garbage_collection_threshold": 0.0,
                                   "large_segment_size": 20 * MiB, "expandable_segments": False}}


def _mutated(path: tuple[object, ...], value: object) -> Callable[[], bytes]:
    def build() -> bytes:
        snap = copy.deepcopy(_valid())
        target: object = snap
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return pickle.dumps(snap, protocol=4)
    return build


WRONG_SHAPES: dict[str, Callable[[], bytes]] = {
    "requested_size None": _mutated(("segments", 0, "blocks", 0, "requested_size"), None),
    "history 5": _mutated(("segments", 0, "blocks", 0, "history"), 5),
    "address hex string": _mutated(("segments", 0, "address"), "0x7f00"),
    "address None": _mutated(("segments", 0, "address"), None),
    "max_split_size inf": _mutated(("allocator_settings", "max_split_size"), float("inf")),
    "large_segment_size -2": _mutated(("allocator_settings", "large_segment_size"), -2),
    "action a list": _mutated(("device_traces", 0, 1, "action"), ["alloc"]),
    "size 2**64": _mutated(("device_traces", 0, 1, "size"), 2**64),
    "time_us inf": _mutated(("device_traces", 0, 1, "time_us"), float("inf")),
    "junk initial segments": _mutated(("allocconf_initial_segments",), {"a": 1}),
    "junk initial segment": _mutated(("allocconf_initial_segments",), [5]),
    "segments a dict": _mutated(("segments",), {"0": 1}),
    "trace a dict": _mutated(("device_traces",), [{"0": 1}]),
    "block size negative": _mutated(("segments", 0, "blocks", 0, "size"), -5),
    "size a float": _mutated(("device_traces", 0, 1, "size"), 1.5),
    "frames a string": _mutated(("device_traces", 0, 1, "frames"), "x" * 100),
    # field ranges at the door (issue 22, item 12): each passed the type check before
    "max_split_size 0": _mutated(("allocator_settings", "max_split_size"), 0),
    "max_split_size 0.5": _mutated(("allocator_settings", "max_split_size"), 0.5),
    "max_split_size 7 bytes": _mutated(("allocator_settings", "max_split_size"), 7),
    "large_segment_size 0": _mutated(("allocator_settings", "large_segment_size"), 0),
    "gc threshold 7": _mutated(("allocator_settings", "garbage_collection_threshold"), 7),
    "gc threshold 1": _mutated(("allocator_settings", "garbage_collection_threshold"), 1.0),
    "fraction 2": _mutated(("allocator_settings", "per_process_memory_fraction"), 2.0),
    "expandable a string": _mutated(("allocator_settings", "expandable_segments"), "yes"),
    "roundup negative": _mutated(("allocator_settings", "roundup_power2_divisions"), [-1] * 16),
    "conf text a list": _mutated(("allocator_settings", "PYTORCH_CUDA_ALLOC_CONF"), ["x"]),
}

BOMBS: dict[str, Callable[[], bytes]] = {
    "deep nesting": deep_nesting,
    "deep tuple key": deep_tuple_key,
    "memo index": memo_index,
    "DUP run": dup_run,
    "many gzip members": gzip_members,
    "billion laughs": billion_laughs,
    "memo fan-out": memo_fan_out,
    "gzip bomb": gzip_bomb,
    "gzipped billion laughs": lambda: gzip.compress(billion_laughs()),
}


def valid_snapshot() -> bytes:
    """The file the mutations start from: it must load (a control for every case)."""
    return pickle.dumps(_valid(), protocol=4)
