"""Recommend allocator settings by replaying a trace under a grid of candidates.

The grid is the usual advice (expandable segments, ``max_split_size_mb``,
``roundup_power2_divisions``, the GC threshold when a memory fraction is in
force), filtered to what the given torch release accepts. Every candidate is
replayed; results are ranked by "does it run out of memory", then by peak
reserved memory, each with a one-line reason a person can check. Candidates
are option strings validated by ``core.config.conf.parse_conf`` before they are
simulated, so nothing recommended here can be rejected by torch.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from allocconf_widget._errors import AllocConfError, AllocConfWarning
from allocconf_widget.core.sim.capacity import replay_room
from allocconf_widget.core.sim.notes import Note, NoteKind
from allocconf_widget.core.sim.outcome import Outcome, outcome_of
from allocconf_widget.core.sim.result import Fidelity, SimResult
from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.simulator import simulate_many
from allocconf_widget.core.sim.trace.model import Trace
from allocconf_widget.core.versions import TorchVersion, simulated_release


@dataclass(frozen=True)
class Candidate:
    """One replayed configuration; :class:`Recommendation` holds what it is compared with."""

    conf: str  # the PYTORCH_CUDA_ALLOC_CONF value to set ("" = torch's defaults)
    kind: str  # current, recorded, defaults, expandable, max_split, roundup, gc, combo, extra
    settings: SimSettings
    result: SimResult
    is_current: bool

    @property
    def outcome(self) -> Outcome:
        return outcome_of(self.result)


@dataclass(frozen=True)
class Comparison:
    """What a ranked row's reason compares it with: the current settings' replay (the numbers)
    and torch's defaults' (what the option's mechanism does on this trace)."""

    current: SimResult
    defaults: SimResult


@dataclass(frozen=True)
class Recommendation:
    """Ranked candidates (best first), the current configuration, and how far to trust it."""

    candidates: tuple[Candidate, ...]
    current: Candidate
    fidelity: Fidelity | None
    torch_version: TorchVersion
    device_total: int | None
    comparison: Comparison
    notes: tuple[Note, ...] = ()

    @property
    def best(self) -> Candidate:
        """The top-ranked candidate (may be the current settings)."""
        return self.candidates[0]


def candidate_confs(version: TorchVersion, *, with_fraction: bool) -> list[tuple[str, str]]:
    """The grid as ``(conf, kind)`` pairs for a torch release.

    GC thresholds appear only ``with_fraction`` (without a memory-fraction limit
    the GC never runs, §6.9); expandable segments from 2.1; the
    ``max_non_split_rounding_mb`` combination from 2.6.
    """
    grid: list[tuple[str, str]] = [("", "defaults")]
    if version >= (2, 1):
        grid.append(("expandable_segments:True", "expandable"))
    grid += [(f"max_split_size_mb:{n}", "max_split") for n in (128, 256, 512)]
    grid += [(f"roundup_power2_divisions:{d}", "roundup") for d in (4, 8, 16)]
    grid.append(("max_split_size_mb:256,roundup_power2_divisions:4", "combo"))
    if version >= (2, 6):
        grid.append(("max_split_size_mb:256,max_non_split_rounding_mb:512", "combo"))
    if with_fraction:
        grid += [(f"garbage_collection_threshold:{t}", "gc") for t in (0.6, 0.8)]
        grid.append(("garbage_collection_threshold:0.6,max_split_size_mb:128", "gc"))
    return grid


def _offerable(grid: list[tuple[str, str]], release: TorchVersion | None,
               ) -> tuple[list[tuple[str, str]], list[str]]:
    """Split the grid into what ``release`` accepts and what it rejects (with torch's reason)."""
    if release is None:
        return grid, []
    kept = [(conf, kind) for conf, kind in grid if _takes(release, conf)]
    return kept, [conf for conf, kind in grid if (conf, kind) not in kept]


@functools.lru_cache(maxsize=256)
def _takes(release: TorchVersion, conf: str) -> bool:
    """Whether ``release`` accepts the grid's ``conf`` (asked once per release and setting)."""
    from allocconf_widget.core.config.conf import parse_conf

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parse_conf(conf, release)
    except AllocConfError:
        return False
    return True


@functools.lru_cache(maxsize=256)
def _settings_for(conf: str, version: TorchVersion) -> SimSettings:
    """A grid setting as the replay models it (the grid is fixed: converted once per release)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AllocConfWarning)  # traps are explained by the reason
        return SimSettings.from_string(conf, version)


def recommend(
    trace: Trace,
    *,
    torch_version: Any,
    current_settings: SimSettings | None = None,
    current_conf: str | None = None,
    device_total: int | None = None,
    non_pytorch_bytes: int = 0,
    fraction: float | None = None,
    extra_confs: Iterable[str | tuple[str, SimSettings]] | None = (),
    workers: int | None = None,
    recorded_settings: SimSettings | None = None,
    progress: Callable[[int, int], None] | None = None,
    offer_release: TorchVersion | None = None,
    self_check_settings: SimSettings | None = None,
) -> Recommendation:
    """Replay the candidate grid and rank it.

    Args:
        current_settings: what the trace ran with (e.g. from the snapshot's
            ``allocator_settings``); replayed with the fidelity self-check.
        current_conf: the current option string, used when ``current_settings``
            is not given (and as its label).
        fraction: ``torch.cuda.set_per_process_memory_fraction`` value in force;
            applied to every candidate (it is a limit, not a tuning knob).
        extra_confs: more settings to try: option strings (validated; invalid ones raise), or
            (label, settings) pairs already validated. A memory fraction of their own is kept.
        recorded_settings: what the trace ran with, when "current" is something else (the
            settings of the kernel looking at the recording): the self-check replays these,
            they get their own row, and every reason compares with the current settings.
        progress: ``progress(done, total)`` after each replay (see ``simulate_many``).
        offer_release: the torch a user would apply a row to (the kernel's, when it differs
            from the trace's): grid settings it does not take are not offered, and a note
            says which. The replays still follow the trace's release.
        self_check_settings: what the self-check replays, when not the recorded settings
            under ``fraction``: the recording's own, where ``fraction`` is a limit the run
            was not made under (its rows still apply it).
    """
    version = simulated_release(torch_version)
    if current_settings is None:
        current_settings = _settings_for(current_conf or "", version)
    if fraction is None:
        fraction = (recorded_settings or current_settings).per_process_memory_fraction
    notes: list[Note] = []
    room = replay_room(trace, device_total, non_pytorch_bytes, fraction, read_limit=False)
    device_total, non_pytorch_bytes, fraction = room.device_total, room.non_pytorch_bytes, room.fraction
    if room.note is not None:
        notes.append(Note(NoteKind.CAPACITY, room.note))
    label = current_conf if current_conf is not None else current_settings.describe()
    current = dataclasses.replace(current_settings, per_process_memory_fraction=fraction, label=label)

    entries: list[tuple[str, str, SimSettings]] = [(label, "current", current)]
    recorded = current
    grid: list[tuple[str, str]] = []
    if recorded_settings is not None:
        recorded = dataclasses.replace(recorded_settings, per_process_memory_fraction=fraction)
        described = recorded.describe()
        grid.append(("" if described == "(defaults)" else described, "recorded"))
    offered, not_offered = _offerable(
        # a fraction in force, or set by the program mid-run: the collector has a limit to act at
        candidate_confs(version, with_fraction=device_total is not None
                        and (fraction is not None or bool(trace.limit_changes))),
        offer_release)
    grid += offered
    if not_offered:
        notes.append(Note(NoteKind.SETTINGS, f"not offered, because torch {offer_release} does not "
                          "take them: " + "; ".join(not_offered)))
    extras = list(extra_confs or ())
    given = dict(e for e in extras if isinstance(e, tuple))
    for conf, kind in grid + [(e if isinstance(e, str) else e[0], "extra") for e in extras]:
        try:
            s = recorded if kind == "recorded" else given.get(conf) or _settings_for(conf, version)
        except AllocConfError:
            if kind == "extra":
                raise
            continue  # a grid entry this release rejects (e.g. minimum sizes)
        own = s.per_process_memory_fraction if kind == "extra" else None
        s = dataclasses.replace(s, per_process_memory_fraction=fraction if own is None else own, label=conf)
        # Against a kernel's own settings, another string stays a row even when it replays the
        # same (e.g. the defaults vs. release_lock_on_cudamalloc:True): it is a different Apply.
        if all(s != other or (recorded_settings is not None and k == "current" and c != conf)
               for c, k, other in entries):
            entries.append((conf, kind, s))

    # The last run is the self-check: the recorded settings replayed with the same
    # information as every candidate (the driver address model, no recorded addresses),
    # so a row of the recorded settings and the self-check beside it never disagree.
    results = simulate_many(
        trace,
        [s for _, _, s in entries] + [self_check_settings or recorded],
        device_total=device_total,
        non_pytorch_bytes=non_pytorch_bytes,
        workers=workers,
        check=[False] * len(entries) + [True],
        progress=progress,
        timing=[True] * len(entries) + [False],  # the self-check row only gives the fidelity
    )
    fidelity = results.pop().fidelity
    base = results[0]
    # a row's mechanism is what its option does on this trace, against torch's defaults: said
    # against "now", the same split128 row was "large requests keep adding segments" beside
    # expandable segments and "small requests cannot fragment the big blocks" beside split64
    plain = dataclasses.replace(_settings_for("", version), per_process_memory_fraction=fraction)
    defaults = next((r for (_, _, s), r in zip(entries, results, strict=True)
                     if s == plain), base)  # (labels take no part in equality)
    candidates = [  # each result carries the self-check, so its verdict can say how sure it is
        Candidate(conf, kind, s, r.with_fidelity(fidelity), kind == "current")
        for (conf, kind, s), r in zip(entries, results, strict=True)
    ]
    candidates.sort(key=_rank_key)
    # a trace without segment events: the model check's own line says so (Fidelity.summary)
    if fidelity is not None and fidelity.recorded_events > 0 and not fidelity.exact:
        notes.append(Note(NoteKind.MODEL, (
            "the replay of the current settings does not reproduce the recorded segment "
            f"events exactly ({fidelity.summary()}); treat the ranking as approximate")))
    elif fidelity is not None and fidelity.caveats:
        notes.append(Note(NoteKind.MODEL, "the replay cannot model everything in this trace ("
                          + "; ".join(fidelity.caveats) + "); treat the ranking as approximate"))
    return Recommendation(
        candidates=tuple(candidates),
        current=next(c for c in candidates if c.is_current),
        fidelity=fidelity,
        torch_version=version,
        device_total=device_total,
        comparison=Comparison(base, defaults),
        notes=tuple(notes),
    )


def _rank_key(c: Candidate) -> tuple[bool, int, bool, int, int, bool, int]:
    """Settings that get furthest first: those predicted to the end, then those whose peak
    covers part of the run (a path nobody recorded follows), each by peak reserved; among
    the ones that stop, the one that gets furthest."""
    r, outcome = c.result, c.outcome
    reach = -r.events if outcome.stops else 0
    return (outcome.stops, reach, outcome.partial_peak, r.peak_reserved_bytes, r.num_alloc_retries,
            not c.is_current, len(c.conf))
