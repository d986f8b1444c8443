"""The forked checker behind every snapshot load (core/memory/unpickle_guard.py), attacked directly.

Each case runs in a fresh interpreter: a child that escaped into the caller would run the rest
of the test process twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the guard forks on Linux only")
ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_child_never_returns_into_the_caller():
    """A check whose error cannot even be worded (its ``str`` raises MemoryError, as a second
    MemoryError did while wording the first): the child still ends with ``_exit``; only the
    caller's process goes on, and it is told the check ended without a verdict."""
    done = _run("""
        import os, pickle
        from allocconf_widget._errors import SnapshotError
        from allocconf_widget.core.memory.unpickle_guard import load_checked

        class Unsayable(SnapshotError):
            def __str__(self):
                raise MemoryError

        def check(obj):
            raise Unsayable()

        me = os.getpid()
        try:
            load_checked(pickle.dumps([1, 2]), "data", pickle.loads, check)
        except SnapshotError as exc:
            print("REFUSED", os.getpid() == me, exc)
        print("AFTER", os.getpid() == me)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("AFTER") == 1 and "AFTER True" in done.stdout, done.stdout
    assert "REFUSED True" in done.stdout and "without a verdict" in done.stdout


def test_a_process_with_many_open_files_still_loads():
    """Descriptors above 1023 (a kernel holding many files): ``select`` refused them."""
    done = _run("""
        import os, pickle
        from allocconf_widget.core.memory.unpickle_guard import load_checked
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
        print("LOADED", load_checked(pickle.dumps([1, 2]), "data", pickle.loads, lambda obj: None).obj)
    """)
    assert "LOADED [1, 2]" in done.stdout, done.stderr[-2000:]


def test_a_hash_that_never_ends_costs_the_caller_nothing():
    """About 90 bytes: a dict key made of a tuple doubled 40 times over shared references;
    hashing it takes 2^40 steps. The child is stopped at its unpickle budget (2 s); the caller, which
    unpickles only after the child did, spends nothing on it."""
    done = _run("""
        import resource
        from allocconf_widget._errors import SnapshotError
        from allocconf_widget.core.memory.snapshot import load_snapshot
        # {(t, t) nested 40 deep: None}: DUP and TUPLE2 forty times, then the key's value
        data = b"\\x80\\x04}" + b"K\\x01\\x85" + b"2\\x86" * 40 + b"Ns."
        try:
            load_snapshot(data)
        except SnapshotError as exc:
            print("REFUSED", exc)
        me = resource.getrusage(resource.RUSAGE_SELF)
        print("SELF_CPU", me.ru_utime + me.ru_stime)
    """)
    assert "REFUSED" in done.stdout and "of CPU" in done.stdout, (done.stdout, done.stderr[-2000:])
    self_cpu = float(done.stdout.split("SELF_CPU")[1])
    assert self_cpu < 2.0, self_cpu


# ---------------------------------------------------------------- the decode beside the checks

def test_a_refused_file_never_waits_for_its_decode():
    """The decoding child runs on bytes nobody has checked yet. A file the checks refuse gets
    their message at once, whatever the decode is doing (here: sleeping for a minute), and
    neither child is left behind."""
    done = _run("""
        import os, pickle, time
        from allocconf_widget._errors import SnapshotError
        from allocconf_widget.core.memory.unpickle_guard import load_checked

        def check(obj):
            raise SnapshotError("segment 3 has blocks that do not add up")

        start = time.monotonic()
        try:
            load_checked(pickle.dumps(list(range(1000))), "data", pickle.loads, check,
                         derive=lambda obj: time.sleep(60), read_derived=pickle.loads)
        except SnapshotError as exc:
            print("REFUSED", exc)
        print("SECONDS", time.monotonic() - start)
        try:
            os.waitpid(-1, os.WNOHANG)
            print("CHILDREN LEFT")
        except ChildProcessError:
            print("NO CHILDREN")
    """)
    assert "REFUSED segment 3 has blocks that do not add up" in done.stdout, done.stderr[-2000:]
    assert float(done.stdout.split("SECONDS")[1].split()[0]) < 10
    assert "NO CHILDREN" in done.stdout


def test_what_the_decode_gives_is_kept_only_when_it_worked():
    """A decode that raises, one whose result cannot be pickled, one whose result the reader
    refuses and one that is stuck (no output, no CPU: a lock another thread held at the fork)
    all leave ``derived`` empty (the caller decodes, and meets any error there); one that works
    comes back. The stuck one costs about a second, not its wall-clock deadline."""
    done = _run("""
        import pickle, threading, time
        from allocconf_widget.core.memory.unpickle_guard import load_checked

        def load(derive, read=pickle.loads):
            got = load_checked(pickle.dumps({"a": [1, 2]}), "data", pickle.loads, lambda obj: None,
                               derive=derive, read_derived=read)
            return got.obj, got.derived

        def refuse(payload):
            raise pickle.UnpicklingError("not ours")

        print("WORKS", load(lambda obj: sorted(obj)))
        print("RAISES", load(lambda obj: 1 / 0))
        print("UNPICKLABLE", load(lambda obj: threading.Lock()))
        print("REFUSED", load(lambda obj: [3], refuse))
        start = time.monotonic()
        print("STUCK", load(lambda obj: threading.Event().wait()))
        print("STUCK_SECONDS", time.monotonic() - start)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "WORKS ({'a': [1, 2]}, ['a'])" in out
    for case in ("RAISES", "UNPICKLABLE", "REFUSED", "STUCK"):
        assert f"{case} ({{'a': [1, 2]}}, None)" in out, out
    assert float(out.split("STUCK_SECONDS")[1]) < 10, out


def test_shapes_that_broke_an_early_decode_cost_the_caller_nothing(tmp_path):
    """Round 12 decoded in the caller's process while the child checked, and took it back:
    five shapes the checks refuse in a moment hurt the decoder before the verdict came. The
    decode now runs in a child of its own, under the checker's limits, and the caller leaves
    it the moment the checks refuse. Each shape is loaded the way ``allocconf simulate`` loads
    a file: refused with the checks' message, in seconds, with no child left behind."""
    done = _run(f"""
        import os, pickle, resource, sys, time
        from allocconf_widget._errors import SnapshotError
        from allocconf_widget.app.sources import file_source

        def entry(action="alloc", addr=1 << 40, size=512, **more):
            return {{"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 1, **more}}

        doubled = "a" * (1 << 20)
        for _ in range(50):
            doubled = [doubled, doubled]
        blocks = [{{"size": 512, "state": "inactive", "address": 0}}] * 5000
        shared = [{{"device": 0, "address": i << 30, "total_size": 1 << 20, "allocated_size": 0,
                    "active_size": 0, "stream": 0, "segment_type": "large", "blocks": blocks}}
                  for i in range(5000)]
        metadata = "m" * (16 << 20)
        shapes = {{
            "deep action": [entry(), entry(action="DEEP-MARK")],
            "doubled action": [entry(), entry(action=doubled)],
            "shared start blocks": "start",
            "shared metadata": [entry(addr=(1 << 40) + 512 * i, user_metadata=metadata)
                                for i in range(100_000)] + [entry(size=-1)],
        }}
        for name, trace in shapes.items():
            snap = {{"segments": [], "device_traces": [[entry()] if trace == "start" else trace]}}
            if trace == "start":
                snap["allocconf_initial_segments"] = shared
            path = os.path.join({str(tmp_path)!r}, name.replace(" ", "_") + ".pickle")
            data = pickle.dumps(snap, protocol=4)  # the mark: None in 200,000 tuples
            data = data.replace(b"\\x8c\\x09DEEP-MARK", b"N" + b"\\x85" * 200_000)
            with open(path, "wb") as handle:
                handle.write(data)
            before = resource.getrusage(resource.RUSAGE_SELF)
            start = time.monotonic()
            try:
                file_source(path)
                print(name, "LOADED")
            except SnapshotError as exc:
                print(name, "REFUSED", str(exc)[:80].replace(os.linesep, " "))
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            print(name, "SECONDS", round(time.monotonic() - start, 2), "CPU", round(cpu, 2))
        try:
            os.waitpid(-1, os.WNOHANG)
            print("CHILDREN LEFT")
        except ChildProcessError:
            print("NO CHILDREN")
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for name in ("deep action", "doubled action", "shared start blocks", "shared metadata"):
        assert f"{name} REFUSED" in out, out
        seconds = float(out.split(f"{name} SECONDS")[1].split()[0])
        cpu = float(out.split(f"{name} SECONDS")[1].split("CPU")[1].split()[0])
        assert seconds < 20 and cpu < 5, (name, seconds, cpu)
    assert "NO CHILDREN" in out


_LEAK_CHECK = """
    import os, pickle, time
    from allocconf_widget._errors import SnapshotError
    from allocconf_widget.core.memory import unpickle_guard as guard

    def left():
        fds = len(os.listdir("/proc/self/fd"))
        try:
            os.waitpid(-1, os.WNOHANG)
            return fds, "CHILDREN LEFT"
        except ChildProcessError:
            return fds, "NO CHILDREN"

    def refuse(obj):
        raise SnapshotError("refused")

    before = left()
"""


def test_an_interrupt_while_the_children_are_ended_still_ends_both():
    """A second Ctrl-C during the cleanup (here: the first kill) still collects the checker
    and the decoding child, which a refused file leaves mid-decode; before, the decoding
    child stayed blocked on its pipe, with its copy of the file, until the kernel exited."""
    done = _run(_LEAK_CHECK + """
    kill = guard._Child.kill
    calls = []
    def interrupted_once(self):
        calls.append(self.pid)
        if len(calls) == 1:
            raise KeyboardInterrupt
        kill(self)
    guard._Child.kill = interrupted_once
    try:
        guard.load_checked(pickle.dumps(list(range(1000))), "data", pickle.loads, refuse,
                           derive=lambda obj: time.sleep(60), read_derived=pickle.loads)
    except KeyboardInterrupt:
        print("INTERRUPTED")
    print("BEFORE", before, "AFTER", left())
    """)
    assert "INTERRUPTED" in done.stdout, done.stderr[-2000:]
    before, after = done.stdout.split("BEFORE")[1].split("AFTER")
    assert "NO CHILDREN" in after and before.strip() == after.strip(), done.stdout


def test_an_interrupt_as_the_second_child_is_forked_ends_both():
    """A Ctrl-C that lands as the decoding child's fork returns (a slow fork of a big
    process): both children are killed and collected and every pipe closed; before, the
    checker stayed a zombie and the decoding child blocked for good."""
    done = _run(_LEAK_CHECK + """
    fork = os.fork
    forks = []
    def fork_then_interrupt():
        pid = fork()
        if pid:
            forks.append(pid)
            if len(forks) == 2:
                raise KeyboardInterrupt
        return pid
    guard.os.fork = fork_then_interrupt
    try:
        guard.load_checked(pickle.dumps(list(range(1000))), "data", pickle.loads, lambda obj: None,
                           derive=lambda obj: time.sleep(60), read_derived=pickle.loads)
    except KeyboardInterrupt:
        print("INTERRUPTED")
    guard.os.fork = fork
    print("BEFORE", before, "AFTER", left())
    """)
    assert "INTERRUPTED" in done.stdout, done.stderr[-2000:]
    before, after = done.stdout.split("BEFORE")[1].split("AFTER")
    assert "NO CHILDREN" in after and before.strip() == after.strip(), done.stdout


def test_no_descriptor_for_the_second_child_loads_all_the_same():
    """Out of file descriptors at the decoding child's pipe: the file loads (the caller
    decodes it later), no raw OSError, nothing left behind."""
    done = _run(_LEAK_CHECK + """
    pipe = os.pipe
    pipes = []
    def second_fails():
        pipes.append(1)
        if len(pipes) == 2:
            raise OSError(24, "Too many open files")
        return pipe()
    guard.os.pipe = second_fails
    got = guard.load_checked(pickle.dumps([1, 2]), "data", pickle.loads, lambda obj: None,
                             derive=lambda obj: obj, read_derived=pickle.loads)
    guard.os.pipe = pipe
    print("LOADED", got.obj, got.derived)
    print("BEFORE", before, "AFTER", left())
    """)
    assert "LOADED [1, 2] None" in done.stdout, done.stderr[-2000:]
    before, after = done.stdout.split("BEFORE")[1].split("AFTER")
    assert "NO CHILDREN" in after and before.strip() == after.strip(), done.stdout
