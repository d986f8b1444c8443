"""What every ``%allocconf`` subcommand handler is given, and the shape of a subcommand module.

Each subcommand module exposes ``register(subparsers)``, which adds its parsers and sets
``handler=<callable(args, ctx)>``; :mod:`allocconf_widget.views.magic.commands` lists the modules
by import (not by name strings), so mypy and the layering test see every one.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from allocconf_widget.app.session import Session

SubParsers = argparse._SubParsersAction  # the argparse type register() receives


@dataclass
class MagicContext:
    """What a subcommand handler gets besides its arguments."""

    shell: Any  # IPython's InteractiveShell (untyped)
    session: Session
    cell: str | None


class CommandModule(Protocol):
    """A module of subcommands: ``register`` adds them to the magic's parser."""

    def register(self, subparsers: SubParsers) -> None: ...
