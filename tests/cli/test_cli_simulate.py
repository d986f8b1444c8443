"""``python -m allocconf_widget simulate``, run for real in a subprocess."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.simulator import simulate
from allocconf_widget.core.sim.trace.codes import SEG_NAMES
from allocconf_widget.core.versions import TorchVersion
from tests.trace_builder import TraceBuilder

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
READBACK = {
    "PYTORCH_CUDA_ALLOC_CONF": "",
    "max_split_size": -1,
    "garbage_collection_threshold": 0.0,
    "expandable_segments": False,
    "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)},
}


def _simulate_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "allocconf_widget", "simulate", *map(str, args)],
        capture_output=True, text=True, timeout=300, check=False, cwd=REPO, env=env,
    )


def _workload() -> TraceBuilder:
    """A small training-like loop whose batch size varies (fragmentation-prone)."""
    b = TraceBuilder(reuse_addresses=True)
    weights = [b.alloc(n * MiB) for n in (16, 16, 64, 3)]
    for step in range(30):
        batch = 20 + (step * 7) % 13
        acts = [b.alloc(batch * k * 256 * 1024) for k in (1, 3, 5, 2)]
        tmp = b.alloc(batch * 40_000)
        b.free(tmp)
        for a in reversed(acts):
            b.free(a)
    assert weights
    return b


def _recorded_snapshot(b: TraceBuilder) -> dict[str, Any]:
    """The snapshot torch (as modelled) would write: segment events in the trace."""
    result = simulate(b.build(), SimSettings(torch_version=TorchVersion(2, 11)), record_segments=True)
    by_index: dict[int, list[dict[str, Any]]] = {}
    for idx, kind, addr, size in result.segment_events:
        by_index.setdefault(idx, []).append(
            {"action": SEG_NAMES[kind], "addr": addr, "size": size, "stream": 0}
        )
    entries: list[dict[str, Any]] = []
    for idx, entry in enumerate(b.entries):
        entries.extend(by_index.get(idx, ()))
        entries.append(entry)
    return {"segments": [], "device_traces": [entries], "allocator_settings": READBACK}


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "trace.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps(_recorded_snapshot(_workload()))))
    return path


def test_no_conf_replays_recorded_settings_with_self_check(trace_file: Path) -> None:
    result = _simulate_cli(trace_file, "--torch-version", "2.11", "--no-rank")
    assert result.returncode == 0, result.stderr
    assert "self-check" in result.stdout
    assert "reproduced (100.0%)" in result.stdout
    assert "peak reserved matches" in result.stdout
    assert "recorded:" in result.stdout


def test_json_has_one_object_per_conf_in_order(trace_file: Path) -> None:
    confs = ["expandable_segments:True", "max_split_size_mb:128", ""]
    args: list[str] = ["--torch-version", "2.11", "--json", "--no-rank"]
    for c in confs:
        args += ["--conf", c]
    result = _simulate_cli(trace_file, *args)
    assert result.returncode == 0, result.stderr
    docs = json.loads(result.stdout)
    assert [d["conf"] for d in docs] == confs
    for d in docs:
        for key in ("peak_reserved_bytes", "peak_allocated_bytes", "num_device_alloc",
                    "num_alloc_retries", "oom", "fidelity"):
            assert key in d
        assert d["oom"] is None
        assert d["fidelity"]["exact"] is True
    assert docs[0]["peak_reserved_bytes"] <= docs[2]["peak_reserved_bytes"]


def test_json_without_conf_describes_the_recorded_settings(trace_file: Path) -> None:
    result = _simulate_cli(trace_file, "--torch-version", "2.11", "--json", "--no-rank")
    assert result.returncode == 0, result.stderr
    (doc,) = json.loads(result.stdout)
    assert doc["conf"] == "" and doc["recorded_settings"] is True
    assert doc["fidelity"]["exact"] is True and doc["fidelity"]["checked"] is True


def test_torch_version_is_inferred_when_not_given(trace_file: Path) -> None:
    result = _simulate_cli(trace_file, "--json", "--no-rank")
    assert result.returncode == 0, result.stderr
    assert "reproduce this trace best" in result.stderr
    (doc,) = json.loads(result.stdout)
    assert doc["fidelity"]["exact"] is True


def test_device_total_with_suffix_predicts_an_oom(trace_file: Path) -> None:
    result = _simulate_cli(trace_file, "--torch-version", "2.11", "--json", "--no-rank",
                           "--device-total", "100MiB", "--conf", "")
    assert result.returncode == 0, result.stderr
    (doc,) = json.loads(result.stdout)
    assert doc["oom"] is not None
    assert doc["oom"]["event_index"] >= 0
    assert doc["device_total"] == 100 * MiB


def test_recommend_ranks_candidates(trace_file: Path) -> None:
    result = _simulate_cli(trace_file, "--torch-version", "2.11", "--recommend", "--json")
    assert result.returncode == 0, result.stderr
    docs = json.loads(result.stdout)
    assert [d["rank"] for d in docs] == list(range(1, len(docs) + 1))
    assert any(d["is_current"] for d in docs)
    assert all(d["reason"] for d in docs)
    peaks = [d["peak_reserved_bytes"] for d in docs]
    assert peaks == sorted(peaks)  # nothing OOMs on an unlimited device
    text = _simulate_cli(trace_file, "--torch-version", "2.11", "--recommend")
    assert text.returncode == 0 and "why:" in text.stdout and "[current]" in text.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--conf", "max_split_size_mb:1"], "too small"),
        (["--conf", "no_such_key:1"], "unknown option"),
        (["--device-total", "eighty"], "cannot read 'eighty' as a size"),
        (["--fraction", "0.5"], "total memory (--device-total)"),
        (["--torch-version", "1.9"], "outside the simulated range"),
        (["--device-total", "0"], "less than 1 MiB"),  # these three replayed "OOM at event 0"
        (["--device-total", "0.4"], "less than 1 MiB"),
        (["--device-total", "1GiB", "--non-pytorch", "2GiB"], "leaves nothing of the device's 1.00 GiB"),
        (["--workers", "0"], "--workers 0 is not a number of processes"),
        (["--workers", "-3"], "--workers -3 is not a number of processes"),
    ],
)
def test_bad_arguments_exit_2_with_a_fix(trace_file: Path, args: list[str], message: str) -> None:
    result = _simulate_cli(trace_file, "--torch-version", "2.11", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == ""


def test_snapshot_without_history_explains_how_to_record(tmp_path: Path) -> None:
    path = tmp_path / "nohistory.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}))
    result = _simulate_cli(path)
    assert result.returncode == 2
    assert "_record_memory_history(max_entries=1_000_000)" in result.stderr


@pytest.mark.parametrize("content", [b"not a pickle at all", b""])
def test_unreadable_files_exit_2(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.pickle"
    path.write_bytes(content)
    result = _simulate_cli(path)
    assert result.returncode == 2
    assert "error:" in result.stderr


def test_truncated_file_exit_2(tmp_path: Path, trace_file: Path) -> None:
    raw = gzip.decompress(trace_file.read_bytes())
    path = tmp_path / "cut.pickle"
    path.write_bytes(raw[: len(raw) // 2])
    result = _simulate_cli(path)
    assert result.returncode == 2
    assert "truncated" in result.stderr


def test_missing_file_exit_2(tmp_path: Path) -> None:
    result = _simulate_cli(tmp_path / "nope.pickle")
    assert result.returncode == 2
    assert "nope.pickle" in result.stderr


def test_mid_run_recording_says_the_replay_starts_from_its_recorded_state() -> None:
    # GIVEN a notebook recording (the model existed before recording began)
    nb = REPO / "tests" / "data" / "transformer_nb__default.pickle.gz"
    result = _simulate_cli(nb, "--torch-version", "2.11", "--conf", "max_split_size_mb:128")
    assert result.returncode == 0, result.stderr
    assert "start: the replay starts from the allocator state recorded when the trace began " \
           "(41 segments, 1.43 GiB reserved" in result.stdout
    assert "starts from a recorded allocator state" in result.stdout
    doc = json.loads(_simulate_cli(nb, "--torch-version", "2.11", "--json").stdout)[0]
    assert doc["initial_state"] == {"source": "recorded", "reserved_bytes": 1_530_920_960,
                                    "allocated_bytes": doc["initial_state"]["allocated_bytes"]}
    assert doc["peak_reserved_bytes"] == 1_530_920_960  # the real window peak: no new segment


def test_a_fraction_the_run_was_not_made_under_leaves_the_self_check_as_recorded(trace_file: Path) -> None:
    """``--fraction`` below what the recording reserved is a what-if: every row runs under the
    limit, the self-check replays the run as it was (it said LOW CONFIDENCE, "the replay
    reserves less than the real run did", of a model that reproduces the run exactly)."""
    result = _simulate_cli(trace_file, "--torch-version", "2.11", "--device-total", "1GiB",
                           "--fraction", "0.05", "--conf", "garbage_collection_threshold:0.6")
    assert result.returncode == 0, result.stderr
    assert "ran without that limit, so the self-check replays it as it was" in result.stderr
    assert "GC does nothing" not in result.stderr + result.stdout
    assert "peak reserved matches" in result.stdout and "LOW CONFIDENCE" not in result.stdout
    docs = json.loads(_simulate_cli(trace_file, "--torch-version", "2.11", "--device-total", "1GiB",
                                    "--fraction", "0.05", "--json", "--no-rank").stdout)
    (doc,) = docs
    assert doc["fidelity"]["exact"] is True
    assert doc["peak_reserved_bytes"] <= int(0.05 * 1024 * MiB)  # the row itself is limited


def test_a_fraction_the_run_fits_under_is_the_self_checks_too(trace_file: Path) -> None:
    result = _simulate_cli(trace_file, "--torch-version", "2.11", "--device-total", "1GiB",
                           "--fraction", "0.9")
    assert result.returncode == 0, result.stderr
    assert "ran without that limit" not in result.stderr
    assert "peak reserved matches" in result.stdout


def test_a_non_pytorch_size_without_a_device_total_is_said_to_be_unused(trace_file: Path) -> None:
    result = _simulate_cli(trace_file, "--torch-version", "2.11", "--non-pytorch", "500MiB")
    assert result.returncode == 0, result.stderr
    assert "the memory outside PyTorch (500.00 MiB) is not used" in result.stderr


def _on_a_terminal(*args: str | Path) -> tuple[int, str, str]:
    """The CLI with its stderr on a pseudo-terminal (what a person at a shell has); stdout piped.
    Returns the exit code, stdout, and everything the terminal was sent."""
    import pty
    import select

    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "allocconf_widget", "simulate", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=follower, cwd=REPO, env=env, text=True)
    os.close(follower)
    sent = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            proc.kill()
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the last holder of the terminal ended (EIO on Linux)
            break
        if not chunk:
            break
        sent += chunk
    out = proc.stdout.read() if proc.stdout is not None else ""
    os.close(leader)
    return proc.wait(timeout=60), out, sent.decode("utf-8", "replace")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pseudo-terminal as Linux has it")
def test_a_terminal_sees_how_far_the_replays_have_got_and_then_a_clean_report(trace_file: Path) -> None:
    code, out, terminal = _on_a_terminal(trace_file, "--conf", "", "--conf", "expandable_segments:True",
                                         "--workers", "1", "--no-rank")
    assert code == 0, terminal
    assert "reading trace.pickle.gz" in terminal
    import re

    counts = [(int(d), int(t)) for d, t in re.findall(r"replaying: (\d+) of (\d+) settings done", terminal)]
    total = counts[-1][1]  # the two settings and the recorded one's self-check
    assert total == 3 and counts == [(d, total) for d in range(1, total + 1)], counts
    # the line is wiped before the notes: nothing of it is left on the screen
    assert "replaying" not in terminal.rsplit("\x1b[K", 1)[-1] and "note:" in terminal.rsplit("\x1b[K", 1)[-1]
    assert "\r" not in out and "expandable_segments:True" in out  # the report itself is untouched


def test_a_pipe_or_a_log_gets_no_progress_line(trace_file: Path) -> None:
    result = _simulate_cli(trace_file, "--conf", "expandable_segments:True")
    assert result.returncode == 0, result.stderr
    assert "replaying" not in result.stderr and "\r" not in result.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pseudo-terminal as Linux has it")
def test_ctrl_c_during_the_replays_ends_with_one_line(tmp_path: Path) -> None:
    """Ctrl-C at a terminal (SIGINT to the whole foreground group: the command and its worker
    processes) while the replays run: exit 130 and one line, no traceback from any process."""
    import pty
    import select
    import signal
    import time

    b = TraceBuilder(reuse_addresses=True)
    for step in range(40_000):  # long enough that the replays are still running when it comes
        kept = b.alloc((step % 13 + 1) * MiB)
        b.free(b.alloc((step % 7 + 2) * MiB))
        b.free(kept)
    path = tmp_path / "long.pickle"
    path.write_bytes(pickle.dumps(b.snapshot(), protocol=4))
    leader, follower = pty.openpty()

    # started as a shell starts a command, with Ctrl-C's default action: a test runner started in
    # the background by a script (CI's lanes) has SIGINT ignored, an ignored signal stays ignored
    # across exec, and Python then installs no KeyboardInterrupt handler (the run went on: exit 0).
    # A handled signal is reset to its default by exec, so handle it here for the moment of the start.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "allocconf_widget", "simulate", str(path),
                                 "--recommend", "--workers", "2"], stdout=subprocess.DEVNULL, stderr=follower,
                                cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, before)
    os.close(follower)
    sent = b""
    deadline = time.monotonic() + 120
    # after the first setting is back: the pool's processes are forked by then (a Ctrl-C during
    # a fork is swallowed by CPython's at-fork hooks, "Exception ignored", and the run goes on)
    while b"replaying: 1 of" not in sent and time.monotonic() < deadline:
        if select.select([leader], [], [], 1)[0]:
            sent += os.read(leader, 65536)
    assert b"replaying: 1 of" in sent, sent.decode("utf-8", "replace")
    os.killpg(proc.pid, signal.SIGINT)
    while True:
        if not select.select([leader], [], [], 60)[0]:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        sent += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 130
    text = sent.decode("utf-8", "replace")
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-2000:]
    # the progress line is wiped, then the one line is said
    assert text.rsplit("\x1b[K", 1)[-1].strip() == "allocconf: interrupted", text[-500:]


def test_ctrl_c_while_the_command_starts_is_one_line_too(monkeypatch, capsys) -> None:
    """A Ctrl-C in the command's first tenth of a second landed while the parser was built,
    outside the handler's ``try``: a traceback through ``build_parser``. Raised there here."""
    from allocconf_widget.views.cli import main as cli

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["simulate", "x.pickle"]) == cli.INTERRUPTED
    err = capsys.readouterr().err
    assert err == "allocconf: interrupted\n", err
