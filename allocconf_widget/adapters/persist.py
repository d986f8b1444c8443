"""The saved configuration that survives kernel restarts.

Environment variables die with the kernel (measured in JupyterLab), so the
chosen settings are written to ``$XDG_CONFIG_HOME/allocconf_widget/settings.json``
(default ``~/.config/...``) atomically, and ``%load_ext allocconf_widget`` in
a fresh kernel re-applies them before torch touches CUDA.

A file that is corrupt, hand-edited into nonsense or written for settings
the installed torch rejects produces a warning and is ignored: it must never
stop a kernel from starting.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from allocconf_widget._errors import AllocConfError, AllocConfWarning
from allocconf_widget.core.config.conf import AllocConf, parse_conf
from allocconf_widget.core.versions import VersionLike

FORMAT = 1
FILE_NAME = "settings.json"


@dataclass(frozen=True)
class SavedSettings:
    """What was saved: the configuration, for which torch, when."""

    conf: AllocConf
    torch_version: str
    saved_at: str
    path: Path


MAX_FILE_BYTES = 64 * 1024  # a real settings file is ~200 bytes; anything near this is not ours
MAX_JSON_DEPTH = 8


class NoConfigDirError(OSError):
    """Neither ``$XDG_CONFIG_HOME`` nor a home directory is known (random container uids)."""


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


def settings_path() -> Path:
    """Where the saved settings live."""
    return config_dir() / FILE_NAME


def save(conf: AllocConf) -> Path:
    """Write ``conf`` atomically (a reader never sees half a file); returns the path."""
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "conf": conf.to_string(),
        "torch_version": str(conf.torch_version),
        "saved_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
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
    """The saved settings, validated for ``torch_version`` (default: installed torch).

    Returns None when there is no file; warns (AllocConfWarning) and returns None
    when the file cannot be used, saying why and how to fix it.
    """
    try:
        path = settings_path()
    except NoConfigDirError:
        return None  # nothing can have been saved without a folder; saving says why
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return _ignore(path, f"it cannot be read ({exc.strerror or type(exc).__name__})")
    if len(data) > MAX_FILE_BYTES:
        return _ignore(path, f"it is larger than {MAX_FILE_BYTES // 1024} KiB, which no saved "
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
                         path)


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


def forget() -> bool:
    """Delete the saved settings; True if there was a file."""
    try:
        settings_path().unlink()
    except FileNotFoundError:
        return False
    return True


def _ignore(path: Path, reason: str) -> SavedSettings | None:
    """Warn that the file is unusable and why; returns None so callers can ``return _ignore(...)``."""
    warnings.warn(
        f"ignoring saved settings in {path}: {reason}. Fix the file, or run "
        "%allocconf forget (or delete it) to start from torch's defaults.",
        AllocConfWarning,
        stacklevel=3,
    )
    return None
