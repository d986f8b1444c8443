"""The Python API as a front end: what ``allocconf_widget.dry_run()`` hands to a user's code."""
