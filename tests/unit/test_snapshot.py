"""Loading and saving snapshots: safe, tolerant, with messages that say what to do."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import pickletools
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest

from allocconf_widget._errors import SnapshotError
from allocconf_widget.core.memory.snapshot import (
    LARGE_SNAPSHOT_BYTES,
    allocator_settings,
    devices_in,
    has_trace,
    large_snapshot_note,
    load_snapshot,
    pool_id_of,
    requested_size_of,
    save_snapshot,
    segment_type_of,
)
from tests.snapshot_builders import MIB, block, legacy_segment, segment, snapshot

# Opcodes MemoryViz.js (pytorch.org/memory_viz) implements in its unpickler; anything
# else makes the viewer throw "UNKNOWN OPCODE".
VIEWER_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET",
    "LONG_BINGET", "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST",
    "APPEND", "APPENDS", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE",
    "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT",
    "SHORT_BINUNICODE", "BINUNICODE",
}


def _rich_snapshot() -> Any:
    seg0 = segment(block(2 * MIB, requested=2 * MIB - 100), block(18 * MIB, "inactive"))
    seg1 = segment(block(512, requested=500), kind="small", device=1, pool=(1, 2))
    trace = [{"action": "alloc", "addr": 1, "size": 3, "stream": 0, "time_us": 2**52,
              "frames": [{"filename": "x.py", "line": 3, "name": "f"}]}]
    return snapshot(seg0, seg1, traces=[trace, []],
                    settings={"expandable_segments": False, "max_split_size": -1,
                              "garbage_collection_threshold": 0.5,
                              "roundup_power2_divisions": {"1": 0, "2": 4}})


# ----------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", ["snap.pickle", "snap.pickle.gz"])
def test_saved_snapshot_loads_back_identical(tmp_path: Path, name: str) -> None:
    # GIVEN a snapshot with every kind of value torch writes (tuple pool ids, floats, big ints)
    snap = _rich_snapshot()
    # WHEN it is saved and loaded again
    path = tmp_path / name
    written = save_snapshot(snap, path)
    # THEN nothing changed and the byte count is the file size
    assert load_snapshot(path) == snap
    assert written == path.stat().st_size


def test_gz_name_is_compressed_and_plain_name_is_not(tmp_path: Path) -> None:
    snap = _rich_snapshot()
    save_snapshot(snap, tmp_path / "a.pickle.gz")
    save_snapshot(snap, tmp_path / "a.pickle")
    assert (tmp_path / "a.pickle.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert (tmp_path / "a.pickle").read_bytes()[:1] == b"\x80"


def test_saved_pickle_uses_only_what_memory_viz_js_can_read(tmp_path: Path) -> None:
    # GIVEN a saved snapshot, WHEN we list its pickle opcodes
    path = tmp_path / "snap.pickle"
    save_snapshot(_rich_snapshot(), path)
    ops = list(pickletools.genops(path.read_bytes()))
    # THEN the protocol is one the browser viewer accepts (2-4) and every opcode is known to it
    protocol = ops[0][1]
    assert ops[0][0].name == "PROTO" and isinstance(protocol, int) and 2 <= protocol <= 4
    assert {op.name for op, _arg, _pos in ops} <= VIEWER_OPCODES


def test_torch_memory_viz_cli_opens_a_saved_snapshot(tmp_path: Path) -> None:
    """The installed torch's own viewer opens what the package saves for it (1.13 reads a list)."""
    torch = pytest.importorskip("torch")
    from allocconf_widget.app.exports import viewer_torch, write_snapshot

    path = write_snapshot(snapshot(segment(block(20 * MIB, requested=19 * MIB))), tmp_path / "snap.pickle")
    result = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "stats", str(path)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    # 2.x prints total_reserved; 1.13's viewer prints total_size ('20.0MiB' in both)
    total = "total_reserved" if viewer_torch() >= (2, 0) else "'total_size'"
    assert re.search(total + r":? *20\.0MiB", result.stdout), (torch.__version__, result.stdout)
    assert load_snapshot(path)["segments"][0]["total_size"] == 20 * MIB


def test_a_snapshot_saved_for_torch_1_13_is_the_list_its_viewer_reads(tmp_path: Path) -> None:
    snap = snapshot(segment(block(MIB)), segment(block(2 * MIB)))
    path = tmp_path / "old.pickle"
    save_snapshot(snap, path, for_torch=(1, 13))
    raw = pickle.loads(path.read_bytes())
    assert isinstance(raw, list) and [s["total_size"] for s in raw] == [MIB, 2 * MIB]
    assert load_snapshot(path)["segments"] == snap["segments"]


def test_a_snapshot_with_a_trace_keeps_it_when_saved_for_torch_1_13(tmp_path: Path) -> None:
    """The bundled recordings (torch 2.11) exported from a torch 1.13 kernel: dropping their
    trace for 1.13's viewer left a file `allocconf simulate` refused ("no allocation history")."""
    snap: Any = dict(snapshot(segment(block(MIB))))
    snap["device_traces"] = [[{"action": "alloc", "addr": 1 << 40, "size": MIB, "stream": 0}]]
    path = tmp_path / "recorded.pickle"
    save_snapshot(snap, path, for_torch=(1, 13))
    assert load_snapshot(path)["device_traces"] == snap["device_traces"]


def test_save_adds_device_traces_the_viewer_needs_without_touching_the_input(
    tmp_path: Path,
) -> None:
    # GIVEN segments on devices 0 and 2 and no device_traces (memory_snapshot() style)
    snap: Any = {"segments": [segment(block(MIB)), segment(block(MIB), device=2)]}
    path = tmp_path / "s.pickle"
    save_snapshot(snap, path)
    # THEN the viewer finds a trace list for every device, and the caller's dict is unchanged
    assert load_snapshot(path)["device_traces"] == [[], [], []]
    assert "device_traces" not in snap


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        ({1, 2}, "set"),
        (b"raw", "bytes"),
        (type("NumpyLikeInt", (int,), {})(3), "NumpyLikeInt"),
    ],
)
def test_save_refuses_values_the_viewers_cannot_read(tmp_path: Path, bad: object, where: str) -> None:
    snap = snapshot(segment(block(MIB)))
    snap["segments"][0]["blocks"][0]["frames"] = [{"line": bad}]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(SnapshotError, match=where) as info:
        save_snapshot(snap, out_dir / "s.pickle")
    assert "['segments'][0]['blocks'][0]['frames'][0]['line']" in str(info.value)
    assert list(out_dir.iterdir()) == []  # neither the file nor a temporary one


def test_failed_save_keeps_the_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "s.pickle"
    save_snapshot(snapshot(segment(block(MIB))), path)
    before = path.read_bytes()
    not_plain: Any = {"segments": [{"total_size": {1}, "blocks": []}]}
    with pytest.raises(SnapshotError):
        save_snapshot(not_plain, path)
    assert path.read_bytes() == before


def test_save_into_missing_directory_says_so(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="cannot write snapshot file"):
        save_snapshot(snapshot(), tmp_path / "nope" / "s.pickle")


def test_load_accepts_bytes_file_objects_and_bare_segment_lists() -> None:
    segs = [segment(block(MIB))]
    data = pickle.dumps(segs)
    assert load_snapshot(data) == {"segments": segs}
    assert load_snapshot(io.BytesIO(gzip.compress(data))) == {"segments": segs}


def test_load_refuses_text_mode_file_objects() -> None:
    with pytest.raises(SnapshotError, match="'rb'"):
        load_snapshot(cast(Any, io.StringIO("x")))


def test_big_snapshots_get_a_viewer_warning_but_small_ones_do_not() -> None:
    assert large_snapshot_note(LARGE_SNAPSHOT_BYTES) is None
    note = large_snapshot_note(3 * LARGE_SNAPSHOT_BYTES // 2)
    assert note is not None and "1.50 GiB" in note and "max_entries" in note


# ----------------------------------------------------------------- refusing unsafe pickles


class _OpensFile:
    """Unpickling this with the standard unpickler creates ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


class _RunsShell:
    """Unpickling this with the standard unpickler runs ``touch path`` through os.system."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def _wrapped(payload: object) -> Any:
    # Malicious object hidden inside an otherwise valid snapshot.
    snap = snapshot(segment(block(MIB)))
    snap["segments"][0]["blocks"][0]["frames"] = [payload]
    return snap


def test_malicious_fixture_really_creates_the_file_when_loaded_naively(tmp_path: Path) -> None:
    # Control: proves the payload below is live, so the refusal tests mean something.
    marker = tmp_path / "created"
    data = pickle.dumps(_wrapped(_OpensFile(str(marker))))
    code = "import pickle,sys; pickle.loads(sys.stdin.buffer.read())"
    subprocess.run([sys.executable, "-c", code], input=data, check=True, timeout=60)
    assert marker.exists()


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("payload_type", [_OpensFile, _RunsShell])
def test_pickles_naming_functions_are_refused_and_never_run(
    tmp_path: Path, protocol: int, payload_type: type
) -> None:
    marker = tmp_path / "created"
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps(_wrapped(payload_type(str(marker))), protocol=protocol))
    with pytest.raises(SnapshotError, match=r"refused to load .*(open|system)") as info:
        load_snapshot(path)
    assert "Nothing in the file was executed" in str(info.value)
    assert not marker.exists()


def test_gzipped_malicious_pickle_is_refused_too(tmp_path: Path) -> None:
    marker = tmp_path / "created"
    path = tmp_path / "evil.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps(_wrapped(_RunsShell(str(marker))))))
    with pytest.raises(SnapshotError, match="refused"):
        load_snapshot(path)
    assert not marker.exists()


def test_handwritten_protocol0_global_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "created"
    evil = f"cos\nsystem\n(Vtouch {marker}\ntR.".encode()
    with pytest.raises(SnapshotError, match=r"refused to load os\.system|posix\.system"):
        load_snapshot(evil)
    assert not marker.exists()


# ----------------------------------------------------------------- broken files


def _valid_bytes() -> bytes:
    return pickle.dumps(_rich_snapshot(), protocol=4)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "empty \\(0 bytes\\)"),
        (_valid_bytes()[: len(_valid_bytes()) // 2], "truncated"),
        (gzip.compress(_valid_bytes())[:-40], "truncated"),
        (gzip.compress(b""), "contains nothing"),
        (b"just some text", "not a readable pickle"),
        (b"<!DOCTYPE html><html>", "HTML page"),
        (b'{"segments": []}', "JSON"),
        (b"PK\x03\x04 zip archive data", "zip archive"),
        (pickle.dumps(42), "holds 'int' data"),
        (pickle.dumps({"device_traces": []}), "no 'segments' list"),
        (pickle.dumps({"allocated_bytes.all.current": 1}), "memory_stats"),
        (pickle.dumps({"segments": [{"blocks": []}]}), "segment 0 has no integer 'total_size'"),
        (pickle.dumps({"segments": [{"total_size": 1}]}), "segment 0 has no 'blocks' list"),
        (
            pickle.dumps({"segments": [{"total_size": 1, "blocks": [{"size": 1}]}]}),
            "block 0 of segment 0 has no 'state'",
        ),
        (
            pickle.dumps({"segments": [{"total_size": 1, "blocks": [], "segment_pool_id": (1,)}]}),
            "segment 0 has a 'segment_pool_id' that is not a pair",
        ),
    ],
    ids=[
        "empty", "truncated", "truncated-gzip", "empty-gzip", "text", "html", "json", "zip",
        "int", "no-segments", "memory-stats", "no-total-size", "no-blocks", "no-state",
        "bad-pool-id",
    ],
)
def test_broken_inputs_get_a_message_saying_what_is_wrong(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    path = tmp_path / "broken.pickle"
    path.write_bytes(content)
    with pytest.raises(SnapshotError, match=expected) as info:
        load_snapshot(path)
    message = str(info.value)
    assert "broken.pickle" in message or "pickle" in message


def test_corrupt_gzip_is_reported_as_corrupt(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(_valid_bytes()))
    data[len(data) // 2 : len(data) // 2 + 32] = b"\xff" * 32
    path = tmp_path / "c.pickle.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match=r"gzip-compressed .* (corrupt|truncated)"):
        load_snapshot(path)


def test_missing_file_and_directory_say_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match=r"does not exist.*_dump_snapshot"):
        load_snapshot(tmp_path / "missing.pickle")
    with pytest.raises(SnapshotError, match="is a directory"):
        load_snapshot(tmp_path)


# ----------------------------------------------------------------- helpers


def test_devices_in_covers_trace_only_devices() -> None:
    snap = snapshot(segment(block(MIB)), segment(block(MIB), device=1),
                    traces=[[], [], [{"action": "alloc", "addr": 1, "size": 1}]])
    # device 2 has only trace events: the viewer lists it, so do we
    assert devices_in(snap) == [0, 1, 2]


def test_has_trace_and_allocator_settings() -> None:
    bare = snapshot(segment(block(MIB)))
    assert not has_trace(bare)
    assert allocator_settings(bare) is None
    rich = _rich_snapshot()
    assert has_trace(rich)
    settings = allocator_settings(rich)
    assert settings is not None and settings["max_split_size"] == -1


def test_requested_size_reads_legacy_history_like_torch() -> None:
    assert requested_size_of(block(1024, requested=1000)) == 1000
    assert requested_size_of(block(1024, requested=900, legacy=True)) == 900
    assert requested_size_of({"size": 1024, "state": "inactive"}) == 1024


def test_legacy_segments_get_default_pool_and_inferred_type() -> None:
    small = legacy_segment(block(2 * MIB, legacy=True))
    large = legacy_segment(block(20 * MIB, legacy=True))
    assert pool_id_of(small) == (0, 0)
    assert segment_type_of(small) == "small"
    assert segment_type_of(large) == "large"
