"""Bounds for data read from files we did not write: size, nesting and expanded element count.

A pickle can be small and still cost without bound once something walks it:
memo references let one list appear 10⁵ times ("billion laughs"), a gzip
stream can expand a thousandfold, and nesting can be deep enough to overflow
any recursive walk. :func:`check_structure` measures the *expanded* size of a
loaded object (every reference counted, as a walk over it would see it) in time
linear in the number of *distinct* containers, and without recursion, so a
hostile file is refused before anything iterates it.

The defaults fit the largest honest traces we have measured many times over
(docs/limits.md); ``ALLOCCONF_MAX_SNAPSHOT_MIB`` and ``ALLOCCONF_MAX_SNAPSHOT_ITEMS``
lift them for a genuinely huge trace.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from allocconf_widget._errors import SnapshotError, printable
from allocconf_widget.core.units import MIB

SIZE_VARIABLE = "ALLOCCONF_MAX_SNAPSHOT_MIB"
ITEMS_VARIABLE = "ALLOCCONF_MAX_SNAPSHOT_ITEMS"
_CONTAINERS = (list, tuple, dict, set, frozenset)
_CONTAINER_TYPES = frozenset(_CONTAINERS)
#: values that hold nothing to walk (exact types: a subclass takes the general path)
_SCALAR_TYPE_TUPLE: tuple[type, ...] = (int, float, str, bool, bytes, complex, type(None))
_SCALAR_TYPES = frozenset(_SCALAR_TYPE_TUPLE)


@dataclass(frozen=True)
class LoadLimits:
    """What a loader accepts before it refuses a file."""

    max_bytes: int = 512 * MIB          # the file as read, and again after decompression
    max_items: int = 60_000_000          # container elements, shared references counted each time
    max_depth: int = 40                  # torch's snapshots nest about 8 levels deep

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> LoadLimits:
        """The defaults, with the two override variables applied where they are valid numbers."""
        env = os.environ if environ is None else environ
        limits = cls()
        size = _positive_int(env.get(SIZE_VARIABLE))
        items = _positive_int(env.get(ITEMS_VARIABLE))
        return cls(size * MIB if size else limits.max_bytes, items or limits.max_items,
                   limits.max_depth)


def _positive_int(text: str | None) -> int | None:
    if not text or not text.strip().isdigit() or len(text.strip()) > 12:
        return None
    value = int(text.strip())
    return value if value > 0 else None


def too_large(what: str, limit_bytes: int) -> SnapshotError:
    return SnapshotError(
        f"the {what} is larger than the {limit_bytes // MIB} MiB this loader accepts; if it is a "
        f"genuine trace, raise the limit with {SIZE_VARIABLE}=<MiB> (docs/limits.md)")


#: gzip that expands further than this beyond :data:`_RATIO_FLOOR` is a bomb: torch's pickles
#: compress 6- to 10-fold (docs/limits.md)
MAX_GZIP_RATIO = 100
_RATIO_FLOOR = 16 * MIB
_FIRST_FEED = 1024  # input bytes handed to zlib at first in each member, doubling up to 1 MiB
#: gzip members (concatenated streams) accepted in one file: gzip writes one, ``cat`` a few
MAX_GZIP_MEMBERS = 1000


def gunzip_bounded(data: bytes, what: str, limit_bytes: int) -> bytes:
    """Decompress gzip ``data``, refusing to produce more than ``limit_bytes`` (a gzip bomb), or
    more than :data:`MAX_GZIP_RATIO` times its size once past 16 MiB.

    Linear in the input whatever its members: each member is fed to zlib in slices that
    start small and double, so neither a million tiny members nor one large one makes zlib
    copy the rest of the input again and again (``unused_data`` and ``unconsumed_tail`` are
    copies of what was fed and not used).
    """
    out: list[bytes] = []
    total = 0
    view = memoryview(data)
    pos, end = 0, len(data)
    ratio_limit = max(_RATIO_FLOOR, MAX_GZIP_RATIO * end)
    members = 0
    while pos < end:
        members += 1
        if members > MAX_GZIP_MEMBERS:
            raise SnapshotError(
                f"the gzip-compressed {what} is more than {MAX_GZIP_MEMBERS:,} gzip streams joined "
                "together; torch's snapshots compress as one stream, so it is not one; refused")
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        feed = _FIRST_FEED
        try:
            while pos < end and not inflater.eof:
                stop = min(pos + feed, end)
                chunk = inflater.decompress(view[pos:stop], 4 * MIB)
                total += len(chunk)
                if total > limit_bytes:
                    raise too_large(f"decompressed {what}", limit_bytes)
                if total > ratio_limit:
                    raise SnapshotError(
                        f"the gzip-compressed {what} expands more than {MAX_GZIP_RATIO}-fold "
                        f"(beyond {total // MIB} MiB from {end:,} bytes); torch's snapshots "
                        "compress 6- to 10-fold, so this is a compression bomb; refused. If it "
                        "is genuine, decompress it yourself and pass the .pickle")
                out.append(chunk)
                pos = stop - len(inflater.unconsumed_tail) - len(inflater.unused_data)
                feed = min(feed * 2, MIB)
        except zlib.error as exc:
            raise SnapshotError(
                f"the gzip-compressed {what} is corrupt ({exc}); copy or download it again") from None
        if not inflater.eof:
            raise SnapshotError(
                f"the gzip-compressed {what} is truncated; copy or download it again")
        while pos < end:  # zero padding may follow a member, then another member
            piece = data[pos:pos + _FIRST_FEED]
            zeros = len(piece) - len(piece.lstrip(b"\0"))
            pos += zeros
            if zeros < len(piece):
                break
    return b"".join(out)


def check_structure(obj: object, what: str, limits: LoadLimits,
                    scalar_dicts: Callable[[list[Any], int, tuple[type, ...]], tuple[int, int]] | None = None,
                    ) -> None:
    """Refuse ``obj`` if walking it would meet more than ``limits`` allow.

    ``scalar_dicts(node, start, types)``, where given, applies the leaf rule below to a run of a
    list's children at compiled speed (``core/memory/_entrycheck``): the lengths of the dicts of
    scalars from ``start`` added up, and the index of the first other child.

    Raises:
        SnapshotError: nesting deeper than ``max_depth`` (a cycle counts as endless
            nesting) or more than ``max_items`` elements once shared parts are
            counted at every place they appear.
    """
    if not isinstance(obj, _CONTAINERS):
        return
    expanded: dict[int, int] = {}
    stack: list[tuple[object, int, bool]] = [(obj, 0, False)]
    while stack:
        node, depth, revisit = stack.pop()
        key = id(node)
        if key in expanded:
            continue
        if depth >= limits.max_depth:
            raise SnapshotError(
                f"the {what} is nested more than {limits.max_depth} levels deep (or refers to "
                "itself); torch's snapshots nest about 8 levels, so this is not one")
        total = len(node)  # type: ignore[arg-type]
        pending = None
        leaves_fit = depth + 1 < limits.max_depth
        counted = [0]
        children = (_unskipped(node, scalar_dicts, counted)
                    if scalar_dicts is not None and leaves_fit and type(node) is list else _children(node))
        for child in children:
            kind = type(child)
            if kind is dict and leaves_fit:
                leaf = cast("dict[object, object]", child)
                if _SCALAR_TYPES.issuperset(map(type, leaf.values())):
                    # a dict of scalars (a trace entry without frames; a million in a long
                    # trace): its size is its length, it cannot nest or refer back, and as a
                    # child of this node it is within the depth limit: counted, not walked
                    total += len(leaf)
                    continue
            if kind in _CONTAINER_TYPES or isinstance(child, _CONTAINERS):
                size = expanded.get(id(child))
                if size is None:
                    if pending is None:
                        pending = [child]
                    else:
                        pending.append(child)
                else:
                    total += size
        total += counted[0]
        if pending and not revisit:
            stack.append((node, depth, True))
            stack.extend((child, depth + 1, False) for child in pending)
            continue
        if pending:  # a child still unmeasured on the second visit refers back here: a cycle
            raise SnapshotError(f"the {what} refers to itself; torch's snapshots never do")
        if total > limits.max_items:
            raise SnapshotError(
                f"the {what} holds more than {limits.max_items:,} elements once its shared "
                "parts are counted where they are used (a pickle bomb, or a trace far beyond "
                f"any recorded one); if it is genuine, raise {ITEMS_VARIABLE} (docs/limits.md)")
        expanded[key] = total


def _unskipped(node: list[Any], scalar_dicts: Callable[[list[Any], int, tuple[type, ...]], tuple[int, int]],
               counted: list[int]) -> Iterator[object]:
    """The children of ``node`` the leaf rule does not decide; the lengths of those it does are
    added to ``counted[0]``."""
    i, n = 0, len(node)
    while i < n:
        add, i = scalar_dicts(node, i, _SCALAR_TYPE_TUPLE)
        counted[0] += add
        if i < n:
            yield node[i]
            i += 1


def _children(node: object) -> Iterable[object]:
    # a dict's keys are counted (len) but not walked: keys are hashable scalars or tuples, and
    # no reader walks a key; every message shows untrusted values through a bounded repr
    if isinstance(node, dict):
        return node.values()
    if isinstance(node, list | tuple):
        return node
    if isinstance(node, set | frozenset):
        return list(node)
    return ()


# ----------------------------------------------------------------- opening a file we did not write

class NotRegularFileError(OSError):
    """The path names something that is not a regular file (a FIFO, a device, a socket, a link)."""

    def __str__(self) -> str:
        return self.strerror or "not a regular file"


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISLNK, "a symbolic link"))


def _kind(mode: int) -> str:
    return next((text for test, text in _KINDS if test(mode)), "not a regular file")


def read_regular_file(path: str | os.PathLike[str], limit: int, *, follow_links: bool = True) -> bytes:
    """Read at most ``limit + 1`` bytes of ``path``, refusing anything but a regular file.

    Every reader of a file we did not write goes through here, so a FIFO (or a link to
    one) planted where a snapshot, a settings file or a rank record is expected can
    never block: the file is opened with ``O_NONBLOCK`` (opening a FIFO for reading
    then returns at once instead of waiting for a writer), checked with ``fstat`` on
    the open descriptor (no race between the check and the read), and refused unless it
    is a regular file. ``follow_links=False`` adds ``O_NOFOLLOW``: a symbolic link at
    ``path`` is refused, as the rank channel requires.

    Raises:
        FileNotFoundError, PermissionError, IsADirectoryError: as ``open`` would.
        NotRegularFileError: a FIFO, device, socket or (with ``follow_links=False``) link,
            with a message that says which.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_BINARY", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    name = os.fspath(path)
    try:
        fd = os.open(name, flags)
    except OSError as exc:
        if not follow_links and exc.errno == errno.ELOOP:
            raise NotRegularFileError(errno.ELOOP, f"{name!r} is a symbolic link; it is not "
                                      "followed here (someone else may have planted it)") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, f"{name!r} is a directory", name)
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(errno.EINVAL, f"{name!r} is {_kind(mode)}, not a regular "
                                      "file; refused without reading it (reading could block)")
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 4 * MIB))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


# ----------------------------------------------------------------- writing a file the user named

def check_write_target(target: str | os.PathLike[str]) -> int | None:
    """Refuse a path no file may be written to; returns the mode of what is there (None: nothing).

    Checked before work whose result is to be saved (a recorded or dry-run cell), so a bad
    ``--save`` is said before the cell runs rather than after.

    A link is replaced only where it leads to a regular file, in a folder of the user's: a
    rename over ``/dev/stdout`` (a link to the process's standard output) as root replaced the
    system's link with a pickle for every process, as ``/dev/null`` itself once was.

    Raises:
        NotRegularFileError: an empty name, a folder that does not exist or belongs to the
            system's devices or processes (``/dev``, ``/proc``, ``/sys``), or something there
            that is neither a regular file nor a link to one (a FIFO, a device, a directory).
    """
    name = os.fspath(target)
    if not name.strip():
        raise NotRegularFileError(errno.ENOENT, "the file name is empty; give a path such as step.pickle")
    _check_name(name)
    path = Path(name)
    if not _is_dir(path.parent):
        raise NotRegularFileError(errno.ENOENT, f"the folder {os.fspath(path.parent)!r} does not "
                                  f"exist; create it, or save {path.name!r} elsewhere")
    folder = os.path.realpath(path.parent)
    if _is_system_folder(folder):
        raise NotRegularFileError(errno.EPERM, f"{name!r} is in {folder!r}, the system's devices "
                                  "or processes; nothing was written (save to a file such as step.pickle)")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:  # too long for this file system, a loop, no permission to look
        raise NotRegularFileError(exc.errno, f"{_shown(name)} cannot be written: "
                                  f"{exc.strerror or exc}; nothing was written (choose another "
                                  "name, such as step.pickle)") from None
    if stat.S_ISLNK(mode):
        try:
            leads_to = path.stat().st_mode
        except OSError:  # dangling, or a loop: the link alone is replaced
            return mode
        if not stat.S_ISREG(leads_to):
            kind = "a directory" if stat.S_ISDIR(leads_to) else _kind(leads_to)
            raise NotRegularFileError(errno.EEXIST, f"{name!r} is a link to {kind}, not to a "
                                      "regular file; nothing was written (choose a file name)")
        return mode
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else _kind(mode)
        raise NotRegularFileError(errno.EEXIST, f"{name!r} is {kind}, not a regular "
                                  "file; nothing was written (choose a file name)")
    return mode


#: a name's and a path's length where the file system does not say (Linux's NAME_MAX and
#: PATH_MAX, the latter counting the final NUL)
_NAME_MAX = 255
_PATH_MAX = 4096
#: the length of the temporary name a write adds to the file's name (:func:`_temporary_name`)
_TEMPORARY_EXTRA = len(".") + 12 + len("..tmp")


def _shown(name: str) -> str:
    """A name in a message: quoted, on one line, escaped, cut."""
    return f"'{printable(name, 80, newlines=False)}'"


def _check_name(name: str) -> None:
    """Refuse a name no file system takes: a NUL character, or a part longer than the folder's
    file system allows (its ``NAME_MAX``, counted in bytes as the file system counts them)."""
    if "\0" in name:
        raise NotRegularFileError(errno.EINVAL, f"the file name {_shown(name)} contains a NUL "
                                  "character, which no file system allows; nothing was written "
                                  "(give a name such as step.pickle)")
    parts = [part for part in Path(name).parts if part not in ("/", "")]
    folder = Path(name).parent
    limit = _path_limit(folder, "PC_NAME_MAX", _NAME_MAX)
    for part in parts:
        size = len(os.fsencode(part))
        if size > limit:
            raise NotRegularFileError(errno.ENAMETOOLONG, (
                f"the name {_shown(part)} is {size} bytes long; this file system allows "
                f"{limit} per name; nothing was written (choose a shorter name, such as "
                "step.pickle)"))
    size, limit = len(os.fsencode(name)), _path_limit(folder, "PC_PATH_MAX", _PATH_MAX)
    if size >= limit:
        raise NotRegularFileError(errno.ENAMETOOLONG, (
            f"the path {_shown(name)} is {size} bytes long; this system allows paths shorter "
            f"than {limit}; nothing was written (save in a folder nearer the top, such as "
            "step.pickle here)"))


def _path_limit(folder: Path, which: str, default: int) -> int:
    """``os.pathconf`` of ``folder`` (of the working folder where it does not exist yet)."""
    try:
        return os.pathconf(folder if _is_dir(folder) else ".", which)
    except (OSError, ValueError, AttributeError):  # not POSIX, or the folder says nothing
        return default


def _is_dir(path: Path) -> bool:
    """``path.is_dir()``, False where the path cannot even be looked at (too long, no access)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def _temporary_name(path: Path) -> str:
    """The name a write goes to before it is renamed over ``path``: beside it, hidden, and
    never longer than the longest name the folder takes, however long ``path``'s is."""
    stem = path.name
    if len(os.fsencode(stem)) + _TEMPORARY_EXTRA > _NAME_MAX:
        stem = "allocconf"
    return str(path.parent / f".{stem}.{secrets.token_hex(6)}.tmp")


def check_companion_target(target: str | os.PathLike[str], *, is_ours: Callable[[bytes], bool],
                           what: str, limit: int) -> None:
    """Refuse to write a file the user did not name (a snapshot's JSON sidecar beside the
    pickle they named) over one the package did not write: ``--save results`` replaced the
    user's own ``results.json`` with a sidecar, and said only that the pickle was saved.

    ``is_ours`` tells from the first ``limit`` bytes whether a file there is ``what``.

    Raises:
        NotRegularFileError: as :func:`check_write_target`; or a file is there that is not
            ``what`` (or cannot be read to tell).
    """
    check_write_target(target)
    name = os.fspath(target)
    try:
        data = read_regular_file(name, limit)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise NotRegularFileError(errno.EEXIST, f"{name!r} exists and cannot be read to tell whether "
                                  f"it is {what} ({exc.strerror or exc}); nothing was written") from None
    if len(data) > limit or not is_ours(data):
        raise NotRegularFileError(errno.EEXIST, f"{name!r} exists and is not {what}; nothing was "
                                  "written (save under another name, or move that file)")


_SYSTEM_FOLDERS = ("/dev", "/proc", "/sys")


def _is_system_folder(folder: str) -> bool:
    """``/dev`` itself (its links and nodes; not a tmpfs below it such as ``/dev/shm``), or
    anywhere in ``/proc`` or ``/sys``: no file a user saves belongs there."""
    if folder == "/dev":
        return True
    return any(folder == top or folder.startswith(top + "/") for top in _SYSTEM_FOLDERS[1:])


def replace_file_atomically(target: str | os.PathLike[str], payload: bytes) -> None:
    """Write ``payload`` to a temporary file beside ``target``, then rename it over ``target``.

    Every file the package writes goes through here. A reader never sees half a file, and a
    failure leaves no truncated file behind. A symbolic link to a regular file at ``target`` is
    replaced, never followed (:func:`check_write_target` refuses other links); anything else
    that is not a regular file (a FIFO, a device, a socket, a directory) is refused untouched:
    run as root (Colab), a rename over ``/dev/null`` replaced the system's device with a pickle.

    Raises:
        NotRegularFileError: ``target`` exists and is neither a regular file nor a link.
        OSError: the folder cannot be written.
    """
    path = Path(target)
    mode = check_write_target(path)
    # a new file gets what the user's umask allows, as open() would give (mkstemp's 0600 hid
    # exports from the user's other tools; a fixed 0644 ignored a umask of 077); a file
    # replaced keeps its permissions
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    tmp = _temporary_name(path)
    fd = os.open(tmp, flags, 0o666)
    try:
        if mode is not None and stat.S_ISREG(mode):
            os.fchmod(fd, stat.S_IMODE(mode))
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
        Path(tmp).replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            Path(tmp).unlink()
        raise
