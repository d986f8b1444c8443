"""``run.save(name)`` with a name no file system takes: the package's error with a fix, nothing written.

A NUL character (Python's ``ValueError: embedded null byte``) and a name longer than the file
system's limit (``OSError: [Errno 36] File name too long``) must reach the user as the
:class:`SnapshotError` the docstring promises. A name just within the limit must still save,
though the temporary file a save writes first has a longer name than the one given.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from allocconf_widget._errors import SnapshotError
from allocconf_widget.core.untrusted import NotRegularFileError, check_write_target
from tests.torch_versions import needs_torch

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def run():
    import allocconf_widget

    with allocconf_widget.dry_run("t4") as result:
        model = torch.nn.Linear(64, 64).to("cuda")
        with torch.no_grad():
            model(torch.randn(8, 64, device="cuda"))
    return result


def _name_max(folder: Path) -> int:
    return os.pathconf(folder, "PC_NAME_MAX")


@pytest.fixture
def out(tmp_path: Path) -> Path:
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


BAD = {
    "NUL": lambda tmp: tmp / "step\x00.pickle",
    "name over the limit": lambda tmp: tmp / ("s" * (_name_max(tmp) + 1) + ".pickle"),
    "folder over the limit": lambda tmp: tmp / ("d" * (_name_max(tmp) + 1)) / "step.pickle",
    "whole path over the limit": lambda tmp: tmp / "/".join(["d" * 200] * 30) / "step.pickle",
}


@needs_torch((2, 4), "the dry run")
@pytest.mark.parametrize("case", list(BAD))
def test_a_name_no_file_system_takes_is_refused_with_a_fix(run, out: Path, case: str) -> None:
    target = BAD[case](out)
    with pytest.raises(SnapshotError) as info:
        run.save(target)
    message = str(info.value)
    assert message.startswith("cannot save the dry run as ")
    assert "nothing was written" in message and "step.pickle" in message  # what to give instead
    assert "\x00" not in message and len(message) < 600  # one readable line
    assert list(out.iterdir()) == []


@needs_torch((2, 4), "the dry run")
def test_the_longest_name_the_file_system_takes_is_saved(run, out: Path) -> None:
    target = out / ("s" * (_name_max(out) - len(".pickle")) + ".pickle")
    assert run.save(target) == target
    assert target.stat().st_size > 0
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([target.name, target.name.removesuffix(".pickle") + ".json"])


@pytest.mark.parametrize("case", list(BAD))
def test_every_save_target_check_refuses_them(tmp_path: Path, case: str) -> None:
    """``%%allocconf record --save`` and ``dryrun --save`` check the name before the cell runs."""
    with pytest.raises(NotRegularFileError):
        check_write_target(BAD[case](tmp_path))
