"""A broken settings file or environment never stops the extension, and nothing applied is lost silently.

Each case runs a real IPython shell in a fresh interpreter, as a kernel would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.torch_versions import OPT, OPT_SET, READ_VAR

SCRIPT = textwrap.dedent(f"""
    from IPython.testing.globalipapp import start_ipython
    ip = start_ipython()
    ip.run_line_magic("load_ext", "allocconf_widget")
    ip.run_line_magic("allocconf", "show")
    ip.run_line_magic("allocconf", "set {OPT_SET}")
    import torch
    ip.run_line_magic("allocconf", "set garbage_collection_threshold=0.7")
    ip.run_line_magic("allocconf", "apply")
    import os, sys
    print("ENV", os.environ.get("{READ_VAR}"))
    # what the child saw, for the failure message: its torch, every allocator variable, sys.path
    from allocconf_widget.core.versions import installed_torch_version
    print("SEEN", installed_torch_version(), torch.__file__,
          {{k: v for k, v in os.environ.items() if k.endswith("ALLOC_CONF")}}, sys.path[:4])
""")


def _env_options(stdout: str) -> set[str]:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("ENV "))
    return set(line[4:].split(","))


def _seen(stdout: str) -> str:
    return next((ln for ln in stdout.splitlines() if ln.startswith("SEEN ")), stdout[-2000:])


def _run(env: dict[str, str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120, check=False, **kwargs)  # type: ignore[call-overload]


def _base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("ALLOC_CONF")}
    env["IPYTHONDIR"] = str(tmp_path / "ipython")
    return env


@pytest.mark.parametrize("content", [b"\xff\xfe\x00{", b"[" * 50_000, b"\x00" * 10])
def test_kernel_starts_on_a_hostile_settings_file(tmp_path, content):
    env = _base_env(tmp_path)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "cfg")
    settings = tmp_path / "cfg" / "allocconf_widget" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_bytes(content)
    done = _run(env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "ignoring saved settings" in done.stdout
    assert _env_options(done.stdout) == {OPT, "garbage_collection_threshold:0.7"}, _seen(done.stdout)


def test_unwritable_settings_path_says_applied_not_saved(tmp_path):
    env = _base_env(tmp_path)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "cfg")
    (tmp_path / "cfg" / "allocconf_widget").mkdir(parents=True)
    (tmp_path / "cfg" / "allocconf_widget" / "projects").write_text("")  # a file where a folder goes
    done = _run(env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "Applied, but NOT saved for kernel restarts" in done.stdout
    assert _env_options(done.stdout) == {OPT, "garbage_collection_threshold:0.7"}, _seen(done.stdout)
