"""Which test modules give the same answer on every torch and notebook stack (marker ``pure``).

CI runs the suite on five stacks: the main one, Colab's pinned IPython / ipywidgets / plotly /
Notebook 6, and torch 1.13 and 2.4. A test that exercises only the stdlib core (config model,
snapshot metrics, simulator: ``tests/unit/test_layering.py`` keeps ``allocconf_widget.core``
free of torch and the notebook packages) cannot see which stack it runs on, so running it on
more than one stack spends CI minutes and proves nothing new. Those tests get the ``pure``
marker here, decided from the source, and the other cells leave them out with ``-m "not pure"``.

A module is pure when every import in it (at any depth, including imports inside functions)
is ``__future__``, pytest, hypothesis, ``allocconf_widget.core`` or below (or its error types,
``allocconf_widget._errors``), a ``tests`` helper
that is itself pure, or a standard-library module that cannot reach another stack: no
``subprocess``, ``multiprocessing``, ``importlib`` (a test could import anything by name, or
read installed versions), ``runpy``, ``ctypes`` or ``asyncio``. Only ``tests/unit`` and
``tests/hostile`` qualify: the other folders' tests start IPython shells, widgets, the CLI,
kernels, servers and browsers (docs/testing.md's tiers).
When in doubt (a relative import, a file that does not parse) a module is not pure, so the
worst a mistake costs is a test run once more than it needs to. The core can still read the
installed torch through a ``torch_version=None`` default; ``tests/conftest.py`` makes that call
fail in a pure test.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PURE_FOLDERS = (TESTS / "unit", TESTS / "hostile")
_THIRD_PARTY_OK = frozenset({"pytest", "_pytest", "hypothesis"})
_STDLIB_REACHING_OUT = frozenset({"subprocess", "multiprocessing", "importlib", "runpy", "ctypes",
                                  "asyncio", "concurrent", "pkgutil"})


def is_pure_test_module(path: Path) -> bool:
    """True when the test module at ``path`` exercises only the stdlib core (see the module doc)."""
    path = path.resolve()
    return any(folder in path.parents for folder in PURE_FOLDERS) and _imports_only_pure(path)


@functools.cache
def _imports_only_pure(path: Path) -> bool:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, ValueError):
        return False
    return all(_name_is_pure(name) for name in _imported_names(tree))


def _imported_names(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level or node.module is None:
                yield "."  # relative: not resolved here, so not pure
                continue
            yield node.module
            # `from tests import recordings` imports a module, not a name: check it too
            if node.module.split(".")[0] == "tests":
                yield from (f"{node.module}.{alias.name}" for alias in node.names
                            if _helper_file(f"{node.module}.{alias.name}") is not None)


def _name_is_pure(name: str) -> bool:
    root = name.split(".", maxsplit=1)[0]
    if root == "__future__" or root in _THIRD_PARTY_OK:
        return True
    if root == "allocconf_widget":  # the core and its error types (the layering test's "core")
        return (name in ("allocconf_widget.core", "allocconf_widget._errors")
                or name.startswith("allocconf_widget.core."))
    if root == "tests":
        helper = _helper_file(name)
        return helper is not None and _imports_only_pure(helper)
    return root in sys.stdlib_module_names and root not in _STDLIB_REACHING_OUT


def _helper_file(name: str) -> Path | None:
    """The file of module ``tests.a.b`` (``tests/a/b.py`` or its package's ``__init__.py``)."""
    parts = name.split(".")[1:]
    base = TESTS.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if parts and candidate.is_file():
            return candidate
    return TESTS / "__init__.py" if not parts else None
