"""Why a ranked setting ranks where it does: one line a person can check.

Each line gives the numbers against the settings running now, then the mechanism: what the
setting's options do on this trace against torch's defaults. The out-of-memory part is worded
from the row's :class:`~allocconf_widget.core.sim.outcome.Outcome`, as every view words it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from allocconf_widget.core.sim.outcome import Outcome, outcome_of
from allocconf_widget.core.sim.recommend import Comparison
from allocconf_widget.core.sim.result import SimResult
from allocconf_widget.core.sim.settings import SimSettings
from allocconf_widget.core.units import MIB, format_bytes

if TYPE_CHECKING:
    from allocconf_widget.app.simulate import SimulationReport, SimulationRow


def row_reason(report: SimulationReport, row: SimulationRow) -> str | None:
    """Why a ranked row ranks where it does; None for a report that did not rank."""
    if report.comparison is None or row.rank is None:
        return None
    return reason_text(row.kind, row.settings, row.result, report.comparison)


def _oom_words(r: SimResult) -> str:
    """The OOM part of a reason, never "dies" for a program that catches its OOMs."""
    outcome, oom = outcome_of(r), r.oom
    assert oom is not None
    if outcome is Outcome.RUNS_OUT:
        return f"runs out of memory at event {oom.event_index:,}"
    if outcome is Outcome.HANDLER_DECIDES:
        return (f"runs out of memory at event {oom.event_index:,}, where the recording did not; "
                "the program catches its OOMs, so its own handler decides what follows (the replay "
                "stops there)")
    return (f"the program catches the OOM at event {oom.event_index:,} and goes on, as in the "
            "recording")


def _path_words(r: SimResult) -> str:
    return (f"the request that failed at event {r.path_changes_at:,} in the recording fits here, so "
            "the program's OOM handler would not run and what it does next (a larger batch, say) is "
            "not in the recording: peaks after that event are not predicted")


def _timing_words(r: SimResult) -> str:
    """The peak range where GPU timing of record_stream frees can change it, else ''."""
    if not r.timing_dependent:
        return ""
    low, high = r.reserved_range
    text = (f"; with other GPU timing (frees waiting on other streams) the peak lies between "
            f"{format_bytes(low)} and {format_bytes(high)}")
    if outcome_of(r) is Outcome.MAY_RUN_OUT:
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


def reason_text(kind: str, s: SimSettings, r: SimResult, comparison: Comparison) -> str:
    """One line: the numbers against the current settings, then the mechanism: what the
    setting does on this trace against torch's defaults, whatever runs now."""
    base, defaults = comparison.current, comparison.defaults
    if kind == "current":
        text = (
            f"current settings: peak reserved {format_bytes(r.peak_reserved_bytes)} for "
            f"{format_bytes(r.peak_allocated_bytes)} peak allocated"
        )
        if r.oom is not None:
            text += "; " + _oom_words(r)
        if r.path_changes_at is not None:
            text += "; " + _path_words(r)
        return text + _timing_words(r)
    params = {
        "split": format_bytes(s.max_split_bytes or 0),
        "slack": format_bytes(s.max_non_split_rounding_bytes or 20 * MIB),
        "div": max(s.roundup_slots),
        "gc": s.gc_threshold,
        "page": format_bytes(s.large_segment_bytes),
    }
    if outcome_of(r).stops:
        assert r.oom is not None
        head = (
            f"{_oom_words(r)} (needs {format_bytes(r.oom.segment_bytes)} with "
            f"{format_bytes(r.oom.reserved_bytes)} reserved"
        )
        if outcome_of(base).stops:
            assert base.oom is not None
            head += f"; now at event {base.oom.event_index:,}"
        if outcome_of(base).stops and r.events == base.events:  # neither better nor worse: no mechanism
            return f"{head}): the same request fails as now{_timing_words(r)}"
        further = outcome_of(base).stops and r.events > base.events
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
        caught = "" if outcome_of(base).stops else " the program caught"
        head = f"avoids the OOM{caught} at event {base.oom.event_index:,}; " + head
    if r.oom is not None:
        head += "; " + _oom_words(r)
    if r.path_changes_at is not None:
        head += "; " + _path_words(r)
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

