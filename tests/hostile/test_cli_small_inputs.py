"""Small CLI inputs that gave an exit code of 0 and a silent or useless answer (an attack pass,
round 18): a memory fraction that leaves nothing, an empty size, bytes that are not UTF-8 in an
allocator variable written as JSON."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from allocconf_widget.views.cli.main import main
from tests.trace_builder import TraceBuilder

MiB = 1 << 20


@pytest.fixture
def snapshot_file(tmp_path: Path) -> Path:
    b = TraceBuilder()
    b.segment("segment_alloc", 0x10000000, 20 * MiB)
    b.free(b.alloc(20 * MiB))
    path = tmp_path / "run.pickle"
    path.write_bytes(pickle.dumps(b.snapshot(), protocol=4))
    return path


@pytest.mark.parametrize("fraction", ["0", "-0", "1e-320"])
def test_a_fraction_that_leaves_nothing_is_refused(snapshot_file, capsys, fraction):
    code = main(["simulate", "--workers", "1", "--device-total", "80GB", f"--fraction={fraction}",
                 str(snapshot_file)])
    err = capsys.readouterr().err
    assert code == 2 and "leaves less than 1 MiB of the device" in err and "0.5" in err


@pytest.mark.parametrize("flag", ["--device-total", "--non-pytorch"])
def test_an_empty_size_is_an_error_not_unknown(snapshot_file, capsys, flag):
    extra = ["--device-total", "80GB"] if flag == "--non-pytorch" else []
    code = main(["simulate", "--workers", "1", *extra, f"{flag}=", str(snapshot_file)])
    assert code == 2 and "cannot read ''" in capsys.readouterr().err


def test_check_env_json_is_valid_unicode_for_a_non_utf8_variable(monkeypatch, capsys):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:\udcff")  # the byte 0xff
    main(["check", "--env", "--json"])
    out = capsys.readouterr().out
    out.encode("utf-8")  # no lone surrogate left
    doc = json.loads(out)
    assert doc["set"]["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:\\xff"
