"""Bytes per live chart update, per renderer, as a run grows to hours at 10 Hz.

Fills the monitor's bounded timeline with synthetic samples (a training-like
pattern: slow reserved growth, fast allocated oscillation, sparse snapshots,
cell runs, optimizer steps) and, at several run lengths, measures what one
redraw would send to the browser:

* ``svg``: the ``ipywidgets.HTML`` update message carrying the inline SVG;
* ``figurewidget``: the comm messages plotly's ``FigureWidget`` sends for one
  ``batch_update`` (captured from a real widget through a recording comm);
* ``plotly json (full)``: a whole ``fig.to_json()``, i.e. what re-rendering
  the figure in an ``Output`` each time would ship (for comparison; the 4.9 MB
  plotly.js bundle not counted);

plus the kernel-side time to build each update. The target is ≤ 64 KB per
update after one hour at 10 Hz, and no growth beyond that.

    python benchmarks/bench_chart_payload.py
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from allocconf_widget.core.memory.timeline import Timeline
from allocconf_widget.views.charts.monitor_render import FIGURE_POINTS, SVG_POINTS
from allocconf_widget.views.charts.svg import timeline_svg

GIB = 1 << 30
RATE_HZ = 10
CHECKPOINTS_S = (60, 600, 3600, 4 * 3600)


class RecordingComm:
    """Captures what a widget would send over its comm."""

    kernel = "recording"

    def __init__(self, **_kwargs: object) -> None:
        self.comm_id = f"bench-{id(self)}"
        self.sent: list[tuple[dict, list]] = []

    def send(self, data: dict | None = None, buffers: list | None = None, **_kw: object) -> None:
        self.sent.append((data or {}, list(buffers or [])))

    def on_msg(self, *_a: object, **_k: object) -> None:
        pass

    def on_close(self, *_a: object, **_k: object) -> None:
        pass

    def close(self, *_a: object, **_k: object) -> None:
        pass


def message_bytes(messages: list[tuple[dict, list]]) -> int:
    return sum(len(json.dumps(d, default=str).encode()) + sum(len(bytes(b)) for b in bufs)
               for d, bufs in messages)


def feed(tl: Timeline, start: int, stop: int) -> None:
    for i in range(start, stop):
        t = i / RATE_HZ
        tl.add(t, {
            "reserved": 12 * GIB + 6 * GIB * (1 - math.exp(-t / 900)) + 0.5 * GIB * math.sin(t / 40),
            "allocated": 6 * GIB + 4 * GIB * abs(math.sin(t * 3.1)),
            "active": 6.2 * GIB + 4 * GIB * abs(math.sin(t * 3.1)),
            "requested": 6 * GIB,
            "non_pytorch": 0.55 * GIB,
            "cached_share": 0.3 + 0.2 * abs(math.sin(t / 7)),
            "fragmentation": 0.1 + 0.3 * abs(math.sin(t / 90)) if i % RATE_HZ == 0 else None,
        })
        tl.step(t, i // 3)
        if i % 6000 == 0:
            tl.cell_started(f"cell [{i // 6000}]", x=t)
        elif i % 6000 == 5000:
            tl.cell_finished(x=t)
        if i == 3000 * RATE_HZ:
            tl.mark("oom", "CUDA out of memory. Tried to allocate 2.00 GiB", x=t)


def svg_update(tl: Timeline) -> tuple[int, float]:
    t0 = time.perf_counter()
    html = timeline_svg(tl.render(0, max_points=SVG_POINTS), title="GPU 0")
    took = time.perf_counter() - t0
    message = {"method": "update", "state": {"value": html}, "buffer_paths": []}
    return len(json.dumps(message).encode()), took


def figure_updates(tl: Timeline, widget: object, comm: RecordingComm) -> tuple[int, float, int]:
    import plotly.graph_objects as go  # noqa: F401

    from allocconf_widget.views.charts.figures import timeline_figure, update_timeline_figure

    payload = tl.render(0, max_points=FIGURE_POINTS)
    before = len(comm.sent)
    t0 = time.perf_counter()
    update_timeline_figure(widget, payload)
    took = time.perf_counter() - t0
    full = len(timeline_figure(payload).to_json().encode())
    return message_bytes(comm.sent[before:]), took, full


def make_figure_widget(tl: Timeline) -> tuple[object, RecordingComm] | None:
    try:
        import comm as comm_pkg
        import plotly.graph_objects as go

        from allocconf_widget.views.charts.figures import timeline_figure
    except ImportError:
        return None
    holder: list[RecordingComm] = []
    original = comm_pkg.create_comm

    def create(**kwargs: object) -> RecordingComm:
        holder.append(RecordingComm(**kwargs))
        return holder[-1]

    comm_pkg.create_comm = create
    try:
        widget = go.FigureWidget(timeline_figure(tl.render(0, max_points=FIGURE_POINTS)))
    except Exception as exc:  # no anywidget, etc.
        print(f"(FigureWidget unavailable: {exc})")
        return None
    finally:
        comm_pkg.create_comm = original
    return widget, holder[0]


def main() -> None:
    tl = Timeline()
    feed(tl, 0, 10)
    fw = make_figure_widget(tl)
    rows = []
    done = 10
    for seconds in CHECKPOINTS_S:
        feed(tl, done, seconds * RATE_HZ)
        done = seconds * RATE_HZ
        sizes, times = [], []
        for k in range(3):  # a few consecutive updates, new samples between them
            feed(tl, done, done + 5)
            done += 5
            sizes.append(svg_update(tl))
            if fw is not None:
                times.append(figure_updates(tl, *fw))
            _ = k
        row = {
            "run": f"{seconds // 3600} h" if seconds >= 3600 else f"{seconds // 60} min",
            "samples": tl.samples(0), "stored_points": tl.stored_points(0),
            "svg_bytes": max(s for s, _t in sizes), "svg_ms": statistics.fmean(t for _s, t in sizes) * 1e3,
        }
        if times:
            row.update(fw_bytes=max(b for b, _t, _f in times),
                       fw_ms=statistics.fmean(t for _b, t, _f in times) * 1e3,
                       full_json_bytes=max(f for _b, _t, f in times))
        rows.append(row)
    print(f"one update of the monitor chart (≤ {SVG_POINTS} points per series), {RATE_HZ} Hz sampling")
    header = f"{'run':>7}{'samples':>9}{'stored':>8}{'svg bytes':>11}{'svg ms':>8}"
    if fw is not None:
        header += f"{'FigureWidget bytes':>20}{'FW ms':>8}{'full plotly JSON':>18}"
    print(header)
    for r in rows:
        line = (f"{r['run']:>7}{r['samples']:>9,}{r['stored_points']:>8,}{r['svg_bytes']:>11,}"
                f"{r['svg_ms']:>8.1f}")
        if "fw_bytes" in r:
            line += f"{r['fw_bytes']:>20,}{r['fw_ms']:>8.1f}{r['full_json_bytes']:>18,}"
        print(line)
    print("target: <= 65,536 bytes per update after 1 h at 10 Hz; FigureWidget's one-time bundle "
          "(~5 MB per instance) and plotly.js for full re-renders are not included")


if __name__ == "__main__":
    main()
