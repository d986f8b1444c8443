"""The ranks widget: one chart per rank and GPU, the rank table, and OOMs, refreshed live.

It renders :class:`~allocconf_widget.app.ranks.RanksReport` and the board's timelines, nothing
else. A daemon thread polls the channel every ``interval`` seconds (bounded reads, see
``adapters/rank_channel.py``); front ends that do not draw updates sent from a thread (Colab)
still get the Refresh button.
"""

from __future__ import annotations

import threading
from html import escape

from allocconf_widget.app.ranks import RankBoard, RanksReport, RankView
from allocconf_widget.core.memory.timeline import Timeline
from allocconf_widget.views.charts.svg import timeline_svg
from allocconf_widget.views.text.ranks import render_ranks

_STATE_COLORS = {"reporting": "#2a7", "waiting": "#888", "silent": "#c80", "died": "#c33",
                 "finished": "#555", "failed": "#c33", "oom": "#c33"}
#: charts drawn per refresh (each is an SVG of a few KiB); the rest are summarised in one line
MAX_CHARTS = 32
#: rows of the table the widget shows (the text of ``ranks status`` lists all)
MAX_TABLE_ROWS = 256
_CHART_ORDER = {"oom": 0, "failed": 1, "died": 2, "silent": 3, "reporting": 4, "waiting": 5,
                "finished": 6}


class RanksView:
    """Rank table + small multiples (one SVG timeline per rank and GPU) + Refresh/Stop."""

    def __init__(self, board: RankBoard, *, interval: float = 1.0) -> None:
        import ipywidgets as widgets

        self.board = board
        self.interval = interval
        self.updates = 0
        self.report: RanksReport | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.table = widgets.HTML()
        self.table.add_class("allocconf-ranks-table")
        self.charts = widgets.HTML()
        self.charts.add_class("allocconf-ranks-charts")
        refresh = widgets.Button(description="Refresh", tooltip="read the rank channel now")
        refresh.on_click(lambda _b: self.refresh())
        stop = widgets.Button(description="Stop", tooltip="stop refreshing (the ranks keep reporting)")
        stop.on_click(lambda _b: self.stop())
        self.widget = widgets.VBox([self.table, self.charts, widgets.HBox([refresh, stop])])
        self.widget.add_class("allocconf-ranks")
        self.refresh()

    def refresh(self) -> RanksReport:
        report = self.board.poll()
        self.report = report
        self.table.value = _table_html(report)
        self.charts.value = self._charts_html(report)
        self.updates += 1
        return report

    def _charts_html(self, report: RanksReport) -> str:
        """At most :data:`MAX_CHARTS` charts, ranks in trouble first, and a line for the rest.

        256 ranks × 64 GPUs would be 16,384 charts (tens of MB of HTML per refresh); the
        table still lists every rank, and the summary says what was left out.
        """
        wanted: list[tuple[RankView, Timeline, int | None]] = []
        for view in sorted(report.ranks, key=lambda v: (_CHART_ORDER.get(v.state, 9), v.key)):
            timeline = self.board.timelines.get(view.key)
            if timeline is None:
                continue
            wanted.extend((view, timeline, device) for device in timeline.devices)
        parts = []
        for view, timeline, device in wanted[:MAX_CHARTS]:
            payload = timeline.render(device, max_points=300)
            title = f"rank {view.rank} · GPU {device} · {view.state}"
            parts.append(f'<div style="display:inline-block;vertical-align:top;width:49%">'
                         f"{timeline_svg(payload, width=480, height=200, title=title)}</div>")
        if len(wanted) > MAX_CHARTS:
            left = wanted[MAX_CHARTS:]
            ranks = sorted({v.rank for v, _t, _d in left})
            shown = ", ".join(str(r) for r in ranks[:20]) + (" …" if len(ranks) > 20 else "")
            parts.append(f'<div class="allocconf-ranks-more">{len(wanted):,} charts (rank, GPU); '
                         f"showing {MAX_CHARTS} (ranks in trouble first). Not drawn: "
                         f"{len(left):,} charts of ranks {escape(shown)}; the table above lists "
                         "every rank.</div>")
        return "".join(parts)

    def start(self) -> RanksView:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="allocconf-ranks-view", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.board.channel is None:
                break
            try:
                self.refresh()
            except Exception as exc:  # a display problem must never reach the user's cell
                self.table.value = f"<pre>ranks view stopped: {escape(str(exc))[:500]}</pre>"
                break

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def _table_html(report: RanksReport) -> str:
    text = escape(render_ranks(report, max_rows=MAX_TABLE_ROWS))
    badges = "".join(
        f'<span style="margin-right:10px;color:{_STATE_COLORS.get(v.state, "#333")}">'
        f"● rank {v.rank}: {escape(v.state_text)}</span>" for v in report.ranks[:MAX_CHARTS])
    if len(report.ranks) > MAX_CHARTS:
        badges += f"<span>… and {len(report.ranks) - MAX_CHARTS:,} more ranks</span>"
    return f'<div>{badges}</div><pre style="margin:4px 0">{text}</pre>'


def show_ranks(board: RankBoard, *, interval: float = 1.0) -> RanksView:
    """Build, display and start the live ranks view."""
    from IPython.display import display

    view = RanksView(board, interval=interval).start()
    display(view)
    return view
