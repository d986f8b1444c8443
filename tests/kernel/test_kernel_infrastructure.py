"""The real-kernel fixture works, and the facts the product relies on hold."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.kernel.kernels import (
    ALLOC_CONF_VARS,
    TCP_WARNING,
    KernelError,
    KernelFactory,
    RealKernel,
)

pytestmark = pytest.mark.kernel


def test_printed_value_and_result_come_back(kernel: RealKernel) -> None:
    out, result, err = kernel.execute("print('hello', 6 * 7)\n'last'")
    assert out == "hello 42\n"
    assert result == "'last'"
    assert err is None
    assert kernel.value("{'a': (1, 2.5, None, True)}") == {"a": (1, 2.5, None, True)}


def test_errors_are_reported_not_swallowed(kernel: RealKernel) -> None:
    out, result, err = kernel.execute("print('before')\n1 / 0")
    assert out == "before\n"
    assert result is None
    assert err == "ZeroDivisionError: division by zero"
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        kernel.execute("1 / 0").check()
    with pytest.raises(KernelError, match="not finish"):
        kernel.execute("import time; time.sleep(5)", timeout=0.5)


def test_env_var_set_in_kernel_is_gone_after_restart(kernel: RealKernel) -> None:
    pid = kernel.pid
    kernel.execute("import os; os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'")
    assert kernel.getenv("PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True"

    kernel.restart()

    assert kernel.pid != pid, "restart_kernel(now=True) should start a new process"
    assert kernel.getenv("PYTORCH_CUDA_ALLOC_CONF") is None
    assert kernel.value("'os' in dir()") is False  # globals are gone too


def test_kernel_environment_is_clean_and_isolated(
    kernel_factory: KernelFactory, xdg_config_home: Path
) -> None:
    # Even if the test process has allocator variables, the kernel does not inherit them.
    for name in ALLOC_CONF_VARS:
        os.environ[name] = "max_split_size_mb:128"
    k = kernel_factory()
    for name in ALLOC_CONF_VARS:
        assert k.getenv(name) is None, name
    assert k.getenv("XDG_CONFIG_HOME") == str(xdg_config_home)
    assert k.value("__import__('sys').executable") == __import__("sys").executable
    assert k.value("__import__('allocconf_widget').__name__") == "allocconf_widget"

    chosen = kernel_factory(extra_env={"PYTORCH_CUDA_ALLOC_CONF": "backend:native"})
    assert chosen.getenv("PYTORCH_CUDA_ALLOC_CONF") == "backend:native"
    # the launch environment survives a restart (what a Jupyter server does too)
    chosen.restart()
    assert chosen.getenv("PYTORCH_CUDA_ALLOC_CONF") == "backend:native"
    # the kernel's own log is kept...
    chosen.execute("import sys; print('to-the-kernel-log', file=sys.__stderr__, flush=True)").check()
    assert _wait_for_log(chosen, "to-the-kernel-log")
    # ...and the harmless TCP warning is filtered from it, where this ipykernel prints it
    # (ipykernel 7 does; Colab's 6.17.1 does not): ask the installed ipykernel
    if _ipykernel_warns_about_tcp():
        assert TCP_WARNING in chosen.log_path.read_text(encoding="utf-8")
    assert TCP_WARNING not in chosen.log()


def _ipykernel_warns_about_tcp() -> bool:
    import inspect

    import ipykernel.kernelapp

    return TCP_WARNING in inspect.getsource(ipykernel.kernelapp)


def _wait_for_log(kernel: RealKernel, text: str, timeout: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in kernel.log():
            return True
        time.sleep(0.05)
    return False
