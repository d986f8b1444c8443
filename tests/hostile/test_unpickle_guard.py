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
        print("LOADED", load_checked(pickle.dumps([1, 2]), "data", pickle.loads, lambda obj: None))
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
