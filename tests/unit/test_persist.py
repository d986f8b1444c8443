"""Saved settings: atomic writes, and files that must never crash a kernel."""

from __future__ import annotations

import json
import os

import pytest

from allocconf_widget import AllocConfWarning
from allocconf_widget.adapters import persist
from allocconf_widget.core.config.conf import parse_conf


def test_save_load_round_trip_under_xdg_config_home(xdg_config_home):
    path = persist.save(parse_conf("expandable_segments:True,max_split_size_mb:512", "2.11", warn=False))
    assert path.parent == xdg_config_home / "allocconf_widget" / "projects"
    saved = persist.load("2.11")
    assert saved is not None
    assert saved.conf.to_string() == "expandable_segments:True,max_split_size_mb:512"
    assert saved.torch_version == "2.11"
    assert saved.scope == "project" and saved.project == persist.project_dir()
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left


def test_default_location_is_dot_config(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert persist.settings_path("global") == tmp_path / ".config" / "allocconf_widget" / "settings.json"
    assert persist.settings_path().parent == tmp_path / ".config" / "allocconf_widget" / "projects"


def _project(tmp_path, name, marker=".git"):
    folder = tmp_path / name
    (folder / "notebooks" / "deep").mkdir(parents=True)
    (folder / marker).mkdir() if marker == ".git" else (folder / marker).write_text("")
    return folder


def test_each_project_has_its_own_settings_and_shares_them_between_its_folders(monkeypatch, tmp_path):
    a, b = _project(tmp_path, "proj-a"), _project(tmp_path, "proj-b", "pyproject.toml")
    monkeypatch.chdir(a / "notebooks")
    assert persist.project_dir() == a
    persist.save(parse_conf("expandable_segments:True", "2.11", warn=False))
    monkeypatch.chdir(a / "notebooks" / "deep")  # another notebook folder of the same repository
    assert persist.load("2.11").conf.to_string() == "expandable_segments:True"
    monkeypatch.chdir(b / "notebooks")  # another project: the settings do not follow
    assert persist.project_dir() == b
    assert persist.load("2.11") is None


def test_the_global_default_applies_only_where_a_project_saved_nothing(monkeypatch, tmp_path):
    a, b = _project(tmp_path, "proj-a"), _project(tmp_path, "proj-b")
    persist.save(parse_conf("garbage_collection_threshold:0.7", "2.11", warn=False), "global")
    monkeypatch.chdir(a)
    persist.save(parse_conf("expandable_segments:True", "2.11", warn=False))
    saved = persist.load("2.11")
    assert (saved.scope, saved.conf.to_string()) == ("project", "expandable_segments:True")
    assert "this project's saved settings" in saved.describe_source()
    monkeypatch.chdir(b)
    saved = persist.load("2.11")
    assert (saved.scope, saved.conf.to_string()) == ("global", "garbage_collection_threshold:0.7")
    assert saved.describe_source().startswith("the global default in ")
    assert persist.forget("global") is True and persist.load("2.11") is None


def test_no_marker_means_the_working_directory_and_the_variable_overrides(monkeypatch, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    monkeypatch.chdir(plain)
    assert persist.project_dir() == plain
    monkeypatch.setenv(persist.PROJECT_ENV, str(tmp_path / "elsewhere"))
    assert persist.project_dir() == tmp_path / "elsewhere"


def test_nothing_is_written_into_the_project_folder(monkeypatch, tmp_path):
    a = _project(tmp_path, "proj-a")
    monkeypatch.chdir(a)
    persist.save(parse_conf("expandable_segments:True", "2.11", warn=False))
    assert sorted(p.name for p in a.iterdir()) == [".git", "notebooks"]


def test_forget_removes_the_file():
    persist.save(parse_conf("expandable_segments:True", "2.11", warn=False))
    assert persist.forget() is True
    assert persist.load("2.11") is None
    assert persist.forget() is False


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "no \"conf\" string"),
        (json.dumps({"format": 1, "conf": 5}), "no \"conf\" string"),
        (json.dumps({"format": 99, "conf": "expandable_segments:True"}), "format 99"),
        (json.dumps({"format": 1, "conf": "max_split_size_mb=128"}), "not valid for this torch"),
        (json.dumps({"format": 1, "conf": "large_segment_size_mb:64"}), "needs torch 2.11"),
        ("", "not valid JSON"),
    ],
)
def test_corrupt_or_hand_edited_file_warns_and_is_ignored(content, reason):
    path = persist.settings_path()
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.warns(AllocConfWarning, match=reason) as caught:
        assert persist.load("2.9") is None
    assert "%allocconf forget" in str(caught[0].message)


def test_unreadable_path_warns(tmp_path):
    path = persist.settings_path()
    path.mkdir(parents=True)  # a directory where the file should be
    with pytest.warns(AllocConfWarning, match="cannot be read"):
        assert persist.load("2.11") is None


def test_failed_write_leaves_the_previous_file_intact(monkeypatch):
    persist.save(parse_conf("expandable_segments:True", "2.11", warn=False))

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        persist.save(parse_conf("max_split_size_mb:512", "2.11", warn=False))
    monkeypatch.undo()
    assert persist.load("2.11").conf.to_string() == "expandable_segments:True"
    assert [p.name for p in persist.settings_path().parent.iterdir()] == [persist.settings_path().name]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\xff\xfe{\x00}\x00", "not UTF-8"),                      # UTF-16 with a BOM
        (b'{"format": 1, "conf": "caf\xe9"}', "not UTF-8"),       # one Latin-1 byte
        (bytes(range(256)) * 4, "not UTF-8"),                      # binary
        (b"[" * 30_000 + b"]" * 30_000, "nested deeper"),        # RecursionError in json
        (b'{"format": 1, "conf": "", "n": ' + b"9" * 5000 + b"}", "not usable JSON"),  # int limit
        (b" " * (persist.MAX_FILE_BYTES + 1), "larger than"),
    ],
)
def test_hostile_files_warn_once_and_are_left_alone(xdg_config_home, content, reason):
    path = xdg_config_home / "allocconf_widget" / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.warns(AllocConfWarning, match=reason) as caught:
        assert persist.load("2.13") is None
    assert len(caught) == 1 and not str(caught[0].message).startswith("allocconf_widget:")
    assert path.read_bytes() == content  # never rewritten or deleted


def test_no_home_directory_is_a_clear_error_not_a_crash(monkeypatch):
    import pwd

    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)  # what a random container uid meets
    with pytest.raises(persist.NoConfigDirError, match="XDG_CONFIG_HOME"):
        persist.settings_path()
    assert persist.load("2.13") is None


# ------------------------------------------------------------------ an attack pass (round 18)
def test_a_project_dir_under_an_unknown_users_home_is_named_with_its_fix(monkeypatch):
    """``~nosuchuser/proj`` (or ``~`` with no home) raised a bare RuntimeError that every
    command reported as "the input could not be processed"."""
    monkeypatch.setenv(persist.PROJECT_ENV, "~no_such_user_allocconf_zz/proj")
    with pytest.raises(persist.NoConfigDirError) as caught:
        persist.project_dir()
    said = str(caught.value)
    assert persist.PROJECT_ENV in said and "absolute path" in said


def test_a_project_folder_named_with_escapes_and_a_newline_stays_on_one_inert_line(tmp_path):
    folder = tmp_path / "proj\x1b[2J\x1b[31mEVIL\nFAKE: line"
    saved = persist.SavedSettings(parse_conf("max_split_size_mb:128"), "2.11", "now",
                                  tmp_path / "x.json", scope="project", project=folder)
    shown = saved.describe_source()
    assert "\x1b" not in shown and "\n" not in shown
    assert "\\x1b[2J" in shown and "\\x0aFAKE: line" in shown
