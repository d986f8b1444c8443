"""``simulate_many`` runs each setting's replays as separate jobs (the point replay, and with
frees that wait on other streams the early and late timings) on one pool of processes.

What a user would notice if it broke: a row whose range, OOM or counters differ from what
replaying that setting alone gives, rows in another order, a progress count that skips or
repeats, or a comparison that fails where processes cannot start or die mid-way (it must
finish in this process with the same rows).
"""

from __future__ import annotations

import os
import signal

import pytest

from allocconf_widget.app.simulate import SimulationRequest
from allocconf_widget.app.simulate import simulate as simulate_source
from allocconf_widget.app.sources import TraceSource
from allocconf_widget.core.sim import simulator
from allocconf_widget.core.sim.result import SimResult
from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.simulator import simulate, simulate_many
from allocconf_widget.core.sim.trace.model import Trace
from allocconf_widget.core.versions import TorchVersion
from tests.trace_builder import TraceBuilder
from tests.unit.test_simulator_twins import _alike, _s

MiB = 1 << 20


def _two_streams() -> Trace:
    """Blocks freed after ``record_stream`` complete a few requests later (the first one eight
    requests later, so the late timing lags all of them that far), among requests of mixed
    sizes (the largest segment 200 MiB): the early and late timings differ from the recorded
    one, and a split limit below 200 MiB acts while one above does not."""
    b = TraceBuilder(reuse_addresses=True)
    for step in range(6):
        big = b.alloc(200 * MiB)
        mid = [b.alloc((20 + 10 * (step % 3)) * MiB) for _ in range(3)]
        b.free_requested(big)
        small = [b.alloc(40 * MiB) for _ in range(3 if step else 8)]
        b.free_completed(big)
        for x in mid:
            b.free_requested(x)
        b.free(b.alloc(90 * MiB))
        for x in mid:
            b.free_completed(x)
        for x in small:
            b.free(x)
    return b.build()


CONFIGS = [
    _s(),
    _s(expandable_segments=True),
    _s(max_split_bytes=64 * MiB),  # acts: replayed after its twin (the defaults)
    _s(max_split_bytes=4096 * MiB),  # cannot act: the twin's replay
    _s(roundup_slots=(4,) * 16),
    _s(),  # asked twice: the first one's result
]


def _alone(trace: Trace, configs: list[SimSettings], **kw: object) -> list[SimResult]:
    return [simulate(trace, c, **kw) for c in configs]  # type: ignore[arg-type]


def test_the_trace_has_a_range_to_replay() -> None:
    trace = _two_streams()
    assert trace.deferred_frees
    low, high = simulate(trace, CONFIGS[0]).reserved_range
    assert low < high  # otherwise the early and late jobs prove nothing here


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_every_row_is_what_replaying_its_setting_alone_gives(workers: int) -> None:
    trace = _two_streams()
    seen: list[tuple[int, int]] = []
    rows = simulate_many(trace, CONFIGS, workers=workers, progress=lambda d, t: seen.append((d, t)))
    alone = _alone(trace, CONFIGS)
    assert [r.settings for r in rows] == CONFIGS
    for row, single in zip(rows, alone, strict=True):
        assert _alike(row, single), row.settings.describe()
        assert row.reserved_range == single.reserved_range
    assert seen == [(i, len(CONFIGS)) for i in range(1, len(CONFIGS) + 1)]


def test_under_a_limit_a_timing_that_runs_out_is_said_on_the_row() -> None:
    trace = _two_streams()
    total = 420 * MiB  # the rounding row fits in the recorded timing, not in the late one
    rows = simulate_many(trace, CONFIGS, workers=2, device_total=total)
    alone = _alone(trace, CONFIGS, device_total=total)
    assert [r.timing_oom for r in rows] == [r.timing_oom for r in alone]
    assert rows[4].timing_oom and rows[4].oom is None
    assert all(_alike(r, a) for r, a in zip(rows, alone, strict=True))


def test_where_processes_cannot_start_the_rows_come_from_this_process(monkeypatch) -> None:
    def refuse(*_args: object, **_kw: object) -> None:
        raise OSError("no processes in this sandbox")

    monkeypatch.setattr(simulator, "ProcessPoolExecutor", refuse)
    trace = _two_streams()
    rows = simulate_many(trace, CONFIGS, workers=2)
    assert all(_alike(r, a) for r, a in zip(rows, _alone(trace, CONFIGS), strict=True))


def _die_on_late_jobs(settings: SimSettings, kwargs: dict[str, object], order: str) -> object:
    if order == simulator.LATE:
        os._exit(3)  # a worker killed (out of memory, say): the pool breaks
    return simulator._run_job(simulator._WORKER_TRACE, settings, kwargs, order)  # type: ignore[arg-type]


def test_when_a_worker_dies_the_rest_runs_here_with_the_same_rows(monkeypatch) -> None:
    # the pool's processes are forked from this one, so they run the patched job function
    monkeypatch.setattr(simulator, "_job_in_worker", _die_on_late_jobs)
    trace = _two_streams()
    seen: list[int] = []
    rows = simulate_many(trace, CONFIGS, workers=2, progress=lambda d, _t: seen.append(d))
    assert all(_alike(r, a) for r, a in zip(rows, _alone(trace, CONFIGS), strict=True))
    assert seen == list(range(1, len(CONFIGS) + 1))


def test_a_trace_without_stream_frees_is_one_job_per_setting(monkeypatch) -> None:
    orders: list[str] = []
    real = simulator._run_job

    def count(trace: Trace, settings: SimSettings, kwargs: dict[str, object], order: str) -> object:
        orders.append(order)
        return real(trace, settings, kwargs, order)

    monkeypatch.setattr(simulator, "_run_job", count)
    b = TraceBuilder()
    for _ in range(3):
        b.free(b.alloc(30 * MiB))
    simulate_many(b.build(), CONFIGS[:2], workers=1)
    assert orders == [simulator.POINT, simulator.POINT]
    orders.clear()
    simulate_many(_two_streams(), CONFIGS[:2], workers=1)
    assert sorted(orders) == sorted([simulator.POINT, simulator.EARLY, simulator.LATE] * 2)


def _two_streams_snapshot() -> dict[str, object]:
    b = TraceBuilder(reuse_addresses=True)
    b.segment("segment_alloc", 1 << 44, 1 << 30)  # the recorded run reserved 1 GiB
    for step in range(4):
        big = b.alloc(200 * MiB)
        b.free_requested(big)
        small = [b.alloc((40 + 10 * step) * MiB) for _ in range(3)]
        b.free_completed(big)
        for x in small:
            b.free(x)
    return b.snapshot()


def test_a_self_check_that_only_scores_replays_only_the_recorded_timing(monkeypatch) -> None:
    # a fraction below what the run reserved (1 GiB): the self-check replays the run as it was, and
    # only its score is shown, so its early and late replays would be time spent for nothing
    orders: list[tuple[float | None, str]] = []
    real = simulator._run_job

    def count(trace: Trace, settings: SimSettings, kwargs: dict[str, object], order: str) -> object:
        orders.append((settings.per_process_memory_fraction, order))
        return real(trace, settings, kwargs, order)

    monkeypatch.setattr(simulator, "_run_job", count)
    source = TraceSource(_two_streams_snapshot(), "two streams", TorchVersion(2, 11), device_total=1 << 30)
    report = simulate_source(source, SimulationRequest(confs=("", "expandable_segments:True"),
                                                       fraction=0.5, workers=1))
    assert sorted(order for fraction, order in orders if fraction is None) == [simulator.POINT]
    assert sorted(order for fraction, order in orders if fraction == 0.5) == sorted(
        [simulator.POINT, simulator.EARLY, simulator.LATE] * 2)
    assert report.fidelity is not None
    assert all(row.result.peak_reserved_range is not None for row in report.rows)
    # without the fraction the self-check's replay is the recorded row's: its range is shown
    orders.clear()
    report = simulate_source(source, SimulationRequest(confs=(), workers=1))
    assert sorted(order for _, order in orders) == [simulator.EARLY, simulator.LATE, simulator.POINT]
    assert report.rows[0].result.peak_reserved_range is not None


def test_an_interrupt_ends_the_workers_at_once(monkeypatch) -> None:
    """A notebook's interrupt (KeyboardInterrupt in this process) while the pool replays: it
    reaches the caller, and no worker is left finishing the replays in hand or queued."""
    import multiprocessing
    import signal
    import threading
    import time

    workers: list[multiprocessing.process.BaseProcess] = []

    def interrupt(done: int, _total: int) -> None:
        if done == 1:
            workers.extend(multiprocessing.active_children())
            raise KeyboardInterrupt

    trace = _two_streams()
    threads_before = set(threading.enumerate())
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        simulate_many(trace, CONFIGS * 4, workers=2, progress=interrupt)
    # the pool's own thread is gone too, at once: left running, it raced the interpreter's exit
    # hook and a CLI ended by Ctrl-C printed a "Bad file descriptor" traceback after its line
    assert set(threading.enumerate()) <= threads_before, threading.enumerate()
    while multiprocessing.active_children() and time.monotonic() - started < 30:
        time.sleep(0.05)  # ended by a signal: gone a moment later
    assert multiprocessing.active_children() == []
    # ended, not left to finish their queue and leave on their own (exit code 0)
    assert workers and all(w.exitcode == -signal.SIGTERM for w in workers), [w.exitcode for w in workers]


def test_a_worker_leaves_ctrl_c_to_the_caller() -> None:
    """A terminal's Ctrl-C reaches every process of the group; a worker ignores it (the caller
    ends the pool), so none prints a traceback of its own between two jobs."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    try:
        simulator._init_worker(_two_streams())
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
        simulator._WORKER_TRACE = None



_CTRL_C_AT_NEXT_FORK: list[bool] = []


def _ctrl_c_as_a_fork_returns() -> None:
    if _CTRL_C_AT_NEXT_FORK:
        _CTRL_C_AT_NEXT_FORK.clear()
        os.kill(os.getpid(), signal.SIGINT)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_parent=_ctrl_c_as_a_fork_returns)


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")
def test_a_ctrl_c_as_the_pool_forks_is_raised_not_dropped():
    """A Ctrl-C landing inside ``os.fork`` (the pool's first submit forks its workers) was handled
    in CPython's at-fork hooks, printed as "Exception ignored" and dropped: the CLI went on
    replaying after the user's Ctrl-C and outlived its minute (seen once in CI's torch 1.13
    cell). Here the Ctrl-C comes from an at-fork hook as the first worker's fork returns, with
    another thread running, as a notebook kernel or a test runner has: a signal mask on the main
    thread alone let that thread take it, and the main thread still raised inside the hook."""
    import threading

    configs = [_s(), _s(expandable_segments=True), _s(max_split_bytes=64 << 20)]
    done = threading.Event()
    other = threading.Thread(target=done.wait, name="another thread of the process")
    other.start()
    _CTRL_C_AT_NEXT_FORK.append(True)
    try:
        with pytest.raises(KeyboardInterrupt):
            simulate_many(_two_streams(), configs, workers=2)
    finally:
        fired = not _CTRL_C_AT_NEXT_FORK
        _CTRL_C_AT_NEXT_FORK.clear()
        done.set()
        other.join()
    assert fired, "the pool forked no worker: the test no longer reaches a fork"
