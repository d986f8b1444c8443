"""What-if replay simulator: predict the CUDA caching allocator under other settings.

Typical use::

    snap = load_snapshot("trace.pickle")
    trace = extract_trace(snap)
    recorded = SimSettings.from_allocator_settings(snap["allocator_settings"], (2, 11))
    print(self_check(trace, recorded).summary())          # can we trust the model here?
    results = simulate_many(trace, [recorded, SimSettings(expandable_segments=True,
                                                          torch_version=(2, 11))])

The engine lives in :mod:`.engine` (hot loop, new segments), with
:mod:`.blocks` (blocks, free lists), :mod:`.reclaim` (OOM path, GC,
``empty_cache``) and :mod:`.expandable`; the start state of traces recorded
mid-run (recorded, or reconstructed backwards) in :mod:`.state`; settings and release rules in
:mod:`.settings`; result types and the fidelity comparison in
:mod:`.result`; trace decoding in :mod:`.trace`. Standard library only.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from types import FrameType
from typing import Any

from allocconf_widget.core.sim.capacity import replay_room
from allocconf_widget.core.sim.engine import Engine
from allocconf_widget.core.sim.native import engine_name, new_engine
from allocconf_widget.core.sim.result import (
    Divergence,
    Fidelity,
    PredictedOom,
    SimResult,
    SimSeries,
    compare_segments,
)
from allocconf_widget.core.sim.settings import EngineRules, SimSettings, round_size
from allocconf_widget.core.sim.state import AllocatorState, reconstruct_initial_state
from allocconf_widget.core.sim.timing import timing_variants
from allocconf_widget.core.sim.trace.decode import decode_entries
from allocconf_widget.core.sim.trace.extract import extract_trace
from allocconf_widget.core.sim.trace.model import Trace
from allocconf_widget.core.versions import TorchVersion, parse_version

__all__ = [
    "AllocatorState",
    "Divergence",
    "Fidelity",
    "PredictedOom",
    "SimResult",
    "SimSeries",
    "SimSettings",
    "Trace",
    "decode_entries",
    "extract_trace",
    "infer_torch_version",
    "reconstruct_initial_state",
    "replay_state",
    "round_size",
    "self_check",
    "simulate",
    "simulate_many",
]


def simulate(
    trace: Trace,
    settings: SimSettings,
    *,
    device_total: int | None = None,
    non_pytorch_bytes: int = 0,
    stop_at_oom: bool = True,
    check: bool = False,
    record_segments: bool = False,
    series_points: int = 1000,
    address_hints: bool = False,
    timing: bool = True,
) -> SimResult:
    """Replay ``trace`` under ``settings`` and predict reserved memory, OOMs and counters.

    Args:
        device_total: device memory in bytes (``totalGlobalMem``); ``None`` means
            unlimited: cudaMalloc never fails and no fraction limit applies.
        non_pytorch_bytes: memory used outside the allocator (CUDA context,
            libraries, other processes); cudaMalloc fails when a new segment does
            not fit in ``device_total − non_pytorch_bytes``.
        stop_at_oom: stop at the first allocation that fails, as the real program
            would have raised there. OOMs recorded in the trace (which the program
            survived) never stop the replay.
        check: compare the simulated segment events with the recorded ones and
            attach a :class:`Fidelity`. Meaningful only for the recorded settings.
            The replay itself is the one a what-if gets (the driver address model
            places new segments), so the score measures what a prediction can do.
        record_segments: keep the simulated segment events in the result.
        series_points: upper bound on points in the reserved/fragmentation series.
        address_hints: give new segments the recorded addresses (only meaningful
            under the recorded settings), so address-ordered tie-breaks (≤ 2.11)
            follow the real run. A what-if cannot have them: a fidelity from such a
            replay is labelled ``recorded_addresses`` and must not stand beside a
            prediction as its self-check.
        timing: where frees wait on other streams (``record_stream``), replay the trace
            twice more with those frees completing at once and twice as late as the
            recording's longest wait (:mod:`.timing`) and attach the peak's range
            (:attr:`SimResult.peak_reserved_range`).
    """
    engine = new_engine(
        trace,
        settings,
        device_total=device_total,
        non_pytorch_bytes=non_pytorch_bytes,
        stop_at_oom=stop_at_oom,
        record_segments=record_segments or check,
        address_hints=address_hints,
    )
    result = engine.run(series_points)
    if timing:
        result = _with_timing_range(trace, settings, result, device_total=device_total,
                                    non_pytorch_bytes=non_pytorch_bytes, stop_at_oom=stop_at_oom)
    if check:
        fidelity = compare_segments(trace, tuple(engine.seg_events), result.peak_reserved_bytes,
                                    recorded_addresses=address_hints)
        events = result.segment_events if record_segments else ()
        result = dataclasses.replace(result, fidelity=fidelity, segment_events=events)
    return result


def _with_timing_range(
    trace: Trace, settings: SimSettings, result: SimResult, *, device_total: int | None,
    non_pytorch_bytes: int, stop_at_oom: bool,
) -> SimResult:
    """``result`` with the peak range over the GPU timings the recording allows."""
    variants = timing_variants(trace)
    if variants is None:
        return result
    return with_bounds(result, [replay_bound(variant, settings, device_total=device_total,
                                             non_pytorch_bytes=non_pytorch_bytes, stop_at_oom=stop_at_oom)
                                for variant in (variants.early, variants.late)])


@dataclasses.dataclass(frozen=True)
class TimingBound:
    """What the range needs of one replay in another GPU timing (:mod:`.timing`): small, so
    a worker process sends it back in a few bytes."""

    peak_reserved_bytes: int
    largest_segment_bytes: int
    new_oom: bool  # the replay ran out of memory where the recording did not


def replay_bound(variant: Trace, settings: SimSettings, *, device_total: int | None,
                 non_pytorch_bytes: int, stop_at_oom: bool) -> TimingBound:
    """Replay one timing variant of a trace (no series, no segment events)."""
    other = new_engine(variant, settings, device_total=device_total, non_pytorch_bytes=non_pytorch_bytes,
                       stop_at_oom=stop_at_oom).run(1)
    return TimingBound(other.peak_reserved_bytes, other.largest_segment_bytes,
                       other.oom is not None and not other.oom.recorded)


def with_bounds(result: SimResult, bounds: Sequence[TimingBound]) -> SimResult:
    """The point replay ``result`` with the range its timing variants' replays span."""
    peaks = [result.peak_reserved_bytes, *(b.peak_reserved_bytes for b in bounds)]
    largest = max([result.largest_segment_bytes, *(b.largest_segment_bytes for b in bounds)])
    timing_oom = result.oom is None and any(b.new_oom for b in bounds)
    return dataclasses.replace(result, peak_reserved_range=(min(peaks), max(peaks)), timing_oom=timing_oom,
                               largest_segment_bytes=largest)


def replay_state(
    trace: Trace,
    settings: SimSettings,
    *,
    device_total: int | None = None,
    non_pytorch_bytes: int = 0,
    check: bool = True,
) -> AllocatorState:
    """The simulated allocator's segments and blocks after replaying the whole trace.

    With ``check`` (the default) new segments take the recorded addresses, so under
    the recorded settings the result can be compared with the snapshot's final
    ``segments`` (``AllocatorState.from_snapshot_segments(snapshot["segments"])``).
    The replay does not stop at an OOM.
    """
    engine = Engine(trace, settings, device_total=device_total, non_pytorch_bytes=non_pytorch_bytes,
                    stop_at_oom=False, address_hints=check)
    engine.run(1)
    return engine.export_state()


def self_check(
    trace: Trace,
    recorded_settings: SimSettings,
    *,
    device_total: int | None = None,
    non_pytorch_bytes: int = 0,
    recorded_addresses: bool = False,
) -> Fidelity:
    """Replay under the settings the trace was recorded with and score the match.

    The replay has exactly the information a what-if has (no recorded segment
    addresses), so the score says how far a prediction can be trusted;
    ``recorded_addresses=True`` replays with them instead (a model diagnostic,
    labelled so in :meth:`Fidelity.summary`). Without ``device_total`` and a fraction the
    capacity is the device's room at the first recorded OOM (:func:`.capacity.replay_room`),
    so OOM-path releases replay too; a limit read off the OOMs is the caller's to pass, as
    the fraction of ``recorded_settings`` (``app/simulate`` does). A trace with a start state
    (``trace.initial_state``) replays from it.
    """
    room = replay_room(trace, device_total, non_pytorch_bytes, recorded_settings.per_process_memory_fraction,
                       read_limit=False)
    device_total, non_pytorch_bytes = room.device_total, room.non_pytorch_bytes
    result = simulate(
        trace,
        recorded_settings,
        device_total=device_total,
        non_pytorch_bytes=non_pytorch_bytes,
        stop_at_oom=False,
        check=True,
        address_hints=recorded_addresses,
        timing=False,  # the score is about the recorded order; no range needed
    )
    assert result.fidelity is not None
    return result.fidelity


# ------------------------------------------------------------- parallel replay
_WORKER_TRACE: Trace | None = None

#: the replays of one setting: the recorded order, and the early and late GPU timings
POINT, EARLY, LATE = "point", "early", "late"
Job = tuple[int, str]  # (configuration index, one of the orders above)


def _init_worker(trace: Trace) -> None:
    """Keep the trace, and leave Ctrl-C to the calling process: a terminal's Ctrl-C reaches the
    whole process group, and a worker that got it between two jobs died with a traceback of
    its own on the user's screen. The caller stops the pool instead (:meth:`_Replays.__exit__`)."""
    global _WORKER_TRACE  # noqa: PLW0603 - one trace per worker process, set once
    _WORKER_TRACE = trace
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_job(trace: Trace, settings: SimSettings, kwargs: dict[str, Any],
             order: str) -> SimResult | TimingBound:
    """One replay of a setting: the point prediction, or one bound of its range."""
    if order == POINT:
        return simulate(trace, settings, **{**kwargs, "timing": False})
    variants = timing_variants(trace)
    assert variants is not None
    return replay_bound(variants.early if order == EARLY else variants.late, settings,
                        device_total=kwargs["device_total"], non_pytorch_bytes=kwargs["non_pytorch_bytes"],
                        stop_at_oom=kwargs["stop_at_oom"])


def _job_in_worker(settings: SimSettings, kwargs: dict[str, Any], order: str) -> SimResult | TimingBound:
    assert _WORKER_TRACE is not None
    return _run_job(_WORKER_TRACE, settings, kwargs, order)


def simulate_many(
    trace: Trace,
    settings_list: Iterable[SimSettings],
    *,
    device_total: int | None = None,
    non_pytorch_bytes: int = 0,
    stop_at_oom: bool = True,
    workers: int | None = None,
    series_points: int = 1000,
    check: Sequence[bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
    timing: Sequence[bool] | None = None,
) -> list[SimResult]:
    """Replay several configurations, in parallel processes when there are several.

    The trace goes to each worker once (its columns are ``array`` objects, which
    pickle as raw bytes); each task then ships only a small :class:`SimSettings`.
    One configuration, ``workers=1``, or a platform that cannot start processes
    runs in this process. ``workers=None`` means a process per core, or where the compiled
    engine replays a thread per core (its replays release the GIL). Results come back in input
    order. ``check`` holds a
    :func:`simulate` ``check`` flag per configuration (for the recorded one).
    ``progress(done, total)`` is called after each configuration finishes, so a
    front end can show how far a slow comparison has got. ``timing`` holds a
    :func:`simulate` ``timing`` flag per configuration (default: all on).

    A setting with ``garbage_collection_threshold`` or ``max_split_size_mb`` whose twin
    without them is in the list too is replayed after the others, and only where they could
    act: where the twin never reserved more than the threshold allows (:func:`_gc_never_acts`)
    and never held a segment as large as the split limit (:func:`_split_never_acts`), the
    replay would be the twin's step for step, and the twin's result is returned under its own
    settings.
    """
    configs = list(settings_list)
    base: dict[str, Any] = {
        "device_total": device_total,
        "non_pytorch_bytes": non_pytorch_bytes,
        "stop_at_oom": stop_at_oom,
        "series_points": series_points,
    }
    flags = list(check) if check is not None else [False] * len(configs)
    if len(flags) != len(configs):
        raise ValueError("check needs one flag per configuration")
    ranges = list(timing) if timing is not None else [True] * len(configs)
    if len(ranges) != len(configs):
        raise ValueError("timing needs one flag per configuration")
    per_config = [{**base, "check": flag, "timing": t} for flag, t in zip(flags, ranges, strict=True)]
    # the compiled engine replays a million entries in tens of milliseconds without holding the
    # GIL: threads of this process share the trace (and what it built for the next call: its
    # timing orders, its columns), where worker processes would each get a pickled copy and
    # build them again. Asked for workers, the replays go to processes as always
    threads = workers is None and engine_name() == "native"
    if workers is None:
        workers = os.cpu_count() or 1
    total = len(configs)
    results: list[SimResult | None] = [None] * total
    done = 0

    def report() -> None:
        if progress is not None:
            progress(done, total)

    same = _same_replays(configs, per_config)
    twins = _twins(configs, per_config, same)
    bases = set(twins.values())
    # the twins' own twins first: a twin is decided (reused, or queued) as soon as its twin is in
    first = sorted((i for i in range(total) if i not in twins and i not in same),
                   key=lambda i: i not in bases)
    with _Replays(trace, configs, per_config, workers, threads=threads) as replays:
        replays.submit(first)
        for i, result in replays.finished():
            results[i] = result
            done += 1
            report()
            for k in [k for k, j in twins.items() if j == i]:
                if _twin_replays_alike(trace, configs[k], result, device_total, non_pytorch_bytes):
                    results[k] = dataclasses.replace(result, settings=configs[k])  # its score: below
                    done += 1
                    report()
                else:
                    replays.submit([k])
    for i, j in same.items():
        got = results[j]
        assert got is not None
        results[i] = dataclasses.replace(got, settings=configs[i])
        done += 1
        report()
    # a self-check's score belongs only to the rows that asked for it (a repeat or a twin may
    # have taken its result from the checked replay)
    return [r if flags[i] or r.fidelity is None else dataclasses.replace(r, fidelity=None)
            for i, r in enumerate(results) if r is not None]


def _same_replays(configs: list[SimSettings], kwargs: list[dict[str, Any]]) -> dict[int, int]:
    """Each configuration asked for again (the recorded row and its own option string, say):
    index -> the first index with the same settings and timing flag. The first one replays,
    with the self-check if any of them asks for it (a check only records and compares the
    segment events: the replay and its result are the same), and the others take its result.
    Updates ``kwargs`` in place for that."""
    first: dict[tuple[SimSettings, bool], int] = {}
    same: dict[int, int] = {}
    for i, (s, kw) in enumerate(zip(configs, kwargs, strict=True)):
        j = first.setdefault((s, kw["timing"]), i)
        if j != i:
            same[i] = j
            if kw["check"]:
                kwargs[j] = {**kwargs[j], "check": True}
    return same


class _Replays:
    """The replays of the settings asked for, on up to ``workers`` processes (threads of this
    process, with ``threads``: the compiled engine replays without holding the GIL).

    Each setting is one to three jobs (its point replay, and with frees that wait on other
    streams the early and late timings), each a task of its own, so two processes share out
    eight settings' two dozen replays evenly instead of eight unequal tasks. One pool serves
    every batch: the settings queued after their twin's result (:func:`_twins`) reuse its
    processes. Where processes cannot start or break, the jobs not yet back run here.
    """

    def __init__(self, trace: Trace, configs: list[SimSettings], kwargs: list[dict[str, Any]],
                 workers: int, *, threads: bool = False) -> None:
        self.trace, self.configs, self.kwargs = trace, configs, kwargs
        # never more processes than jobs there could be (every setting replayed)
        self.workers = min(workers, sum(len(self.jobs(i)) for i in range(len(configs))))
        self.threads = threads  # threads of this process instead of processes (compiled engine)
        self.pool: ProcessPoolExecutor | ThreadPoolExecutor | None = None
        self.no_pool = self.workers <= 1  # one process asked for, or processes failed: run here
        self.futures: dict[Future[SimResult | TimingBound], Job] = {}
        self.local: list[Job] = []  # jobs to run in this process, in order
        self.got: dict[Job, SimResult | TimingBound] = {}
        self.waiting: dict[int, int] = {}  # configuration -> its jobs not back yet

    def __enter__(self) -> _Replays:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """Stop the pool. Interrupted (Ctrl-C, a notebook's interrupt) or failed, the workers
        are ended at once instead of finishing the replays in hand and queued, so a Ctrl-C
        returns at once.

        The pool's manager thread is then waited for (a bounded moment: it only notices the
        ended workers and closes its pipes). Left running, it raced the interpreter's exit: the
        executor's exit hook wrote to a wake-up pipe the thread was closing, and a CLI ended by
        Ctrl-C printed "Exception ignored ... Bad file descriptor" and a traceback after its one
        line (seen once in CI, Python 3.11; the check-then-write is unlocked up to 3.13)."""
        if self.pool is None:
            return
        if exc_type is None or isinstance(self.pool, ThreadPoolExecutor):
            # a thread's replay in hand ends within a fraction of a second; the queued never start
            self.pool.shutdown(wait=True, cancel_futures=True)
            return
        manager: threading.Thread | None = getattr(self.pool, "_executor_manager_thread", None)
        _end_workers(self.pool)
        self.pool.shutdown(wait=False, cancel_futures=True)
        if manager is not None:
            manager.join(timeout=_MANAGER_GRACE_S)

    def jobs(self, i: int) -> list[Job]:
        timed = self.kwargs[i]["timing"] and self.trace.deferred_frees  # timing_variants is not None
        return [(i, POINT), (i, EARLY), (i, LATE)] if timed else [(i, POINT)]

    def submit(self, indices: list[int]) -> None:
        """Queue the jobs of ``indices`` (a pool's first submit forks its worker processes);
        a Ctrl-C meanwhile is raised once the forks are done (:func:`_ctrl_c_after_forks`)."""
        with _ctrl_c_after_forks():
            self._submit(indices)

    def _submit(self, indices: list[int]) -> None:
        jobs: list[Job] = []
        for i in indices:
            mine = self.jobs(i)
            self.waiting[i] = len(mine)
            jobs += mine
        if self.pool is None and not self.no_pool:
            try:
                self.pool = (ThreadPoolExecutor(max_workers=self.workers) if self.threads else
                             ProcessPoolExecutor(max_workers=self.workers, initializer=_init_worker,
                                                 initargs=(self.trace,)))
            except (OSError, NotImplementedError):
                self.no_pool = True  # e.g. a sandbox without process support
        while jobs and self.pool is not None:
            i, order = jobs[0]
            try:
                if isinstance(self.pool, ThreadPoolExecutor):
                    future = self.pool.submit(_run_job, self.trace, self.configs[i], self.kwargs[i], order)
                else:
                    future = self.pool.submit(_job_in_worker, self.configs[i], self.kwargs[i], order)
            except (OSError, BrokenProcessPool, RuntimeError):
                self._give_up_pool()
                break
            self.futures[future] = jobs.pop(0)
        self.local.extend(jobs)

    def _give_up_pool(self) -> None:
        """Move every job not back yet to this process (a broken pool returns nothing more)."""
        assert self.pool is not None
        pending = list(self.futures.values())
        self.futures.clear()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.pool, self.no_pool = None, True
        self.local = sorted({*self.local, *pending}, key=_job_order)

    def finished(self) -> Iterator[tuple[int, SimResult]]:
        """Each setting's result (its range attached) as soon as all its jobs are back,
        settings submitted meanwhile included."""
        while self.waiting:
            for job, value in self._next_jobs():
                self.got[job] = value
                i = job[0]
                self.waiting[i] -= 1
                if self.waiting[i] == 0:
                    del self.waiting[i]
                    yield i, self._result(i)

    def _next_jobs(self) -> list[tuple[Job, SimResult | TimingBound]]:
        if self.futures:
            done, _ = wait(self.futures, return_when=FIRST_COMPLETED)
            out: list[tuple[Job, SimResult | TimingBound]] = []
            for future in done:
                try:
                    value = future.result()
                except (OSError, BrokenProcessPool):
                    self._give_up_pool()
                    return out
                out.append((self.futures.pop(future), value))
            return out
        job = self.local.pop(0)
        i, order = job
        return [(job, _run_job(self.trace, self.configs[i], self.kwargs[i], order))]

    def _result(self, i: int) -> SimResult:
        point = self.got.pop((i, POINT))
        assert isinstance(point, SimResult)
        bounds = [self.got.pop((i, order)) for order in (EARLY, LATE) if (i, order) in self.got]
        if not bounds:
            return point
        return with_bounds(point, [b for b in bounds if isinstance(b, TimingBound)])


@contextmanager
def _ctrl_c_after_forks() -> Iterator[None]:
    """Defer a Ctrl-C on the main thread while the pool forks its workers, then raise it.

    A Ctrl-C that lands while ``os.fork`` runs raises inside CPython's at-fork hooks, which
    print "Exception ignored" and drop the KeyboardInterrupt: the replays went on, and a user
    who pressed Ctrl-C once waited for all of them. Masking the signal is not enough: another
    thread of the process takes it, and the main thread still raises inside the hook. So the
    handler only notes it meanwhile, and the caller's own handler runs once the forks are done
    (its KeyboardInterrupt reaches the caller's cleanup, which ends the workers)."""
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if on_main else None
    if not callable(previous):  # not the main thread, or Ctrl-C ignored / left to the default
        yield
        return
    pending: list[tuple[int, FrameType | None]] = []

    def note(signum: int, frame: FrameType | None) -> None:
        pending.append((signum, frame))

    signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending:
            previous(*pending[0])


_MANAGER_GRACE_S = 5.0  # for the pool's thread once its workers are ended (it takes far less)


def _end_workers(pool: ProcessPoolExecutor) -> None:
    """Terminate ``pool``'s processes (``terminate_workers`` from Python 3.14; before it, the
    processes the executor keeps)."""
    terminate = getattr(pool, "terminate_workers", None)
    if terminate is not None:
        terminate()
        return
    processes: Mapping[int, Any] = getattr(pool, "_processes", None) or {}
    for process in list(processes.values()):
        process.terminate()


def _job_order(job: Job) -> tuple[int, int]:
    return job[0], (POINT, EARLY, LATE).index(job[1])


def _twins(configs: list[SimSettings], kwargs: list[dict[str, Any]],
           same: Mapping[int, int]) -> dict[int, int]:
    """Each setting with ``garbage_collection_threshold`` or ``max_split_size_mb`` (not with
    expandable segments) whose twin is replayed too: the same settings and timing flag without
    both, else without one of them. index -> the twin's index. A twin is never itself a twin
    (settings with fewer of the two options are decided first), so it replays with the first
    batch. A repeat of another setting (``same``) takes that one's result instead; a setting
    with a self-check is always replayed."""
    first: dict[tuple[SimSettings, bool], int] = {}
    for i, (s, kw) in enumerate(zip(configs, kwargs, strict=True)):
        if i not in same:
            first.setdefault((s, kw["timing"]), i)
    twins: dict[int, int] = {}
    candidates = [i for i, kw in enumerate(kwargs) if not kw["check"] and i not in same]
    for i in sorted(candidates, key=lambda i: len(_twin_options(configs[i]))):
        for stripped in _without_twin_options(configs[i]):
            j = first.get((stripped, kwargs[i]["timing"]))
            if j is not None and j not in twins:
                twins[i] = j
                break
    return twins


def _twin_options(s: SimSettings) -> tuple[str, ...]:
    """The options of ``s`` a twin may lack: the collector's threshold, and the split limit
    where segments are classic (an expandable segment grows past any size)."""
    return ((("gc",) if s.gc_threshold > 0.0 else ())
            + (("split",) if s.max_split_bytes is not None and not s.expandable_segments else ()))


def _without_twin_options(s: SimSettings) -> list[SimSettings]:
    """``s`` without all of its twin options, then without each one alone."""
    options = _twin_options(s)

    def without(names: tuple[str, ...]) -> SimSettings:
        return dataclasses.replace(
            s, gc_threshold=0.0 if "gc" in names else s.gc_threshold,
            max_split_bytes=None if "split" in names else s.max_split_bytes)

    if not options:
        return []
    alone = [(name,) for name in options] if len(options) > 1 else []
    return [without(options)] + [without(names) for names in alone]


def _twin_replays_alike(trace: Trace, s: SimSettings, twin: SimResult, device_total: int | None,
                        non_pytorch_bytes: int) -> bool:
    """Whether the replay of ``s`` would be its twin's, step for step: every option the twin
    lacks could never act in it (the two replays stay alike until one would first act)."""
    t = twin.settings
    if s.gc_threshold != t.gc_threshold and not _gc_never_acts(
            trace, s, twin, device_total, non_pytorch_bytes):
        return False
    return s.max_split_bytes == t.max_split_bytes or _split_never_acts(s, twin)


def _split_never_acts(s: SimSettings, twin: SimResult) -> bool:
    """``max_split_size_mb`` changes only what happens to blocks at least that large (torch's
    ``get_free_block``, ``should_split`` and ``release_available_cached_blocks`` all ask
    ``size >= max_split_size`` of a block or a request first, and a block is never larger than
    its segment). Where the twin never held a segment that large, in any GPU timing, no block
    or served request was; a request that large that found no block failed in the twin too,
    and ``release_available_cached_blocks``, finding no oversize block, frees nothing there."""
    assert s.max_split_bytes is not None
    return twin.largest_segment_bytes < s.max_split_bytes


def _gc_never_acts(trace: Trace, s: SimSettings, twin: SimResult, device_total: int | None,
                   non_pytorch_bytes: int) -> bool:
    """Whether the replay of ``s`` is its twin's without garbage collection, step for step.

    torch's collector frees nothing while reserved memory is within threshold × the fraction's
    limit, and nothing else reads the ages it keeps; so where the twin (identical until the
    collector would first act) never reserved more than that, in any GPU timing, nor does ``s``.
    Without a fraction the collector never runs at all. A trace that changes its fraction
    mid-run moves the limit: replayed for real.
    """
    if trace.limit_changes:
        return False
    rules = EngineRules.derive(s, device_total, non_pytorch_bytes)
    if not rules.gc_enabled:
        return True
    assert rules.allowed_max is not None
    return twin.reserved_range[1] <= int(rules.gc_threshold * rules.allowed_max)


#: First releases of each set of replay rules (docs/internals/allocator_facts.md §6.14): expandable
#: segments, the d > 1 division rule, max_non_split_rounding, the fraction < 1 GC
#: precondition, large_segment_size, the registration-counter tie-break.
RULE_CHANGES = ((2, 0), (2, 1), (2, 4), (2, 6), (2, 10), (2, 11), (2, 12))


def infer_torch_version(
    trace: Trace,
    allocator_settings: Mapping[str, Any] | None,
    *,
    floor: TorchVersion | tuple[int, int] = (2, 0),
    prefer: TorchVersion | None = None,
    device_total: int | None = None,
    non_pytorch_bytes: int = 0,
    fraction: float | None = None,
) -> tuple[TorchVersion, Fidelity | None]:
    """Pick the torch release whose allocator rules best reproduce the trace.

    Snapshots do not say which torch wrote them, and the rules differ between
    releases (most visibly the equal-size tie-break: address up to 2.11, a
    counter from 2.12). Each rule set from ``floor`` on is self-checked; the
    best match wins, ties going to ``prefer`` (e.g. the installed torch), then
    to the newest release. Without recorded segment events nothing can be
    told apart: ``prefer`` (or ``floor``) is returned with no fidelity.
    """
    floor = parse_version(floor)
    candidates = {parse_version(v) for v in RULE_CHANGES if v >= floor}
    candidates.add(max(floor, parse_version(RULE_CHANGES[0])))
    if prefer is not None and prefer >= floor:
        candidates.add(prefer)
    fallback = prefer if prefer is not None and prefer >= floor else floor
    if not len(trace.seg_kinds):
        return fallback, None
    scored = []
    for version in sorted(candidates):
        settings = SimSettings.from_allocator_settings(allocator_settings, version)
        if fraction is not None:
            settings = dataclasses.replace(settings, per_process_memory_fraction=fraction)
        fidelity = self_check(trace, settings, device_total=device_total,
                              non_pytorch_bytes=non_pytorch_bytes)
        rank = (fidelity.score, fidelity.peak_matches, version == prefer, version)
        scored.append((rank, version, fidelity))
    _, version, fidelity = max(scored)
    return version, fidelity
