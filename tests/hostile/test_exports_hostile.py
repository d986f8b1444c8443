"""Exports in a working directory someone else can write to (issue 22, item 18).

A planted ``allocconf-exports`` link is refused; every export is written atomically; two
exports of one kind within a second both survive; a project folder named with a newline or
an ANSI escape cannot break ``%load_ext``'s one line.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from allocconf_widget.app import exports
from allocconf_widget.core.memory.timeline import Timeline


def _timeline() -> Timeline:
    timeline = Timeline()
    for i in range(5):
        timeline.add(float(i), {"reserved": float(i << 20), "allocated": float(i << 19)}, 0)
    return timeline


def test_a_planted_exports_link_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    work = tmp_path / "shared"
    work.mkdir()
    (work / exports.EXPORT_DIR).symlink_to(victim)
    monkeypatch.chdir(work)
    with pytest.raises(OSError, match="symbolic link"):
        exports.write_timeline_csv(_timeline())
    assert list(victim.iterdir()) == []


def test_a_dangling_planted_link_is_refused_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "shared"
    work.mkdir()
    (work / exports.EXPORT_DIR).symlink_to(tmp_path / "not-yet")
    monkeypatch.chdir(work)
    with pytest.raises(OSError, match="symbolic link"):
        exports.write_timeline_json(_timeline())
    assert not (tmp_path / "not-yet").exists()


def test_two_exports_in_one_second_both_survive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("time.time", lambda: 1_800_000_000.0)  # the same second
    first = exports.write_timeline_csv(_timeline())
    second = exports.write_timeline_csv(_timeline())
    third = exports.write_snapshot({"segments": [], "device_traces": []})
    fourth = exports.write_snapshot({"segments": [], "device_traces": []})
    assert len({first, second, third, fourth}) == 4
    assert all(p.stat().st_size > 0 for p in (first, second, third, fourth))


def test_an_export_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure while writing leaves the old file whole, and no temporary file behind."""
    folder = tmp_path / "out"
    folder.mkdir()
    target = folder / "timeline.csv"
    target.write_text("old contents\n")
    monkeypatch.setattr(exports, "timeline_csv", lambda _t: "x" * 10)
    exports.write_timeline_csv(_timeline(), target)
    assert target.read_text() == "x" * 10
    target.write_text("old contents\n")
    real_fdopen = os.fdopen

    class FailingHandle:
        def __init__(self, handle: object) -> None:
            self.handle = handle

        def __enter__(self) -> FailingHandle:
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()  # type: ignore[attr-defined]

        def write(self, text: str) -> int:
            self.handle.write(text[:3])  # type: ignore[attr-defined]
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: FailingHandle(real_fdopen(fd, *a, **k)))
    with pytest.raises(OSError, match="No space"):
        exports.write_timeline_csv(_timeline(), target)
    assert target.read_text() == "old contents\n"
    assert [p.name for p in folder.iterdir()] == ["timeline.csv"]


@pytest.mark.parametrize("name", ["proj\nect", "proj\x1b[2J\x1b[31mect", "proj\rect"],
                         ids=["newline", "ansi", "carriage-return"])
def test_load_ext_prints_one_line_whatever_the_project_folder_is_named(tmp_path: Path,
                                                                       name: str) -> None:
    project = tmp_path / name
    project.mkdir()
    (project / "pyproject.toml").write_text("")
    code = ("from IPython.testing.globalipapp import start_ipython\nip = start_ipython()\n"
            "print('<<<')\nip.run_line_magic('load_ext', 'allocconf_widget')\nprint('>>>')")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.pop("ALLOCCONF_PROJECT_DIR", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          check=False, cwd=project, env=env)
    out = done.stdout.split("<<<\n", 1)[1].split(">>>", 1)[0]
    assert out.count("\n") == 1 and out.startswith("allocconf_widget: "), repr(out)
    assert "\x1b" not in out and "\r" not in out


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_save_onto_a_fifo_or_a_link_changes_nothing_there(tmp_path):
    """A FIFO (or, as root, a device) where a snapshot or its sidecar is saved is refused and
    left as it was; a link there is replaced, never followed (it pointed at the user's notes)."""
    from allocconf_widget._errors import SnapshotError
    from allocconf_widget.core.memory.snapshot import save_snapshot
    from allocconf_widget.core.untrusted import NotRegularFileError, replace_file_atomically

    fifo = tmp_path / "pipe.pickle"
    os.mkfifo(fifo)
    with pytest.raises(SnapshotError, match="FIFO"):
        save_snapshot({"segments": [], "device_traces": []}, fifo)  # names the FIFO
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with pytest.raises(NotRegularFileError, match="directory"):
        replace_file_atomically(tmp_path, b"x")
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    link = tmp_path / "step.json"
    link.symlink_to(notes)
    replace_file_atomically(link, b"{}")
    assert notes.read_text() == "my notes" and not link.is_symlink() and link.read_bytes() == b"{}"
    assert stat.S_IMODE(link.stat().st_mode) == 0o666 & ~_umask()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's /proc and /dev")
def test_a_link_to_a_pipe_a_folder_or_a_system_file_is_refused_and_left(tmp_path):
    """``--save /dev/stdout`` as root replaced the system's link (to the process's standard
    output) with a pickle: a link is replaced only where it leads to a regular file, and no
    file is written into ``/dev``, ``/proc`` or ``/sys`` (checked without writing there)."""
    from allocconf_widget.core.untrusted import (
        NotRegularFileError,
        check_write_target,
        replace_file_atomically,
    )

    read_end, write_end = os.pipe()
    try:
        to_pipe = tmp_path / "out.pickle"
        to_pipe.symlink_to(f"/proc/self/fd/{write_end}")
        with pytest.raises(NotRegularFileError, match="link to a FIFO"):
            replace_file_atomically(to_pipe, b"x")
        assert to_pipe.is_symlink()
    finally:
        os.close(read_end)
        os.close(write_end)
    to_folder = tmp_path / "folder.pickle"
    to_folder.symlink_to(tmp_path)
    with pytest.raises(NotRegularFileError, match="link to a directory"):
        replace_file_atomically(to_folder, b"x")
    assert to_folder.is_symlink()
    for system in ("/dev/stdout", "/dev/stderr", "/dev/fd/1", "/proc/self/comm", "/sys/kernel/x.pickle"):
        with pytest.raises(NotRegularFileError, match="system's devices or processes"):
            check_write_target(system)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    if Path("/dev/shm").is_dir():
        check_write_target("/dev/shm/step.pickle")  # a tmpfs below /dev is a user's folder


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's /dev")
def test_an_export_into_a_system_folder_creates_nothing_there(tmp_path, monkeypatch):
    """An export given a folder reserves its name there first; given ``/dev`` (or a link to it)
    it left an empty reserved file in ``/dev`` and then said "nothing was written". Every
    create is intercepted here, so this test cannot write into ``/dev`` even if it fails."""
    from allocconf_widget.core.untrusted import NotRegularFileError

    created: list[str] = []
    real_open = os.open

    def intercepted(path, flags, *args, **kwargs):
        folder = os.path.realpath(Path(os.fspath(path)).parent)
        if flags & os.O_CREAT and (folder == "/dev" or folder.startswith(("/proc", "/sys"))):
            created.append(os.fspath(path))
            return real_open(tmp_path / "stand-in", flags, *args, **kwargs)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", intercepted)
    link = tmp_path / "devices"
    link.symlink_to("/dev")
    for folder in (link, Path("/dev")):
        with pytest.raises(NotRegularFileError, match="system's devices or processes"):
            exports.write_timeline_csv(_timeline(), folder)
    assert created == []


def test_two_flight_exports_in_one_second_keep_both(tmp_path, monkeypatch):
    """The OOM card's viewer export twice in a row: the second gets ``-2``, the first stays."""
    from allocconf_widget.app.flight import export_for_viewer, load_demo_oom

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(exports, "default_name", lambda kind, suffix: f"allocconf-{kind}-fixed{suffix}")
    capture = load_demo_oom().capture
    first, second = export_for_viewer(capture), export_for_viewer(capture)
    assert first.pickle != second.pickle and second.pickle.name.endswith("-2.pickle")
    assert first.pickle.stat().st_size > 0 and second.pickle.stat().st_size > 0


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def test_a_new_file_gets_what_the_umask_allows(tmp_path):
    from allocconf_widget.core.untrusted import replace_file_atomically

    old = os.umask(0o077)
    try:
        replace_file_atomically(tmp_path / "private.pickle", b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "private.pickle").stat().st_mode) == 0o600
