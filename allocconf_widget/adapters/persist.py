"""The saved configuration that survives kernel restarts, per project, with a global default.

Environment variables die with the kernel (measured in JupyterLab), so the
chosen settings are written atomically under ``$XDG_CONFIG_HOME/allocconf_widget/``
(default ``~/.config/...``), and ``%load_ext allocconf_widget`` in a fresh
kernel re-applies them before torch touches CUDA.

Scope: settings tuned for one project must not follow the user into every other
notebook. So *Apply* saves for the **project** the kernel runs in
(``projects/<name>-<hash>.json``), and only ``--global`` writes the **global
default** (``settings.json``), read by projects that saved nothing of their own.
The project is the nearest folder above the kernel's working directory that
holds ``.git``, ``pyproject.toml``, ``setup.py`` or ``setup.cfg`` (never the home
folder itself), else the working directory: Jupyter starts kernels in the
notebook's folder, so every notebook of a repository shares one project.
``ALLOCCONF_PROJECT_DIR`` names the project folder explicitly. Nothing is ever
written into the project folder itself.

A file that is corrupt, hand-edited into nonsense or written for settings
the installed torch rejects produces a warning and is ignored: it must never
stop a kernel from starting.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from allocconf_widget._errors import AllocConfError, AllocConfWarning, printable
from allocconf_widget.core.config.conf import AllocConf, parse_conf
from allocconf_widget.core.units import format_bytes
from allocconf_widget.core.untrusted import NotRegularFileError, read_regular_file
from allocconf_widget.core.versions import VersionLike

FORMAT = 1
FILE_NAME = "settings.json"
PROJECTS_DIR = "projects"
PROJECT_ENV = "ALLOCCONF_PROJECT_DIR"
PROJECT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")

Scope = Literal["project", "global"]


@dataclass(frozen=True)
class SavedSettings:
    """What was saved: the configuration, for which torch, when, and for which scope."""

    conf: AllocConf
    torch_version: str
    saved_at: str
    path: Path
    scope: Scope = "global"
    project: Path | None = None

    def describe_source(self) -> str:
        """``this project's settings (<dir>) in <file>`` / ``the global default in <file>``."""
        # a folder name can hold escape sequences and newlines (git allows them): never raw
        if self.scope == "project":
            return (f"this project's saved settings ({printable(str(self.project), 300, newlines=False)}) in "
                    f"{printable(str(self.path), 300, newlines=False)}")
        return f"the global default in {printable(str(self.path), 300, newlines=False)}"


MAX_FILE_BYTES = 64 * 1024  # a real settings file is ~200 bytes; anything near this is not ours
MAX_JSON_DEPTH = 8


class NoConfigDirError(OSError):
    """Neither ``$XDG_CONFIG_HOME`` nor a home directory is known (random container uids)."""


class NoProjectDirError(NoConfigDirError):
    """The working directory was deleted (or moved away), so no project can be found for it.

    A :class:`NoConfigDirError`: every caller that copes with "no settings folder" (save
    says "Applied, but NOT saved", load finds nothing) copes with this the same way.
    """

    def __init__(self) -> None:
        super().__init__(
            "the kernel's working directory no longer exists (deleted or moved), so this "
            f"project's settings file cannot be found; %cd to a folder that exists, or set "
            f"{PROJECT_ENV} to the project's folder")

    def __str__(self) -> str:
        return str(self.args[0])


def _cwd() -> Path:
    try:
        return Path.cwd()
    except FileNotFoundError:
        raise NoProjectDirError from None


def config_dir() -> Path:
    """``$XDG_CONFIG_HOME/allocconf_widget`` (``~/.config/allocconf_widget`` by default).

    Raises:
        NoConfigDirError: HOME is unset and the uid has no passwd entry, so there is no default.
    """
    base = os.environ.get("XDG_CONFIG_HOME")
    if not base:
        try:
            base = str(Path.home() / ".config")
        except (RuntimeError, KeyError, OSError) as exc:
            raise NoConfigDirError(
                f"no home directory is known for this user ({exc}); set XDG_CONFIG_HOME to a "
                "writable folder to keep settings across restarts") from None
    return Path(base) / "allocconf_widget"


def project_dir(cwd: Path | None = None) -> Path:
    """The folder whose notebooks share saved settings (see the module docstring)."""
    override = os.environ.get(PROJECT_ENV)
    if override:
        try:
            chosen = Path(override).expanduser()
        except (RuntimeError, KeyError, OSError) as exc:  # "~nosuchuser/x", or "~" with no home
            raise NoConfigDirError(
                f"{PROJECT_ENV}={printable(override, 120, newlines=False)} names a home directory "
                f"that cannot be found ({exc}); give the project folder as an absolute path, or unset "
                f"{PROJECT_ENV}") from None
        return chosen if chosen.is_absolute() else _cwd() / chosen
    start = (_cwd() if cwd is None else cwd).absolute()
    try:
        home: Path | None = Path.home().absolute()
    except (RuntimeError, KeyError, OSError):
        home = None
    for folder in (start, *start.parents):
        if folder == home or folder == Path(folder.anchor):
            break
        if any((folder / marker).exists() for marker in PROJECT_MARKERS):
            return folder
    return start


def project_settings_path(project: Path | None = None) -> Path:
    """``<config>/projects/<folder name>-<hash of its path>.json`` for ``project`` (default: this one)."""
    folder = project_dir() if project is None else project
    digest = hashlib.sha256(os.fsencode(folder)).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", folder.name)[:40] or "root"
    return config_dir() / PROJECTS_DIR / f"{name}-{digest}.json"


def global_settings_path() -> Path:
    """The global default: read by projects that saved nothing of their own."""
    return config_dir() / FILE_NAME


def settings_path(scope: Scope = "project") -> Path:
    """Where :func:`save` writes for ``scope``."""
    return project_settings_path() if scope == "project" else global_settings_path()


def save(conf: AllocConf, scope: Scope = "project") -> Path:
    """Write ``conf`` atomically (a reader never sees half a file) for ``scope``; returns the path."""
    path = settings_path(scope)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "conf": conf.to_string(),
        "torch_version": str(conf.torch_version),
        "saved_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if scope == "project":
        payload["project"] = os.fspath(project_dir())
    fd, tmp = tempfile.mkstemp(prefix=".settings-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=1)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)  # noqa: PTH105 - the atomic step; tests patch os.replace
    except BaseException:
        with contextlib.suppress(OSError):
            Path(tmp).unlink()
        raise
    return path


def load(torch_version: VersionLike = None) -> SavedSettings | None:
    """This project's saved settings, else the global default, validated for ``torch_version``.

    Returns None when neither file exists; warns (AllocConfWarning) and returns None
    when the file that applies cannot be used, saying why and how to fix it (a broken
    project file is not silently replaced by the global default).
    """
    try:
        project = project_dir()
        project_path = project_settings_path(project)
        global_path = global_settings_path()
    except NoProjectDirError as exc:
        warnings.warn(f"saved settings cannot be looked up: {exc}", AllocConfWarning, stacklevel=2)
        return None
    except NoConfigDirError:
        return None  # nothing can have been saved without a folder; saving says why
    if project_path.exists() or project_path.is_symlink():
        return _load_file(project_path, torch_version, "project", project)
    return _load_file(global_path, torch_version, "global", None)


def _load_file(path: Path, torch_version: VersionLike, scope: Scope,
               project: Path | None) -> SavedSettings | None:
    try:
        data = read_regular_file(path, MAX_FILE_BYTES)
    except FileNotFoundError:
        return None
    except NotRegularFileError as exc:
        return _ignore(path, f"{exc}")
    except OSError as exc:
        return _ignore(path, f"it cannot be read ({exc.strerror or type(exc).__name__})")
    if len(data) > MAX_FILE_BYTES:
        return _ignore(path, f"it is larger than {format_bytes(MAX_FILE_BYTES)}, which no saved "
                       "settings file is")
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _ignore(path, f"it is not UTF-8 text (byte {exc.start} cannot be decoded)")
    if _nesting_depth(raw) > MAX_JSON_DEPTH:
        return _ignore(path, f"it is nested deeper than {MAX_JSON_DEPTH} levels, which no saved "
                       "settings file is")
    try:
        payload = json.loads(raw)
    except json.JSONDecodeError as exc:
        return _ignore(path, f"it is not valid JSON ({exc.msg} at line {exc.lineno})")
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
        return _ignore(path, f"it is not usable JSON ({str(exc)[:120]})")
    if not isinstance(payload, dict) or not isinstance(payload.get("conf"), str):
        return _ignore(path, "it has no \"conf\" string")
    if payload.get("format") != FORMAT:
        return _ignore(path, f"it has format {payload.get('format')!r}, this version reads {FORMAT}")
    try:
        conf = parse_conf(payload["conf"], torch_version, warn=False)
    except AllocConfError as exc:
        return _ignore(path, f"its settings are not valid for this torch: {exc}")
    return SavedSettings(conf, str(payload.get("torch_version", "")), str(payload.get("saved_at", "")),
                         path, scope, project)


def _nesting_depth(text: str) -> int:
    """The deepest bracket nesting in ``text`` (strings included: an over-estimate is safe here)."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def forget(scope: Scope = "project") -> bool:
    """Delete the saved settings of ``scope``; True if there was a file."""
    try:
        settings_path(scope).unlink()
    except (FileNotFoundError, NotADirectoryError):  # a file where a folder of the path should
        return False  # be: nothing can have been saved there
    return True


def _ignore(path: Path, reason: str) -> SavedSettings | None:
    """Warn that the file is unusable and why; returns None so callers can ``return _ignore(...)``."""
    warnings.warn(
        f"ignoring saved settings in {path}: {reason}. Fix the file, or run "
        f"%allocconf forget{' --global' if path.name == FILE_NAME else ''} (or delete it) to start "
        "from torch's defaults.",
        AllocConfWarning,
        stacklevel=3,
    )
    return None
