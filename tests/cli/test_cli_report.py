"""``python -m allocconf_widget report``, run for real in a subprocess."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from allocconf_widget.core.memory.snapshot import save_snapshot
from tests.snapshot_builders import MIB, block, segment, snapshot

REPO = Path(__file__).resolve().parents[2]
RECORDED = sorted((REPO / "tests" / "data").glob("*.pickle.gz"))


def _report(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "allocconf_widget", "report", *map(str, args)],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO, env=env,
    )


@pytest.fixture
def two_device_snapshot(tmp_path: Path) -> Path:
    # device 0: a 60 MiB large segment (40 MiB allocated, 20 MiB free in two 10 MiB holes)
    #           and a 2 MiB small segment with one 512-byte tensor
    # device 1: one fully allocated 20 MiB segment
    snap = snapshot(
        segment(block(10 * MIB, "inactive"), block(20 * MIB, requested=19 * MIB),
                block(10 * MIB, "inactive"), block(20 * MIB)),
        segment(block(512, requested=100), block(2 * MIB - 512, "inactive"), kind="small"),
        segment(block(20 * MIB), device=1),
        settings={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False", "max_split_size": -1,
                  "expandable_segments": False},
    )
    path = tmp_path / "two.pickle.gz"
    save_snapshot(snap, path)
    return path


def test_text_report_shows_each_device_and_pool(two_device_snapshot: Path) -> None:
    result = _report(two_device_snapshot)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "device 0" in out and "device 1" in out
    assert "default/large" in out and "default/small" in out
    assert "max_split_size=unlimited" in out
    reserved = next(line for line in out.splitlines() if line.strip().startswith("reserved"))
    assert "62.00 MiB" in reserved  # device 0 total: 60 MiB large + 2 MiB small
    frag = next(line for line in out.splitlines() if "external fragmentation" in line)
    assert "50.0%" in frag  # two equal 10 MiB holes in default/large


def test_json_report_uses_the_documented_structure(two_device_snapshot: Path) -> None:
    result = _report(two_device_snapshot, "--json")
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    assert list(doc) == ["devices"]
    assert sorted(doc["devices"]) == ["0", "1"]
    dev0 = doc["devices"]["0"]
    assert sorted(dev0["pools"]) == ["default/large", "default/small"]
    large = dev0["pools"]["default/large"]
    assert large["reserved_bytes"] == 60 * MIB
    assert large["allocated_bytes"] == 40 * MIB
    assert large["inactive_bytes"] == 20 * MIB
    assert large["largest_free_block_bytes"] == 10 * MIB
    assert large["external_fragmentation"] == 0.5
    assert large["internal_fragmentation_bytes"] == MIB
    assert large["segsum_allocated_bytes"] == 39 * MIB
    assert dev0["total"]["segment_count"] == 2
    assert "segments" not in dev0["total"]  # per-segment detail only on request
    assert doc["devices"]["1"]["total"]["external_fragmentation"] == 0


def test_json_segments_and_device_filter(two_device_snapshot: Path) -> None:
    result = _report(two_device_snapshot, "--json", "--segments", "--device", "0")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert list(doc["devices"]) == ["0"]
    segs = doc["devices"]["0"]["total"]["segments"]
    fills = sorted((s["pool"], round(s["fill"], 4)) for s in segs)
    assert fills == [("default/large", round(40 / 60, 4)), ("default/small", round(512 / (2 * MIB), 4))]


def test_text_segments_listing(two_device_snapshot: Path) -> None:
    result = _report(two_device_snapshot, "--segments", "--device", "1")
    assert result.returncode == 0, result.stderr
    assert "device 0" not in result.stdout
    assert "100.0%" in result.stdout  # the fully allocated segment


def test_unknown_device_is_an_error_listing_the_devices(two_device_snapshot: Path) -> None:
    result = _report(two_device_snapshot, "--device", "7")
    assert result.returncode == 2
    assert "device 7 has no segments" in result.stderr and "0, 1" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "does not exist"),
        (b"", "empty"),
        (b"hello, I am text", "not a readable pickle"),
        (pickle.dumps({"cats": 3}), "not a memory snapshot"),
    ],
    ids=["missing", "empty", "text", "not-snapshot"],
)
def test_bad_files_exit_2_with_a_helpful_message(
    tmp_path: Path, content: bytes | None, expected: str
) -> None:
    path = tmp_path / "bad.pickle"
    if content is not None:
        path.write_bytes(content)
    result = _report(path)
    assert result.returncode == 2
    assert result.stderr.startswith("allocconf report: error:")
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_malicious_snapshot_is_refused_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "x": _Evil(str(marker))}))
    result = _report(path, "--json")
    assert result.returncode == 2
    assert "refused to load" in result.stderr
    assert not marker.exists()


def test_snapshot_without_segments_reports_that(tmp_path: Path) -> None:
    path = tmp_path / "empty.pickle"
    save_snapshot(snapshot(), path)
    text = _report(path)
    assert text.returncode == 0 and "no segments" in text.stdout
    assert json.loads(_report(path, "--json").stdout) == {"devices": {}}


@pytest.mark.skipif(not RECORDED, reason="no recorded GPU snapshots in tests/data yet")
def test_report_on_a_recorded_gpu_snapshot() -> None:
    result = _report(RECORDED[0], "--json")
    assert result.returncode == 0, result.stderr
    total = json.loads(result.stdout)["devices"]["0"]["total"]
    assert total["reserved_bytes"] == (
        total["segsum_allocated_bytes"] + total["segsum_internal_free_bytes"]
        + total["segsum_external_free_bytes"]
    )


def test_help_lists_the_options() -> None:
    result = _report("--help")
    assert result.returncode == 0
    for option in ("--json", "--device", "--segments", "SNAPSHOT"):
        assert option in result.stdout
