"""Result types of the replay simulator, and the fidelity comparison.

Everything here is a frozen dataclass of plain values so results pickle back
from worker processes and serialise with :meth:`SimResult.to_json` without
custom encoders.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from allocconf_widget.core.sim.alignment import matched_in_order
from allocconf_widget.core.sim.trace.codes import SEG_NAMES
from allocconf_widget.core.units import format_bytes

if TYPE_CHECKING:
    from allocconf_widget.core.sim.settings import SimSettings
    from allocconf_widget.core.sim.trace.model import Trace

#: (trace event index, segment event kind, address, size)
SegmentEvent = tuple[int, int, int, int]


@dataclass(frozen=True)
class PredictedOom:
    """An allocation the simulated allocator could not serve.

    ``recorded`` is True when the real run failed there as well (an ``oom``
    entry in the trace, which the program survived); ``rejected`` when
    ``throw_on_cudamalloc_oom`` refused the segment without trying cudaMalloc.
    """

    event_index: int
    requested_bytes: int
    rounded_bytes: int
    segment_bytes: int
    reserved_bytes: int
    allocated_bytes: int
    recorded: bool = False
    rejected: bool = False

    def to_json(self) -> dict[str, Any]:
        """Plain dict for JSON output."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Divergence:
    """Where the simulated segment events first differ from the recorded ones."""

    position: int  # index into the segment-event sequence
    recorded_event_index: int | None  # trace index of the expected event
    simulated_event_index: int | None  # trace index at which the simulator acted
    expected: str | None  # e.g. "segment_alloc 20971520"
    got: str | None

    def to_json(self) -> dict[str, Any]:
        """Plain dict for JSON output."""
        return dataclasses.asdict(self)


def _segment_event_text(event: str | None) -> str:
    """``segment_alloc 20971520`` as a person reads it (``a segment_alloc of 20.00 MiB``);
    None: the other side had no event there."""
    if event is None:
        return "no event (one side ended)"
    kind, _, size = event.partition(" ")
    return f"a {kind} of {format_bytes(int(size))}" if size.isdigit() else event


@dataclass(frozen=True)
class Fidelity:
    """How well a replay under the recorded settings reproduces the real allocator.

    ``reproduced`` = recorded segment events matched in order with equal kind
    and size (longest matching alignment); ``score`` divides that by the longer
    of the two sequences so extra simulated events also cost.
    """

    recorded_events: int
    simulated_events: int
    matched_events: int
    exact: bool
    first_divergence: Divergence | None
    recorded_peak_reserved_bytes: int
    simulated_peak_reserved_bytes: int
    partial_trace: bool
    notes: tuple[str, ...] = ()
    #: the replay reused the recorded segment addresses (a diagnostic a what-if cannot have)
    recorded_addresses: bool = False
    #: why predictions from this trace are less certain than the score says (see :attr:`confident`)
    caveats: tuple[str, ...] = ()

    @property
    def confident(self) -> bool:
        """The replay reproduced the run exactly, with nothing it cannot model: only then may a
        prediction say "no OOM" without a caveat."""
        return self.checked and self.exact and self.peak_matches and not self.caveats

    @property
    def underestimates(self) -> bool:
        """The replay under the recorded settings reserved less than the real run did."""
        return self.simulated_peak_reserved_bytes < self.recorded_peak_reserved_bytes

    @property
    def checked(self) -> bool:
        """False when the trace has no segment events to compare with (nothing was verified)."""
        return self.recorded_events > 0

    @property
    def reproduced(self) -> float:
        """Fraction of recorded segment events reproduced (1.0 when there are none)."""
        return self.matched_events / self.recorded_events if self.recorded_events else 1.0

    @property
    def score(self) -> float:
        """Matched events over the longer sequence, in [0, 1]."""
        longest = max(self.recorded_events, self.simulated_events)
        return self.matched_events / longest if longest else 1.0

    @property
    def peak_matches(self) -> bool:
        """Simulated peak reserved equals the peak the recorded segment events imply."""
        return self.recorded_peak_reserved_bytes == self.simulated_peak_reserved_bytes

    def summary(self) -> str:
        """One line for people."""
        if self.recorded_events == 0:
            if self.simulated_events and self.first_divergence is None:
                text = ("the trace records no segment events (a dry run records none), so there "
                        "is nothing to check the model against")
            elif self.simulated_events:
                text = (f"no recorded segment events to check against, but the replay made "
                        f"{self.simulated_events}: the model needed memory the real run did not")
            else:
                text = "no recorded segment events to check against (the replay made none either)"
        else:
            text = (
                f"{self.matched_events}/{self.recorded_events} recorded segment events reproduced "
                f"({100 * self.reproduced:.1f}%), peak reserved "
                + ("matches" if self.peak_matches else
                   f"differs ({format_bytes(self.simulated_peak_reserved_bytes)} replayed, "
                   f"{format_bytes(self.recorded_peak_reserved_bytes)} recorded)")
            )
        if self.first_divergence is not None:
            d = self.first_divergence
            text += (f"; first divergence at segment event {d.position}: expected "
                     f"{_segment_event_text(d.expected)}, got {_segment_event_text(d.got)}")
        if self.partial_trace:
            text += "; trace is partial (ring buffer wrapped), so the start state is unknown"
        if self.recorded_addresses:
            text += " [replayed with the recorded segment addresses, which a what-if does not have]"
        if self.caveats or (self.checked and not self.confident):
            text += "; LOW CONFIDENCE"
            if self.caveats:
                text += ": " + "; ".join(self.caveats)
            if self.underestimates:
                text += ("; the replay reserves less than the real run did, so a predicted "
                         "\"no OOM\" is not reliable")
        return text

    def to_json(self) -> dict[str, Any]:
        """Plain dict for JSON output (derived ratios included)."""
        out = dataclasses.asdict(self)
        out["first_divergence"] = (
            self.first_divergence.to_json() if self.first_divergence is not None else None
        )
        out["notes"] = list(self.notes)
        out["reproduced"] = round(self.reproduced, 6)
        out["score"] = round(self.score, 6)
        out["peak_matches"] = self.peak_matches
        out["checked"] = self.checked
        out["caveats"] = list(self.caveats)
        out["confident"] = self.confident
        return out


@dataclass(frozen=True)
class SimSeries:
    """Reserved/allocated over the replay, decimated to a bounded number of points.

    Each point covers a bucket of consecutive operations: ``reserved_bytes`` and
    ``allocated_bytes`` are the bucket maxima (so the global peaks survive
    decimation); ``fragmentation`` is the cached share of reserved memory,
    ``(reserved − allocated) / reserved``, at the bucket's end.
    """

    event_index: tuple[int, ...] = ()
    time_us: tuple[int, ...] = ()
    reserved_bytes: tuple[int, ...] = ()
    allocated_bytes: tuple[int, ...] = ()
    fragmentation: tuple[float, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Plain dict of lists."""
        return {k: list(v) for k, v in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class SimResult:
    """What one replay predicts. Byte counts are ints; peaks are since the trace start."""

    settings: SimSettings
    events: int
    ops: int
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    peak_active_bytes: int
    final_reserved_bytes: int
    final_allocated_bytes: int
    num_device_alloc: int
    num_device_free: int
    num_alloc_retries: int
    num_ooms: int
    num_oom_rejections: int
    num_sync_all_streams: int
    oom: PredictedOom | None
    recorded_ooms: int
    recorded_ooms_avoided: int
    stopped_early: bool
    series: SimSeries
    seconds: float
    device_total: int | None
    partial_trace: bool
    fidelity: Fidelity | None = None
    segment_events: tuple[SegmentEvent, ...] = ()
    initial_state_source: str | None = None  # "recorded" / "reconstructed"; None: empty start
    initial_reserved_bytes: int = 0
    initial_allocated_bytes: int = 0
    #: the trace shows the program surviving its OOMs (it allocates after an ``oom`` entry)
    program_catches_ooms: bool = False
    #: ``oom`` (the first OOM the recording did not have, else the first) would end the run:
    #: False for one the program catches (docs/simulator.md)
    oom_fatal: bool = False
    #: a program that catches its OOMs would not fail the recorded request at this event (it
    #: fits here), so its handler would not run and it takes a path the recording does not show
    path_changes_at: int | None = None
    #: the recording ends at the OOM that ended the program (``Trace.ends_at_its_oom``) and this
    #: replay served that request: it got past the crash, into a part of the run never recorded
    outlives_recording: bool = False
    #: (low, high) peak reserved when ``record_stream`` frees complete as early / as late as
    #: the recording allows (:mod:`.timing`); None: timing cannot change the peak
    peak_reserved_range: tuple[int, int] | None = None
    #: a timing within that range runs out of memory where this replay did not
    timing_oom: bool = False
    #: the largest classic segment held at any moment (the start state's included), in any GPU
    #: timing the range covers: a ``max_split_size_mb`` above it could never act (simulate_many)
    largest_segment_bytes: int = 0

    @property
    def reserved_range(self) -> tuple[int, int]:
        """(low, high) peak reserved over the GPU timings the recording allows; both equal to
        :attr:`peak_reserved_bytes` where timing cannot change it."""
        if self.peak_reserved_range is None:
            return self.peak_reserved_bytes, self.peak_reserved_bytes
        return self.peak_reserved_range

    @property
    def timing_dependent(self) -> bool:
        """The peak depends on when the GPU finishes other streams' work (a range, not a point)."""
        low, high = self.reserved_range
        return low != high or self.timing_oom

    @property
    def fragmentation_at_peak(self) -> float:
        """1 − peak allocated / peak reserved (GMLake's fragmentation ratio, from peaks)."""
        if not self.peak_reserved_bytes:
            return 0.0
        return 1.0 - self.peak_allocated_bytes / self.peak_reserved_bytes

    def with_fidelity(self, fidelity: Fidelity | None) -> SimResult:
        """Copy carrying a self-check result beside the prediction."""
        return dataclasses.replace(self, fidelity=fidelity)

    def to_json(self) -> dict[str, Any]:
        """Plain dict; ``segment_events`` are left out (they can be huge)."""
        return {
            "conf": self.settings.describe(),
            "torch_version": str(self.settings.torch_version),
            "events": self.events,
            "ops": self.ops,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_active_bytes": self.peak_active_bytes,
            "final_reserved_bytes": self.final_reserved_bytes,
            "final_allocated_bytes": self.final_allocated_bytes,
            "fragmentation_at_peak": round(self.fragmentation_at_peak, 6),
            "num_device_alloc": self.num_device_alloc,
            "num_device_free": self.num_device_free,
            "num_alloc_retries": self.num_alloc_retries,
            "num_ooms": self.num_ooms,
            "num_oom_rejections": self.num_oom_rejections,
            "num_sync_all_streams": self.num_sync_all_streams,
            "oom": self.oom.to_json() if self.oom is not None else None,
            "oom_fatal": self.oom_fatal,
            "program_catches_ooms": self.program_catches_ooms,
            "path_changes_at": self.path_changes_at,
            "outlives_recording": self.outlives_recording,
            "peak_reserved_range_bytes": list(self.reserved_range),
            "timing_oom": self.timing_oom,
            "recorded_ooms": self.recorded_ooms,
            "recorded_ooms_avoided": self.recorded_ooms_avoided,
            "stopped_early": self.stopped_early,
            "device_total": self.device_total,
            "partial_trace": self.partial_trace,
            "initial_state": None if self.initial_state_source is None else {
                "source": self.initial_state_source,
                "reserved_bytes": self.initial_reserved_bytes,
                "allocated_bytes": self.initial_allocated_bytes,
            },
            "seconds": round(self.seconds, 6),
            "fidelity": self.fidelity.to_json() if self.fidelity is not None else None,
            "series": self.series.to_json(),
        }


def compare_segments(
    trace: Trace, simulated: tuple[SegmentEvent, ...], simulated_peak: int, *,
    recorded_addresses: bool = False,
) -> Fidelity:
    """Compare the simulator's own segment events with the trace's, in order.

    The alignment is difflib's on (kind, size) pairs, within a work budget
    (:func:`.alignment.matched_in_order`): near-linear on the long identical runs a faithful
    replay produces, and tolerant of a local difference without scoring everything after it
    as lost.
    """
    rec = list(zip(trace.seg_kinds, trace.seg_sizes, strict=True))
    sim = [(kind, size) for _, kind, _, size in simulated]
    prefix = 0
    limit = min(len(rec), len(sim))
    while prefix < limit and rec[prefix] == sim[prefix]:
        prefix += 1
    exact = prefix == len(rec) == len(sim)
    matched = prefix if exact else prefix + matched_in_order(rec[prefix:], sim[prefix:])
    divergence = None
    # a trace with no segment events that starts from an empty allocator (a dry run) has
    # nothing to diverge from: a real run from empty always makes segments, so it recorded none
    uncheckable = not rec and trace.initial_state is None
    if not exact and not uncheckable:
        divergence = Divergence(
            position=prefix,
            recorded_event_index=trace.seg_index[prefix] if prefix < len(rec) else None,
            simulated_event_index=simulated[prefix][0] if prefix < len(sim) else None,
            expected=_label(rec[prefix]) if prefix < len(rec) else None,
            got=_label(sim[prefix]) if prefix < len(sim) else None,
        )
    notes: list[str] = []
    if trace.initial_state is not None:
        notes.append(f"replay started from {trace.initial_state.provenance()} "
                     f"({trace.initial_state.describe()})")
    elif trace.initial_note:
        notes.append(trace.initial_note)
    if trace.partial:
        notes.append(
            f"{trace.unknown_frees} frees of addresses allocated before the trace began: "
            "the recorded window starts from an unknown allocator state"
        )
    if trace.empty_cache_calls:
        notes.append(f"{trace.empty_cache_calls} torch.cuda.empty_cache() calls inferred")
    return Fidelity(
        recorded_events=len(rec),
        simulated_events=len(sim),
        matched_events=matched,
        exact=exact,
        first_divergence=divergence,
        recorded_peak_reserved_bytes=trace.recorded_reserved_peak(),
        simulated_peak_reserved_bytes=simulated_peak,
        partial_trace=trace.partial,
        notes=tuple(notes),
        recorded_addresses=recorded_addresses,
        caveats=trace.caveats(),
    )


def _label(event: tuple[int, int]) -> str:
    kind, size = event
    return f"{SEG_NAMES[kind]} {size}"
