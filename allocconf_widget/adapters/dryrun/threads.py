"""Threads a dry-run step starts run inside the dry run.

torch's dispatch modes are per thread: a prefetcher the step starts (``.to("cuda",
non_blocking=True)`` on a loader thread, a pin-memory thread) would run on real tensors and
real CUDA, its allocations missing from the trace. While the dry run runs, ``Thread.start``
hands the new thread the starting thread's modes (the same objects, as autograd's worker
threads get them), so its tensors are fakes and its allocations recorded. Where this torch
cannot hand modes over, starting a thread stops the dry run with one line naming it.

A thread that outlives the dry run keeps its fake modes until it ends (its later tensors are
fakes, never real CUDA); the dry run notes it. Threads that were already running when the dry
run started are not inside it: a CUDA start from one is refused by
:class:`.entry_points.EntryPointsAnswered`.
"""

from __future__ import annotations

import threading
import time
from types import ModuleType
from typing import Any

from allocconf_widget._errors import DryRunError
from allocconf_widget.adapters.dryrun.log import caller_line
from allocconf_widget.adapters.dryrun.ports import Notes
from allocconf_widget.adapters.dryrun.tensors import mode_stacks, modes_pushed


class ThreadsFollowed:
    """While entered, threads started by a thread inside the dry run run inside it too."""

    def __init__(self, torch: ModuleType, notes: Notes, in_dry_run: Any) -> None:
        self._torch = torch
        self._notes = notes
        self._in_dry_run = in_dry_run
        self._saved: Any = None
        self.started: list[threading.Thread] = []

    def __enter__(self) -> ThreadsFollowed:
        torch, started, in_dry_run = self._torch, self.started, self._in_dry_run
        original = self._saved = threading.Thread.start

        def start(thread: threading.Thread) -> None:
            if in_dry_run():
                stacks = mode_stacks(torch)
                if stacks is None:
                    raise DryRunError(f"the step starts a thread ({thread.name!r}) at {caller_line()}, "
                                      f"which this torch ({torch.__version__}) cannot run on fake tensors: "
                                      "its work would run for real. Run the step without the thread "
                                      "(e.g. a DataLoader with num_workers=0 and pin_memory=False)")
                run = thread.run

                def run_inside() -> None:
                    with modes_pushed(torch, stacks):
                        run()

                thread.run = run_inside  # type: ignore[method-assign]
                started.append(thread)
            original(thread)

        threading.Thread.start = start  # type: ignore[method-assign, assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            threading.Thread.start = self._saved  # type: ignore[method-assign]
        deadline = time.monotonic() + 0.5  # a thread that ends as the step does: wait a little, once
        for thread in self.started:
            thread.join(timeout=max(deadline - time.monotonic(), 0.0))
        alive = [t.name for t in self.started if t.is_alive()]
        if alive:
            self._notes.add(f"thread(s) {', '.join(repr(n) for n in alive)}, started by the step, were still "
                            "running when the dry run ended: their allocations after that are not in the "
                            "trace, and they stay on fake tensors until they end", key="threads alive")
        self.started.clear()
