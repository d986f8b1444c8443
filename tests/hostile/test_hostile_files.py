"""Every hostile file: exit 2 with a message, no traceback, within 5 s and 1 GiB.

Each case runs the real CLI in a fresh interpreter under an address-space limit,
for both ``report`` and ``simulate`` (the loaders every front end shares).
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from allocconf_widget.core.memory.snapshot import load_snapshot
from tests.hostile.bombs import BOMBS, WRONG_SHAPES, valid_snapshot

GiB = 1 << 30
CASES = {**BOMBS, **WRONG_SHAPES}


def _limit_memory() -> None:  # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_AS, (2 * GiB, 2 * GiB))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("hostile")
    out = {}
    for i, (name, build) in enumerate(CASES.items()):
        out[name] = folder / f"case{i}.pickle"
        out[name].write_bytes(build())
    return out


def _run_cli(*args: str) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """Run the CLI on a file; (result, CPU seconds the child used, its peak RSS), the
    loader's own checking child (core/memory/unpickle_guard.py) included.

    CPU time, not wall time: the bound is about the work a hostile file can cause, and a
    2-core CI machine running other cells stretches wall time (a hang still hits the timeout).
    """
    code = ("import resource, sys\n"
            "from allocconf_widget.views.cli.main import main\nrc = main(sys.argv[1:])\n"
            "u = resource.getrusage(resource.RUSAGE_SELF)\n"
            "c = resource.getrusage(resource.RUSAGE_CHILDREN)\n"  # the loader's checking child
            "print('MAXRSS_KIB', max(u.ru_maxrss, c.ru_maxrss),\n"
            "      u.ru_utime + u.ru_stime + c.ru_utime + c.ru_stime, file=sys.stderr)\n"
            "sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=60, check=False, preexec_fn=_limit_memory)
    usage = next((line.split()[1:] for line in done.stderr.splitlines()
                  if line.startswith("MAXRSS_KIB")), ["0", "0"])
    return done, float(usage[1]), int(usage[0]) * 1024


def test_the_unmutated_control_file_loads():
    snap = load_snapshot(valid_snapshot())
    assert len(snap["segments"]) == 1


@pytest.mark.parametrize("command", ["report", "simulate"])
@pytest.mark.parametrize("case", list(CASES))
def test_hostile_file_exits_2_with_a_message(files, case, command):
    done, seconds, rss = _run_cli(command, str(files[case]))
    assert done.returncode == 2, (done.returncode, done.stdout[-500:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr + done.stdout
    message = done.stderr.splitlines()[0] if done.stderr else ""
    assert "error:" in message and len(message) < 1500, message
    assert rss > 0, "the CLI's child process did not report what it used"
    assert seconds < 5, f"{case}: {seconds:.1f} s of CPU"
    assert rss < 1 * GiB, f"{case}: {rss / GiB:.2f} GiB"


@pytest.mark.parametrize("case", list(WRONG_SHAPES))
def test_wrong_shape_names_the_field(files, case):
    from allocconf_widget._errors import SnapshotError

    with pytest.raises(SnapshotError) as caught:
        load_snapshot(files[case])
    text = str(caught.value)
    assert "segments" in text or "device_traces" in text or "allocator_settings" in text, text


def test_limits_can_be_lifted_for_a_genuine_huge_trace(tmp_path, monkeypatch):
    import gzip
    import random

    from allocconf_widget._errors import SnapshotError

    # 3 MiB that compress about as little as a real trace; seeded, because what random bytes
    # say when unpickled depends on the bytes ("truncated" for some, "not a readable pickle" for
    # others: os.urandom made this test fail once in a while)
    path = tmp_path / "big.pickle.gz"
    path.write_bytes(gzip.compress(random.Random(23).randbytes(3 << 20)))
    monkeypatch.setenv("ALLOCCONF_MAX_SNAPSHOT_MIB", "2")
    with pytest.raises(SnapshotError, match="ALLOCCONF_MAX_SNAPSHOT_MIB"):
        load_snapshot(path)
    monkeypatch.setenv("ALLOCCONF_MAX_SNAPSHOT_MIB", "8")
    with pytest.raises(SnapshotError, match=r"not a readable pickle|not a memory snapshot") as refused:
        load_snapshot(path)  # now expanded, and refused for what it is
    assert "ALLOCCONF_MAX_SNAPSHOT_MIB" not in str(refused.value)


def test_a_gzip_bomb_is_refused_for_its_ratio_before_the_size_limit(files):
    from allocconf_widget._errors import SnapshotError

    with pytest.raises(SnapshotError, match="100-fold"):
        load_snapshot(files["gzip bomb"])


@pytest.mark.parametrize("case", ["max_split_size 0", "max_split_size 0.5", "gc threshold 7"])
def test_the_magic_names_an_out_of_range_field_instead_of_raising(files, case, tmp_path):
    """``%allocconf simulate FILE`` on a value out of range: the field's name, no ValueError."""
    code = ("import sys\nfrom IPython.testing.globalipapp import start_ipython\n"
            "ip = start_ipython()\nip.run_line_magic('load_ext', 'allocconf_widget')\n"
            "r = ip.run_cell('%allocconf simulate ' + sys.argv[1])\n"
            "print('ERROR', type(r.error_in_exec).__name__)")
    done = subprocess.run([sys.executable, "-c", code, str(files[case])], capture_output=True,
                          text=True, timeout=120, check=False, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert "ERROR NoneType" in done.stdout or "ERROR UsageError" in done.stdout, out[-3000:]
    assert "allocator_settings." in out and "Traceback" not in out, out[-3000:]


def test_a_zero_max_split_in_the_recorded_text_replays_as_no_limit():
    """The recorded variable's text is not range-checked by torch's readback: the replay copes."""
    from allocconf_widget.core.sim.settings import SimSettings

    settings = SimSettings.from_allocator_settings(
        {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:0,large_segment_size_mb:0"}, (2, 11))
    assert settings.max_split_bytes is None and settings.large_segment_bytes > 0


def _tarred(payload: bytes) -> bytes:
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("run.pickle")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    return out.getvalue()


@pytest.mark.parametrize(("pack", "named"), [
    ("bz2", "bzip2-compressed"), ("lzma", "xz-compressed"), ("tar", "a tar archive")])
def test_a_snapshot_sent_compressed_another_way_is_named_not_called_an_attack(tmp_path, pack, named):
    """A bzip2 file was read as a pickle whose first opcode asks for a 0.8 GB bytes object, and
    refused as "built to exhaust memory" (an attack pass, round 18)."""
    import bz2
    import lzma

    from allocconf_widget._errors import SnapshotError

    raw = valid_snapshot()
    data = {"bz2": bz2.compress, "lzma": lzma.compress, "tar": _tarred}[pack](raw)
    path = tmp_path / "run.pickle.x"
    path.write_bytes(data)
    with pytest.raises(SnapshotError) as caught:
        load_snapshot(path)
    said = str(caught.value)
    assert named in said and "decompress it first" in said and "exhaust" not in said
