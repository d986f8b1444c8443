"""The panel's "What if?" tab: compare candidate settings on a recorded trace, apply one.

Source: the last ``%%allocconf record`` of this session, or the bundled H200
recording when there is none (labelled as such). The recommender replays the
trace under a candidate grid (both cores), then the tab shows the model check
(the recorded settings must reproduce the recorded segment events), a bar
chart of predicted peak reserved memory, the reserved-over-time curves, and
one row per candidate with its reason and an *Apply* button that goes through
the lifecycle logic (applied now / at first CUDA use / needs restart).

Charts: a plotly ``FigureWidget`` where it works (JupyterLab, Notebook 7),
inline SVG elsewhere (Colab, VS Code), as for the monitor.
"""

from __future__ import annotations

import html
import threading
from typing import Any

from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.charts.style import COLORS


def _runs(recommendation: Any, limit: int = 6) -> list[tuple[str, list[float], list[float], float, bool]]:
    runs = []
    for cand in recommendation.candidates[:limit]:
        series = cand.result.series
        runs.append((cand.conf or "(defaults)", [float(i) for i in series.event_index],
                     [float(v) for v in series.reserved_bytes], float(cand.result.peak_reserved_bytes),
                     cand.result.oom is not None))
    return runs


def bars_svg(runs: list[tuple[str, list[float], list[float], float, bool]], width: int = 640) -> str:
    """Horizontal bars of peak reserved memory per configuration, as inline SVG."""
    top = max([r[3] for r in runs] + [1.0])
    row, label_w = 22, 250
    height = row * len(runs) + 10
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
             "style='font:11px sans-serif'>"]
    for i, (label, _xs, _ys, peak, oom) in enumerate(runs):
        y = 5 + i * row
        bar = max(1.0, (width - label_w - 90) * peak / top)
        color = COLORS["oom"] if oom else COLORS["reserved"]
        parts.append(f"<text x='{label_w - 6}' y='{y + 14}' text-anchor='end'>"
                     f"{html.escape(label[:40])}</text>")
        parts.append(f"<rect x='{label_w}' y='{y + 3}' width='{bar:.1f}' height='{row - 6}' "
                     f"fill='{color}'/>")
        parts.append(f"<text x='{label_w + bar + 4:.1f}' y='{y + 14}'>"
                     f"{'OOM ' if oom else ''}{format_bytes(int(peak))}</text>")
    parts.append("</svg>")
    return "".join(parts)


_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def overlay_svg(runs: list[tuple[str, list[float], list[float], float, bool]],
                width: int = 640, height: int = 220) -> str:
    """Reserved memory over the replay, one polyline per configuration, as inline SVG."""
    x_max = max([max(r[1], default=0.0) for r in runs] + [1.0])
    y_max = max([r[3] for r in runs] + [1.0])
    left, bottom, legend_h = 60, 20, 16 * len(runs)
    plot_h = height - bottom - 10
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height + legend_h}' "
             "style='font:11px sans-serif'>",
             f"<text x='4' y='14'>{format_bytes(int(y_max))}</text>",
             f"<text x='4' y='{plot_h + 10}'>0</text>",
             f"<line x1='{left}' y1='{plot_h + 10}' x2='{width - 10}' y2='{plot_h + 10}' stroke='#999'/>"]
    for i, (label, xs, ys, _peak, oom) in enumerate(runs):
        color = _PALETTE[i % len(_PALETTE)]
        points = " ".join(f"{left + (width - left - 10) * x / x_max:.1f},"
                          f"{10 + plot_h * (1 - y / y_max):.1f}" for x, y in zip(xs, ys, strict=False))
        parts.append(f"<polyline fill='none' stroke='{color}' stroke-width='1.5' points='{points}'/>")
        parts.append(f"<text x='{left}' y='{height + 12 + 16 * i}' fill='{color}'>"
                     f"— {html.escape(label[:60])}{' (out of memory)' if oom else ''}</text>")
    parts.append(f"<text x='{width - 10}' y='{height - 2}' text-anchor='end'>allocator event</text>")
    parts.append("</svg>")
    return "".join(parts)


class WhatIfView:
    """The tab's widgets. ``view.widget`` is displayed; ``view.run()`` computes (any thread)."""

    def __init__(self, session: Any, renderer: str = "auto") -> None:
        import ipywidgets as W

        self.session = session
        self.renderer = renderer
        self._lock = threading.Lock()
        self.source = W.HTML()
        self.run_button = W.Button(description="Compare settings", icon="play",
                                   button_style="primary")
        self.run_button.add_class("allocconf-whatif-run")
        self.run_button.on_click(lambda _b: self.run())
        self.summary = W.HTML()
        self.summary.add_class("allocconf-whatif-summary")
        self.charts = W.VBox()
        self.rows = W.VBox()
        self.result = W.HTML()
        self.result.add_class("allocconf-whatif-result")
        self.widget = W.VBox([W.HBox([self.run_button, self.source]), self.summary, self.charts,
                              self.rows, self.result])
        self.widget.add_class("allocconf-whatif")
        self.recommendation: Any = None
        self._describe_source()

    def _describe_source(self) -> None:
        from allocconf_widget.app.simulate import RECORDING_KEY

        rec = self.session.extras.get(RECORDING_KEY)
        self.source.value = ("<i>trace: the last %%allocconf record</i>" if rec is not None
                             else "<i>trace: the bundled H200 recording (no %%allocconf record "
                                  "in this session yet)</i>")

    def run(self) -> Any:
        """Replay the candidates and render the comparison."""
        from allocconf_widget.app.simulate import trace_source, what_if

        with self._lock:
            self.run_button.disabled = True
            self.summary.value = "<i>Replaying the trace under each candidate…</i>"
            try:
                report = what_if(trace_source(self.session))
                self.recommendation = report.recommendation
                self.session.extras["whatif"] = report.recommendation
                self._render(report.headline(), report.notes)
            except Exception as exc:  # shown in the tab; never breaks the panel
                self.summary.value = f"<span style='color:#b00020'>✖ {html.escape(str(exc))}</span>"
            finally:
                self.run_button.disabled = False
                self._describe_source()
        return self.recommendation

    def _render(self, header: list[str], source_notes: tuple[str, ...] = ()) -> None:
        import ipywidgets as W

        rec = self.recommendation
        notes = [html.escape(n) for n in (*source_notes, *rec.notes)]
        self.summary.value = "<br>".join([html.escape(h) for h in header] + notes)
        runs = _runs(rec)
        self.charts.children = self._charts(runs)
        rows = []
        for cand in rec.candidates:
            button = W.Button(description="Apply", layout=W.Layout(width="80px"),
                              disabled=cand.is_current)
            button.add_class("allocconf-whatif-apply")
            button.on_click(lambda _b, conf=cand.conf: self.apply(conf))
            label = W.HTML(f"<code>{html.escape(cand.conf or '(torch defaults)')}</code> — "
                           f"{html.escape(cand.reason)}", layout=W.Layout(width="85%"))
            rows.append(W.HBox([button, label]))
        self.rows.children = rows

    def _charts(self, runs: list[tuple[str, list[float], list[float], float, bool]]) -> list[Any]:
        import ipywidgets as W

        from allocconf_widget.adapters.frontend import detect_frontend
        from allocconf_widget.views.charts.monitor_render import choose_renderer

        if choose_renderer(self.renderer, detect_frontend()) == "figurewidget":
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

    def apply(self, conf: str) -> Any:
        """Stage ``conf`` and apply it through the lifecycle logic; show what happened."""
        try:
            self.session.stage_text(conf, eager=False)
            result = self.session.apply()
        except Exception as exc:  # an invalid candidate for this torch, or torch refusing it
            self.result.value = f"<span style='color:#b00020'>✖ {html.escape(str(exc))}</span>"
            return None
        lines = "<br>".join(html.escape(line) for line in result.summary().splitlines())
        self.result.value = f"<b>Applied {html.escape(conf or '(torch defaults)')}.</b><br>{lines}"
        return result
