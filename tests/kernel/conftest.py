"""Real-kernel fixtures (``jupyter_client`` + the venv's ``ipykernel``).

``kernel``: a fresh kernel for this test, with a clean environment (no allocator
variables) that inherits the test's ``XDG_CONFIG_HOME``; shut down afterwards.

``kernel_factory(extra_env=None, xdg_config_home=None, base_env=None)``: start more
kernels, or kernels with a chosen environment.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.kernel.kernels import KernelFactory, RealKernel, clean_kernel_env, start_kernel


@pytest.fixture
def kernel_factory(tmp_path: Path, xdg_config_home: Path) -> Iterator[KernelFactory]:
    started: list[RealKernel] = []

    def start(
        *,
        extra_env: Mapping[str, str] | None = None,
        xdg_config_home: Path = xdg_config_home,
        base_env: Mapping[str, str] | None = None,
        timeout: float = 60.0,
    ) -> RealKernel:
        workdir = tmp_path / f"kernel{len(started)}"
        env = clean_kernel_env(
            xdg_config_home, ipython_dir=workdir / "ipython", base=base_env, extra=extra_env
        )
        k = start_kernel(workdir, env=env, timeout=timeout)
        started.append(k)
        return k

    yield start
    for k in started:
        k.shutdown()


@pytest.fixture
def kernel(kernel_factory: KernelFactory) -> RealKernel:
    """A fresh real kernel (``sys.executable -m ipykernel_launcher``) for this test."""
    return kernel_factory()
