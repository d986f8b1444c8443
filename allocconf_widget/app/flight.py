"""The OOM flight recorder's use cases: turn it on, analyse an OOM, apply the verdict, export.

``%allocconf flight …``, the panel's toggle and the OOM view call these; they
only parse input and render the typed results below.

The analysis of one OOM (:func:`analyse`) has three parts:

* who held the memory: live bytes by allocation site (:mod:`~allocconf_widget.core.memory.sites`);
* the snapshot itself, for the segment map the views draw;
* the **verdict**: the recorded window replayed under the candidate settings
  (:func:`allocconf_widget.app.simulate.simulate`, the one ranking), split into settings that would
  have avoided this OOM (ranked by peak) and settings that would not, with the
  replay's self-check saying how sure it is. When none avoids it, the verdict says
  so with the number that explains why: the bytes allocated, not cached.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from allocconf_widget.adapters.flight_history import (
    FlightSettings,
    flight_history,
)

# the recorder's state and captures, as the views read them (they reach the adapter through here)
from allocconf_widget.adapters.flight_history import FlightStatus as FlightStatus  # noqa: PLC0414
from allocconf_widget.adapters.flight_history import OomCapture as OomCapture  # noqa: PLC0414
from allocconf_widget.core.memory.sites import SiteReport, top_sites
from allocconf_widget.core.units import format_bytes

if TYPE_CHECKING:
    from allocconf_widget.app.candidates import CandidatePlan
    from allocconf_widget.app.oom import OomRecommendation, OomReport, SettingsInForce
    from allocconf_widget.app.session import ApplyOutcome, Session
    from allocconf_widget.app.simulate import SimulationReport, SimulationRow
    from allocconf_widget.core.config.conf import AllocConf
    from allocconf_widget.core.sim.capacity import Limit
    from allocconf_widget.core.sim.result import Fidelity

DEMO_NAME = "flight_oom_h200"
CDN_NOTE = ("PyTorch's viewer page loads its script (MemoryViz.js) from cdn.jsdelivr.net, so it "
            "needs the internet; offline, the segment map here shows the same segments")


# ----------------------------------------------------------------- on / off / status


def turn_on(*, max_entries: int | None = None, python_stacks: bool = False) -> FlightStatus:
    """Keep the allocation history from now (or from CUDA's start, when it is not up yet)."""
    settings = FlightSettings(**({"max_entries": max_entries} if max_entries is not None else {}),
                              python_stacks=python_stacks)
    return flight_history().turn_on(settings)


def turn_off() -> FlightStatus:
    return flight_history().turn_off()


def status() -> FlightStatus:
    return flight_history().status()


# ----------------------------------------------------------------- captures


def last_capture() -> OomCapture | None:
    """This kernel's last captured OOM (None before any)."""
    return flight_history().last_capture()


def capture_for_cell(since: float | None, message: str) -> OomCapture | None:
    """The capture of the cell that just failed with a CUDA OOM (one taken now where torch's
    observer missed it), with torch's message, kept as this kernel's last OOM; None where the
    recorder was off."""
    import dataclasses

    history = flight_history()
    capture = history.take_capture(since=since) or history.capture_after_cell()
    if capture is None:
        return None
    capture = dataclasses.replace(capture, message=message)
    history.set_capture(capture)
    return capture


def keep_capture(capture: OomCapture) -> None:
    """Make ``capture`` this kernel's last OOM (``%allocconf flight show`` / ``apply`` use it)."""
    flight_history().set_capture(capture)


#: Host bytes per ring-buffer entry, budgeted a little above the resident-set growth measured
#: with and without Python stacks (benchmarks/gpu/bench_flight_overhead.py, docs/flight.md).
BYTES_PER_ENTRY = 400
BYTES_PER_ENTRY_STACKS = 400


def memory_bound(settings: FlightSettings) -> str:
    """The host-memory bound of the ring buffer, from the per-entry sizes in docs/flight.md."""
    per_entry = BYTES_PER_ENTRY_STACKS if settings.python_stacks else BYTES_PER_ENTRY
    return (f"at most {settings.max_entries:,} entries × ~{per_entry} B ≈ "
            f"{format_bytes(settings.max_entries * per_entry)} of host memory while recording")


# ----------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class VerdictOption:
    """One candidate setting replayed over the recorded window: a row of the one replay."""

    row: SimulationRow

    @property
    def conf(self) -> str:
        return self.row.conf

    @property
    def shown_conf(self) -> str:
        return self.conf or "torch's defaults"

    @property
    def avoids_oom(self) -> bool:
        """No OOM in the window, in any GPU timing (:attr:`Outcome.avoids_oom`)."""
        return self.row.outcome.avoids_oom

    @property
    def peak_reserved(self) -> int:
        return self.row.result.peak_reserved_bytes


class Sureness(enum.Enum):
    """How far the verdict can be trusted, from the replay of the settings the OOM ran under."""

    SURE = "sure"  # the replay reproduced the OOM and every recorded segment event
    APPROXIMATE = "approximate"  # it reproduced the OOM, not every segment event
    UNCHECKED = "unchecked"  # it reproduced the OOM; no segment events to check against
    NOT_SURE = "not sure"  # it did not reproduce the OOM: no setting is promised


@dataclass(frozen=True)
class Verdict:
    """Which settings would have avoided this OOM, ranked, and how sure the replay is."""

    limit: Limit | None  # the memory the window's run could reserve
    allocated_at_oom: int
    winners: tuple[VerdictOption, ...]
    losers: tuple[VerdictOption, ...]
    sureness: Sureness
    fidelity: Fidelity | None
    events: int
    notes: tuple[str, ...] = ()
    #: the settings this kernel runs, where they differ from the recording's and avoid the OOM
    #: (a recording of another run, or settings changed since): nothing to apply then
    current: VerdictOption | None = None
    report: SimulationReport | None = field(default=None, compare=False, repr=False)  # the ranking

    @property
    def winner(self) -> VerdictOption | None:
        """The setting to apply; None when none avoids the OOM or the kernel's already does."""
        if self.current is not None:
            return None
        return self.winners[0] if self.winners else None

    @property
    def also(self) -> tuple[VerdictOption, ...]:
        """The other settings that avoid it, by peak (listed under the headline)."""
        return self.winners if self.current is not None else self.winners[1:]

    @property
    def avoided(self) -> bool:
        """Some setting avoids the OOM: the kernel's own, or the winner."""
        return self.current is not None or self.winner is not None


def verdict(capture: OomCapture, kernel: AllocConf | None = None) -> Verdict:
    """Replay the captured window under the candidate grid; split it into helps / does not.

    Ranked by the one ranking of every front end (:func:`~allocconf_widget.app.simulate.simulate`),
    against ``kernel`` (the settings this kernel runs, as the What if? tab ranks): a row the
    kernel's torch does not take is never offered here either. A setting avoids the OOM where
    its :class:`~allocconf_widget.core.sim.outcome.Outcome` says so (no OOM in any GPU timing).

    Raises:
        SnapshotError: the snapshot holds no usable trace.
    """
    from allocconf_widget.app.simulate import SimulationRequest, simulate
    from allocconf_widget.app.sources import TraceSource, recorded_release
    from allocconf_widget.core.sim.notes import NoteKind
    from allocconf_widget.core.sim.trace_notes import recorded_window

    source = TraceSource(capture.snapshot, "the flight recorder's window",
                         recorded_release(capture.torch_version), capture.device_total,
                         capture.non_pytorch_bytes, device=capture.device, fraction=capture.fraction,
                         limit_known=True)  # the fraction the window ran under: its self-check's
    report = simulate(source, SimulationRequest(rank=True, fraction=capture.fraction, kernel=kernel))
    recorded = report.recorded
    reproduced = recorded is not None and recorded.outcome.fits is False
    winners: list[VerdictOption] = []
    losers: list[VerdictOption] = []
    current: VerdictOption | None = None
    for row in report.rows:
        if row is recorded:
            continue
        option = VerdictOption(row)
        if row.is_current and option.avoids_oom and reproduced:
            current = option
            continue
        (winners if option.avoids_oom and reproduced else losers).append(option)
    winners.sort(key=lambda o: (o.peak_reserved, len(o.conf)))
    stats = capture.stats or {}
    allocated = int(stats.get("allocated_bytes.all.current", 0) or 0)
    if not allocated and recorded is not None and recorded.result.oom is not None:
        allocated = recorded.result.oom.allocated_bytes
    notes = list(report.all_notes())
    if not any(note.kind is NoteKind.WINDOW for note in report.notes):
        notes.append(recorded_window(report.num_events).text)
    limit = recorded.limit if recorded is not None else report.capacity.limit_for(None)
    return Verdict(limit, allocated, tuple(winners), tuple(losers), _sureness(report, reproduced),
                   report.fidelity, report.num_events, tuple(notes), current, report)


def _sureness(report: SimulationReport, reproduced: bool) -> Sureness:
    fidelity = report.fidelity
    if not reproduced:
        return Sureness.NOT_SURE
    if fidelity is not None and fidelity.checked and fidelity.exact:
        return Sureness.SURE
    if fidelity is not None and fidelity.checked:
        return Sureness.APPROXIMATE
    return Sureness.UNCHECKED


# ----------------------------------------------------------------- the analysis


@dataclass(frozen=True)
class FlightAnalysis:
    """Everything the OOM view shows beside torch's message."""

    capture: OomCapture
    sites: SiteReport
    verdict: Verdict | None = None
    verdict_error: str | None = None
    label: str = ""  # "Recording" for a run that is not this kernel's (the demo)
    kernel: AllocConf | None = None  # what the verdict's rows were compared with

    @property
    def snapshot(self) -> dict[str, Any]:
        return self.capture.snapshot

    def capture_line(self) -> str:
        c = self.capture
        text = (f"Flight recorder: {c.events:,} allocator events captured {c.when}"
                f" ({c.settings.describe()}; snapshot took {c.seconds * 1e3:.0f} ms)")
        return f"{self.label}: {text}" if self.label else text


def analyse(capture: OomCapture, *, kernel: AllocConf | None = None, with_verdict: bool = True,
            label: str = "") -> FlightAnalysis:
    """Sites now; the verdict too unless the caller computes it later (it replays the window).

    ``kernel`` is the settings this kernel runs (the Session's effective ones); ``label``
    names a recording that is not this kernel's ("Recording"), so Apply says so and asks.
    """
    sites = top_sites(capture.snapshot, device=capture.device)
    analysis = FlightAnalysis(capture, sites, label=label, kernel=kernel)
    return with_verdict_of(analysis) if with_verdict else analysis


def with_verdict_of(analysis: FlightAnalysis) -> FlightAnalysis:
    """The analysis with its verdict computed (errors become a line, never an exception)."""
    from dataclasses import replace

    from allocconf_widget._errors import AllocConfError, SnapshotError

    try:
        return replace(analysis, verdict=verdict(analysis.capture, analysis.kernel),
                       verdict_error=None)
    except (SnapshotError, AllocConfError, ValueError) as exc:
        return replace(analysis, verdict_error=f"no verdict: {exc}")


def plan_winner(session: Session, analysis: FlightAnalysis) -> CandidatePlan | None:
    """What applying the verdict's winner would change (None: no setting avoids the OOM).

    A recording that is not this kernel's (the demo) is named in the plan, so every front end
    says so and asks before applying.

    Raises:
        AllocConfError: the winner is not valid for this kernel's torch.
    """
    from allocconf_widget.app.candidates import plan_for_session

    winner = analysis.verdict.winner if analysis.verdict is not None else None
    if winner is None:
        return None
    foreign = "a recording of another run" if analysis.label else None
    return plan_for_session(session, winner.conf, foreign_source=foreign)


def recommendation_of(report: OomReport, verdict: Verdict | None) -> OomRecommendation:
    """The card's one recommendation: the replay's when there is a verdict, else the first rule
    of thumb; each rule of thumb is marked with whether it agrees."""
    from allocconf_widget.app.oom import OomRecommendation

    if verdict is not None:
        winner = verdict.winner.conf if verdict.winner is not None else None
        return OomRecommendation(winner, True,
                                 tuple((a, a.conf_change is not None and a.conf_change == winner)
                                       for a in report.advice))
    first = next((a.conf_change for a in report.advice if a.conf_change), None)
    return OomRecommendation(first, False, tuple((a, True) for a in report.advice))


def next_step(outcome: ApplyOutcome) -> str:
    """What to re-run after applying a verdict's setting."""
    if outcome.restart_needed:
        return ("Next: restart the kernel (%allocconf restart, or the panel's Restart) and "
                "re-run the notebook from the top; the setting is saved and re-applied by "
                "%load_ext allocconf_widget.")
    return ("Next: re-run the cell that ran out of memory. Segments cached under the old "
            "setting stay until freed: del the failed step's tensors and call "
            "torch.cuda.empty_cache() first, or restart and re-run from the top for a "
            "clean start.")


# ----------------------------------------------------------------- PyTorch's viewer


@dataclass(frozen=True)
class ViewerFiles:
    """The snapshot pickle (pytorch.org/memory_viz opens it) and, if torch is here, its page."""

    pickle: Path
    html: Path | None
    lines: tuple[str, ...]


def export_for_viewer(capture: OomCapture, directory: str | os.PathLike[str] | None = None,
                      *, html_kind: str = "trace") -> ViewerFiles:
    """Write ``allocconf-oom-<time>.pickle`` and PyTorch's ``trace_plot`` page beside it, by
    default into ``./allocconf-exports/`` (git-ignored), where every export goes."""
    from allocconf_widget.adapters import torch_private
    from allocconf_widget.app.exports import (
        default_name,
        export_dir,
        write_replay_sidecar,
        write_snapshot,
        write_text_atomically,
    )

    folder = Path(directory) if directory is not None else export_dir()
    snapshot: Any = capture.snapshot  # torch's plain dict, the shape Snapshot describes
    # a folder: the name is reserved there (-2, -3 … within one second), never overwriting
    where = folder if folder.is_dir() else folder / default_name("oom", ".pickle")
    pickle_path = write_snapshot(snapshot, where, kind="oom")
    lines = [f"snapshot saved: {pickle_path} (drag it onto pytorch.org/memory_viz)"]
    # the facts the card's replay used, so `allocconf simulate` on the file agrees with it
    sidecar = write_replay_sidecar(pickle_path, torch_version=capture.torch_version,
                                   device_total=capture.device_total,
                                   non_pytorch_bytes=capture.non_pytorch_bytes,
                                   fraction=capture.fraction)
    if sidecar is not None:
        lines.append(f"its replay facts (torch, device, memory fraction): {sidecar.name}")
    torch = torch_private.imported_torch()
    html_path: Path | None = None
    if torch is None:
        lines.append("PyTorch's viewer page needs torch imported in this kernel; the pickle "
                     "opens at pytorch.org/memory_viz")
    else:
        try:
            page = torch_private.memory_viz_html(torch, capture.snapshot, html_kind)
        except Exception as exc:  # an older torch without the viewer: the pickle still works
            lines.append(f"PyTorch's viewer page could not be made here ({exc})")
        else:
            html_path = pickle_path.with_suffix(".html")
            write_text_atomically(html_path, page)
            lines.append(f"PyTorch's viewer: {html_path} ({CDN_NOTE})")
    return ViewerFiles(pickle_path, html_path, tuple(lines))


# ----------------------------------------------------------------- the recorded demo


@dataclass(frozen=True)
class DemoOom:
    """A real OOM recorded on an H200 with the flight recorder on, for CPU-only machines."""

    capture: OomCapture
    message: str
    description: str
    settings: SettingsInForce
    meta: dict[str, Any] = field(default_factory=dict)


def capture_from_meta(meta: dict[str, Any], snapshot: dict[str, Any]) -> OomCapture:
    """Rebuild a capture from a JSON sidecar (``benchmarks/gpu/flight_oom.py`` writes it)."""

    def opt_int(key: str) -> int | None:
        value = meta.get(key)
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    fraction = meta.get("fraction")
    stats = meta.get("stats")
    return OomCapture(
        snapshot=snapshot, device=opt_int("device") or 0, requested=opt_int("requested"),
        limit=opt_int("limit"), device_free=opt_int("device_free"),
        device_total=opt_int("device_total"),
        fraction=float(fraction) if isinstance(fraction, int | float) else None,
        stats=dict(stats) if isinstance(stats, dict) else None,
        settings=FlightSettings(int(meta.get("max_entries") or 100_000),
                                bool(meta.get("python_stacks"))),
        torch_version=str(meta["torch"]) if meta.get("torch") else None,
        when=str(meta.get("when") or "at the OOM"), seconds=float(meta.get("snapshot_s") or 0.0),
        at=float(meta.get("at") or 0.0), message=str(meta.get("oom") or ""))


def load_demo_oom() -> DemoOom:
    """The bundled recording ``allocconf_widget/data/flight_oom_h200.{json,pickle.gz}``."""
    from allocconf_widget.app.oom import recorded_settings
    from allocconf_widget.app.sources import recorded_release
    from allocconf_widget.core.memory.snapshot import load_snapshot
    from allocconf_widget.core.versions import parse_version

    data = resources.files("allocconf_widget").joinpath("data")
    meta = json.loads(data.joinpath(f"{DEMO_NAME}.json").read_text(encoding="utf-8"))
    snapshot = load_snapshot(data.joinpath(f"{DEMO_NAME}.pickle.gz").read_bytes())
    capture = capture_from_meta(meta, dict(snapshot))
    settings = recorded_settings(dict(capture.snapshot.get("allocator_settings") or {}),
                                 recorded_release(capture.torch_version) or parse_version("2.11"))
    return DemoOom(capture, str(meta.get("oom") or ""), str(meta.get("description") or DEMO_NAME),
                   settings, meta)
