"""Fixtures for every test: an isolated environment and a thread-leak check.

* ``_isolated_alloc_env`` (autouse): removes ``PYTORCH_CUDA_ALLOC_CONF``,
  ``PYTORCH_ALLOC_CONF`` and ``PYTORCH_HIP_ALLOC_CONF`` before each test, restores
  the original values afterwards, and points ``XDG_CONFIG_HOME`` at a per-test
  directory, so no test reads or writes the real ``~/.config``; the test's first
  ``%load_ext`` re-applies saved settings as a new kernel's does.
* ``_no_thread_leaks`` (autouse): a test that leaves behind a new non-daemon thread,
  or any thread whose name starts with ``allocconf``, fails at teardown (the idea of
  tqdm's ``tqdm._instances`` check). Opt out with ``@pytest.mark.allow_thread_leak``.
* Tests using the real-kernel or browser fixtures are marked ``kernel`` / ``browser``
  automatically (the test modules also say so explicitly); those on the JupyterLab 4 /
  Notebook 7 server also ``jupyterlab`` (CI's Colab cell, on classic Notebook 6, leaves them out).
* Tests that exercise only the stdlib core are marked ``pure`` (tests/stack_independence.py):
  CI runs them on its main stack only.

The IPython shell every test of a magic uses (docs/testing.md, "The IPython shell"):

* ``ip``: IPython's in-process test shell with ``%load_ext allocconf_widget`` run, as a new
  kernel's first load; afterwards staged edits are discarded and the extension unloaded (which
  drops the shell's session and stops a monitor and the flight recorder).
* ``ipython_shell``: the same shell without the extension.
* ``torch_imported`` and ``tmp_home``: ask for them before ``ip`` (or with
  ``pytest.mark.usefixtures``) for a shell in which torch is imported, so ``%allocconf set``
  stages instead of writing the environment, or whose ``HOME`` is a per-test folder.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.stack_independence import is_pure_test_module

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
THREAD_PREFIX = "allocconf"
THREAD_GRACE_S = 1.0

_KERNEL_FIXTURES = {"kernel", "kernel_factory"}
_BROWSER_FIXTURES = {"browser_page", "chromium", "notebook_page"}
_LAB_FIXTURES = {"jupyter_server", "browser_page", "notebook_page"}  # the JupyterLab 4 server
_SHELL_FIXTURES = {"ipython_shell", "ip", "torch_imported"}  # IPython and torch: never pure


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "allow_thread_leak: skip the per-test check for leaked non-daemon/allocconf threads",
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Close the widgets the tests made while the comm machinery still stands.

    Left to interpreter exit, ipywidgets closes each one in ``Widget.__del__`` against a comm
    manager already torn down and prints a ``KeyError`` traceback per widget: 600 to 1,100 of
    them in CI's log, where a real error could hide. Best effort: it never fails the session.
    """
    import sys

    module = sys.modules.get("ipywidgets.widgets.widget")
    registry = getattr(module, "_instances", None)  # ipywidgets 8
    if registry is None:
        registry = vars(getattr(module, "Widget", object)).get("widgets")  # ipywidgets 7
    if not isinstance(registry, dict):
        return
    for widget in list(registry.values()):
        try:
            widget.close()
        except Exception:  # its comm belonged to a manager already gone
            try:
                widget.comm = None  # nothing left for __del__ to close
                registry.pop(getattr(widget, "model_id", None), None)
            except Exception:
                pass


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & _KERNEL_FIXTURES and not item.get_closest_marker("kernel"):
            item.add_marker(pytest.mark.kernel)
        if names & _BROWSER_FIXTURES and not item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.browser)
        # every browser module but the classic-notebook one drives JupyterLab 4 / Notebook 7
        # (some through servers of their own, so the fixture names alone would miss them)
        lab_module = item.nodeid.startswith("tests/browser/") and not item.nodeid.startswith(
            "tests/browser/test_classic_notebook.py")
        if names & _LAB_FIXTURES or lab_module:
            item.add_marker(pytest.mark.jupyterlab)
        if is_pure_test_module(Path(str(item.path))) and all(
                _fixture_is_pure(item, name) for name in names):
            item.add_marker(pytest.mark.pure)
        _mark_not_yet_version_aware(item)


def _fixture_is_pure(item: pytest.Item, name: str) -> bool:
    """pytest's own, this file's (but the shell's), a parameter, or one defined in the (pure) test
    module itself (tests/stack_independence.py); decided by where the fixture is defined."""
    if name == "request" or name in getattr(getattr(item, "callspec", None), "params", {}):
        return True
    if name in _SHELL_FIXTURES:
        return False
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.get(name, ()) if info is not None else ()
    allowed = {__name__, getattr(getattr(item, "module", None), "__name__", None)}
    return bool(definitions) and all(
        (module := getattr(d.func, "__module__", None)) in allowed or str(module).startswith("_pytest.")
        for d in definitions)


@functools.cache
def _ipython_major() -> int | None:
    import importlib.metadata

    try:
        return int(importlib.metadata.version("ipython").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def _mark_not_yet_version_aware(item: pytest.Item) -> None:
    """xfail (not strict) the tests listed in tests/torch_versions.py on releases they don't fit."""
    from tests.torch_versions import IPYTHON_8_ONLY, NOT_YET_VERSION_AWARE, TORCH, TORCH_TEXT

    for prefix, (version, reason) in NOT_YET_VERSION_AWARE.items():
        if item.nodeid.startswith(prefix) and TORCH is not None and version > TORCH:
            item.add_marker(pytest.mark.xfail(
                reason=f"not yet written for torch {TORCH_TEXT}: {reason}", strict=False))
    ipython_major = _ipython_major()
    if ipython_major is None:
        return
    for prefix, reason in IPYTHON_8_ONLY.items():
        if item.nodeid.startswith(prefix) and ipython_major < 8:
            item.add_marker(pytest.mark.xfail(reason=f"IPython {ipython_major}: {reason}", strict=False))


@pytest.fixture
def xdg_config_home(tmp_path: Path) -> Path:
    """The per-test ``XDG_CONFIG_HOME`` (an empty directory)."""
    path = tmp_path / "xdg-config"
    path.mkdir()
    return path


@pytest.fixture(autouse=True)
def _isolated_alloc_env(xdg_config_home: Path) -> Iterator[dict[str, str | None]]:
    """Clear the allocator variables and isolate ``XDG_CONFIG_HOME``; restore afterwards.

    Yields the values the variables had before the test (``None`` = unset).
    """
    keys = (*ALLOC_CONF_VARS, "XDG_CONFIG_HOME")
    saved = {k: os.environ.get(k) for k in keys}
    for k in ALLOC_CONF_VARS:
        os.environ.pop(k, None)
    os.environ["XDG_CONFIG_HOME"] = str(xdg_config_home)
    extension = sys.modules.get("allocconf_widget.views.magic.extension")
    if extension is not None:  # each test's first %load_ext is a new kernel's: it re-applies
        extension.LOAD_STATE["loaded_before"] = False  # saved settings (a second load in a test does not)
    try:
        yield {k: saved[k] for k in ALLOC_CONF_VARS}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def ipython_shell() -> InteractiveShell:
    """IPython's in-process test shell (``IPython.testing.globalipapp``), our extension not loaded.

    There is one per process: ``start_ipython`` makes it on its first call and returns None on
    every later one, so the shell then comes from ``get_ipython``.
    """
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython() or get_ipython()
    assert shell is not None
    return shell


@pytest.fixture
def ip(ipython_shell: InteractiveShell) -> Iterator[InteractiveShell]:
    """The shell with ``%load_ext allocconf_widget`` run, in the environment ``_isolated_alloc_env``
    made for this test (the load is a new kernel's first: it re-applies saved settings, of which
    this test's empty ``XDG_CONFIG_HOME`` has none).

    The shell's session is new (one left by a test that used the shell without this fixture is
    dropped first). Afterwards the staged edits are discarded and the extension unloaded, which
    drops the session and stops a monitor and the flight recorder.
    """
    from allocconf_widget.app.session import drop_session

    drop_session(ipython_shell)
    ipython_shell.run_line_magic("load_ext", "allocconf_widget")
    yield ipython_shell
    if ipython_shell.find_line_magic("allocconf") is not None:  # the test may have unloaded it
        ipython_shell.run_line_magic("allocconf", "discard")
    ipython_shell.run_line_magic("unload_ext", "allocconf_widget")


@pytest.fixture
def torch_imported() -> None:
    """Import torch (the CPU build here): ``%allocconf set`` then stages instead of writing the
    environment. Torch stays imported for the rest of the process, as in a kernel."""
    pytest.importorskip("torch")


@pytest.fixture
def tmp_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``HOME`` set to an empty per-test folder (where the search for a project folder stops)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def _suspects(before: set[threading.Thread]) -> list[threading.Thread]:
    return [
        t
        for t in threading.enumerate()
        if t not in before and t.is_alive() and (not t.daemon or t.name.lower().startswith(THREAD_PREFIX))
    ]


@pytest.fixture(autouse=True)
def _pure_tests_never_ask_the_installed_torch(request: pytest.FixtureRequest,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``pure`` test runs on the main stack only, so it must not depend on which torch is
    installed: the one way the core reads it (``core.versions.installed_torch_version``, behind
    a ``torch_version=None`` default) fails the test here, in every cell."""
    if request.node.get_closest_marker("pure") is None:
        return
    from allocconf_widget.core import versions

    def refuse() -> None:
        pytest.fail("this test is marked pure (tests/stack_independence.py) but asked for the "
                    "installed torch's version: pass torch_version explicitly", pytrace=True)

    monkeypatch.setattr(versions, "installed_torch_version", refuse)


@pytest.fixture(autouse=True)
def _no_thread_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test if it leaves a new non-daemon or ``allocconf*`` thread running."""
    before = set(threading.enumerate())
    yield
    if request.node.get_closest_marker("allow_thread_leak"):
        return
    leaked = _suspects(before)
    if not leaked:
        return
    deadline = time.monotonic() + THREAD_GRACE_S  # let threads that are ending finish
    for t in leaked:
        t.join(max(0.0, deadline - time.monotonic()))
    leaked = _suspects(before)
    if leaked:
        names = ", ".join(f"{t.name} (daemon={t.daemon})" for t in leaked)
        pytest.fail(
            f"test leaked {len(leaked)} thread(s): {names}. Stop/join them in the test, "
            "or mark it @pytest.mark.allow_thread_leak (threads of session-wide machinery, "
            "e.g. an event loop's executor, must be started by the session fixture)",
            pytrace=False,
        )
