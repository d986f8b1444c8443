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
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from allocconf_widget._errors import AllocConfError, AllocConfWarning
from allocconf_widget.core.sim.capacity import replay_room
from allocconf_widget.core.sim.result import Fidelity, SimResult
from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.sim.simulator import simulate_many
from allocconf_widget.core.sim.trace.model import Trace
from allocconf_widget.core.units import MIB, format_bytes
from allocconf_widget.core.versions import TorchVersion, simulated_release


@dataclass(frozen=True)
class Candidate:
    """One replayed configuration and how it compares with the current one."""

    conf: str  # the PYTORCH_CUDA_ALLOC_CONF value to set ("" = torch's defaults)
    kind: str  # current, defaults, expandable, max_split, roundup, gc, combo, extra
    settings: SimSettings
    result: SimResult
    reason: str
    is_current: bool

    def to_json(self) -> dict[str, Any]:
        """Plain dict: the conf string, the reason and the prediction."""
        out = self.result.to_json()
        out.pop("series", None)
        out.update(conf=self.conf, kind=self.kind, reason=self.reason, is_current=self.is_current)
        return out


@dataclass(frozen=True)
class Recommendation:
    """Ranked candidates (best first), the current configuration, and how far to trust it."""

    candidates: tuple[Candidate, ...]
    current: Candidate
    fidelity: Fidelity | None
    torch_version: TorchVersion
    device_total: int | None
    notes: tuple[str, ...] = ()

    @property
    def best(self) -> Candidate:
        """The top-ranked candidate (may be the current settings)."""
        return self.candidates[0]

    def to_json(self) -> dict[str, Any]:
        """Plain dict for JSON output."""
        return {
            "torch_version": str(self.torch_version),
            "device_total": self.device_total,
            "fidelity": self.fidelity.to_json() if self.fidelity is not None else None,
            "notes": list(self.notes),
            "candidates": [c.to_json() for c in self.candidates],
        }


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
    from allocconf_widget.core.config.conf import parse_conf

    kept: list[tuple[str, str]] = []
    rejected: list[str] = []
    for conf, kind in grid:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                parse_conf(conf, release)
        except AllocConfError:
            rejected.append(conf)
            continue
        kept.append((conf, kind))
    return kept, rejected


def _settings_for(conf: str, version: TorchVersion) -> SimSettings:
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
    extra_confs: Iterable[str] | None = (),
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
        extra_confs: more option strings to try (validated; invalid ones raise).
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
    notes: list[str] = []
    room = replay_room(trace, device_total, non_pytorch_bytes, fraction, read_limit=False)
    device_total, non_pytorch_bytes, fraction = room.device_total, room.non_pytorch_bytes, room.fraction
    if room.note is not None:
        notes.append(room.note)
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
        notes.append(f"not offered, because torch {offer_release} does not take them: "
                     + "; ".join(not_offered))
    for conf, kind in grid + [(c, "extra") for c in extra_confs or ()]:
        try:
            s = recorded if kind == "recorded" else _settings_for(conf, version)
        except AllocConfError:
            if kind == "extra":
                raise
            continue  # a grid entry this release rejects (e.g. minimum sizes)
        s = dataclasses.replace(s, per_process_memory_fraction=fraction, label=conf)
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
    candidates = [  # each result carries the self-check, so its OOM verdict can say how sure it is
        Candidate(conf, kind, s, r.with_fidelity(fidelity), _reason(kind, s, r, base, defaults),
                  kind == "current")
        for (conf, kind, s), r in zip(entries, results, strict=True)
    ]
    candidates.sort(key=_rank_key)
    # a trace without segment events: the model check's own line says so (Fidelity.summary)
    if fidelity is not None and fidelity.recorded_events > 0 and not fidelity.exact:
        notes.append(
            "the replay of the current settings does not reproduce the recorded segment "
            f"events exactly ({fidelity.summary()}); treat the ranking as approximate"
        )
    elif fidelity is not None and fidelity.caveats:
        notes.append("the replay cannot model everything in this trace ("
                     + "; ".join(fidelity.caveats) + "); treat the ranking as approximate")
    if trace.initial_state is not None:
        notes.append(
            f"the replays start from {trace.initial_state.provenance()} "
            f"({trace.initial_state.describe()}): each candidate is replayed as if switched now, "
            "mid-run, keeping those segments; peaks cover the recorded window")
    elif trace.initial_note:
        notes.append(trace.initial_note)
    if trace.partial:
        notes.append("the trace is partial (ring buffer wrapped): peaks cover only its window")
    return Recommendation(
        candidates=tuple(candidates),
        current=next(c for c in candidates if c.is_current),
        fidelity=fidelity,
        torch_version=version,
        device_total=device_total,
        notes=tuple(notes),
    )


def _rank_key(c: Candidate) -> tuple[bool, int, bool, int, int, bool, int]:
    r = c.result
    failed = _stops(r)
    reach = -r.events if failed else 0  # among failures, the one that gets furthest
    # a program whose recorded OOM fits here takes a path nobody recorded: its peak covers only
    # the part before, so it ranks after the rows predicted to the end
    unpredicted_tail = r.path_changes_at is not None
    return (failed, reach, unpredicted_tail, r.peak_reserved_bytes, r.num_alloc_retries,
            not c.is_current, len(c.conf))


def _stops(r: SimResult) -> bool:
    """The run ends (a fatal OOM) or the replay cannot follow it further (an OOM the program's
    own handler would catch where the recording had none). OOMs the program caught in the
    recording and catches again here end nothing."""
    return r.oom_fatal or r.handler_decides  # oom_fatal is set only with an OOM


def _oom_words(r: SimResult) -> str:
    """The OOM part of a reason, never "dies" for a program that catches its OOMs."""
    assert r.oom is not None
    if r.oom_fatal:
        return f"runs out of memory at event {r.oom.event_index:,}"
    if r.handler_decides:
        return (f"runs out of memory at event {r.oom.event_index:,}, where the recording did not; "
                "the program catches its OOMs, so its own handler decides what follows (the replay "
                "stops there)")
    return (f"the program catches the OOM at event {r.oom.event_index:,} and goes on, as in the "
            "recording")


def _timing_words(r: SimResult) -> str:
    """The peak range where GPU timing of record_stream frees can change it, else ''."""
    if not r.timing_dependent:
        return ""
    low, high = r.reserved_range
    text = (f"; with other GPU timing (frees waiting on other streams) the peak lies between "
            f"{format_bytes(low)} and {format_bytes(high)}")
    if r.timing_oom:
        text += ", and the latest timing runs out of memory"
    return text


_WHY_BETTER = {
    "expandable": "expandable segments map memory in pages instead of carving fixed segments",
    "max_split": "blocks of {split} and more are never split, so small requests cannot "
    "fragment the big cached blocks",
    "max_split_expandable": "a split limit beside expandable segments can let reserved memory grow "
    "while little is allocated (pytorch/pytorch#123548): the expandable segments do the work here",
    "roundup": "rounding sizes up to 1/{div} steps of a power of two lets similar sizes "
    "share cached blocks",
    "gc": "cached segments that sat unused are released once reserved passes "
    "{gc:.0%} of the allowed memory",
    "defaults": "torch's defaults",
    "recorded": "the settings the recording ran with",
}
_WHY_WORSE = {
    "expandable": "mapping in {page} pages costs more than it saves for this trace",
    "max_split": "blocks of {split} and more are reused only for requests within {slack} "
    "of their size and released only on the OOM path, so large requests keep adding segments",
    "max_split_expandable": "a split limit beside expandable segments lets reserved memory grow "
    "while little is allocated (pytorch/pytorch#123548), as here: drop the split limit",
    "roundup": "rounding sizes up to 1/{div} steps of a power of two pads every allocation",
    "gc": "releasing idle segments early means re-allocating them later",
    "defaults": "torch's defaults",
    "recorded": "the settings the recording ran with",
}


def _reason(kind: str, s: SimSettings, r: SimResult, base: SimResult, defaults: SimResult) -> str:
    """One line: the numbers against the current settings, then the mechanism: what the
    setting does on this trace against torch's defaults (``defaults``), whatever runs now."""
    if kind == "current":
        text = (
            f"current settings: peak reserved {format_bytes(r.peak_reserved_bytes)} for "
            f"{format_bytes(r.peak_allocated_bytes)} peak allocated"
        )
        if r.oom is not None:
            text += "; " + _oom_words(r)
        if r.path_changes_at is not None:
            text += "; " + r.path_change_words()
        return text + _timing_words(r)
    params = {
        "split": format_bytes(s.max_split_bytes or 0),
        "slack": format_bytes(s.max_non_split_rounding_bytes or 20 * MIB),
        "div": max(s.roundup_slots),
        "gc": s.gc_threshold,
        "page": format_bytes(s.large_segment_bytes),
    }
    if _stops(r):
        assert r.oom is not None
        head = (
            f"{_oom_words(r)} (needs {format_bytes(r.oom.segment_bytes)} with "
            f"{format_bytes(r.oom.reserved_bytes)} reserved"
        )
        if _stops(base):
            assert base.oom is not None
            head += f"; now at event {base.oom.event_index:,}"
        if _stops(base) and r.events == base.events:  # neither better nor worse: no mechanism
            return f"{head}): the same request fails as now{_timing_words(r)}"
        further = _stops(base) and r.events > base.events
        return f"{head}): {_why(kind, s, better=further).format(**params)}{_timing_words(r)}"
    new, old = r.peak_reserved_bytes, base.peak_reserved_bytes
    if new == old:
        head = f"same peak reserved as now ({format_bytes(new)})"
    else:
        ratio = (new - old) / old if old else 0.0
        change = f"{ratio:+.1%}" if abs(ratio) < 0.095 else f"{ratio:+.0%}"
        change = change.replace("-", "−") if old else "new"
        head = f"peak reserved {format_bytes(new)} vs {format_bytes(old)} now ({change})"
    if base.oom is not None and (r.oom is None or r.oom.event_index != base.oom.event_index):
        caught = "" if _stops(base) else " the program caught"
        head = f"avoids the OOM{caught} at event {base.oom.event_index:,}; " + head
    if r.oom is not None:
        head += "; " + _oom_words(r)
    if r.path_changes_at is not None:
        head += "; " + r.path_change_words()
    plain = defaults.peak_reserved_bytes
    idle = _idle_split_words(s, r)
    if kind == "max_split" and idle:
        why = idle  # the advice pasted most often, on a trace where it cannot do anything
    elif new == plain and kind not in ("defaults", "recorded"):
        why = "on this trace it reserves what torch's defaults reserve at the peak"
        if idle:
            why += "; " + idle
    else:
        why = _why(kind, s, better=new <= plain, idle_split=bool(idle)).format(**params)
        if idle:
            why = "; ".join(filter(None, (why, idle)))
    return f"{head}: {why}{_timing_words(r)}"


def _idle_split_words(s: SimSettings, r: SimResult) -> str:
    """Where a ``max_split_size_mb`` can never act on this trace (no segment as large, in any
    GPU timing: simulate_many's twin rule), say so, else ''."""
    if s.max_split_bytes is None or s.expandable_segments or r.largest_segment_bytes >= s.max_split_bytes:
        return ""
    return (f"no segment here reaches the split limit of {format_bytes(s.max_split_bytes)} (the "
            f"largest is {format_bytes(r.largest_segment_bytes)}), so that limit never acts")


def _why(kind: str, s: SimSettings, *, better: bool, idle_split: bool = False) -> str:
    """The mechanism of ``kind`` (of each option, for a combination), for a row better or
    worse than torch's defaults; an idle split limit (``idle_split``) is said apart."""
    if kind in ("combo", "extra"):
        parts = []
        paired = s.expandable_segments and s.max_split_bytes is not None and not idle_split
        if s.expandable_segments and (better or not paired):
            parts.append("expandable")  # worse with a split limit beside it: the pair's doing
        if s.max_split_bytes is not None and not idle_split:
            # beside expandable segments a split limit is what the settings warning is about
            parts.append("max_split_expandable" if paired else "max_split")
        if any(s.roundup_slots):
            parts.append("roundup")
        if s.gc_threshold:
            parts.append("gc")
        table = _WHY_BETTER if better else _WHY_WORSE
        return "; ".join(table[p] for p in parts) or ("" if idle_split else table["defaults"])
    table = _WHY_BETTER if better else _WHY_WORSE
    return table.get(kind, table["defaults"])
