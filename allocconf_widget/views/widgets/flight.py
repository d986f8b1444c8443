"""The OOM view with the flight recorder's history: who held the memory, and what would have helped.

Shown under a cell that died of a CUDA OOM while the flight recorder was on
(:mod:`allocconf_widget.views.widgets.oom` hands over), or by
``%allocconf flight show`` / ``demo``. From top to bottom:

* the breakdown the OOM assistant already shows (its HTML is passed in);
* the verdict: settings that would have avoided the OOM, ranked, with how sure
  the replay is, and one **Apply** button for the winner. The card states one
  recommendation: once the verdict is in, the rules of thumb above it say that the
  replay decides. Apply first says what it will set, unset and keep (and, for a recording
  of another run, that it is not this kernel's) and waits for a yes; then it goes through
  the one candidate use case (:mod:`allocconf_widget.app.candidates`);
* the top allocation sites by live bytes at the OOM;
* the segment map at the OOM (inline SVG: it works in every front end);
* "Open in PyTorch's viewer" and "Download snapshot" buttons.

The verdict replays the window, which can take seconds: in a notebook it is
computed on a thread and fills in when ready; :meth:`FlightOomView.compute_verdict`
does it synchronously (the terminal and the tests).
"""

from __future__ import annotations

import threading
from html import escape

from allocconf_widget.app.candidates import CandidatePlan, apply_candidate
from allocconf_widget.app.flight import (
    CDN_NOTE,
    FlightAnalysis,
    OomCapture,
    ViewerFiles,
    analyse,
    export_for_viewer,
    next_step,
    plan_winner,
    recommendation_of,
    with_verdict_of,
)
from allocconf_widget.app.oom import OomReport
from allocconf_widget.app.session import ApplyOutcome, Session
from allocconf_widget.core.units import format_bytes
from allocconf_widget.views.charts.segment_map import build_segment_map
from allocconf_widget.views.charts.segment_map_svg import segment_map_svg
from allocconf_widget.views.text.flight import analysis_lines, headline, option_line, sureness_text
from allocconf_widget.views.text.oom import report_text
from allocconf_widget.views.widgets.confirm import Confirmation, natural_width
from allocconf_widget.views.widgets.oom_card import report_html

_GOOD, _BAD, _MUTED = "#2ca02c", "#d62728", "#666"
_NUM = "style='text-align:right;padding:1px 8px'"
_CELL = "style='text-align:left;padding:1px 8px'"
#: Segments drawn one per row; smaller ones are summed into one row (totals stay exact).
MAP_ROWS = 24
#: A link that looks like one: JupyterLab and Notebook 7 style an ``<a>`` in a widget's HTML as
#: plain text (no colour, no underline); the colour is the front end's own link colour.
LINK_STYLE = ("color:var(--jp-content-link-color, #1976d2);text-decoration:underline;"
              "cursor:pointer")


def sites_html(analysis: FlightAnalysis) -> str:
    report = analysis.sites
    rows = "".join(
        f"<tr><td {_NUM}>{format_bytes(s.live_bytes)}</td>"
        f"<td {_NUM}>{s.live_bytes / report.live_bytes:.0%}</td>"
        f"<td {_NUM}>{s.blocks:,}</td><td {_CELL}><code>{escape(s.label)}</code></td></tr>"
        for s in report.sites) if report.live_bytes else ""
    if report.rest_sites:
        rows += (f"<tr><td {_NUM}>{format_bytes(report.rest_bytes)}</td><td {_NUM}></td>"
                 f"<td {_NUM}></td><td {_CELL}>{report.rest_sites} more sites</td></tr>")
    # every cell padded: classic Notebook 6 gives table cells none ("shareblockssite")
    head = "".join(f"<th {_NUM}>{h}</th>" for h in ("live", "share", "blocks")) + f"<th {_CELL}>site</th>"
    return (f"<div><b>Who held the memory</b> — live bytes at the OOM by {escape(report.by)}:</div>"
            "<table class='allocconf-flight-sites' style='font-size:12px;border-collapse:collapse'>"
            f"<tr>{head}</tr>{rows}</table>")


def verdict_html(analysis: FlightAnalysis) -> str:
    verdict = analysis.verdict
    if verdict is None:
        if analysis.verdict_error:
            return f"<div style='color:{_MUTED}'>{escape(analysis.verdict_error)}</div>"
        return ("<div style='color:#666'><i>Verdict: replaying the recorded window under the "
                "candidate settings…</i></div>")
    color = _GOOD if verdict.avoided else _BAD
    parts = [f"<div style='font-weight:600;color:{color}'>Verdict: {escape(headline(verdict))}</div>"]
    if verdict.also:
        items = "".join(f"<li>{escape(option_line(verdict, o))}</li>" for o in verdict.also[:5])
        parts.append(f"<div style='font-size:12px'>Also avoids it, by peak:</div>"
                     f"<ul style='margin:2px 0;font-size:12px'>{items}</ul>")
    parts.append(f"<div style='font-size:12px'>How sure: {escape(sureness_text(verdict))}</div>")
    notes = "".join(f"<li>{escape(n)}</li>" for n in verdict.notes)
    parts.append(f"<ul style='font-size:11px;color:{_MUTED};margin:2px 0'>{notes}</ul>")
    return f"<div class='allocconf-flight-verdict-body'>{''.join(parts)}</div>"


class FlightOomView:
    """The widgets; ``view.widget`` is what gets displayed."""

    def __init__(self, analysis: FlightAnalysis, *, session: Session, report: OomReport | None = None,
                 background: bool = False) -> None:
        import ipywidgets as W

        self.session = session
        self.analysis = analysis
        self.report = report
        self.applied: ApplyOutcome | None = None
        self.plan: CandidatePlan | None = None
        self.files: ViewerFiles | None = None
        self._lock = threading.Lock()
        smap = build_segment_map(analysis.snapshot, device=analysis.capture.device,
                                 max_rows=MAP_ROWS)
        self.caption = smap.caption
        self.header = W.HTML(f"<div style='color:{_MUTED};font-size:12px'>"
                             f"{escape(analysis.capture_line())}</div>")
        self.breakdown = W.HTML(report_html(report) if report is not None else "")
        self.sites = W.HTML(sites_html(analysis))
        self.sites.add_class("allocconf-flight-sites")
        self.segments = W.HTML(f"<div><b>Segments at the OOM</b> — {escape(smap.caption)}</div>"
                               + segment_map_svg(smap))
        self.segments.add_class("allocconf-flight-map")
        self.verdict = W.HTML(verdict_html(analysis))
        self.verdict.add_class("allocconf-flight-verdict")
        # at its text's width, never shrunk (Lab cut it to "Apply max_split_", icon above) nor
        # stretched across the card; no icon: Lab drew its glyph above the text line
        self.apply_button = W.Button(description="Apply", button_style="success",
                                     disabled=True, layout=W.Layout(display="none"))
        natural_width(self.apply_button)
        self.apply_button.add_class("allocconf-flight-apply")
        self.apply_button.on_click(lambda _b: self.ask())
        # the confirm step: what Apply will change, then a yes (the What if? tab's own)
        self.confirm = Confirmation("flight", self.apply_winner)
        self.result = W.HTML()
        self.result.add_class("allocconf-flight-result")
        self.viewer_button = W.Button(description="Open in PyTorch's viewer", icon="external-link",
                                      tooltip=CDN_NOTE, layout=W.Layout(width="auto"))
        self.viewer_button.add_class("allocconf-flight-viewer")
        self.viewer_button.on_click(lambda _b: self.open_viewer())
        self.download_button = W.Button(description="Download snapshot (.pickle)", icon="download",
                                        layout=W.Layout(width="auto"))
        self.download_button.add_class("allocconf-flight-download")
        self.download_button.on_click(lambda _b: self.open_viewer(html=False))
        self.viewer_status = W.HTML()
        self.viewer_status.add_class("allocconf-flight-viewer-status")
        # The answer first: the verdict and its Apply button sit right under the breakdown.
        self.widget = W.VBox([
            self.header, self.breakdown, self.verdict, self.apply_button, self.confirm.widget,
            self.result,
            self.sites, self.segments,
            W.HBox([self.viewer_button, self.download_button]), self.viewer_status,
        ])
        self.widget.add_class("allocconf-flight")
        if analysis.verdict is not None or analysis.verdict_error:
            self._show_verdict()
        elif background:
            threading.Thread(target=self.compute_verdict, name="allocconf-flight-verdict",
                             daemon=True).start()
        else:
            self.compute_verdict()

    # ------------------------------------------------------------- actions
    def compute_verdict(self) -> FlightAnalysis:
        """Replay the window (seconds, not minutes) and show the verdict."""
        with self._lock:
            if self.analysis.verdict is None and not self.analysis.verdict_error:
                self.analysis = with_verdict_of(self.analysis)
            self._show_verdict()
        return self.analysis

    def _show_verdict(self) -> None:
        self.verdict.value = verdict_html(self.analysis)
        if self.report is not None:  # one recommendation: the rules of thumb yield to the replay
            self.breakdown.value = report_html(self.report,
                                               recommendation_of(self.report, self.analysis.verdict))
        winner = self.analysis.verdict.winner if self.analysis.verdict is not None else None
        if winner is not None:
            self.apply_button.description = f"Apply {winner.shown_conf}"
            self.apply_button.tooltip = ("see what it changes, then confirm"
                                         + (" (a recording of another run)" if self.analysis.label
                                            else ""))
            self.apply_button.layout.display = ""
            self.apply_button.disabled = False
        else:  # none avoids it, or the kernel's own settings already do: nothing to apply
            self.apply_button.layout.display = "none"

    def ask(self) -> CandidatePlan | None:
        """The confirm step: what Apply would set, unset and keep, with Apply / Cancel."""
        try:
            plan = plan_winner(self.session, self.analysis)
        except Exception as exc:  # not valid for this kernel's torch: say why, change nothing
            self.result.value = f"<span style='color:{_BAD}'>✖ {escape(str(exc))}</span>"
            return None
        if plan is None:
            return None
        self.plan = plan
        self.result.value = ""
        self.confirm.ask(f"{escape(plan.describe())}.", can_apply=bool(plan.changes))
        return plan

    def apply_winner(self) -> ApplyOutcome | None:
        """Apply the confirmed plan the right way for this runtime; say what to re-run."""
        plan = self.plan
        if plan is None:
            return None
        self.confirm.hide()
        try:
            outcome = apply_candidate(self.session, plan)
        except Exception as exc:  # invalid for this torch, or torch refusing it: say so
            self.result.value = (f"<div style='color:{_BAD}'><b>Not applied.</b></div>"
                                 f"<div>{escape(str(exc))}</div>")
            return None
        self.applied = outcome
        body = "<br>".join(escape(line) for line in [*outcome.lines(), next_step(outcome)])
        self.result.value = (f"<div style='color:{_GOOD}'><b>{escape(outcome.headline())}</b></div>"
                             f"<div>{body}</div>")
        return outcome

    def open_viewer(self, *, html: bool = True) -> ViewerFiles | None:
        """Write the pickle (and PyTorch's page) into ./allocconf-exports/; link them below."""
        try:
            files = export_for_viewer(self.analysis.capture)
        except OSError as exc:
            self.viewer_status.value = (f"<span style='color:{_BAD}'>could not write: "
                                        f"{escape(str(exc))}</span>")
            return None
        self.files = files
        lines = [escape(line) for line in files.lines if html or "viewer" not in line]
        lines += self._links(files, html=html)
        self.viewer_status.value = "<br>".join(lines)
        return files

    @staticmethod
    def _links(files: ViewerFiles, *, html: bool) -> list[str]:
        """A line per file saying how to get it in this front end (HTML).

        Links are absolute ``<base_url>files/…`` URLs in the status widget itself: Lab,
        Notebook 7 and classic Notebook 6 serve them, and no ``Output`` widget is needed
        (classic Notebook 6's ipywidgets 7 could not create one, so it showed no link). The
        viewer page opens in a new browser tab (``target=_blank``): Lab's own HTML viewer
        showed it blank behind "Trust HTML". In Colab each file goes through
        ``google.colab.files.download`` (the click on this view's button started it).
        """
        from allocconf_widget.adapters.frontend import download_link

        targets = [files.html] if html and files.html is not None else []
        targets.append(files.pickle)
        out = []
        for path in targets:
            link = download_link(path)
            name = escape(path.name)
            if link.url is not None and path.suffix == ".html":
                out.append(f"<a class='allocconf-flight-link' style='{LINK_STYLE}' "
                           f"href='{escape(link.url, quote=True)}' target='_blank' rel='noopener'>"
                           f"open {name} in a new browser tab</a> (offline, use the segment map above)")
            elif link.url is not None:
                out.append(f"<a class='allocconf-flight-link' style='{LINK_STYLE}' "
                           f"href='{escape(link.url, quote=True)}' download='{name}'>download {name}</a>")
            elif path.suffix == ".html":
                out.append(f"open {name} in a browser tab{f' ({escape(link.note)})' if link.note else ''}; "
                           "offline, use the segment map above")
            elif link.note:
                out.append(f"{name}: {escape(link.note)}")
        return out


def show_flight_oom(capture: OomCapture, *, session: Session, report: OomReport,
                    label: str = "") -> FlightOomView | None:
    """Display the OOM view under the cell (text in terminal IPython); returns the widget view.

    ``label`` names a recording that is not this kernel's ("Recording"): its Apply says so.
    """
    from allocconf_widget.adapters.frontend import detect_frontend

    kernel = session.view().effective
    if not detect_frontend().shows_widgets:
        analysis = analyse(capture, kernel=kernel, label=label)
        smap = build_segment_map(analysis.snapshot, device=capture.device)
        recommendation = recommendation_of(report, analysis.verdict)
        print("\n".join([report_text(report, recommendation),
                         *analysis_lines(analysis, segment_caption=smap.caption)]))
        return None
    from IPython.display import display

    view = FlightOomView(analyse(capture, kernel=kernel, with_verdict=False, label=label),
                         session=session, report=report, background=True)
    display(view.widget)
    return view
