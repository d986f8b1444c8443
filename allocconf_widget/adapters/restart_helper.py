"""A restart through the Jupyter server that the notebook page can follow (a process of its own).

:func:`allocconf_widget.adapters.frontend.restart` starts this file with the kernel's own Python
(``python restart_helper.py CONNECTION_FILE RESTART_URL KERNEL_PID``, the server's token in
``ALLOCCONF_RESTART_TOKEN``) in a session of its own, so it outlives the kernel it restarts. It:

1. connects to the kernel's shell channel and prints ``ready`` (the kernel waits for that line);
2. asks the kernel for its ``kernel_info``: the kernel answers shell requests one after the
   other, so the answer comes only once the cell (or widget click) that asked for the restart
   has been answered. Restarted while that cell still ran, the kernel could not send the cell's
   reply (its sockets were already closed: a ``ZMQError`` in the server's log), and the page
   showed the cell running (``[*]``) for good;
3. ``POST``\\ s the restart to the server, which answers once the new kernel is up;
4. sends the new kernel one silent, empty ``execute_request``. JupyterLab and Notebook 7 take the
   kernel's state only from status messages of requests they track: after a restart that the
   page did not ask for, they see the new kernel's ``starting`` and then only the busy/idle of the
   server's own ``kernel_info_request``, which they ignore, so the status bar read "Starting"
   until the next cell. The busy/idle of this request is one they read.

A refused or failed request ends the old kernel instead, so the server's restarter starts a new
one (the page then says the kernel died and restarts it). Standard library and
``jupyter_client`` only: the package need not be importable from the kernel's working directory.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import time
import urllib.error
import urllib.request
from typing import Any

TOKEN_VARIABLE = "ALLOCCONF_RESTART_TOKEN"
#: the longest the cell that asked may still run before the restart is given up
ANSWER_WAIT_S = 3600.0
#: the restart request answers once the new kernel has answered the server
RESTART_WAIT_S = 120.0


def _client(connection_file: str) -> Any:
    from jupyter_client.blocking.client import BlockingKernelClient

    client = BlockingKernelClient()
    client.load_connection_file(connection_file)
    client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
    return client


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _answered(client: Any, pid: int) -> bool:
    """Wait until the kernel answers a ``kernel_info_request`` (queued behind the asking cell)."""
    request = client.kernel_info()
    deadline = time.monotonic() + ANSWER_WAIT_S
    while time.monotonic() < deadline:
        try:
            reply = client.get_shell_msg(timeout=1.0)
        except queue.Empty:
            if not _alive(pid):
                return False  # interrupted for good, or ended by somebody else: nothing to restart
            continue
        if reply.get("parent_header", {}).get("msg_id") == request:
            return True
    return False


def _post(url: str, token: str) -> bool:
    request = urllib.request.Request(url, method="POST", data=b"")
    if token:
        request.add_header("Authorization", f"token {token}")
    try:
        urllib.request.urlopen(request, timeout=RESTART_WAIT_S).close()
    except (OSError, urllib.error.HTTPError):
        return False
    return True


def _poke(connection_file: str) -> None:
    """A silent, empty request on the new kernel: the page reads its busy/idle (step 4)."""
    client = _client(connection_file)
    try:
        for _ in range(2):  # a second one in case the server's iopub had not reconnected yet
            request = client.execute("", silent=True, store_history=False)
            deadline = time.monotonic() + 30.0
            while time.monotonic() < deadline:
                try:
                    reply = client.get_shell_msg(timeout=1.0)
                except queue.Empty:
                    continue
                if reply.get("parent_header", {}).get("msg_id") == request:
                    break
            time.sleep(1.0)
    finally:
        client.stop_channels()


def main(argv: list[str]) -> int:
    connection_file, url, pid = argv[1], argv[2], int(argv[3])
    token = os.environ.pop(TOKEN_VARIABLE, "")
    client = _client(connection_file)
    print("ready", flush=True)
    try:
        answered = _answered(client, pid)
    finally:
        client.stop_channels()
    if not answered:
        return 1
    time.sleep(0.2)  # the reply is out; let the idle status after it go out too
    if not _post(url, token):
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)  # the server's restarter starts a new kernel
        return 1
    _poke(connection_file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
