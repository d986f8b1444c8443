"""The panel's "What if?" tab: compare candidate settings on a recorded trace, apply one.

Source: the last ``%%allocconf record`` of this session, or the bundled H200
recording when there is none (labelled as such). The recommender replays the
trace under a candidate grid (both cores), then the tab shows the model check
(the recorded settings must reproduce the recorded segment events), a bar
chart of predicted peak reserved memory, the reserved-over-time curves, and
one row per candidate with its reason and an *Apply* button that goes through
the lifecycle logic (applied now / at first CUDA use / needs restart).

"Current" is this kernel's effective configuration, read from the Session (the
recording's own settings get a row of their own). A row's Apply first says what
it will set and unset and waits for a confirmation; the outcome appears under
that row. The tab follows the Session: an Apply made anywhere moves the
"current" mark.

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

from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.charts.style import COLORS


def _runs(recommendation: Any, limit: int = 6) -> list[tuple[str, list[float], list[float], float, bool]]:
    """The chart's runs: the ``limit`` best candidates, plus this kernel's own setting when it
    ranks lower (every row is compared with it, so the chart must always show it)."""
    chosen = list(recommendation.candidates[:limit])
    current = next((c for c in recommendation.candidates if c.is_current), None)
    if current is not None and current not in chosen:
        chosen.append(current)
    runs = []
    for cand in chosen:
        series = cand.result.series
        label = (cand.conf or "(torch defaults)") + (" (this kernel)" if cand.is_current else "")
        runs.append((label, [float(i) for i in series.event_index],
                     [float(v) for v in series.reserved_bytes], float(cand.result.peak_reserved_bytes),
                     cand.result.oom is not None))
    return runs


#: Width of one character of the charts' 11 px sans-serif labels, rounded up (DejaVu Sans,
#: the widest common default, averages 6.4 px): labels get the room their text needs.
_CHAR_PX = 7.0


def bars_svg(runs: list[tuple[str, list[float], list[float], float, bool]], width: int = 640) -> str:
    """Horizontal bars of peak reserved memory per configuration, as inline SVG.

    Each label is written whole on its own line above its bar (a setting string cut short
    reads as another setting); the chart grows wider when a label needs it.
    """
    top = max([r[3] for r in runs] + [1.0])
    label_h, bar_h, gap, value_w = 14, 14, 6, 110
    row = label_h + bar_h + gap
    width = max(width, int(max([len(r[0]) for r in runs] + [0]) * _CHAR_PX) + 20)
    height = row * len(runs) + 6
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
             "style='font:11px sans-serif'>"]
    for i, (label, _xs, _ys, peak, oom) in enumerate(runs):
        y = 4 + i * row
        bar = max(1.0, (width - 10 - value_w) * peak / top)
        color = COLORS["oom"] if oom else COLORS["reserved"]
        parts.append(f"<text x='4' y='{y + 11}'>{html.escape(label)}</text>")
        parts.append(f"<rect x='4' y='{y + label_h}' width='{bar:.1f}' height='{bar_h}' "
                     f"fill='{color}'/>")
        parts.append(f"<text x='{4 + bar + 4:.1f}' y='{y + label_h + 11}'>"
                     f"{'OOM ' if oom else ''}{format_bytes(int(peak))}</text>")
    parts.append("</svg>")
    return "".join(parts)


_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def overlay_svg(runs: list[tuple[str, list[float], list[float], float, bool]],
                width: int = 640, height: int = 220) -> str:
    """Reserved memory over the replay, one polyline per configuration, as inline SVG."""
    x_max = max([max(r[1], default=0.0) for r in runs] + [1.0])
    y_max = max([r[3] for r in runs] + [1.0])
    left, bottom, legend_h = 60, 20, 16 * len(runs)
    plot_h = height - bottom - 10
    legend = [f"— {label}{' (out of memory)' if oom else ''}" for label, _x, _y, _p, oom in runs]
    width = max(width, int(max([len(t) for t in legend] + [0]) * _CHAR_PX) + left + 10)
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height + legend_h}' "
             "style='font:11px sans-serif'>",
             f"<text x='4' y='14'>{format_bytes(int(y_max))}</text>",
             f"<text x='4' y='{plot_h + 10}'>0</text>",
             f"<line x1='{left}' y1='{plot_h + 10}' x2='{width - 10}' y2='{plot_h + 10}' stroke='#999'/>"]
    for i, (_label, xs, ys, _peak, _oom) in enumerate(runs):
        color = _PALETTE[i % len(_PALETTE)]
        points = " ".join(f"{left + (width - left - 10) * x / x_max:.1f},"
                          f"{10 + plot_h * (1 - y / y_max):.1f}" for x, y in zip(xs, ys, strict=False))
        parts.append(f"<polyline fill='none' stroke='{color}' stroke-width='1.5' points='{points}'/>")
        parts.append(f"<text x='{left}' y='{height + 12 + 16 * i}' fill='{color}'>"
                     f"{html.escape(legend[i])}</text>")
    parts.append(f"<text x='{width - 10}' y='{height - 2}' text-anchor='end'>allocator event</text>")
    parts.append("</svg>")
    return "".join(parts)


_CACHE_KEY = "whatif_trace_cache"
_ERROR = "<span style='color:#b00020'>✖ {}</span>"


def _trace_cache(session: Any) -> Any:
    """The session's :class:`~allocconf_widget.app.simulate.TraceCache` (one per kernel)."""
    from allocconf_widget.app.simulate import TraceCache

    with session.lock:
        cache = session.extras.get(_CACHE_KEY)
        if cache is None:
            cache = session.extras[_CACHE_KEY] = TraceCache()
        return cache


@dataclass
class _Row:
    """The widgets of one candidate: Apply and label; the confirm step and the outcome are built
    when first needed (fewer widgets to create and send, so the rows appear sooner)."""

    conf: str
    is_current: bool
    apply: Any
    box: Any
    result: Any = None
    confirm: Any = None
    question: Any = None
    yes: Any = None


class WhatIfView:
    """The tab's widgets. ``view.widget`` is displayed; ``view.run()`` computes (any thread)."""

    def __init__(self, session: Any, renderer: str = "auto") -> None:
        import ipywidgets as W

        self.session = session
        self.renderer = renderer
        self._lock = threading.Lock()
        self._cache_lock = threading.Lock()
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
        self.recommendation: Any = None
        self.compared_with: str | None = None
        self._rows: list[_Row] = []
        self._describe_source()
        self._show_current()
        self._unsubscribe = session.subscribe(self._session_changed)
        self._warm = threading.Thread(target=self._decode_quietly, name="allocconf-whatif-decode",
                                      daemon=True)
        self._warm.start()

    # -- the trace, decoded ahead of the first click --------------------------------
    def _decode_quietly(self) -> None:
        with self._cache_lock, contextlib.suppress(Exception):  # run() reports any error
            _trace_cache(self.session).get(self.session)

    def _trace(self) -> tuple[Any, Any]:
        with self._cache_lock:
            return _trace_cache(self.session).get(self.session)

    # -- header lines -------------------------------------------------------------
    def _describe_source(self) -> None:
        from allocconf_widget.app.simulate import RECORDING_KEY

        rec = self.session.extras.get(RECORDING_KEY)
        self.source.value = ("<i>trace: the last %%allocconf record</i>" if rec is not None
                             else "<i>trace: the bundled H200 recording (no %%allocconf record "
                                  "in this session yet)</i>")

    def _effective(self) -> str:
        return str(self.session.view().effective.to_string())

    def _show_current(self) -> None:
        now = self._effective()
        line = f"This kernel runs <code>{html.escape(now or '(torch defaults)')}</code>"
        if self.compared_with is not None and self.compared_with != now:
            line += (f"; the rows below were compared with <code>"
                     f"{html.escape(self.compared_with or '(torch defaults)')}</code>: "
                     "Compare again to re-rank them")
        self.current.value = line + "."

    # -- Compare ---------------------------------------------------------------------
    def run(self) -> Any:
        """Replay the candidates and render the comparison."""
        from allocconf_widget.app.simulate import what_if
        from allocconf_widget.core.versions import installed_torch_version

        with self._lock:
            self.run_button.disabled = True
            self.summary.value = "<i>Replaying the trace under each candidate…</i>"
            self.progress.value, self.progress.layout.display = 0, ""
            self.progress.description = "reading"
            try:
                source, trace = self._trace()
                current = self._effective()
                report = what_if(source, trace=trace, current_conf=current, progress=self._progress,
                                 offer_release=installed_torch_version())
                self.recommendation = report.recommendation
                self.compared_with = current
                self.session.extras["whatif"] = report.recommendation
                self._render(report.headline(), report.notes)
            except Exception as exc:  # shown in the tab; never breaks the panel
                self.summary.value = _ERROR.format(html.escape(str(exc)))
            finally:
                self.run_button.disabled = False
                self.progress.layout.display = "none"
                self._describe_source()
                self._show_current()
        return self.recommendation

    def _progress(self, done: int, total: int) -> None:
        self.progress.max = total
        self.progress.value = done
        self.progress.description = f"{done}/{total}"

    def _render(self, header: list[str], source_notes: tuple[str, ...] = ()) -> None:
        rec = self.recommendation
        notes = [html.escape(n) for n in (*source_notes, *rec.notes)]
        self.summary.value = "<br>".join([html.escape(h) for h in header] + notes)
        runs = _runs(rec)
        self.charts.children = self._charts(runs)
        self._rows = [self._row(cand) for cand in rec.candidates]
        self._mark_rows()  # before they are shown: no row ever appears with the wrong Apply state
        self.rows.children = [row.box for row in self._rows]

    def _row(self, cand: Any) -> _Row:
        import ipywidgets as W

        apply = W.Button(description="Apply", layout=W.Layout(width="80px"))
        apply.add_class("allocconf-whatif-apply")
        tag = " <b>(this kernel)</b>" if cand.is_current else ""
        label = W.HTML(f"<code>{html.escape(cand.conf or '(torch defaults)')}</code>{tag} — "
                       f"{html.escape(cand.reason)}", layout=W.Layout(width="85%"))
        box = W.VBox([W.HBox([apply, label])])
        box.add_class("allocconf-whatif-row")
        row = _Row(cand.conf, cand.is_current, apply, box)
        apply.on_click(lambda _b: self.ask(row))
        return row

    def _confirm_widgets(self, row: _Row) -> None:
        import ipywidgets as W

        if row.confirm is not None:
            return
        row.question = W.HTML()
        row.question.add_class("allocconf-whatif-question")
        row.yes = W.Button(description="Apply these settings", button_style="warning",
                           layout=W.Layout(width="auto"))
        row.yes.add_class("allocconf-whatif-confirm")
        no = W.Button(description="Cancel", layout=W.Layout(width="auto"))
        no.add_class("allocconf-whatif-cancel")
        row.yes.on_click(lambda _b: self.apply(row.conf))
        no.on_click(lambda _b: self._hide_confirm(row))
        # the question on its own line, the buttons below it at their natural width: in one
        # row the question took the room and ipywidgets 7 cut the buttons ("Apply these setti…")
        for button in (row.yes, no):
            button.layout.flex, button.layout.min_width = "0 0 auto", "max-content"
        row.confirm = W.VBox([row.question, W.HBox([row.yes, no])],
                             layout=W.Layout(margin="0 0 0 84px"))
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
        parts = [row.box.children[0], row.confirm, row.result]
        row.box.children = [part for part in parts if part is not None]

    def _mark_rows(self) -> None:
        """Apply is enabled on every row that would change what this kernel runs."""
        from allocconf_widget.app.simulate import row_apply_from

        applied = self.session.view().applied
        for row in self._rows:
            try:
                row.apply.disabled = not row_apply_from(applied, row.conf).changes
            except Exception:  # not valid for the installed torch: Apply explains why
                row.apply.disabled = False
            row.apply.tooltip = "this kernel runs these settings" if row.apply.disabled else (
                "see what changes, then confirm")

    def _charts(self, runs: list[tuple[str, list[float], list[float], float, bool]]) -> list[Any]:
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

    def ask(self, row: _Row) -> Any:
        """The confirm step: what Apply would set and unset, with Apply / Cancel under the row."""
        from allocconf_widget.app.simulate import plan_row_apply

        self._say(row, "")
        try:
            plan = plan_row_apply(self.session, row.conf)
        except Exception as exc:  # the row's string is not valid for the installed torch
            self._say(row, _ERROR.format(html.escape(str(exc))))
            return None
        self._confirm_widgets(row)
        row.question.value = f"{html.escape(plan.describe())}."
        row.yes.layout.display = "" if plan.changes else "none"
        row.confirm.layout.display = ""
        return plan

    def _hide_confirm(self, row: _Row) -> None:
        if row.confirm is not None:
            row.confirm.layout.display = "none"

    def apply(self, conf: str) -> Any:
        """Apply the row ``conf`` through the lifecycle logic; show what happened under that row."""
        from allocconf_widget.app.simulate import plan_row_apply

        row = self._find(conf)
        if row is not None:
            self._hide_confirm(row)
        shown = html.escape(conf or "(torch defaults)")
        try:
            plan = plan_row_apply(self.session, conf)
            self.session.stage(plan.target, eager=False)
            result = self.session.apply()
        except Exception as exc:  # an invalid candidate for this torch, or torch refusing it
            if row is not None:
                self._say(row, _ERROR.format(html.escape(str(exc))))
            return None
        lines = "<br>".join(html.escape(line) for line in result.summary().splitlines())
        if row is not None:
            self._say(row, f"<b>Applied {shown}.</b> {html.escape(plan.done())}.<br>{lines}")
        return result

    # -- the Session changed (an Apply here, in the Settings tab or by the magic) ----------
    def _session_changed(self) -> None:
        self._show_current()
        self._mark_rows()

    def close(self) -> None:
        """Stop following the Session (and let the trace decoding started by the tab end)."""
        self._unsubscribe()
        self._warm.join(timeout=10)

