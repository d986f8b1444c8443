"""``python -m allocconf_widget`` runs the command line."""

import sys

try:
    from allocconf_widget.views.cli.main import main
except KeyboardInterrupt:  # Ctrl-C while the command starts: one line, as later (exit 130)
    print("allocconf: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
