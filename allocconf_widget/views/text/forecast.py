"""The one wording of what a setting does to the step.

Every view that says what a replayed setting does (the CLI's table and ``--json``, the magic,
the Settings tab and ``%allocconf set``, ``%%allocconf dryrun`` and ``run.predict()``, the
planner, the What-if rows and bars, the OOM card) words the
:class:`~allocconf_widget.core.sim.outcome.Outcome` of that row here, against the limit the
row ran under, so the same setting reads the same everywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from allocconf_widget.core.sim.capacity import Limit
from allocconf_widget.core.sim.outcome import Outcome, outcome_of
from allocconf_widget.core.sim.result import SimResult
from allocconf_widget.core.units import format_bytes

if TYPE_CHECKING:
    from allocconf_widget.app.draft_prediction import DraftPrediction
    from allocconf_widget.app.dryrun import Prediction


def peak_text(peak: int, low: int | None = None, high: int | None = None) -> str:
    """A peak, followed by its range by GPU timing where one is given."""
    text = format_bytes(peak)
    if low is not None and high is not None and low != high:
        text += f" ({format_bytes(low)}–{format_bytes(high)} by GPU timing)"
    return text


def result_peak(result: SimResult) -> str:
    """A replay's peak reserved, with its range where GPU timing of cross-stream frees moves it."""
    if result.timing_dependent:
        return peak_text(result.peak_reserved_bytes, *result.reserved_range)
    return peak_text(result.peak_reserved_bytes)


def limit_words(limit: Limit | None) -> str:
    """What a peak is measured against, named: the memory fraction's share, or what the device
    leaves to PyTorch ('' where the device's size is unknown)."""
    if limit is None:
        return ""
    if limit.fraction is not None:
        return (f"the {format_bytes(limit.bytes)} limit (memory fraction {limit.fraction:.4g} of "
                f"{format_bytes(limit.device_total)})")
    return f"the {format_bytes(limit.bytes)} usable by PyTorch"


def _of(limit: Limit | None) -> str:
    words = limit_words(limit)
    return f" of {words}" if words else ""


def qualifier(result: SimResult, *, estimate: bool = False) -> str:
    """How sure a "fits" is: '' beside a confident self-check; an estimate says so."""
    if estimate:
        return " (a dry run's estimate)"
    if result.fidelity is not None and result.fidelity.confident:
        return ""
    return " (unverified: see the self-check)"


def outcome_tag(outcome: Outcome) -> str:
    """A few words for a chart's bar ('' for a setting that fits)."""
    return {
        Outcome.RUNS_OUT: "OOM",
        Outcome.HANDLER_DECIDES: "OOM, the program's handler decides",
        Outcome.PATH_CHANGES: "path changes",
        Outcome.CAUGHT_AS_RECORDED: "OOM caught, as recorded",
        Outcome.MAY_RUN_OUT: "may OOM by GPU timing",
        Outcome.OUTLIVES_RECORDING: "past the recorded OOM",
        Outcome.FITS: "",
    }[outcome]


def _needs(result: SimResult) -> str:
    oom = result.oom
    assert oom is not None
    return (f"at event {oom.event_index:,}: it needs {format_bytes(oom.segment_bytes)} more with "
            f"{format_bytes(oom.reserved_bytes)} reserved")


def outcome_cell(result: SimResult, *, estimate: bool = False) -> str:
    """The table's OOM cell and ``--json``'s ``oom_verdict``: short, one line."""
    outcome = outcome_of(result)
    oom = result.oom
    if outcome is Outcome.RUNS_OUT:
        assert oom is not None
        return (f"yes, at event {oom.event_index:,} ({format_bytes(oom.segment_bytes)}"
                + (", as recorded)" if oom.recorded else ")"))
    if outcome is Outcome.HANDLER_DECIDES:
        assert oom is not None
        return (f"at event {oom.event_index:,} ({format_bytes(oom.segment_bytes)}): the program "
                "catches it; its handler decides what follows")
    if outcome is Outcome.PATH_CHANGES:
        caught = f"caught at event {oom.event_index:,}, as recorded; " if oom is not None else ""
        return (f"{caught}the request that failed at event {result.path_changes_at:,} fits here: the "
                "run's path changes there")
    if outcome is Outcome.CAUGHT_AS_RECORDED:
        assert oom is not None
        return f"caught at event {oom.event_index:,}, as recorded"
    if outcome is Outcome.MAY_RUN_OUT:
        return "no in the recorded GPU timing; the latest GPU timing runs out"
    if outcome is Outcome.OUTLIVES_RECORDING:
        return ("past the recorded OOM; the rest of the run was never recorded"
                + qualifier(result, estimate=estimate))
    return "no" + qualifier(result, estimate=estimate)


def forecast_sentence(result: SimResult, limit: Limit | None, *, estimate: bool = False) -> str:
    """What the setting does to the step, as a sentence (the Settings tab, ``%allocconf set``,
    ``run.predict()``, the planner's notes, the OOM card)."""
    outcome, peak, of = outcome_of(result), result_peak(result), _of(limit)
    if outcome is Outcome.RUNS_OUT:
        assert result.oom is not None
        recorded = " (as in the recording)" if result.oom.recorded else ""
        over = f", over {limit_words(limit)}" if limit is not None else ""
        return f"runs out of memory {_needs(result)}{over}{recorded}."
    if outcome is Outcome.HANDLER_DECIDES:
        assert result.oom is not None
        return (f"a request fails at event {result.oom.event_index:,} where the recording did not (it "
                f"needs {format_bytes(result.oom.segment_bytes)} more with "
                f"{format_bytes(result.oom.reserved_bytes)} reserved); the program catches its OOMs, so "
                f"its own handler decides what follows (peak reserved {peak}{of} until then).")
    if outcome is Outcome.PATH_CHANGES:
        caught = ("the OOM the program caught in the recording is caught again at event "
                  f"{result.oom.event_index:,}; " if result.oom is not None else "")
        return (f"{caught}peak reserved {peak}{of} until event {result.path_changes_at:,}, where a request "
                "that failed in the recording fits: the program's OOM handler would not run, and "
                "what it does next (a larger batch, say) is not in the recording, so peaks after "
                "that event are not predicted.")
    if outcome is Outcome.CAUGHT_AS_RECORDED:
        assert result.oom is not None
        return (f"the OOM the program caught in the recording is caught again at event "
                f"{result.oom.event_index:,}; peak reserved {peak}{of}; the run goes on as recorded.")
    if outcome is Outcome.MAY_RUN_OUT:
        return (f"peak reserved {peak}{of} in the recorded GPU timing, but the latest GPU timing the "
                "recording allows runs out of memory: whether it fits depends on when other streams "
                "finish.")
    if outcome is Outcome.OUTLIVES_RECORDING:
        return (f"peak reserved {peak}{of} up to the request that ended the recorded run, which fits "
                f"here{qualifier(result, estimate=estimate)}; what the run needs after it was never "
                "recorded.")
    return f"peak reserved {peak}{of}; fits{qualifier(result, estimate=estimate)}."


def comparison_sentence(draft: SimResult, applied: SimResult) -> str:
    """A draft against the applied settings: fit against OOM first, else the peaks."""
    mine, theirs = outcome_of(draft), outcome_of(applied)
    both = (mine, theirs)
    if Outcome.HANDLER_DECIDES in both:
        return ("Not comparable past the first OOM the recording did not have: the program's "
                "handler decides what follows.")
    if Outcome.PATH_CHANGES in both:
        return ("Not comparable past the request whose path changes: peaks after it are not "
                "predicted.")
    if Outcome.MAY_RUN_OUT in both:
        return ("Not comparable by fit: whether "
                + ("both fit" if mine is theirs else "the draft fits" if mine is Outcome.MAY_RUN_OUT
                   else "the applied settings fit") + " depends on GPU timing.")
    if not theirs.fits and mine.fits:
        return "The draft fits where the applied settings run out of memory."
    if not mine.fits and theirs.fits:
        return "The draft runs out of memory where the applied settings fit."
    if not mine.fits:
        return "Both run out of memory."
    delta = draft.peak_reserved_bytes - applied.peak_reserved_bytes
    if delta == 0:
        return "The draft: the same peak."
    return f"The draft: {format_bytes(abs(delta))} {'less' if delta < 0 else 'more'} reserved at the peak."


def draft_lines(prediction: DraftPrediction) -> list[str]:
    """What the Settings tab and ``%allocconf set`` say about the staged draft: its verdict,
    the applied settings' beside it, the comparison, and where the step came from."""
    head = f"Prediction from {prediction.source_label}"
    draft, applied = prediction.draft, prediction.applied
    if prediction.problem is not None or draft is None:
        return [f"{head}: not available for this draft: {prediction.problem}"]
    estimate = prediction.estimate
    out = [f"{head}, with {_setting(prediction.draft_conf)}: "
           + forecast_sentence(draft.result, draft.limit, estimate=estimate)]
    if applied is not None:
        out.append(f"Applied now, with {_setting(prediction.applied_conf)}: "
                   + forecast_sentence(applied.result, applied.limit, estimate=estimate))
        out.append(comparison_sentence(draft.result, applied.result))
    if estimate:
        out.append("A dry run misses some library workspaces: treat a margin under ~10 % as a maybe "
                   "(docs/dryrun.md).")
    if prediction.other_step is not None:
        out.append(f"({prediction.other_step[0].upper()}{prediction.other_step[1:]}.)")
    return out


def _setting(conf: str) -> str:
    return conf or "torch's defaults"


def prediction_text(prediction: Prediction) -> str:
    """One setting on one GPU (``run.predict()``, ``%%allocconf dryrun``): the setting, the GPU
    and what it does to the step."""
    setting = prediction.conf or "torch's defaults"
    if prediction.row is None:
        return f"{setting} on {prediction.gpu}: not predicted"
    return (f"{setting} on {prediction.gpu}: "
            + forecast_sentence(prediction.row.result, prediction.row.limit, estimate=prediction.estimate))
