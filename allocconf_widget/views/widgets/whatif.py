"""The panel's "What if?" tab: compare candidate settings on a recorded trace, apply one.

Source: the last ``%%allocconf record`` of this session, or the bundled H200
recording when there is none (labelled as such). The recommender replays the
trace under a candidate grid (both cores), then the tab shows the model check
(the recorded settings must reproduce the recorded segment events), a bar
chart of predicted peak reserved memory, the reserved-over-time curves, and
one row per candidate with its reason and an *Apply* button that goes through
the lifecycle logic (applied now / at first CUDA use / needs restart).

The ranking is the one of every front end (:func:`allocconf_widget.app.simulate.simulate`
with ``rank=True``): "current" is this kernel's effective configuration, read from the
Session (the recording's own settings get a row of their own), and only settings this
kernel's torch takes are offered. A row's Apply goes through the one candidate use case
(:mod:`allocconf_widget.app.candidates`): it first says what it will set, unset and keep and
waits for a confirmation; the outcome appears under that row. The tab follows the Session:
when an Apply made anywhere changes what the kernel runs, the rows are ranked again against
it (the trace is already decoded; the outcome under the applied row stays while the kernel
still runs what it applied).

Speed: the first Compare must answer at once. Building the tab starts decoding
the trace in a background thread (kept per session, so a new panel reuses it),
Compare shows a progress bar while the candidates replay, and the charts are
inline SVG: a plotly ``FigureWidget`` (``renderer="figurewidget"``) costs seconds
on first use (plotly's widget module imports nbformat, and each figure ships
plotly's JavaScript bundle to the browser), which is what made the first Compare
take 5–14 s.
"""

from __future__ import annotations

import contextlib
import html
import threading
from dataclasses import dataclass
from typing import Any

from allocconf_widget.app.candidates import CandidatePlan, apply_candidate, plan_candidate, plan_for_session
from allocconf_widget.app.dryrun import EstimateCheck
from allocconf_widget.app.session import ApplyOutcome, Session
from allocconf_widget.app.simulate import SimulationReport, SimulationRequest, SimulationRow, simulate
from allocconf_widget.app.sources import source_label
from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.text.dryrun import estimate_beside, estimate_verdict
from allocconf_widget.views.text.forecast import outcome_tag
from allocconf_widget.views.text.reasons import row_reason
from allocconf_widget.views.text.simulate import headline
from allocconf_widget.views.text.step import step_words

#: label, x, reserved, peak, the outcome's tag ('' where it fits), the peak's (low, high) by GPU timing
Run = tuple[str, list[float], list[float], float, str, float, float]


def _runs(report: SimulationReport, limit: int = 6) -> list[Run]:
    """The chart's runs: the ``limit`` best rows, plus this kernel's own setting when it ranks
    lower (every row is compared with it, so the chart must always show it)."""
    shown = list(report.rows[:limit])
    current = report.current
    if current is not None and current not in shown:
        shown.append(current)
    runs = []
    for row in shown:
        series = row.result.series
        label = row.shown_conf + (" (this kernel)" if row.is_current else "")
        low, high = row.result.reserved_range
        runs.append((label, [float(i) for i in series.event_index],
                     [float(v) for v in series.reserved_bytes], float(row.result.peak_reserved_bytes),
                     outcome_tag(row.outcome), float(low), float(high)))
    return runs


#: Width of one character of the charts' 11 px sans-serif labels, rounded up (DejaVu Sans,
#: the widest common default, averages 6.4 px): labels get the room their text needs.
_CHAR_PX = 7.0


def bars_svg(runs: list[Run], width: int = 640) -> str:
    """Horizontal bars of peak reserved memory per configuration, as inline SVG.

    Each label is written whole on its own line above its bar (a setting string cut short
    reads as another setting); the chart grows wider when a label needs it. Where GPU timing
    moves a peak, a whisker spans its range and the value says it, as the tables do.
    """
    from allocconf_widget.views.charts.figures import ConfigRun

    items = [ConfigRun(*r) for r in runs]
    top = max([r.top for r in items] + [1.0])
    texts = [r.bar_text() for r in items]
    label_h, bar_h, gap = 14, 14, 6
    value_w = int(max([len(t) for t in texts] + [12]) * _CHAR_PX) + 8
    row = label_h + bar_h + gap
    width = max(width, int(max([len(r.label) for r in items] + [0]) * _CHAR_PX) + 20, value_w + 200)
    height = row * len(items) + 6
    scale = (width - 10 - value_w) / top
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
             "style='font:11px sans-serif'>"]
    for i, (run, text) in enumerate(zip(items, texts, strict=True)):
        y = 4 + i * row
        bar = max(1.0, scale * run.peak)
        color = run.color
        parts.append(f"<text x='4' y='{y + 11}'>{html.escape(run.label)}</text>")
        parts.append(f"<rect x='4' y='{y + label_h}' width='{bar:.1f}' height='{bar_h}' "
                     f"fill='{color}'/>")
        end = 4 + bar
        if run.low is not None and run.high is not None and run.low != run.high:
            x0, x1, mid = 4 + scale * run.low, 4 + scale * run.high, y + label_h + bar_h / 2
            parts.append(f"<path d='M{x0:.1f},{mid - 4:.1f}v8M{x0:.1f},{mid:.1f}H{x1:.1f}"
                         f"M{x1:.1f},{mid - 4:.1f}v8' stroke='#333' stroke-width='1.5' fill='none'>"
                         "<title>the peak's range by GPU timing</title></path>")
            end = max(end, x1)
        parts.append(f"<text x='{end + 4:.1f}' y='{y + label_h + 11}'>{html.escape(text)}</text>")
    parts.append("</svg>")
    return "".join(parts)


_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def overlay_svg(runs: list[Run], width: int = 640, height: int = 220) -> str:
    """Reserved memory over the replay, one polyline per configuration, as inline SVG; the
    axis reaches the highest peak any GPU timing allows."""
    x_max = max([max(r[1], default=0.0) for r in runs] + [1.0])
    y_max = max([max(r[3], r[6]) for r in runs] + [max(r[2], default=0.0) for r in runs] + [1.0])
    left, bottom, legend_h = 60, 20, 16 * len(runs)
    plot_h = height - bottom - 10
    legend = [f"— {r[0]}{' (out of memory)' if r[4] else ''}" for r in runs]
    width = max(width, int(max([len(t) for t in legend] + [0]) * _CHAR_PX) + left + 10)
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height + legend_h}' "
             "style='font:11px sans-serif'>",
             f"<text x='4' y='14'>{format_bytes(int(y_max))}</text>",
             f"<text x='4' y='{plot_h + 10}'>0</text>",
             f"<line x1='{left}' y1='{plot_h + 10}' x2='{width - 10}' y2='{plot_h + 10}' stroke='#999'/>"]
    for i, (_label, xs, ys, *_rest) in enumerate(runs):
        color = _PALETTE[i % len(_PALETTE)]
        points = " ".join(f"{left + (width - left - 10) * x / x_max:.1f},"
                          f"{10 + plot_h * (1 - y / y_max):.1f}" for x, y in zip(xs, ys, strict=False))
        parts.append(f"<polyline fill='none' stroke='{color}' stroke-width='1.5' points='{points}'/>")
        parts.append(f"<text x='{left}' y='{height + 12 + 16 * i}' fill='{color}'>"
                     f"{html.escape(legend[i])}</text>")
    parts.append(f"<text x='{width - 10}' y='{height - 2}' text-anchor='end'>allocator event</text>")
    parts.append("</svg>")
    return "".join(parts)


_ERROR = "<span style='color:#b00020'>✖ {}</span>"


@dataclass
class _Row:
    """The widgets of one candidate: Apply and label; the confirm step and the outcome are built
    when first needed (fewer widgets to create and send, so the rows appear sooner)."""

    conf: str
    is_current: bool
    apply: Any
    box: Any
    result: Any = None
    confirm: Any = None  # a views.widgets.confirm.Confirmation


@dataclass(frozen=True)
class _Estimate:
    """The session's dry run beside the recording's rows, or why it could not be set there."""

    check: EstimateCheck | None = None
    failure: str | None = None


def _estimate_beside(session: Session, report: SimulationReport) -> _Estimate:
    """The session's dry run beside the recording's rows (empty without both). A comparison
    that fails is said in the summary, never raised: it must not cost the user the ranking."""
    from allocconf_widget.app.dryrun import session_estimate

    try:
        return _Estimate(check=session_estimate(session, report))
    except Exception as exc:
        return _Estimate(failure=str(exc) or type(exc).__name__)


class WhatIfView:
    """The tab's widgets. ``view.widget`` is displayed; ``view.run()`` computes (any thread)."""

    def __init__(self, session: Session, renderer: str = "auto") -> None:
        import ipywidgets as W

        self.session = session
        self.renderer = renderer
        self._lock = threading.Lock()
        self.source = W.HTML()
        self.run_button = W.Button(description="Compare settings", icon="play",
                                   button_style="primary",
                                   layout=W.Layout(width="auto", min_width="175px"))
        self.run_button.add_class("allocconf-whatif-run")
        self.run_button.on_click(lambda _b: self.run())
        self.progress = W.IntProgress(value=0, min=0, max=1, description="",
                                      layout=W.Layout(width="220px", display="none"))
        self.progress.add_class("allocconf-whatif-progress")
        self.current = W.HTML()
        self.current.add_class("allocconf-whatif-current")
        self.summary = W.HTML()
        self.summary.add_class("allocconf-whatif-summary")
        self.charts = W.VBox()
        self.rows = W.VBox()
        self.widget = W.VBox([W.HBox([self.run_button, self.progress, self.source]), self.current,
                              self.summary, self.charts, self.rows])
        self.widget.add_class("allocconf-whatif")
        self.report: SimulationReport | None = None
        self.estimate: EstimateCheck | None = None  # the session's dry run beside these rows
        self.estimate_failure: str | None = None  # why it could not be set beside them
        self.compared_with: str | None = None
        self.compared_draft: str | None = None  # the staged draft the rows ranked (None: none)
        self.rerank: threading.Thread | None = None  # a re-ranking after an Apply, if one runs
        self._rows: list[_Row] = []
        # row conf → the outcome shown under it, and the settings the kernel ran and the trace
        # replayed right after it: it stays across a new ranking only while both still hold
        self._outcomes: dict[str, tuple[str, tuple[str, tuple[str, int]]]] = {}
        self._describe_source()
        self._show_current()
        self._unsubscribe = session.subscribe(self._session_changed)
        self._warm = threading.Thread(target=self._decode_quietly, name="allocconf-whatif-decode",
                                      daemon=True)
        self._warm.start()

    # -- the trace, decoded ahead of the first click --------------------------------
    def _decode_quietly(self) -> None:
        with contextlib.suppress(Exception):  # run() reports any error
            self.session.trace_cache.get(self.session)

    # -- header lines -------------------------------------------------------------
    def _describe_source(self) -> None:
        said = step_words(self.session.step(), source_label(self.session))
        self.source.value = f"<i>{html.escape(said)}</i>"

    def _effective(self) -> str:
        return str(self.session.view().effective.to_string())

    def _outcome_key(self) -> tuple[str, tuple[str, int]]:
        """What an Apply's outcome under a row is true of: the kernel's settings, the trace."""
        return self._effective(), self.session.recording_key()

    def _show_current(self) -> None:
        from allocconf_widget.app.session import Phase

        view = self.session.view()
        now = view.effective.to_string()
        shown = html.escape(now or "(torch defaults)")
        line = f"This kernel runs <code>{shown}</code>"
        if view.state.phase is Phase.NO_CUDA:  # as the Settings tab says: nothing reads them here
            line += ("; its torch has no CUDA, so no allocator reads them here: the rows say what "
                     "each setting would do on a GPU")
        if self.compared_with is not None and self.compared_with != now:
            line += (f"; the rows below were compared with <code>"
                     f"{html.escape(self.compared_with or '(torch defaults)')}</code>: "
                     "ranking them again…")
        line += "."
        if self.report is not None and view.draft is not None and view.draft != self.compared_draft:
            line += (f" Your staged draft <code>{html.escape(view.draft)}</code> is not among the "
                     "rows yet: press Compare to rank it.")
        self.current.value = line

    # -- Compare ---------------------------------------------------------------------
    def run(self) -> SimulationReport | None:
        """Replay the candidates (the one ranking) and render the comparison."""
        with self._lock:
            self.run_button.disabled = True
            self.summary.value = "<i>Replaying the trace under each candidate…</i>"
            self.progress.value, self.progress.layout.display = 0, ""
            self.progress.description = "reading"
            try:
                source, trace = self.session.trace_cache.get(self.session)
                view = self.session.view()
                kernel = view.effective
                draft = view.staged if view.has_changes else None
                report = simulate(source, SimulationRequest(rank=True, kernel=kernel, draft=draft,
                                                            progress=self._progress), trace)
                beside = _estimate_beside(self.session, report)
                self.estimate, self.estimate_failure = beside.check, beside.failure
                self.report = report
                self.compared_with, self.compared_draft = kernel.to_string(), view.draft
                self._render(report)
            except Exception as exc:  # shown in the tab; never breaks the panel
                self.summary.value = _ERROR.format(html.escape(str(exc)))
            finally:
                self.run_button.disabled = False
                self.progress.layout.display = "none"
                self._describe_source()
                self._show_current()
        return self.report

    def _progress(self, done: int, total: int) -> None:
        self.progress.max = total
        self.progress.value = done
        self.progress.description = f"{done}/{total}"

    def _render(self, report: SimulationReport) -> None:
        notes = [html.escape(n) for n in report.all_notes()]
        if self.estimate is not None:
            notes.append("Your dry run against this recording (the closed loop): "
                         + html.escape(estimate_verdict(self.estimate)))
        elif self.estimate_failure is not None:
            notes.append("Your dry run could not be set beside this recording ("
                         + html.escape(self.estimate_failure) + "); the ranking above stands.")
        self.summary.value = "<br>".join([html.escape(h) for h in headline(report)] + notes)
        runs = _runs(report)
        charts = self._charts(runs)
        if len(report.rows) > len(runs):  # the header says "under 11 settings"; the charts hold 6
            import ipywidgets as W

            caption = W.HTML(f"<i>The charts draw {len(runs)} of the {len(report.rows)} settings: "
                             "the best-ranked and this kernel's own. The rows below list them all.</i>")
            caption.add_class("allocconf-whatif-chart-caption")
            charts = [caption, *charts]
        self.charts.children = charts
        self._rows = [self._row(report, row) for row in report.rows]
        self._mark_rows()  # before they are shown: no row ever appears with the wrong Apply state
        now = self._outcome_key()
        for conf, (_, after) in list(self._outcomes.items()):
            if after != now:  # applied since (here or elsewhere), or another trace replayed
                del self._outcomes[conf]
        for row in self._rows:  # an outcome stays under its row across a new ranking
            if row.conf in self._outcomes:
                self._say(row, self._outcomes[row.conf][0])
        self.rows.children = [row.box for row in self._rows]

    def _row(self, report: SimulationReport, sim_row: SimulationRow) -> _Row:
        import ipywidgets as W

        apply = W.Button(description="Apply", layout=W.Layout(width="80px"))
        apply.add_class("allocconf-whatif-apply")
        tag = (" <b>(this kernel)</b>" if sim_row.is_current
               else " <b>(your staged draft)</b>" if sim_row.is_draft else "")
        beside = estimate_beside(self.estimate, sim_row.conf) if self.estimate is not None else None
        estimate = (f' <span class="allocconf-whatif-estimate">· {html.escape(beside)}</span>'
                    if beside else "")
        label = W.HTML(f"<code>{html.escape(sim_row.shown_conf)}</code>{tag} — "
                       f"{html.escape(row_reason(report, sim_row) or '')}{estimate}",
                       layout=W.Layout(width="85%"))
        box = W.VBox([W.HBox([apply, label])])
        box.add_class("allocconf-whatif-row")
        row = _Row(sim_row.conf, sim_row.is_current, apply, box)
        apply.on_click(lambda _b: self.ask(row))
        return row

    def _confirm_widgets(self, row: _Row) -> None:
        from allocconf_widget.views.widgets.confirm import Confirmation

        if row.confirm is not None:
            return
        row.confirm = Confirmation("whatif", lambda: self.apply(row.conf), margin="0 0 0 84px")
        self._lay_out(row)

    def _say(self, row: _Row, text: str) -> None:
        """Show ``text`` (HTML) under the row: the outcome of its Apply, or why it cannot."""
        import ipywidgets as W

        if row.result is None:
            if not text:
                return
            row.result = W.HTML(layout=W.Layout(margin="0 0 0 84px"))
            row.result.add_class("allocconf-whatif-result")
            self._lay_out(row)
        row.result.value = text

    @staticmethod
    def _lay_out(row: _Row) -> None:
        parts = [row.box.children[0], row.confirm.widget if row.confirm else None, row.result]
        row.box.children = [part for part in parts if part is not None]

    def _mark_rows(self) -> None:
        """Apply is enabled on every row that would change what this kernel runs."""
        applied = self.session.view().applied
        for row in self._rows:
            try:
                row.apply.disabled = not plan_candidate(applied, row.conf).changes
            except Exception:  # not valid for the installed torch: Apply explains why
                row.apply.disabled = False
            row.apply.tooltip = "this kernel runs these settings" if row.apply.disabled else (
                "see what changes, then confirm")

    def _charts(self, runs: list[Run]) -> list[Any]:
        import ipywidgets as W

        if self.renderer == "figurewidget":  # opt-in: seconds on first use (see the module doc)
            try:
                import plotly.graph_objects as go

                from allocconf_widget.views.charts.figures import peak_bar_chart, reserved_overlay_chart

                return [go.FigureWidget(peak_bar_chart(runs)),
                        go.FigureWidget(reserved_overlay_chart(runs))]
            except Exception:  # no plotly/anywidget here: the SVG below works everywhere
                pass
        bars, lines = W.HTML(bars_svg(runs)), W.HTML(overlay_svg(runs))
        bars.add_class("allocconf-whatif-svg")
        return [bars, lines]

    # -- Apply: say what changes, wait for a yes, show the outcome under the row ------------
    def _find(self, conf: str) -> _Row | None:
        return next((row for row in self._rows if row.conf == conf), None)

    def ask(self, row: _Row) -> CandidatePlan | None:
        """The confirm step: what Apply would set, unset and keep, with Apply / Cancel under the row."""
        self._say(row, "")
        self._outcomes.pop(row.conf, None)
        try:
            plan = plan_for_session(self.session, row.conf)
        except Exception as exc:  # the row's string is not valid for the installed torch
            self._say(row, _ERROR.format(html.escape(str(exc))))
            return None
        self._confirm_widgets(row)
        row.confirm.ask(f"{html.escape(plan.describe())}.", can_apply=bool(plan.changes))
        return plan

    def _hide_confirm(self, row: _Row) -> None:
        if row.confirm is not None:
            row.confirm.hide()

    def apply(self, conf: str) -> ApplyOutcome | None:
        """Apply the row ``conf`` through the one candidate use case; show what happened under it."""
        row = self._find(conf)
        if row is not None:
            self._hide_confirm(row)
        try:
            outcome = apply_candidate(self.session, plan_for_session(self.session, conf))
        except Exception as exc:  # an invalid candidate for this torch, or torch refusing it
            if row is not None:
                self._say(row, _ERROR.format(html.escape(str(exc))))
            return None
        text = (f"<b>{html.escape(outcome.headline())}</b> "
                + "<br>".join(html.escape(line) for line in outcome.lines()))
        self._outcomes[conf] = (text, self._outcome_key())
        row = self._find(conf)  # the Session's notification may have ranked the rows again
        if row is not None:
            self._say(row, text)
        return outcome

    # -- the Session changed (an Apply here, in the Settings tab or by the magic) ----------
    def _session_changed(self) -> None:
        self._describe_source()
        self._show_current()
        if self.report is not None and self.compared_with != self._effective():
            # every row's "vs … now" and the "(this kernel)" mark are about the old settings:
            # rank again against what the kernel runs now (the trace is decoded already)
            self._start_rerank()
        else:
            self._mark_rows()

    def _start_rerank(self) -> None:
        running = self.rerank
        if running is not None and running.is_alive():
            return
        self.rerank = threading.Thread(target=self.run, name="allocconf-whatif-rerank", daemon=True)
        self.rerank.start()

    def close(self) -> None:
        """Stop following the Session (and let the trace decoding started by the tab end)."""
        self._unsubscribe()
        self._warm.join(timeout=10)
        if self.rerank is not None:
            self.rerank.join(timeout=30)
