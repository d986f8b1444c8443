"""``%allocconf restart`` through a real Jupyter server ends its cell quietly (issue 22, item 16).

jupyter_client interrupts a kernel before restarting it; the cell that asked for the restart
was still waiting for the server's answer, so a restart that worked ended with a
KeyboardInterrupt traceback, saved in the notebook. No browser here: a real ``jupyter lab``
server, a kernel it runs, and a client on that kernel's channels (as the page would be).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.browser.jupyter import JupyterServer, start_jupyter_server, wait_until

pytestmark = [pytest.mark.kernel, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterServer]:
    pytest.importorskip("jupyterlab")
    srv = start_jupyter_server(tmp_path_factory.mktemp("jupyter-restart"))
    try:
        yield srv
    finally:
        srv.stop(keep_log_as=None)


def test_a_restart_through_the_server_ends_its_cell_without_a_traceback(server: JupyterServer) -> None:
    path = server.write_notebook("restart-quiet.ipynb", [])
    session = server.api("POST", "api/sessions", {"path": path, "type": "notebook", "name": path,
                                                  "kernel": {"name": "python3"}})
    kernel_id = session["kernel"]["id"]  # a notebook's kernel, as the page would open it
    try:
        kernel = server.connect_kernel(kernel_id)
        pid = kernel.execute("import os; os.getpid()").check().result
        stdout, errors = _run_until_quiet(server, kernel_id, "%load_ext allocconf_widget\n%allocconf restart")
        assert not errors, errors
        assert "Restarting the kernel through the Jupyter server" in stdout, stdout

        def new_pid() -> bool:
            try:
                fresh = server.connect_kernel(kernel_id).execute("import os; os.getpid()", timeout=5)
            except Exception:  # still restarting
                return False
            return fresh.result is not None and fresh.result != pid

        wait_until(new_pid, timeout=60, what="the restarted kernel")
    finally:
        server.shutdown_all_sessions()


def _run_until_quiet(server: JupyterServer, kernel_id: str, code: str) -> tuple[str, list[str]]:
    """Run ``code`` and read everything the cell published until it ends or its kernel is gone
    (a restarted kernel never reports the old cell idle): stdout, and every error message."""
    import time

    from jupyter_client.blocking.client import BlockingKernelClient

    client = BlockingKernelClient(connection_file=str(server.runtime_dir / f"kernel-{kernel_id}.json"))
    client.load_connection_file()
    client.start_channels()
    try:
        msg_id = client.execute(code)
        stdout: list[str] = []
        errors: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                msg = client.get_iopub_msg(timeout=1)
            except Exception:  # nothing for a second: the kernel may be restarting
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                stdout.append(content.get("text", ""))
            elif kind == "error":
                errors.append(f"{content.get('ename')}: {content.get('evalue')}")
            elif kind == "status" and content.get("execution_state") == "idle":
                break
        return "".join(stdout), errors
    finally:
        client.stop_channels()
