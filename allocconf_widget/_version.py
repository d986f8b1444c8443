"""The package version, in one place: pyproject reads it, and nothing imports the package for it."""

__version__ = "0.2.0.dev0"
