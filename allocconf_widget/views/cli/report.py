"""``allocconf report SNAPSHOT``: memory and fragmentation figures of a snapshot, no GPU needed.

Prints a table per device (one column per pool plus the total) or, with
``--json``, the document described in docs/metrics.md::

    {"devices": {"0": {"total": {...}, "pools": {"default/large": {...}, ...}}}}

Exit codes: 0 ok, 2 unreadable snapshot or unknown device.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from allocconf_widget._errors import SnapshotError
from allocconf_widget.app.report import report_file
from allocconf_widget.views.text.report import render_report

_PROG = "allocconf report"


def register(subparsers: Any) -> None:
    """Add the ``report`` subcommand to the top-level parser."""
    parser = subparsers.add_parser(
        "report",
        help="memory and fragmentation figures from a saved memory snapshot",
        description=(
            "Read a snapshot written by torch.cuda.memory._dump_snapshot() (plain or .gz) "
            "without running anything in it, and report reserved/allocated memory and "
            "fragmentation per device and per pool. Figures are defined in docs/metrics.md."
        ),
    )
    parser.add_argument("snapshot", metavar="SNAPSHOT", help="snapshot .pickle (or .pickle.gz)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--device", type=int, metavar="N", help="only this CUDA device")
    parser.add_argument(
        "--segments", action="store_true", help="also list every segment and how full it is"
    )
    parser.set_defaults(handler=run)


def _fail(message: str) -> int:
    print(f"{_PROG}: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Build the report (the use case), render it; returns the exit code."""
    try:
        report = report_file(Path(args.snapshot), device=args.device, include_segments=args.segments)
    except SnapshotError as exc:
        return _fail(str(exc))
    for note in report.notes:
        print(f"{_PROG}: note: {note}", file=sys.stderr)
    if args.json:
        document = report.to_json(include_segments=args.segments)
        document.pop("source")
        document.pop("label")
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_report(report, show_segments=args.segments))
    return 0
