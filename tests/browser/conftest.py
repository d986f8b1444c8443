"""Browser fixtures: one JupyterLab server and one Chromium per session, a page per test.

* ``jupyter_server`` (session): :class:`tests.browser.jupyter.JupyterServer`; its log is
  copied to ``<artifacts>/logs/jupyter-server.log`` at the end.
* ``chromium`` (session): a Playwright ``Browser`` on Debian's ``/usr/bin/chromium``.
  Skips when Playwright or Chromium is missing, except under ``CI=true`` (or
  ``ALLOCCONF_REQUIRE_BROWSER=1``), where that is an error: CI must run these tests.
* ``browser_page``: a fresh browser context + page. When the test fails: a screenshot
  (``<artifacts>/screenshots/FAILED-<test>.png``) and the page's console log
  (``<artifacts>/logs/<test>.console.txt``). Afterwards every notebook session on
  the server is shut down, so each test starts from a clean server.
* ``notebook_page(cells, ui="lab", name=None)``: write a notebook with these cells
  into the server root, open it, wait for its idle kernel; returns a ``NotebookUI``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pytest

from tests.browser.jupyter import (
    UI,
    JupyterServer,
    NotebookUI,
    artifacts_dir,
    chromium_missing_reason,
    launch_chromium,
    new_page,
    open_notebook,
    safe_name,
    screenshot,
    start_jupyter_server,
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Page

NotebookPageFactory = Callable[..., NotebookUI]


def _browser_required() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes") or bool(
        os.environ.get("ALLOCCONF_REQUIRE_BROWSER")
    )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    reason = chromium_missing_reason()
    if reason:
        if _browser_required():
            pytest.fail(f"browser tests must run here (CI) but: {reason}", pytrace=False)
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # Playwright's event loop runs file I/O (screenshots) in its default executor,
        # whose non-daemon threads (asyncio_N) start lazily and may grow in number: the
        # per-test thread-leak check would blame whichever test was running. Give the
        # loop a one-thread executor and start that thread now, in the session.
        # (Between sync calls the Playwright loop counts as the running loop.)
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="playwright-io")
        )
        browser = launch_chromium(p)
        try:
            warm = browser.new_page()
            warm.screenshot(path=tmp_path_factory.mktemp("warmup") / "blank.png")
            warm.close()
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="session")
def jupyter_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterServer]:
    server = start_jupyter_server(tmp_path_factory.mktemp("jupyter"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def browser_page(
    chromium: Browser, jupyter_server: JupyterServer, request: pytest.FixtureRequest
) -> Iterator[Page]:
    page = new_page(chromium)
    console: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        console.append(f"[{msg.type}] {msg.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: console.append(f"[pageerror] {exc}"))
    try:
        yield page
    finally:
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            name = safe_name(request.node.nodeid)
            try:
                shot = screenshot(page, f"FAILED-{name}", full_page=True)
                print(f"\nscreenshot: {shot}")
            except Exception as exc:
                print(f"\nscreenshot failed: {exc!r}")
            logs = artifacts_dir() / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            log_file = logs / f"{name}.console.txt"
            log_file.write_text("\n".join(console), encoding="utf-8")
            tail = jupyter_server.log_text()[-3000:]
            print(f"browser console: {log_file}\n--- jupyter server log (tail) ---\n{tail}")
        page.context.close()
        jupyter_server.shutdown_all_sessions()


@pytest.fixture
def notebook_page(
    browser_page: Page, jupyter_server: JupyterServer, request: pytest.FixtureRequest
) -> NotebookPageFactory:
    counter = iter(range(1000))

    def make(cells: Sequence[Any], *, ui: UI = "lab", name: str | None = None) -> NotebookUI:
        if name is None:
            name = f"{safe_name(request.node.name)}-{next(counter)}.ipynb"
        path = jupyter_server.write_notebook(name, cells)
        return open_notebook(browser_page, jupyter_server, path, ui=ui)

    return make


@pytest.fixture
def no_saved_settings(jupyter_server: JupyterServer) -> Iterator[None]:
    """Apply saves settings for the next kernel (one XDG dir per server): start and end without."""
    import shutil
    from pathlib import Path

    folder = Path(jupyter_server.env["XDG_CONFIG_HOME"]) / "allocconf_widget"
    saved = folder / "settings.json"
    saved.unlink(missing_ok=True)
    shutil.rmtree(folder / "projects", ignore_errors=True)
    yield
    saved.unlink(missing_ok=True)
    shutil.rmtree(folder / "projects", ignore_errors=True)
