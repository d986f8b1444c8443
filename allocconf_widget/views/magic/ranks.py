"""``%allocconf ranks [open|status|watch|close]``: follow the ranks this notebook launches.

``open`` exports the rank channel to processes launched afterwards; each rank calls
``allocconf_widget.rank_reporter()``; ``status`` prints one row per rank and device
(the same table in a terminal and a notebook), ``watch`` shows the live widget.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from allocconf_widget.views.magic.context import MagicContext, SubParsers


def register(subparsers: SubParsers) -> None:
    """Add ``ranks`` to the magic's parser."""
    p = subparsers.add_parser(
        "ranks", help="follow processes launched from this notebook (spawn, notebook_launcher, torchrun)",
        description="open: let ranks launched from now on report their allocator here (each rank calls "
        "allocconf_widget.rank_reporter()); status: one row per rank and GPU; watch: a live chart per "
        "rank; close: stop and remove the channel.")
    p.add_argument("action", nargs="?", choices=("open", "status", "watch", "close"), default="status")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between refreshes of the watch view (default 1)")
    p.set_defaults(handler=run_ranks)


def run_ranks(args: argparse.Namespace, _ctx: MagicContext) -> Any:
    from allocconf_widget.app.ranks import rank_board
    from allocconf_widget.views.text.ranks import render_ranks

    board = rank_board()
    if args.action == "open":
        folder = board.open()
        print(f"Rank channel open: {folder}\nLaunch your ranks now; in each, call "
              "allocconf_widget.rank_reporter() (it picks the rank from RANK/LOCAL_RANK, or pass "
              "rank=...). Then: %allocconf ranks watch")
        return folder
    if args.action == "close":
        board.close()
        print("Rank channel closed; ranks launched from now on do not report.")
        return None
    if args.action == "watch":
        if not 0.2 <= args.interval <= 60:
            from IPython.core.error import UsageError

            raise UsageError(f"--interval {args.interval} is outside 0.2–60 s")
        from allocconf_widget.adapters.frontend import detect_frontend

        if board.channel is None:
            board.open()
        why = detect_frontend().why_no_widgets
        if why is None:
            from allocconf_widget.views.widgets.ranks import show_ranks

            return show_ranks(board, interval=args.interval)
        print(f"{why}: the ranks now, as %allocconf ranks status says them (run it again to "
              "refresh)")
    report = board.poll()
    print(render_ranks(report), end="")
    return report
