"""``python -m allocconf_widget`` runs the command line."""

import sys

from allocconf_widget.views.cli import main

sys.exit(main())
