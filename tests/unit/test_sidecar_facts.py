"""A recording's JSON sidecar is optional and untrusted: it can only add facts, never fail a replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocconf_widget.core.memory.recording import SIDECAR_MAX_BYTES, SidecarFacts, read_sidecar


def sidecar_facts(snapshot: Path) -> SidecarFacts | None:
    return read_sidecar(snapshot).facts

GIB = 1 << 30


def _pair(tmp_path: Path, text: str | bytes) -> Path:
    snapshot = tmp_path / "run.pickle.gz"
    snapshot.write_bytes(b"not read here")
    sidecar = tmp_path / "run.json"
    if isinstance(text, bytes):
        sidecar.write_bytes(text)
    else:
        sidecar.write_text(text)
    return snapshot


def test_a_recordings_sidecar_gives_the_device_and_the_torch(tmp_path: Path) -> None:
    meta = {"device_total_bytes": 150 * GIB, "free_at_start_bytes": 149 * GIB, "torch": "2.11.0+cu130"}
    facts = sidecar_facts(_pair(tmp_path, json.dumps(meta)))
    assert facts is not None and facts.path.name == "run.json"
    assert facts.device_total_bytes == 150 * GIB and facts.non_pytorch_bytes == GIB
    assert facts.torch_version == "2.11.0+cu130"


@pytest.mark.parametrize("text", [
    "{", "[1, 2]", "null", '{"device_total_bytes": "lots"}', '{"device_total_bytes": -5}',
    '{"device_total_bytes": true}', "[" * 100_000 + "]" * 100_000, b"\xff\xfe garbage",
    '{"name": "no device here"}',
], ids=["truncated", "a list", "null", "a string", "negative", "a bool", "deep nesting",
        "not utf-8", "no device"])
def test_a_bad_sidecar_is_ignored(tmp_path: Path, text: str | bytes) -> None:
    assert sidecar_facts(_pair(tmp_path, text)) is None


def test_an_oversized_sidecar_is_not_read(tmp_path: Path) -> None:
    meta = json.dumps({"device_total_bytes": 150 * GIB, "pad": "x" * SIDECAR_MAX_BYTES})
    assert sidecar_facts(_pair(tmp_path, meta)) is None


def test_no_sidecar_no_facts(tmp_path: Path) -> None:
    alone = tmp_path / "alone.pickle"
    alone.write_bytes(b"")
    assert sidecar_facts(alone) is None
