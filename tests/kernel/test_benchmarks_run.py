"""The first-Compare benchmark still runs and prints its table (one round): it starts real
kernels. Every other CPU benchmark, and why these runs exist: tests/cli/test_benchmarks_run.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_benchmarks_run import _run

pytestmark = pytest.mark.slow


@pytest.mark.kernel
def test_first_compare_benchmark_runs(tmp_path: Path) -> None:
    """Starts real kernels (jupyter_client), clicks Compare in each, times the CLI beside."""
    out = _run(["bench_first_compare.py", "--rounds", "1", "--think", "0"], tmp_path, timeout=600)
    assert "first Compare" in out and "CLI" in out, out[-3000:]
