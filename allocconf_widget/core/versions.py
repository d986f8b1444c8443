"""Torch release numbers as the allocator configuration cares about them.

Only ``major.minor`` matters: every option, bound and parser change we model
landed in a minor release. Patch numbers, pre-release tags and local build
tags (``+cu130``, ``+rocm6.2``, ``+cpu``) are kept only to tell CUDA, ROCm and
CPU-only builds apart.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from importlib import metadata

from allocconf_widget._errors import AllocConfError

OLDEST = (1, 13)
NEWEST = (2, 15)

#: Every release the option schema covers, oldest first.
KNOWN_RELEASES: tuple[tuple[int, int], ...] = ((1, 13), *((2, m) for m in range(16)))

_VERSION_RE = re.compile(r"^\s*v?(\d{1,6})\.(\d{1,6})(?!\d)(?:\.(\d{1,6})(?!\d))?([^+\s]*)(?:\+(\S+))?\s*$")


@dataclass(frozen=True, eq=False)
class TorchVersion:
    """A torch release, compared by ``(major, minor)``; ``build`` says cuda / rocm / cpu.

    ``known`` is False when the release is newer than the schema: the newest
    schema is used then, and callers warn about it.
    """

    major: int
    minor: int
    build: str = field(default="cuda", compare=False)
    text: str = field(default="", compare=False)

    @property
    def key(self) -> tuple[int, int]:
        """The ``(major, minor)`` pair used for all schema lookups."""
        return (self.major, self.minor)

    @property
    def known(self) -> bool:
        """True when this release is within the modelled range (1.13 … 2.15)."""
        return OLDEST <= self.key <= NEWEST

    @property
    def schema_key(self) -> tuple[int, int]:
        """The release whose rules apply: itself, or the newest known for newer torch."""
        return min(self.key, NEWEST)

    @property
    def new_parser(self) -> bool:
        """2.10 and later share c10's ``ConfigTokenizer``-based parser."""
        return self.schema_key >= (2, 10)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    def __eq__(self, other: object) -> bool:
        other_key = _key_of(other)
        return NotImplemented if other_key is None else self.key == other_key

    def __hash__(self) -> int:
        return hash(self.key)

    def __lt__(self, other: object) -> bool:
        other_key = _key_of(other)
        return NotImplemented if other_key is None else self.key < other_key

    def __le__(self, other: object) -> bool:
        other_key = _key_of(other)
        return NotImplemented if other_key is None else self.key <= other_key

    def __gt__(self, other: object) -> bool:
        other_key = _key_of(other)
        return NotImplemented if other_key is None else self.key > other_key

    def __ge__(self, other: object) -> bool:
        other_key = _key_of(other)
        return NotImplemented if other_key is None else self.key >= other_key


def _key_of(other: object) -> tuple[int, int] | None:
    """Let versions compare with each other and with plain ``(major, minor)`` tuples."""
    if isinstance(other, TorchVersion):
        return other.key
    if isinstance(other, tuple) and len(other) == 2:
        return (int(other[0]), int(other[1]))
    return None


def _parse_parts(value: str | tuple[int, int] | TorchVersion) -> TorchVersion:
    """Parse without the range check: any ``major.minor`` is a version here."""
    if isinstance(value, TorchVersion):
        return value
    if isinstance(value, tuple):
        major, minor = value
        return TorchVersion(int(major), int(minor), "cuda", f"{major}.{minor}")
    match = _VERSION_RE.match(value)
    if not match:
        raise AllocConfError(
            f"{value!r} is not a torch version",
            fix="give it as MAJOR.MINOR, e.g. 2.11 or 2.11.0+cu130",
        )
    local = (match.group(5) or "").lower()
    build = "rocm" if local.startswith("rocm") else "cpu" if local == "cpu" else "cuda"
    return TorchVersion(int(match.group(1)), int(match.group(2)), build, value.strip())


def parse_version(value: str | tuple[int, int] | TorchVersion) -> TorchVersion:
    """Parse ``"2.11.0+cu130"``, ``"2.9"``, ``(2, 9)`` or a TorchVersion.

    Raises:
        AllocConfError: not a version, or older than 1.13 (which we do not model).
    """
    version = _parse_parts(value)
    if version.key < OLDEST:
        raise AllocConfError(
            f"torch {version} is older than what allocconf_widget models "
            f"({OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]})",
            fix="upgrade torch, or pass --torch-version 1.13 to check against the oldest model",
        )
    return version


def installed_torch_version() -> TorchVersion | None:
    """The installed torch's version, read without importing torch (so CUDA stays untouched).

    Prefers the already-imported module's ``__version__`` (it is what actually
    runs), then the distribution metadata. Returns None when torch is absent.
    """
    module = sys.modules.get("torch")
    text = getattr(module, "__version__", None) if module is not None else None
    if not isinstance(text, str):
        try:
            text = metadata.version("torch")
        except metadata.PackageNotFoundError:
            return None
    try:
        return parse_version(text)
    except AllocConfError:
        return None


def default_version() -> TorchVersion:
    """The version a check defaults to: installed torch if any, else the newest modelled."""
    return installed_torch_version() or TorchVersion(*NEWEST, text=f"{NEWEST[0]}.{NEWEST[1]}")


VersionLike = str | tuple[int, int] | TorchVersion | None

#: The releases the replay simulator models (its rules differ from 2.0 on; 1.13 is not modelled).
SIM_OLDEST = (2, 0)
#: The release whose allocator source the simulator's rules were written from; the default
#: when nothing says which torch wrote a trace.
SIM_DEFAULT = TorchVersion(2, 12, text="2.12")


def simulated_release(value: str | tuple[int, int] | TorchVersion) -> TorchVersion:
    """Parse ``value`` and check that the replay simulator models that release.

    Raises:
        AllocConfError: not a version, or a release outside 2.0 … 2.15.
    """
    version = _parse_parts(value)
    if not SIM_OLDEST <= version.key <= NEWEST:
        raise AllocConfError(
            f"torch {version} is outside the simulated range "
            f"{SIM_OLDEST[0]}.{SIM_OLDEST[1]}–{NEWEST[0]}.{NEWEST[1]}",
            fix=f"pass --torch-version with a release from {SIM_OLDEST[0]}.{SIM_OLDEST[1]} "
                f"to {NEWEST[0]}.{NEWEST[1]}",
        )
    return version


def resolve_version(torch_version: VersionLike) -> TorchVersion:
    """``None`` means the default (installed torch, else newest); anything else is parsed."""
    return default_version() if torch_version is None else parse_version(torch_version)
