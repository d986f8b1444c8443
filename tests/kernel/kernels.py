"""Real Jupyter kernels for tests, driven through ``jupyter_client`` (no mocks).

Two entry points:

* :func:`start_kernel` starts a fresh ``ipykernel`` (the venv's own Python, i.e.
  ``sys.executable -m ipykernel_launcher``) with a test-chosen environment and a
  temporary connection directory, and returns a :class:`RealKernel` that can
  :meth:`~RealKernel.execute` code, :meth:`~RealKernel.restart` and
  :meth:`~RealKernel.shutdown`.
* :meth:`KernelConnection.from_connection_file` attaches to a kernel somebody else
  started (e.g. the kernel a JupyterLab page is using; see ``tests/browser/jupyter.py``).

Both share :meth:`KernelConnection.execute`, which returns an :class:`ExecResult`
that unpacks as ``stdout, result, error``::

    out, result, err = kernel.execute("import os; print(1); os.getpid()")

This module is a library, not a test module; the fixtures live in ``conftest.py``.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import queue
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
"""Environment variables torch reads its allocator configuration from."""

TCP_WARNING = "Kernel is running over TCP without encryption"
"""ipykernel >= 7.4 logs this to stderr on every start; harmless on loopback."""

# Variables that would make a test kernel depend on the developer's machine or on
# the Jupyter process that started pytest (e.g. running pytest from a JupyterLab
# terminal exports JPY_* variables, which would fool environment detection).
_DROP_VARS = (
    *ALLOC_CONF_VARS,
    "JPY_PARENT_PID",
    "JPY_SESSION_NAME",
    "JUPYTER_PATH",
    "JUPYTER_CONFIG_PATH",
    "IPYTHONDIR",
    "MPLBACKEND",
    "COLAB_RELEASE_TAG",
    "COLAB_NOTEBOOK_ID",
    "VSCODE_PID",
    "VSCODE_CWD",
)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class KernelError(RuntimeError):
    """The kernel did not answer in time, died, or refused a request."""


def strip_ansi(text: str) -> str:
    """Remove terminal colour codes (tracebacks from IPython are coloured)."""
    return _ANSI.sub("", text)


def filter_kernel_stderr(text: str) -> str:
    """Drop the harmless ``Kernel is running over TCP without encryption`` lines."""
    return "".join(line for line in text.splitlines(keepends=True) if TCP_WARNING not in line)


def clean_kernel_env(
    xdg_config_home: str | os.PathLike[str],
    *,
    ipython_dir: str | os.PathLike[str] | None = None,
    base: Mapping[str, str] | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """An environment for a test kernel.

    Starts from ``base`` (default ``os.environ``), removes the allocator variables
    (``PYTORCH_CUDA_ALLOC_CONF``, ``PYTORCH_ALLOC_CONF``, ``PYTORCH_HIP_ALLOC_CONF``) and
    Jupyter/Colab/VS Code markers, and points ``XDG_CONFIG_HOME`` (and ``IPYTHONDIR``
    when given) at test-owned directories. ``extra`` is applied last, so a test can
    put an allocator variable back on purpose.
    """
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _DROP_VARS}
    env["XDG_CONFIG_HOME"] = os.fspath(xdg_config_home)
    if ipython_dir is not None:
        env["IPYTHONDIR"] = os.fspath(ipython_dir)
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


def write_python3_kernelspec(data_dir: Path) -> Path:
    """Write ``<data_dir>/kernels/python3/kernel.json`` that runs *this* interpreter.

    A ``python3`` spec found elsewhere on the Jupyter path (user or system wide) could
    point at another Python; putting this data dir first makes the choice explicit.
    """
    spec_dir = data_dir / "kernels" / "python3"
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "metadata": {"debugger": False},
    }
    path = spec_dir / "kernel.json"
    path.write_text(json.dumps(spec, indent=1), encoding="utf-8")
    return path


@dataclass
class ExecResult:
    """What one ``execute_request`` produced.

    Unpacks as ``stdout, result, error`` (``result`` is the ``text/plain`` of the last
    expression or ``None``; ``error`` is ``"EName: message"`` or ``None``).
    """

    stdout: str
    result: str | None
    error: str | None
    stderr: str = ""
    traceback: str = ""
    displays: list[dict[str, Any]] = field(default_factory=list)
    execution_count: int | None = None
    msg_types: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.stdout, self.result, self.error))

    def check(self) -> ExecResult:
        """Return ``self``, or raise ``AssertionError`` with the kernel traceback."""
        if self.error is not None:
            raise AssertionError(f"kernel raised {self.error}\n{self.traceback}")
        return self


_VALUE_START = "\x1eALLOCCONF-VALUE:"
_VALUE_END = ":ALLOCCONF-VALUE\x1e"


class KernelConnection:
    """A blocking client for one kernel: run code, get values back.

    Robust against other clients on the same kernel (a browser page, nbclient):
    only iopub messages whose parent is our own request are read.
    """

    def __init__(self, client: Any, *, name: str = "kernel") -> None:
        self.client = client
        self.name = name
        self._subshell_id: str | None = None
        self._iopub_ready = False

    # ------------------------------------------------------------ construction
    @classmethod
    def from_connection_file(
        cls, path: str | os.PathLike[str], *, name: str | None = None
    ) -> KernelConnection:
        """Attach to a running kernel through its ``kernel-<id>.json`` connection file."""
        from jupyter_client.blocking.client import BlockingKernelClient

        client = BlockingKernelClient()
        client.load_connection_file(os.fspath(path))
        client.start_channels(hb=False)
        return cls(client, name=name or Path(path).stem)

    def close(self) -> None:
        """Close this client's sockets (the kernel keeps running)."""
        with contextlib.suppress(Exception):
            self.client.stop_channels()
        self._iopub_ready = False
        self._subshell_id = None

    def __enter__(self) -> KernelConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ plumbing
    def _check_alive(self) -> None:
        """Hook for owners that can tell whether the kernel process died."""

    def _control_request(self, msg_type: str, content: dict[str, Any], timeout: float) -> Any:
        msg = self.client.session.msg(msg_type, content)
        self.client.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise KernelError(f"{self.name}: no reply to {msg_type} within {timeout:.0f} s")
            try:
                reply = self.client.get_control_msg(timeout=min(left, 0.5))
            except queue.Empty:
                self._check_alive()
                continue
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return reply

    def ensure_iopub(self, timeout: float = 30.0) -> None:
        """Make sure our iopub subscription is live before we send a request.

        ZeroMQ PUB/SUB drops messages published before the subscription is connected
        (the "slow joiner"): without this, the first output of a request could be lost.
        A ``kernel_info_request`` on the *control* channel is answered even while the
        main shell is busy, and ipykernel publishes busy/idle status for it on iopub.
        """
        if self._iopub_ready:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.client.session.msg("kernel_info_request", {})
            self.client.control_channel.send(msg)
            probe_end = time.monotonic() + 0.5
            while time.monotonic() < probe_end:
                try:
                    got = self.client.get_iopub_msg(timeout=0.1)
                except queue.Empty:
                    continue
                if got["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                    self._iopub_ready = True
                    break
            # drain control replies to our probes
            with contextlib.suppress(queue.Empty):
                while True:
                    self.client.get_control_msg(timeout=0.01)
            if self._iopub_ready:
                return
            self._check_alive()
        raise KernelError(f"{self.name}: iopub did not connect within {timeout:.0f} s")

    def kernel_info(self, timeout: float = 30.0) -> dict[str, Any]:
        """The kernel's ``kernel_info_reply`` content (asked on the control channel)."""
        reply = self._control_request("kernel_info_request", {}, timeout)
        content: dict[str, Any] = reply["content"]
        return content

    def subshell_id(self, timeout: float = 30.0) -> str:
        """Create (once per connection) a kernel subshell (JEP 91; ipykernel >= 7)."""
        if self._subshell_id is None:
            info = self.kernel_info(timeout)
            if "kernel subshells" not in info.get("supported_features", []):
                raise KernelError(f"{self.name}: this kernel does not support subshells")
            reply = self._control_request("create_subshell_request", {}, timeout)
            if reply["content"].get("status") != "ok":
                raise KernelError(f"{self.name}: create_subshell failed: {reply['content']}")
            self._subshell_id = str(reply["content"]["subshell_id"])
        return self._subshell_id

    # ------------------------------------------------------------ public API
    def execute(
        self,
        code: str,
        *,
        timeout: float = 60.0,
        subshell: bool = False,
        store_history: bool = False,
        stop_on_error: bool = True,
    ) -> ExecResult:
        """Run ``code`` and wait until the kernel is idle for it; collect its outputs.

        ``subshell=True`` runs the code on a kernel subshell, i.e. concurrently with a
        cell that keeps the main shell busy (ipykernel >= 7 only). Without it the
        request queues behind whatever the main shell is running, like a new cell.
        Outputs from other clients (a browser page, background threads writing into
        another cell) are ignored.
        """
        self.ensure_iopub()
        content = {
            "code": code,
            "silent": False,
            "store_history": store_history,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": stop_on_error,
        }
        msg = self.client.session.msg("execute_request", content)
        if subshell:
            msg["header"]["subshell_id"] = self.subshell_id()
        msg_id = msg["header"]["msg_id"]
        self.client.shell_channel.send(msg)

        stdout: list[str] = []
        stderr: list[str] = []
        result: str | None = None
        error: str | None = None
        tb = ""
        displays: list[dict[str, Any]] = []
        msg_types: list[str] = []
        count: int | None = None
        got_idle = got_reply = False
        deadline = time.monotonic() + timeout
        while not (got_idle and got_reply):
            if time.monotonic() > deadline:
                raise KernelError(
                    f"{self.name}: execute did not finish within {timeout:.0f} s\n"
                    f"code: {code[:300]}\nstdout so far: {''.join(stdout)[-2000:]}"
                )
            if not got_reply:
                with contextlib.suppress(queue.Empty):
                    reply = self.client.get_shell_msg(timeout=0.05)
                    if reply["parent_header"].get("msg_id") == msg_id:
                        got_reply = True
                        rc = reply["content"]
                        count = rc.get("execution_count")
                        if rc.get("status") == "error" and error is None:
                            error = f"{rc.get('ename')}: {rc.get('evalue')}"
                            tb = strip_ansi("\n".join(rc.get("traceback", [])))
                        elif rc.get("status") == "aborted" and error is None:
                            error = "Aborted: the kernel aborted the request"
            try:
                m = self.client.get_iopub_msg(timeout=0.05 if not got_reply else 0.2)
            except queue.Empty:
                self._check_alive()
                continue
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            kind = m["header"]["msg_type"]
            c = m["content"]
            msg_types.append(kind)
            if kind == "stream":
                (stdout if c["name"] == "stdout" else stderr).append(c["text"])
            elif kind == "execute_result":
                result = c["data"].get("text/plain")
                count = c.get("execution_count", count)
            elif kind in ("display_data", "update_display_data"):
                displays.append(c["data"])
            elif kind == "error":
                error = f"{c['ename']}: {c['evalue']}"
                tb = strip_ansi("\n".join(c.get("traceback", [])))
            elif kind == "status" and c["execution_state"] == "idle":
                got_idle = True
        return ExecResult(
            stdout="".join(stdout),
            result=result,
            error=error,
            stderr=filter_kernel_stderr("".join(stderr)),
            traceback=tb,
            displays=displays,
            execution_count=count,
            msg_types=msg_types,
        )

    def value(self, expr: str, *, setup: str = "", timeout: float = 60.0, subshell: bool = False) -> Any:
        """Evaluate ``expr`` in the kernel and return it as a Python value.

        The value travels as ``repr`` and is rebuilt with :func:`ast.literal_eval`, so it
        must be made of literals (str, numbers, None, bool, tuples, lists, dicts, sets,
        bytes). ``setup`` runs first, e.g. ``setup="import os"``.
        """
        marker = uuid.uuid4().hex[:8]
        code = f"{setup}\nprint({(_VALUE_START + marker)!r} + repr({expr}) + {(marker + _VALUE_END)!r})"
        res = self.execute(code, timeout=timeout, subshell=subshell).check()
        start = res.stdout.find(_VALUE_START + marker)
        end = res.stdout.find(marker + _VALUE_END)
        if start < 0 or end < 0:
            raise KernelError(f"{self.name}: no value in output: {res.stdout!r}")
        text = res.stdout[start + len(_VALUE_START + marker) : end]
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError) as exc:
            raise KernelError(f"{self.name}: {expr!r} is not a literal: {text[:500]}") from exc

    def getenv(self, name: str, *, subshell: bool = False) -> str | None:
        """``os.environ.get(name)`` inside the kernel."""
        value: str | None = self.value(f"__import__('os').environ.get({name!r})", subshell=subshell)
        return value


class RealKernel(KernelConnection):
    """A kernel process this test owns (``jupyter_client.KernelManager``)."""

    def __init__(self, km: Any, client: Any, *, log_path: Path, log_file: Any, env: dict[str, str]) -> None:
        super().__init__(client, name=f"kernel[{Path(km.connection_file).name}]")
        self.km = km
        self.log_path = log_path
        self.env = env
        # kept open: restart_kernel() re-launches with the same stdout/stderr
        self._log_file = log_file

    def _check_alive(self) -> None:
        if not self.km.is_alive():
            raise KernelError(f"{self.name} died\n--- kernel log ---\n{self.log()[-4000:]}")

    @property
    def pid(self) -> int:
        """Process id of the kernel (asked from inside the kernel)."""
        pid: int = self.value("__import__('os').getpid()")
        return pid

    def log(self) -> str:
        """The kernel's own stdout/stderr so far, without the TCP warning."""
        try:
            return filter_kernel_stderr(self.log_path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            return ""

    def restart(self, *, timeout: float = 60.0) -> None:
        """``km.restart_kernel(now=True)`` (kills the process, same environment and ports),
        then reconnect and wait until the new kernel answers."""
        self.close()
        self.km.restart_kernel(now=True)
        self.client = self.km.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=timeout)

    def shutdown(self) -> None:
        """Stop the kernel (idempotent)."""
        self.close()
        with contextlib.suppress(Exception):
            if self.km.has_kernel:
                self.km.shutdown_kernel(now=True)
        with contextlib.suppress(Exception):
            self.km.cleanup_resources()
        self._log_file.close()


KernelFactory = Callable[..., RealKernel]
"""Type of the ``kernel_factory`` fixture (``tests/kernel/conftest.py``)."""


def start_kernel(
    workdir: Path,
    *,
    env: Mapping[str, str],
    timeout: float = 60.0,
) -> RealKernel:
    """Start ``python3`` (this interpreter's ipykernel) with exactly ``env``.

    ``workdir`` holds the connection file, the kernelspec and the kernel's log, and is
    the kernel's working directory. Use :func:`clean_kernel_env` to build ``env``.
    """
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    workdir.mkdir(parents=True, exist_ok=True)
    data_dir = workdir / "jupyter-data"
    write_python3_kernelspec(data_dir)
    ksm = KernelSpecManager(kernel_dirs=[os.fspath(data_dir / "kernels")], ensure_native_kernel=False)
    km = KernelManager(
        kernel_name="python3",
        kernel_spec_manager=ksm,
        connection_file=os.fspath(workdir / f"kernel-{uuid.uuid4().hex[:8]}.json"),
        transport="tcp",
        ip="127.0.0.1",
    )
    log_path = workdir / "kernel.log"
    log = log_path.open("ab")
    try:
        km.start_kernel(env=dict(env), cwd=os.fspath(workdir), stdout=log, stderr=log)
    except BaseException:
        log.close()
        raise
    client = km.client()
    client.start_channels()
    kernel = RealKernel(km, client, log_path=log_path, log_file=log, env=dict(env))
    try:
        client.wait_for_ready(timeout=timeout)
    except Exception as exc:
        kernel.shutdown()
        raise KernelError(f"kernel did not start within {timeout:.0f} s:\n{kernel.log()}") from exc
    return kernel
