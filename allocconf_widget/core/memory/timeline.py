"""A bounded memory time series for the live monitor: O(max_points) for any run length.

A monitor left running for an hour at 10 Hz sees 36,000 samples per device; a
chart needs a few hundred points, and neither the kernel's memory nor the bytes
sent to the browser may grow with the run. So each device keeps:

* a **recent tail** of raw samples (full resolution: what just happened), and
* a **history** of uniform buckets. A sample leaving the tail is folded into the
  newest bucket; when the history is full, neighbouring buckets are merged in
  pairs and the bucket width (``stride``, in raw samples) doubles.

A bucket keeps, per series, the **maximum**, the minimum and the last value of
the samples it covers, so the peaks that decide an out-of-memory error survive
any amount of decimation. :meth:`Timeline.render` then returns at most N points
per series for one device (x-binned, max-preserving), plus the markers (cell
runs, OOMs, notes) and optimizer steps in view, also bounded.

x is seconds since the monitor started, or the optimizer step number in
step-synchronous mode. It never decreases: a sample older than the last one is
recorded at the last x (clocks are monotonic, so this only guards misuse).

Standard library only; safe to share between a sampling thread and a render
thread (every public method takes the timeline's lock).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

DEFAULT_SERIES: tuple[str, ...] = (
    "reserved",
    "allocated",
    "active",
    "requested",
    "non_pytorch",
    "cached_share",
    "fragmentation",
)
"""Byte series (``reserved`` … ``non_pytorch``) and ratio series (``cached_share``, ``fragmentation``)."""

MARKER_KINDS: tuple[str, ...] = ("cell", "oom", "note", "idle")
_MARKER_CAPS = {"cell": 256, "oom": 64, "note": 128, "idle": 64}
Value = float | None
_T = TypeVar("_T")


# ----------------------------------------------------------------- buckets


class Bucket:
    """Samples ``x0..x1`` (``count`` of them) reduced to per-series max / min / last."""

    __slots__ = ("count", "hi", "last", "lo", "x0", "x1")

    def __init__(self, x: float, values: Sequence[Value]) -> None:
        self.x0 = self.x1 = x
        self.count = 1
        self.hi: list[Value] = list(values)
        self.lo: list[Value] = list(values)
        self.last: list[Value] = list(values)

    @property
    def x(self) -> float:
        """Where the bucket is drawn: the middle of the x range it covers."""
        return (self.x0 + self.x1) / 2

    def absorb(self, other: Bucket) -> None:
        """Fold a later bucket (or sample) into this one."""
        self.x1 = other.x1
        self.count += other.count
        for i, (hi, lo, last) in enumerate(zip(other.hi, other.lo, other.last, strict=True)):
            self.hi[i] = _max(self.hi[i], hi)
            self.lo[i] = _min(self.lo[i], lo)
            if last is not None:
                self.last[i] = last

    def copy(self) -> Bucket:
        twin = Bucket.__new__(Bucket)
        twin.x0, twin.x1, twin.count = self.x0, self.x1, self.count
        twin.hi, twin.lo, twin.last = list(self.hi), list(self.lo), list(self.last)
        return twin


def _max(a: Value, b: Value) -> Value:
    if a is None:
        return b
    if b is None:
        return a
    return a if a >= b else b


def _min(a: Value, b: Value) -> Value:
    if a is None:
        return b
    if b is None:
        return a
    return a if a <= b else b


# ----------------------------------------------------------------- markers


@dataclass(frozen=True, slots=True)
class Marker:
    """Something to draw on the chart: a cell run or an idle stretch (``x`` to ``x_end``), an OOM, a note."""

    kind: str
    x: float
    label: str
    x_end: float | None = None
    device: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "x": self.x, "x_end": self.x_end, "label": self.label,
                "device": self.device}


@dataclass(frozen=True, slots=True)
class RenderPayload:
    """What a chart needs for one device: at most ``max_points`` points per series.

    ``series[name][i]`` is the maximum over the samples drawn at ``x[i]``
    (``lows`` the minimum, when asked for). ``peaks`` are over the whole run,
    not only the window; ``latest`` is the newest known value of each series
    (a sparse series such as ``fragmentation``, measured only on the samples
    that took a snapshot, keeps its last measurement).
    """

    device: int | None
    x: list[float]
    series: dict[str, list[Value]]
    lows: dict[str, list[Value]]
    peaks: dict[str, Value]
    latest: dict[str, Value]
    latest_x: float | None
    markers: list[Marker]
    steps: list[tuple[float, int]]
    x_label: str
    samples: int
    span: tuple[float, float] | None

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (what the JSON export and the payload benchmark serialise)."""
        return {
            "device": self.device,
            "x_label": self.x_label,
            "x": self.x,
            "series": self.series,
            "lows": self.lows,
            "peaks": self.peaks,
            "latest": self.latest,
            "latest_x": self.latest_x,
            "markers": [m.to_dict() for m in self.markers],
            "steps": [list(s) for s in self.steps],
            "samples": self.samples,
        }


# ----------------------------------------------------------------- one device


@dataclass
class _Store:
    """The bounded samples of one device."""

    width: int
    history_cap: int
    recent_cap: int
    history: list[Bucket] = field(default_factory=list)
    recent: deque[Bucket] = field(default_factory=deque)
    stride: int = 1
    samples: int = 0
    last_x: float | None = None
    peaks: list[Value] = field(default_factory=list)
    latest: list[Value] = field(default_factory=list)

    def add(self, x: float, values: Sequence[Value]) -> None:
        if self.last_x is not None and x < self.last_x:
            x = self.last_x
        self.last_x = x
        self.samples += 1
        point = Bucket(x, values)
        if not self.peaks:
            self.peaks = [None] * self.width
        self.peaks = [_max(p, v) for p, v in zip(self.peaks, values, strict=True)]
        # the newest *known* value: a sparse series keeps its last measurement
        self.latest = (list(values) if not self.latest else
                       [old if new is None else new for old, new in zip(self.latest, values, strict=True)])
        self.recent.append(point)
        if len(self.recent) > self.recent_cap:
            self._fold(self.recent.popleft())

    def _fold(self, point: Bucket) -> None:
        """Move a sample from the raw tail into the uniform history."""
        if self.history and self.history[-1].count < self.stride:
            self.history[-1].absorb(point)
        else:
            self.history.append(point)
        if len(self.history) > self.history_cap:
            self._halve()

    def _halve(self) -> None:
        merged: list[Bucket] = []
        for i in range(0, len(self.history) - 1, 2):
            pair = self.history[i].copy()
            pair.absorb(self.history[i + 1])
            merged.append(pair)
        if len(self.history) % 2:
            merged.append(self.history[-1])
        self.history = merged
        self.stride *= 2

    def items(self) -> Iterator[Bucket]:
        yield from self.history
        yield from self.recent

    def __len__(self) -> int:
        return len(self.history) + len(self.recent)


def _bin(items: list[Bucket], max_points: int) -> list[Bucket]:
    """At most ``max_points`` buckets: equal-width x bins, max/min/last kept per bin."""
    if len(items) <= max_points:
        return items
    lo, hi = items[0].x0, items[-1].x1
    if hi <= lo:
        merged = items[0].copy()
        for item in items[1:]:
            merged.absorb(item)
        return [merged]
    span = hi - lo
    out: list[Bucket] = []
    current_bin = -1
    for item in items:
        # divide first: max_points / span overflows to inf for a subnormal span, and inf * 0 is NaN
        fraction = (item.x - lo) / span
        index = min(max_points - 1, int(fraction * max_points)) if math.isfinite(fraction) else 0
        if index != current_bin or not out:
            out.append(item.copy())
            current_bin = index
        else:
            out[-1].absorb(item)
    return out


def _thin(items: Sequence[_T], cap: int) -> list[_T]:
    """Every k-th item so that at most ``cap`` remain, evenly spread, the last one kept."""
    if cap <= 0:
        return []
    if len(items) <= cap:
        return list(items)
    step = len(items) / cap
    picked = [items[int(i * step)] for i in range(cap - 1)]
    picked.append(items[-1])
    return picked


# ----------------------------------------------------------------- the timeline


class Timeline:
    """Bounded per-device series of memory samples plus markers; thread-safe.

    Args:
        series: names of the values each sample carries (:data:`DEFAULT_SERIES`).
        max_points: upper bound on stored points per device (raw tail + history).
        recent_points: how many of those are the raw tail; default a quarter.
        x_label: axis title the charts use (``time (s)`` or ``training step``).
        max_steps: optimizer steps remembered (thinned evenly beyond that).
    """

    def __init__(
        self,
        series: Sequence[str] = DEFAULT_SERIES,
        *,
        max_points: int = 2048,
        recent_points: int | None = None,
        x_label: str = "time (s)",
        max_steps: int = 1024,
    ) -> None:
        if max_points < 8:
            raise ValueError(f"max_points={max_points} is too small: use at least 8")
        recent = max_points // 4 if recent_points is None else recent_points
        if not 1 <= recent < max_points:
            raise ValueError(f"recent_points={recent} must be between 1 and max_points - 1")
        self.series_names: tuple[str, ...] = tuple(series)
        self._index = {name: i for i, name in enumerate(self.series_names)}
        self.max_points = max_points
        self._recent_cap = recent
        self._history_cap = max_points - recent
        self.x_label = x_label
        self._stores: dict[int | None, _Store] = {}
        self._markers: dict[str, deque[Marker]] = {
            kind: deque(maxlen=cap) for kind, cap in _MARKER_CAPS.items()
        }
        self._open_cell: tuple[float, str] | None = None
        self._steps: list[tuple[float, int]] = []
        self._max_steps = max_steps
        self._step_stride = 1
        self._steps_seen = 0
        self._lock = threading.RLock()
        self.version = 0
        """Bumped on every change: a view compares it to skip redundant redraws."""

    # ------------------------------------------------------------- writing
    def add(self, x: float, values: Mapping[str, Value], device: int | None = 0) -> None:
        """Record one sample of ``device``; names not in :attr:`series_names` are ignored."""
        row = [_as_value(values.get(name)) for name in self.series_names]
        with self._lock:
            store = self._stores.get(device)
            if store is None:
                store = _Store(len(row), self._history_cap, self._recent_cap)
                self._stores[device] = store
            store.add(float(x), row)
            self.version += 1

    def mark(self, kind: str, label: str, x: float | None = None, device: int | None = None,
             x_end: float | None = None) -> None:
        """A marker at ``x`` (default: the newest sample's x): ``oom``, ``note``, or a span to ``x_end``."""
        if kind not in self._markers:
            raise ValueError(f"unknown marker kind {kind!r}; use one of {', '.join(MARKER_KINDS)}")
        with self._lock:
            where = self._now() if x is None else float(x)
            end = None if x_end is None else max(where, float(x_end))
            self._markers[kind].append(Marker(kind, where, label, end, device))
            self.version += 1

    def clear(self) -> None:
        """Forget every sample, marker and step: the next sample begins a new run on an empty chart."""
        with self._lock:
            self._stores.clear()
            for queue in self._markers.values():
                queue.clear()
            self._open_cell = None
            self._steps = []
            self._step_stride = 1
            self._steps_seen = 0
            self.version += 1

    def cell_started(self, label: str, x: float | None = None) -> None:
        """A notebook cell began; :meth:`cell_finished` closes the shaded span."""
        with self._lock:
            self._open_cell = (self._now() if x is None else float(x), label)
            self.version += 1

    def cell_finished(self, x: float | None = None, label: str | None = None) -> None:
        with self._lock:
            if self._open_cell is None:
                return
            start, start_label = self._open_cell
            end = self._now() if x is None else max(start, float(x))
            self._markers["cell"].append(Marker("cell", start, label or start_label, end))
            self._open_cell = None
            self.version += 1

    def step(self, x: float, step: int) -> None:
        """Remember that optimizer step ``step`` happened at ``x`` (bounded: thinned evenly)."""
        with self._lock:
            self._steps_seen += 1
            if (self._steps_seen - 1) % self._step_stride:
                return
            self._steps.append((float(x), int(step)))
            if len(self._steps) > self._max_steps:
                self._steps = self._steps[::2]
                self._step_stride *= 2

    # ------------------------------------------------------------- reading
    @property
    def devices(self) -> list[int | None]:
        with self._lock:
            return sorted(self._stores, key=lambda d: -1 if d is None else d)

    def __len__(self) -> int:
        """Stored points over all devices (bounded by ``max_points`` × devices)."""
        with self._lock:
            return sum(len(store) for store in self._stores.values())

    def stored_points(self, device: int | None = 0) -> int:
        with self._lock:
            store = self._stores.get(device)
            return 0 if store is None else len(store)

    def samples(self, device: int | None = 0) -> int:
        """Raw samples ever added for ``device``."""
        with self._lock:
            store = self._stores.get(device)
            return 0 if store is None else store.samples

    def latest(self, device: int | None = 0) -> dict[str, Value]:
        with self._lock:
            store = self._stores.get(device)
            if store is None or not store.latest:
                return {}
            return dict(zip(self.series_names, store.latest, strict=True))

    def peaks(self, device: int | None = 0) -> dict[str, Value]:
        with self._lock:
            store = self._stores.get(device)
            if store is None or not store.peaks:
                return {}
            return dict(zip(self.series_names, store.peaks, strict=True))

    def markers(self) -> list[Marker]:
        """Every stored marker in x order (an open cell run is reported up to now)."""
        with self._lock:
            found = [m for queue in self._markers.values() for m in queue]
            if self._open_cell is not None:
                start, label = self._open_cell
                found.append(Marker("cell", start, label, max(start, self._now())))
        return sorted(found, key=lambda m: m.x)

    def rows(self, device: int | None = 0) -> list[tuple[float, float, int, list[Value]]]:
        """Every stored point as ``(x_start, x_end, samples, maxima)``, oldest first."""
        with self._lock:
            store = self._stores.get(device)
            if store is None:
                return []
            return [(b.x0, b.x1, b.count, list(b.hi)) for b in store.items()]

    def render(
        self,
        device: int | None = 0,
        *,
        max_points: int = 500,
        window: float | None = None,
        envelope: bool = False,
        max_markers: int = 64,
        max_steps: int = 100,
        series: Iterable[str] | None = None,
    ) -> RenderPayload:
        """The chart data for one device: ≤ ``max_points`` points per series.

        Args:
            window: only the last ``window`` x units (seconds or steps); None = all.
            envelope: also return per-point minima (``lows``), for a band.
            series: restrict to these names (fewer bytes per update).
        """
        names = self.series_names if series is None else tuple(series)
        idx = [self._index[name] for name in names]
        with self._lock:
            store = self._stores.get(device)
            items = list(store.items()) if store is not None else []
            if window is not None and items:
                start = items[-1].x1 - window
                items = [b for b in items if b.x1 >= start]
            binned = _bin(items, max_points)
            span = (items[0].x0, items[-1].x1) if items else None
            markers = self._markers_in(span, device, max_markers)
            steps = self._steps_in(span, max_steps)
            peaks = store.peaks if store is not None else []
            latest = store.latest if store is not None else []
            return RenderPayload(
                device=device,
                x=[_round_x(b.x) for b in binned],
                series={n: [b.hi[i] for b in binned] for n, i in zip(names, idx, strict=True)},
                lows=(
                    {n: [b.lo[i] for b in binned] for n, i in zip(names, idx, strict=True)}
                    if envelope
                    else {}
                ),
                peaks={n: (peaks[i] if peaks else None) for n, i in zip(names, idx, strict=True)},
                latest={n: (latest[i] if latest else None) for n, i in zip(names, idx, strict=True)},
                latest_x=store.last_x if store is not None else None,
                markers=markers,
                steps=steps,
                x_label=self.x_label,
                samples=store.samples if store is not None else 0,
                span=span,
            )

    # ------------------------------------------------------------- helpers
    def _now(self) -> float:
        last = [s.last_x for s in self._stores.values() if s.last_x is not None]
        return max(last) if last else 0.0

    def _markers_in(
        self, span: tuple[float, float] | None, device: int | None, cap: int
    ) -> list[Marker]:
        found = [
            m
            for m in self.markers()
            if (m.device is None or m.device == device)
            and (span is None or ((m.x_end if m.x_end is not None else m.x) >= span[0]))
        ]
        ooms = [m for m in found if m.kind == "oom"]
        others = [m for m in found if m.kind != "oom"]
        kept_ooms = ooms[-cap:]
        thinned = _thin(others, cap - len(kept_ooms))
        return sorted([*kept_ooms, *thinned], key=lambda m: m.x)

    def _steps_in(self, span: tuple[float, float] | None, cap: int) -> list[tuple[float, int]]:
        steps = self._steps if span is None else [s for s in self._steps if s[0] >= span[0]]
        return _thin(steps, cap)


def _as_value(value: object) -> Value:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    return None


def _round_x(x: float) -> float:
    """Milliseconds are plenty on the x axis and keep payloads short."""
    return round(x, 3)
