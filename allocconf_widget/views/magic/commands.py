"""Every ``%allocconf`` subcommand module, imported explicitly (no name strings).

Adding a subcommand means importing its module here: mypy checks that it has ``register``
(:class:`~allocconf_widget.views.magic.context.CommandModule`), and the layering test sees
the import.
"""

from __future__ import annotations

from allocconf_widget.views.magic import core, dryrun, flight, monitor, ranks, simulate
from allocconf_widget.views.magic.context import CommandModule

COMMANDS: tuple[CommandModule, ...] = (core, monitor, simulate, ranks, flight, dryrun)
