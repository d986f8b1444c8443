"""The ``pure`` marker: CI runs a pure test on its main stack only, so a test wrongly called pure
would go unrun on Colab's stack and the older torches. These cases pin what makes a module
pure (tests/stack_independence.py) and what does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocconf_widget.core.versions import default_version
from tests.stack_independence import TESTS, _imports_only_pure, is_pure_test_module


def _module(tmp_path: Path, source: str, name: str = "test_x.py") -> Path:
    path = tmp_path / name
    path.write_text(source, encoding="utf-8")
    return path


@pytest.mark.parametrize("source", [
    "from allocconf_widget.core.sim.simulator import simulate\nimport json\n",
    "import pytest\nfrom hypothesis import given\nfrom allocconf_widget._errors import SnapshotError\n",
    "from tests.trace_builder import TraceBuilder\n",
    "from tests import snapshot_builders\n",
])
def test_the_core_the_stdlib_and_pure_helpers_are_pure(tmp_path: Path, source: str) -> None:
    assert _imports_only_pure(_module(tmp_path, source))


@pytest.mark.parametrize("source", [
    "import torch\n",
    "def test_late():\n    import IPython\n",  # an import inside a function counts too
    "from allocconf_widget.app.simulate import simulate\n",
    "from allocconf_widget import views\n",
    "import allocconf_widget\n",
    "import subprocess\n",  # a child process may import anything
    "import importlib\n",  # so may a name
    "from tests.torch_versions import TORCH\n",  # a helper that reads the installed torch
    "from tests import torch_versions\n",
    "from . import helpers\n",  # relative: not resolved, so not pure
    "import plotly.graph_objects as go\n",
    "def broken(:\n",  # does not parse
])
def test_anything_that_can_reach_another_stack_is_not(tmp_path: Path, source: str) -> None:
    assert not _imports_only_pure(_module(tmp_path, source))


def test_only_the_unit_and_hostile_folders_qualify() -> None:
    assert is_pure_test_module(TESTS / "unit" / "test_simulator.py")
    assert not is_pure_test_module(TESTS / "unit" / "test_dryrun.py")  # imports torch's adapters
    assert not is_pure_test_module(TESTS / "cli" / "test_cli_simulate_edges.py")


def test_the_marker_reaches_the_collected_items(request: pytest.FixtureRequest) -> None:
    """This module is itself pure: conftest gave this very test the marker, and with it the
    guard that fails a pure test reading the installed torch (through a ``torch_version=None``
    default of the core)."""
    assert request.node.get_closest_marker("pure") is not None
    with pytest.raises(pytest.fail.Exception, match="asked for the installed torch"):
        default_version()
