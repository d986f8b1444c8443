"""Every ``allocconf`` subcommand module, imported explicitly (no name strings).

Each exposes ``register(subparsers)``, which adds a parser and sets
``handler=<callable(args) -> exit code>``; the modules import nothing heavy at the top, so
only the chosen subcommand's dependencies are loaded.
"""

from __future__ import annotations

import argparse
from typing import Protocol

from allocconf_widget.views.cli import check, options, report, simulate


class CommandModule(Protocol):
    """A module of subcommands: ``register`` adds them to the CLI's parser."""

    def register(self, subparsers: argparse._SubParsersAction) -> None: ...  # argparse.ArgumentParser or ours


COMMANDS: tuple[CommandModule, ...] = (check, options, report, simulate)
