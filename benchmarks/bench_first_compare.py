"""First "Compare settings" in a new panel, in a fresh kernel, side by side with the CLI.

Each round starts a fresh ``ipykernel`` (jupyter_client), loads the extension, imports
torch, shows the panel, opens its What if? tab and, after ``--think`` seconds (a person
reading the tab before clicking; 0 = clicked at once), times one click on Compare on
the bundled recording. The same ranking through ``allocconf simulate`` (a new process,
interpreter start included) is timed beside it. Rows:

* ``tab``: the tab as shipped (SVG charts, trace decoded while the tab opens);
* ``tab, clicked at once``: the same with ``--think 0`` built in;
* ``tab + plotly FigureWidget``: the charts the tab drew before (``renderer="figurewidget"``),
  clicked at once: the first-Compare path of the old tab. Without a browser attached
  this leaves out the browser's share (each figure ships plotly's JavaScript bundle),
  so it is a lower bound of what a user waited;
* ``CLI``: ``python -m allocconf_widget simulate <bundled> --torch-version 2.11``.

    python benchmarks/bench_first_compare.py [--rounds 3] [--think 1.0] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _table import print_table

_KERNEL_CODE = """
import time
%load_ext allocconf_widget
import torch
from allocconf_widget.app.session import get_session
from allocconf_widget.views.widgets.panel import Panel
from allocconf_widget.views.widgets.whatif import WhatIfView
panel = Panel(get_session(get_ipython()))
{open_tab}
time.sleep({think})
t0 = time.perf_counter()
rec = view.run()
elapsed = time.perf_counter() - t0
assert rec is not None and len(view.rows.children) == len(rec.rows), view.summary.value
print("FIRST_COMPARE", elapsed)
"""
_OPEN_TAB = "panel.tabs.selected_index = 2\nview = panel.whatif"
_OPEN_PLOTLY = "view = WhatIfView(get_session(get_ipython()), renderer='figurewidget')"


def _kernel_round(code: str) -> float:
    from jupyter_client.manager import start_new_kernel

    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") and not k.startswith("JPY_")}
        env["XDG_CONFIG_HOME"] = tmp  # no saved settings from the developer's own kernels
        km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=tmp)
        try:
            reply_out: list[str] = []
            kc.execute_interactive(code, timeout=300, output_hook=lambda msg: reply_out.append(
                msg["content"].get("text", "") if msg["msg_type"] == "stream" else
                (msg["content"].get("evalue", "") if msg["msg_type"] == "error" else "")))
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    text = "".join(reply_out)
    for line in text.splitlines():
        if line.startswith("FIRST_COMPARE"):
            return float(line.split()[1])
    raise RuntimeError(f"the kernel did not report a time:\n{text[-2000:]}")


def _cli_round() -> float:
    import allocconf_widget

    demo = Path(allocconf_widget.__file__).parent / "data" / "demo_cnn_h200.pickle.gz"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "allocconf_widget", "simulate", str(demo),
                    "--torch-version", "2.11"], check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--think", type=float, default=1.0,
                        help="seconds between opening the tab and clicking Compare (default 1)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    cases = [
        (f"tab (clicked {args.think:g} s after opening it)",
         lambda: _kernel_round(_KERNEL_CODE.format(open_tab=_OPEN_TAB, think=args.think))),
        ("tab, clicked at once", lambda: _kernel_round(_KERNEL_CODE.format(open_tab=_OPEN_TAB, think=0))),
        ("tab + plotly FigureWidget, clicked at once (the old tab)",
         lambda: _kernel_round(_KERNEL_CODE.format(open_tab=_OPEN_PLOTLY, think=0))),
        ("CLI: allocconf simulate (new process)", _cli_round),
    ]
    results = []
    for name, measure in cases:
        times = [measure() for _ in range(args.rounds)]
        results.append((name, times))
    cli = statistics.median(results[-1][1])
    lines = [[name, f"{statistics.median(t):.2f}", f"{min(t):.2f}–{max(t):.2f}",
              f"{statistics.median(t) / cli:.1f}×"] for name, t in results]
    print_table(["first Compare", "median s", "range s", "vs CLI"], lines, args.markdown)


if __name__ == "__main__":
    main()
