"""Replay a recorded run as if it were being sampled live: the monitor's no-GPU demo.

:class:`ReplaySampler` has the interface the monitor view uses on a
:class:`~allocconf_widget.adapters.sampler.Sampler` (``timeline``, ``start``,
``stop``, ``running``, ``add_listener``, ``latest``, ``status``, ``overhead``),
but its samples come from a :class:`~allocconf_widget.core.memory.recording.Recording`
played back in real time (or faster) by a daemon thread. Every sample it makes
carries the recording, so views can label it "Recording: …" and never present
it as this machine's GPU.

Two things make a replay read like a live run:

* **Fragmentation** comes from the recording's allocation history
  (:meth:`Recording.fragmentation`), so the chart's fragmentation line has data
  even though the recording kept counters only.
* **Idle stretches** (no counter changed for more than ``skip_idle`` seconds, e.g.
  the model set-up before the bundled run's first step) are cut to
  :data:`IDLE_KEEP` seconds, in playback and on the x axis, and marked on the
  chart with how long they were. ``skip_idle=None`` keeps real time.

Start after the replay finished begins a new run on an empty chart; only
``loop=True`` appends passes one after another.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from allocconf_widget.adapters.sampler import OK, THREAD_PREFIX, Listener, Sample
from allocconf_widget.core.memory.recording import RecordedSample, Recording
from allocconf_widget.core.memory.timeline import Timeline

REPLAYING = "replaying"
FINISHED = "replay_finished"
IDLE_SKIP_S = 1.0
"""An unchanged stretch longer than this is idle (cut short in playback and on the chart)."""
IDLE_KEEP = 0.5
"""Seconds of an idle stretch kept on the chart (so the cut is visible, and marked)."""


@dataclass(frozen=True, slots=True)
class IdleCut:
    """Samples ``first..last`` (indices) changed nothing for ``seconds``; all but IDLE_KEEP cut.

    The chart labels the kept stretch ``idle <seconds> skipped`` (no memory counter moved).
    """

    first: int
    last: int
    start: float
    seconds: float

    @property
    def removed(self) -> float:
        return max(0.0, self.seconds - IDLE_KEEP)

    @property
    def label(self) -> str:
        return f"idle {self.seconds:.1f} s skipped"


def idle_cuts(samples: Sequence[RecordedSample], step_times: Sequence[float],
              threshold: float | None) -> list[IdleCut]:
    """Stretches of equal consecutive samples, with no optimizer step, longer than ``threshold``."""
    if threshold is None or len(samples) < 2:
        return []
    cuts: list[IdleCut] = []
    first = 0
    for i in range(1, len(samples) + 1):
        if i < len(samples) and samples[i].values() == samples[first].values():
            continue
        last = i - 1
        start, end = samples[first].t, samples[last].t
        busy = any(start < t < end for t in step_times)
        if end - start > threshold and not busy:
            cuts.append(IdleCut(first, last, start, end - start))
        first = i
    return cuts


class ReplaySampler:
    """Feeds a recording into a timeline at ``speed`` × real time, ``interval`` s per tick."""

    def __init__(
        self,
        recording: Recording,
        *,
        interval: float = 0.1,
        speed: float = 1.0,
        loop: bool = False,
        max_points: int = 2048,
        skip_idle: float | None = IDLE_SKIP_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval > 0 or not speed > 0:
            raise ValueError("interval and speed must be > 0")
        self.recording = recording
        self.cuts = idle_cuts(recording.samples, [s.t for s in recording.steps], skip_idle)
        self._cut_after = {cut.last: cut for cut in self.cuts}
        self._fragmentation: tuple[float | None, ...] | None = None
        self.interval = interval
        self.speed = speed
        self.loop = loop
        self.clock = clock
        self.step_sync = False
        self.timeline = Timeline(max_points=max_points)
        self.status = FINISHED
        self.degraded: str | None = None
        self.latest: dict[int | None, Sample] = {}
        self.steps = 0
        self.rounds = 0
        self.listener_errors = 0
        self.last_error: str | None = None
        self._listeners: list[Listener] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started_at: float | None = None
        self._next_sample = 0
        self._next_step = 0
        self._offset = 0.0  # x of the current pass (loops append after the previous pass)

    @property
    def running(self) -> bool:
        with self._lock:
            return self._started_at is not None

    def start(self) -> ReplaySampler:
        """Replay (idempotent while running): continue a paused replay; a finished one starts over
        as a new run on an empty chart."""
        with self._lock:
            if self._started_at is not None:
                return self
            if self._next_sample >= len(self.recording.samples):
                self._new_run()
            self._started_at = self.clock() - self._position() / self.speed
            self._stop.clear()
            self.status = REPLAYING
            self._thread = threading.Thread(
                target=self._run, name=f"{THREAD_PREFIX}-replay", daemon=True
            )
            self._thread.start()
        return self

    def play(self) -> None:
        """Replay to the end on the calling thread, no background thread at all.

        For front ends that draw only what the running cell's own thread sends
        (Colab, docs/internals/notebook_facts.md §6): listeners (the view) are called from here.
        Ctrl-C (KeyboardInterrupt) pauses the replay and propagates.
        """
        self.stop()
        with self._lock:
            if self._done():
                self._new_run()
            self._started_at = self.clock() - self._position() / self.speed
            self.status = REPLAYING
        try:
            while not self._done():
                self.tick()
                time.sleep(self.interval)
        finally:
            with self._lock:
                self._started_at = None
                self.status = FINISHED if self._done() else "paused"
            self._notify_finished()

    def stop(self, timeout: float = 2.0) -> None:
        """Pause the replay (idempotent); a later start continues, or restarts once finished."""
        with self._lock:
            if self._started_at is None:
                return
            self._started_at = None
            self._stop.set()
            thread, self._thread = self._thread, None
            if self.status == REPLAYING:
                self.status = FINISHED if self._done() else "paused"
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        with self._lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    def overhead(self) -> dict[str, float | int | None]:
        """Same keys as the live sampler's; a replay costs no GPU time at all."""
        return {"samples": self._next_sample, "mean_sample_ms": None, "snapshots": 0,
                "last_snapshot_ms": None, "snapshot_interval_s": None, "snapshot_duty": None,
                "step_stride": 1, "steps": self.steps}

    # ------------------------------------------------------------- playback
    def tick(self, now: float | None = None) -> list[Sample]:
        """Emit every recorded sample due by ``now``; returns them."""
        with self._lock:
            if self._started_at is None:
                return []
            at = ((self.clock() if now is None else now) - self._started_at) * self.speed
            due = self._take_due(at)
            listeners = list(self._listeners)
        if due:
            for listener in listeners:
                try:
                    listener(due)
                except Exception as exc:  # a broken view must not stop the replay
                    self.listener_errors += 1
                    self.last_error = f"listener failed: {exc!r}"
        return due

    def played_x(self, t: float) -> float:
        """Where recording time ``t`` is drawn (and played): idle stretches cut to IDLE_KEEP."""
        removed = 0.0
        for cut in self.cuts:
            if t <= cut.start + IDLE_KEEP:
                break
            if t <= cut.start + cut.seconds:  # inside the cut: every sample at its kept end
                return cut.start + IDLE_KEEP - removed
            removed += cut.removed
        return t - removed

    def fragmentation(self) -> tuple[float | None, ...]:
        """Per-sample fragmentation from the recording's history (computed on first use)."""
        if self._fragmentation is None:
            try:
                self._fragmentation = self.recording.fragmentation()
            except Exception as exc:  # a broken recording must not stop the replay
                self.last_error = f"fragmentation unavailable: {exc}"
                self._fragmentation = (None,) * len(self.recording.samples)
        return self._fragmentation

    def _take_due(self, at: float) -> list[Sample]:
        rec = self.recording
        due: list[Sample] = []
        fragmentation = self.fragmentation()
        while (self._next_sample < len(rec.samples)
               and self.played_x(rec.samples[self._next_sample].t) <= at):
            index = self._next_sample
            sample = self._as_sample(rec.samples[index], fragmentation[index])
            self.timeline.add(self._offset + sample.t, sample.values(), 0)
            self.latest[0] = sample
            due.append(sample)
            self._next_sample += 1
            cut = self._cut_after.get(index)
            if cut is not None:
                start = self._offset + self.played_x(cut.start)
                self.timeline.mark("idle", cut.label, x=start, x_end=start + IDLE_KEEP)
        while (self._next_step < len(rec.steps)
               and self.played_x(rec.steps[self._next_step].t) <= at):
            self.steps = rec.steps[self._next_step].step + 1
            self.timeline.step(self._offset + self.played_x(rec.steps[self._next_step].t), self.steps)
            self._next_step += 1
        self.rounds += 1
        return due

    def _as_sample(self, row: RecordedSample, fragmentation: float | None = None) -> Sample:
        rec = self.recording
        last = row is rec.samples[-1]
        return Sample(
            t=self.played_x(row.t),
            wall=time.time(),
            device=0,
            status=OK,
            reserved=row.reserved,
            allocated=row.allocated,
            active=row.active,
            requested=row.requested,
            inactive_split=row.inactive_split,
            # torch's counters were read once, at the end of the run: only its last sample
            # may carry them (mid-replay they would be a peak still to come)
            reserved_peak=rec.peak("reserved_bytes.all.peak") if last else None,
            allocated_peak=rec.peak("allocated_bytes.all.peak") if last else None,
            non_pytorch=rec.non_pytorch_bytes,
            non_pytorch_source="device" if rec.non_pytorch_bytes is not None else None,
            device_total=rec.device_total_bytes,
            fragmentation=fragmentation,
            step=self.steps or None,
        )

    def _done(self) -> bool:
        return self._next_sample >= len(self.recording.samples)

    def _position(self) -> float:
        if self._next_sample == 0:
            return 0.0
        return self.played_x(self.recording.samples[self._next_sample - 1].t)

    def _new_run(self) -> None:
        """Start over on an empty chart (Start after the replay finished)."""
        self.timeline.clear()
        self.latest.clear()
        self._offset = 0.0
        self._next_sample = self._next_step = 0
        self.steps = 0

    def _rewind(self) -> None:
        """Append another pass after this one (``loop=True`` only)."""
        self._offset = self.timeline.render(0, max_points=2).latest_x or 0.0
        if self._offset:
            self._offset += self.interval
            self.timeline.mark("note", "replay restarted", x=self._offset)
        self._next_sample = self._next_step = 0
        self.steps = 0

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except Exception as exc:
                self.last_error = repr(exc)
            with self._lock:
                if not self._done() or self._started_at is None:
                    continue
                if self.loop:
                    self._rewind()
                    self._started_at = self.clock()
                    continue
                self._started_at = None
                self.status = FINISHED
                self._thread = None
            self._notify_finished()
            return

    def _notify_finished(self) -> None:
        """Listeners get an empty round when the replay ends, so a view can say so."""
        for listener in list(self._listeners):
            with contextlib.suppress(Exception):
                listener([])

    def now_x(self) -> float:
        """Current x (recording seconds) for markers placed by the view."""
        with self._lock:
            return self._offset + self._position()
