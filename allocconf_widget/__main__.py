"""``python -m allocconf_widget`` runs the command line."""

import sys

from allocconf_widget.views.cli.main import main

sys.exit(main())
