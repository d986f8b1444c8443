"""``allocconf options``: the option schema of a torch release as a readable table."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from allocconf_widget._errors import AllocConfError


def register(subparsers: Any) -> None:
    """Add the ``options`` subcommand."""
    parser = subparsers.add_parser(
        "options",
        help="list the allocator options of a torch release",
        description="Show every allocator option a torch release accepts, with ranges and help.",
    )
    parser.add_argument("--torch-version", metavar="X.Y",
                        help="release (default: installed torch, else newest modelled)")
    parser.add_argument("--width", type=int, metavar="COLUMNS",
                        help="wrap the table to this many columns (default: the terminal's width)")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="machine-readable rows")
    out.add_argument("--markdown", action="store_true",
                     help="the all-releases page kept in docs/options.md")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Handler: print the table; 2 on a bad --torch-version."""
    from allocconf_widget.core.config.schema_table import option_rows, render_markdown, render_text
    from allocconf_widget.core.versions import resolve_version

    if args.markdown:
        sys.stdout.write(render_markdown())
        return 0
    try:
        version = resolve_version(args.torch_version)
    except AllocConfError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not version.known:
        print(f"warning: torch {version} is newer than the model; showing torch "
              f"{version.schema_key[0]}.{version.schema_key[1]}", file=sys.stderr)
    if args.json:
        print(json.dumps({"torch_version": str(version), "options": option_rows(version)}))
    else:
        import shutil

        width = args.width if args.width else shutil.get_terminal_size().columns
        print(render_text(version, width=max(60, width)))
    return 0
