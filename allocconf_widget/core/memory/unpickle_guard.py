"""Unpickle bytes we did not write in a throwaway child process first, under memory and CPU limits.

Python's C unpickler has failure modes that no check *after* it can catch, because they strike
while it runs:

* a deeply nested tuple used as a dict key (a few hundred KB of pickle) crashes the
  interpreter: hashing it overflows the C stack, and the notebook's kernel dies with it;
* a 9-byte pickle that stores into memo slot 2**28 makes the unpickler allocate gigabytes for
  its memo table, and a long run of DUP opcodes grows its stack by 8 bytes per input byte.

So on Linux :func:`load_checked` forks. The child lowers its address-space and CPU limits,
unpickles, and says so through a pipe; it then runs the checks (nesting, expanded size, field
types) and sends their verdict. The parent unpickles the same bytes only after the child's
unpickle came through: identical input gives the identical object, so the parent's unpickle
can neither crash nor take more than the child's did. It runs while the child checks, and the
parent takes the child's verdict instead of checking again, so the guard costs about one
fork on an honest file (docs/limits.md, "Cost on honest files").

The memory budget is :data:`BUDGET_BASE` plus :data:`BUDGET_PER_BYTE` times the pickle's
size: torch's snapshots take several times their size once unpickled (docs/limits.md has the
ratio). The unpickle's CPU budget is tight, because the parent repeats what the child was
allowed (a tiny pickle whose dict key hashes for seconds costs both the same); the checks
after it get more.
Files over :data:`OVERLAP_MAX_BYTES` are unpickled by the parent only after the child's
checks, so an honest file never has two copies at once. Where processes cannot fork (not
Linux, or the fork fails), the parent unpickles and checks in process.

A caller that decodes the data next (the what-if) passes ``derive``: a second child, under the
same limits, unpickles and derives while the first checks, and the parent keeps its result only
once the checks passed (:func:`load_checked`).

Standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from allocconf_widget._errors import SnapshotError
from allocconf_widget.core.units import MIB, format_bytes

BUDGET_BASE = 256 * MIB
BUDGET_PER_BYTE = 16
#: CPU for the unpickle itself, well above what honest pickles take (docs/limits.md); the
#: parent repeats whatever the child was allowed, so this bound is the parent's too
UNPICKLE_CPU_BASE_S = 1.0
UNPICKLE_CPU_PER_MIB_S = 0.05
#: CPU for the checks after it (Python-level walks, slower per MiB than the unpickle)
CHECK_CPU_BASE_S = 10.0
CHECK_CPU_PER_MIB_S = 0.5
#: up to this size the parent unpickles while the child checks (two copies at once for a
#: moment); above it, one after the other, so an honest file's peak memory is one copy
OVERLAP_MAX_BYTES = 64 * MIB
_UNPICKLED, _CHECKED, _FAILED, _DERIVED = b"U", b"C", b"E", b"D"
#: the most the deriving child may send back: this plus this many times the pickle's size (a
#: decoded trace is smaller than its pickle)
DERIVED_MAX_BASE = 64 * MIB
DERIVED_MAX_PER_BYTE = 4
#: the deriving child counts as stuck after this long without output or CPU (a child that
#: works gets CPU many times a second, even with three processes on two cores)
STUCK_AFTER_S = 1.0
_CRASHES = {signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE}


def memory_budget(size: int) -> int:
    """Bytes the child may add to its address space while unpickling ``size`` bytes."""
    return BUDGET_BASE + BUDGET_PER_BYTE * size


def unpickle_cpu(size: int) -> int:
    """CPU seconds the child may spend unpickling ``size`` bytes."""
    return int(UNPICKLE_CPU_BASE_S + UNPICKLE_CPU_PER_MIB_S * size / MIB) + 1


def check_cpu(size: int) -> int:
    """CPU seconds the child may spend on the checks after its unpickle."""
    return int(CHECK_CPU_BASE_S + CHECK_CPU_PER_MIB_S * size / MIB) + 1


@dataclasses.dataclass(frozen=True)
class Loaded:
    """What :func:`load_checked` returns: the checked object, and what ``derive`` made of it."""

    #: None where ``derived_suffices`` and the derived result came back (nothing else needed it)
    obj: object
    #: ``derive(obj)``, computed in a second child while the first one checks; None where it
    #: was not asked for, could not run (a file over :data:`OVERLAP_MAX_BYTES`, no fork) or
    #: failed in any way: the caller then derives it itself, and meets the same error there
    derived: object | None = None


def load_checked(data: bytes, what: str, unpickle: Callable[[bytes], object],
                 check: Callable[[object], None], *,
                 derive: Callable[[object], object] | None = None,
                 read_derived: Callable[[bytes], object] | None = None,
                 derived_suffices: bool = False) -> Loaded:
    """``unpickle(data)``, refused unless ``check`` accepts the result; guarded by a child.

    ``derive`` (a decode the caller needs next) runs in a second forked child, on its own
    unpickle of the same bytes, while the first one checks and this process unpickles, so the
    decode overlaps the checks instead of following them. Its result comes back pickled and is
    read by ``read_derived`` (a restricted unpickler), and only once the checks have passed: on
    the data they accepted, a ``derive`` that ran early computed exactly what it would compute
    now. Refused data never reaches it here; the child that met it is killed with the first.

    ``derived_suffices``: the caller needs only ``derive``'s result (it carries whatever of the
    object the caller reads), so where that result comes back this process does not unpickle
    the data at all, and ``obj`` is None: two processes on two cores instead of three, and no
    second copy of a million-entry trace held for the rest of the session (docs/limits.md).
    Where it does not come back, this process unpickles the data once the checks passed.

    Raises:
        SnapshotError: from ``unpickle`` or ``check`` (the child's message, word for word), or
            saying that unpickling crashed, or took more memory or CPU than its budget.
    """
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        obj = unpickle(data)
        check(obj)
        return Loaded(obj)
    child = _fork_child(lambda out: _child(out, data, what, unpickle, check), what, len(data))
    if child is None:
        obj = unpickle(data)
        check(obj)
        return Loaded(obj)
    sibling = None
    try:
        if derive is not None and read_derived is not None and len(data) <= OVERLAP_MAX_BYTES:
            deriving = _fork_child(lambda out: _deriving_child(out, data, unpickle, derive),
                                   "derived data", len(data))
            sibling = None if deriving is None else _Deriving(deriving, len(data), read_derived)
        child.expect(_UNPICKLED)
        if sibling is not None and derived_suffices:
            sibling.read_while_checking(child)
            child.expect(_CHECKED)
            derived = sibling.result()
            return Loaded(unpickle(data)) if derived is None else Loaded(None, derived)
        if len(data) > OVERLAP_MAX_BYTES:  # one copy at a time: wait for the checks first
            child.expect(_CHECKED)
            return Loaded(unpickle(data))
        obj = unpickle(data)  # what the child just did: it cannot crash or grow further
        if sibling is None:
            child.expect(_CHECKED)
            return Loaded(obj)
        sibling.read_while_checking(child)
        child.expect(_CHECKED)
        return Loaded(obj, sibling.result())
    finally:
        _end_all([c for c in (sibling.child if sibling else None, child) if c is not None])


def _end_all(children: list[_Child]) -> None:
    """End each child (the one that may block forever first): each step runs whatever
    interrupts the one before it, so a second Ctrl-C during the first child's collection
    cannot leave the decoding child blocked on its pipe, holding its copy of the file."""
    if not children:
        return
    try:
        children[0].end()
    finally:
        _end_all(children[1:])


def _fork_child(run: Callable[[int], None], what: str, size: int) -> _Child | None:
    """Fork a child that runs ``run`` on the write end of a new pipe (``run`` never returns:
    it ends with ``os._exit``); the child as this process sees it, None where there are no
    descriptors left or the fork fails.

    Interrupted half way, it ends the child it made. A Ctrl-C during the fork itself (tens of
    milliseconds in a big process) raises as ``os.fork`` returns, and its return value, the
    child's pid, is lost: so the child first writes its pid into a pipe of its own, which this
    process reads only then.
    """
    fds: dict[str, int] = {}
    try:
        fds["read"], fds["write"] = os.pipe()
        fds["pid_read"], fds["pid_write"] = os.pipe()
    except OSError:  # out of file descriptors: the caller works in process
        _close(fds)
        return None
    parent, pid = os.getpid(), -1
    try:
        with warnings.catch_warnings():  # "multi-threaded, fork() may deadlock": the children
            warnings.simplefilter("ignore", DeprecationWarning)  # only unpickle, check and exit
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child; it never returns
            try:
                os.close(fds["read"])
                os.close(fds["pid_read"])
                with contextlib.suppress(OSError):  # no reader: the parent has its pid already
                    os.write(fds["pid_write"], str(os.getpid()).encode())
                os.close(fds["pid_write"])
                run(fds["write"])
            finally:
                os._exit(3)
        _close(fds, "write", "pid_write", "pid_read")
        return _Child(pid, fds.pop("read"), what, size)
    except BaseException as exc:
        if os.getpid() != parent:  # pragma: no cover - an interrupt in the child, right after fork
            os._exit(3)
        if pid < 0 and "pid_read" in fds:  # did a child start? it says so, or the pipe ends
            _close(fds, "pid_write")
            pid = _pid_from(fds["pid_read"])
        if pid > 0:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        _close(fds)
        if isinstance(exc, OSError) and pid < 0:  # the fork failed: the caller works in process
            return None
        raise


def _close(fds: dict[str, int], *names: str) -> None:
    """Close the descriptors ``names`` of ``fds`` (all of them without names) and forget them."""
    for name in names or tuple(fds):
        fd = fds.pop(name, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _pid_from(pipe: int) -> int:
    """The pid a new child wrote into ``pipe``; -1 if none comes within a second (no child)."""
    poller = select.poll()
    poller.register(pipe, select.POLLIN | select.POLLHUP)
    if not poller.poll(1000):
        return -1
    with contextlib.suppress(OSError, ValueError):
        return int(os.read(pipe, 32) or b"-1")
    return -1


class _Deriving:
    """The second child, seen from the parent: its pickled result, read as it comes and kept
    only once the checks passed."""

    def __init__(self, child: _Child, size: int, read: Callable[[bytes], object]) -> None:
        self.child = child
        self.read = read  # the restricted unpickler its result goes through
        #: a trace decodes to less than its pickle; anything far larger is not a result
        self.max_bytes = DERIVED_MAX_BASE + DERIVED_MAX_PER_BYTE * size
        self.chunks: list[bytes] = []
        self.got = 0
        self.ended = False  # the child closed its end (or sent too much, or ran out of time)

    def read_while_checking(self, checker: _Child) -> None:
        """Read the child's output until the ``checker`` speaks or this child is done; what
        arrived meanwhile needs no waiting afterwards."""
        poller = select.poll()
        poller.register(checker.pipe, select.POLLIN | select.POLLHUP | select.POLLERR)
        poller.register(self.child.pipe, select.POLLIN | select.POLLHUP | select.POLLERR)
        while not self.ended:
            left = checker.deadline - time.monotonic()
            if left <= 0:
                return  # the checker's own wait says so
            ready = {fd for fd, _ in poller.poll(int(min(left, 1.0) * 1000))}
            if self.child.pipe in ready:
                self._read_chunk()
            if checker.pipe in ready:
                return

    def result(self) -> object | None:
        """The child's result, or None (it failed, ended, ran out of time, sent too much, or
        sat a whole second without output or CPU: a child stuck on a lock some other thread
        held at the fork spends no CPU, so its CPU limit would never end it, and this caller
        would otherwise wait out the wall-clock deadline instead of decoding itself)."""
        spent = _cpu_ticks(self.child.pid)
        while not self.ended:
            left = self.child.deadline - time.monotonic()
            if left <= 0:
                return None
            if self.child.poller.poll(int(min(left, STUCK_AFTER_S) * 1000)):
                self._read_chunk()
                continue
            now = _cpu_ticks(self.child.pid)
            if now is not None and now == spent:
                return None
            spent = now
        payload = b"".join(self.chunks)
        self.chunks.clear()
        if self.got > self.max_bytes or payload[:1] != _DERIVED:
            return None
        try:
            return self.read(payload[1:])
        except Exception:  # any refusal means "derive it here instead"
            return None

    def _read_chunk(self) -> None:
        chunk = os.read(self.child.pipe, 1 << 20)
        self.chunks.append(chunk)
        self.got += len(chunk)
        self.ended = not chunk or self.got > self.max_bytes


def _cpu_ticks(pid: int) -> int | None:
    """CPU clock ticks ``pid`` has used (user + system), or None where /proc cannot say."""
    try:
        with Path(f"/proc/{pid}/stat").open("rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime and stime: fields 14 and 15 of stat
    except (OSError, ValueError, IndexError):
        return None


def _deriving_child(out: int, data: bytes, unpickle: Callable[[bytes], object],
                    derive: Callable[[object], object]) -> None:  # pragma: no cover - a child
    """Unpickle, derive, send the result pickled; end with ``os._exit`` whatever happens.

    Under the same limits as the checking child: it may meet the same hostile bytes before
    their verdict, and a derive run on unchecked data may fail or run long. Either way it
    only ends, and the parent derives on data that passed the checks.
    """
    code = 3
    try:
        import pickle

        caller_cpu = _enter_limits(len(data))
        obj = unpickle(data)
        _allow_checks(len(data), caller_cpu)
        payload = pickle.dumps(derive(obj), protocol=pickle.HIGHEST_PROTOCOL)
        del obj
        view = memoryview(_DERIVED + payload)
        while view:
            view = view[os.write(out, view):]
        code = 0
    except BaseException:  # nothing may keep the child from its _exit
        pass
    finally:
        os._exit(code)


def _child(out: int, data: bytes, what: str, unpickle: Callable[[bytes], object],
           check: Callable[[object], None]) -> None:  # pragma: no cover - runs in the child
    """Unpickle, say so, check, say so; end with ``os._exit`` whatever happens.

    The child must never return into the caller's code: a second MemoryError raised while
    wording the first did exactly that (the child went on as a copy of the caller). So every
    message it may need is worded before the limits go down, and the last line is ``_exit``.
    """
    code = 3
    try:
        memory_said = _memory_message(what, len(data))
        try:
            caller_cpu = _enter_limits(len(data))
            try:
                obj = unpickle(data)
            except SnapshotError as exc:
                if isinstance(exc.__cause__, MemoryError):
                    _send_failure(out, memory_said)
                    return
                raise
            os.write(out, _UNPICKLED)
            _allow_checks(len(data), caller_cpu)
            check(obj)
            os.write(out, _CHECKED)
            code = 0
        except SnapshotError as exc:
            _send_failure(out, str(exc))
        except MemoryError:
            _send_failure(out, memory_said)
        except BaseException as exc:  # anything else still ends the child, quietly
            _send_failure(out, f"checking it failed ({type(exc).__name__})")
            code = 1
    finally:
        os._exit(code)


def _send_failure(out: int, message: str) -> None:  # pragma: no cover - runs in the child
    with contextlib.suppress(BaseException):  # nothing may keep the child from its _exit
        os.write(out, _FAILED + message[:4000].encode("utf-8", "replace"))


def _lower(kind: int, soft: int) -> None:  # pragma: no cover - runs in the child
    """Lower the soft limit ``kind`` to ``soft``, never above what is in force now."""
    import resource

    current, hard = resource.getrlimit(kind)
    if current != resource.RLIM_INFINITY:
        soft = min(soft, current)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(kind, (soft, hard))


def _enter_limits(size: int) -> int:  # pragma: no cover - runs in a child
    """Quiet the child's stderr (a crash report, from faulthandler, is the parent's to word) and
    lower its limits for the unpickle; returns the CPU limit the caller had."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    return _limit_resources(size)


def _limit_resources(size: int) -> int:  # pragma: no cover - runs in the child
    """Lower the child's limits for its unpickle; returns the CPU limit the caller had."""
    import resource

    caller_cpu = resource.getrlimit(resource.RLIMIT_CPU)[0]
    _lower(resource.RLIMIT_CORE, 0)
    _lower(resource.RLIMIT_CPU, unpickle_cpu(size))  # a forked child starts with no CPU time used
    current = _address_space()
    if current is not None:
        _lower(resource.RLIMIT_AS, current + memory_budget(size))
    return caller_cpu


def _allow_checks(size: int, caller_cpu: int) -> None:  # pragma: no cover - runs in the child
    """After the unpickle, the CPU the checks may use on top, never above the caller's limit."""
    import resource

    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = int(used.ru_utime + used.ru_stime) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    wanted = spent + check_cpu(size)
    for cap in (hard, caller_cpu):
        if cap != resource.RLIM_INFINITY:
            wanted = min(wanted, cap)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (wanted, hard))


def _address_space() -> int | None:  # pragma: no cover - runs in the child
    try:
        with Path("/proc/self/statm").open("rb") as handle:
            return int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _memory_message(what: str, size: int) -> str:
    return (f"unpickling the {what} takes more than {format_bytes(memory_budget(size))} of memory "
            f"({BUDGET_PER_BYTE}× its {format_bytes(size)} plus {format_bytes(BUDGET_BASE)}; torch's "
            "snapshots take 6 to 9 times their size), so it is built to exhaust memory "
            "(a huge memo index, a long run of DUP opcodes), not written by torch; refused")


class _Child:
    """The forked checker, seen from the parent: its pipe, its deadline and its end."""

    def __init__(self, pid: int, pipe: int, what: str, size: int) -> None:
        self.pid, self.pipe, self.what, self.size = pid, pipe, what, size
        # a stopped or starved child still ends: four times its CPU, and half a minute
        self.wall_s = 4 * (unpickle_cpu(size) + check_cpu(size)) + 30
        self.deadline = time.monotonic() + self.wall_s
        self.status: int | None = None
        self.reaped = False
        self.poller = select.poll()  # not select(): it refuses descriptors above 1023
        self.poller.register(pipe, select.POLLIN | select.POLLHUP | select.POLLERR)

    def expect(self, wanted: bytes) -> None:
        """Wait for the child's next word; raise what it says instead, or why it ended."""
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise SnapshotError(f"reading the {self.what} did not finish within "
                                    f"{self.wall_s} s; refused")
            if self.poller.poll(int(min(left, 1.0) * 1000)):
                break
        word = os.read(self.pipe, 1)
        if word == wanted:
            return
        if word == _FAILED:
            chunks = []
            while more := os.read(self.pipe, 65536):
                chunks.append(more)
            raise SnapshotError(b"".join(chunks).decode("utf-8", "replace"))
        self.reap()
        raise SnapshotError(_ended(self.what, self.size, self.status))

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)

    def end(self) -> None:
        """Kill the child (its verdict is in, or no longer wanted), collect it, close its pipe;
        each step whatever interrupts the one before."""
        try:
            if not self.reaped:
                self.kill()
        finally:
            try:
                self.reap()
            finally:
                if self.pipe >= 0:
                    with contextlib.suppress(OSError):
                        os.close(self.pipe)
                    self.pipe = -1

    def reap(self) -> None:
        """Collect the child's wait status, killing it if it has not ended within a moment.

        Whatever interrupts the wait (a second Ctrl-C), the child is killed and collected:
        it ran on to its CPU limit and stayed a zombie when the interrupt came mid-wait.
        """
        if self.reaped:
            return
        try:
            for _ in range(100):  # after its last word it exits at once
                if self._collect():
                    return
                time.sleep(0.002)
        finally:
            if not self.reaped:
                self.kill()
                with contextlib.suppress(ChildProcessError):
                    self.status = os.waitpid(self.pid, 0)[1]
                self.reaped = True

    def _collect(self) -> bool:
        try:
            done, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            self.reaped = True
            return True
        if done:
            self.status, self.reaped = status, True
        return bool(done)


def _ended(what: str, size: int, status: int | None) -> str:
    """Why the child ended without a verdict, from its wait status."""
    if status is not None and os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig in _CRASHES:
            return (f"the {what} crashes Python's unpickler (it holds objects nested too deeply "
                    "for it, e.g. a tuple inside a tuple 100,000 times; torch's snapshots nest "
                    "about 8 levels), so it is not one; refused (nothing in it was run)")
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return (f"unpickling the {what} took more than {unpickle_cpu(size)} s of CPU, or "
                    f"checking it more than {check_cpu(size)} s (a million-entry torch trace takes "
                    "about 0.3 s and 1 s), so it is built to exhaust the CPU; refused")
        return f"reading the {what} was stopped by signal {sig}; refused"
    code = os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else "unknown"
    return f"checking the {what} ended without a verdict (exit status {code}); refused"
