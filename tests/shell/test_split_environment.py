"""Three allocator variables at once: ``show`` says what torch reads, ``set`` keeps it (issue 22, item 4).

From 2.10 torch takes the generic keys from the first set of ``PYTORCH_CUDA_ALLOC_CONF``,
``PYTORCH_HIP_ALLOC_CONF``, ``PYTORCH_ALLOC_CONF`` and the CUDA keys from the first set of
the CUDA and ALLOC names (docs/lifecycle.md). With the HIP and ALLOC names set on a CUDA
build the two halves come from different variables. The installed torch's own getter
(``torch._C._accelerator_getAllocatorSettings``, which answers on the CPU build too) is the
oracle for the generic half: every one of the 5³ combinations below is checked against it.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap

import pytest

from allocconf_widget.core.config import options as opt
from allocconf_widget.core.config.conf import parse_conf
from allocconf_widget.core.config.envvars import ALLOC_VAR, CUDA_VAR, HIP_VAR, check_environment
from allocconf_widget.core.versions import installed_torch_version

pytestmark = pytest.mark.skipif(
    installed_torch_version() is None or installed_torch_version() < (2, 12),
    reason="needs torch 2.12+ (its settings getter is the oracle)")

#: per variable: unset, empty (set: it shadows the others), a generic key, a CUDA key, both;
#: each variable has its own values, so the oracle's answer says which one torch read
STATES = {
    CUDA_VAR: [None, "", "max_split_size_mb:128", "release_lock_on_cudamalloc:True",
               "garbage_collection_threshold:0.6,pinned_use_cuda_host_register:True"],
    HIP_VAR: [None, "", "max_split_size_mb:256", "throw_on_cudamalloc_oom:True",
              "garbage_collection_threshold:0.7,release_lock_on_cudamalloc:True"],
    ALLOC_VAR: [None, "", "expandable_segments:True", "pinned_use_cuda_host_register:True",
                "garbage_collection_threshold:0.8,throw_on_cudamalloc_oom:True"],
}
COMBINATIONS = [dict(zip(STATES, values, strict=True))
                for values in itertools.product(*STATES.values())]

_ORACLE = textwrap.dedent("""
    import json, os, sys
    import torch
    combos = json.loads(sys.stdin.read())
    names = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    out = []
    for combo in combos:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # torch parses the environment once per process: one child per case
            os.close(r)
            for name in names:
                os.environ.pop(name, None)
            os.environ.update({k: v for k, v in combo.items() if v is not None})
            os.write(w, json.dumps(torch._C._accelerator_getAllocatorSettings()).encode())
            os._exit(0)
        os.close(w)
        data = b""
        while chunk := os.read(r, 65536):
            data += chunk
        os.waitpid(pid, 0)
        out.append(json.loads(data))
    print(json.dumps(out))
""")


def _generic(text: str, version: object) -> dict[str, object]:
    conf = parse_conf(text, version, warn=False)  # type: ignore[arg-type]
    return {name: value for name, value in conf.items()
            if opt.spec_for(name).scope_in(conf.torch_version) is opt.Scope.GENERIC}


@pytest.fixture(scope="module")
def oracle() -> list[str]:
    done = subprocess.run([sys.executable, "-c", _ORACLE], input=json.dumps(COMBINATIONS),
                          capture_output=True, text=True, timeout=300, check=True)
    answers = json.loads(done.stdout)
    assert len(answers) == len(COMBINATIONS) == 125
    return answers


def test_the_model_reads_what_torch_reads_in_all_125_combinations(oracle: list[str]) -> None:
    version = installed_torch_version()
    wrong = []
    for combo, torch_text in zip(COMBINATIONS, oracle, strict=True):
        environ = {k: v for k, v in combo.items() if v is not None}
        report = check_environment(environ, version)  # type: ignore[arg-type]
        ours = _generic(report.effective_text or "", version)
        theirs = _generic(torch_text, version)
        if ours != theirs:
            wrong.append((environ, report.effective_text, torch_text))
    assert not wrong, f"{len(wrong)} of 125 differ, e.g. {wrong[:3]}"


def test_cuda_keys_come_from_the_cuda_side_of_a_split() -> None:
    """The CUDA half cannot be asked of a CPU build; the rule is the documented one."""
    version = installed_torch_version()
    report = check_environment({HIP_VAR: "max_split_size_mb:256,throw_on_cudamalloc_oom:True",
                                ALLOC_VAR: "expandable_segments:True,release_lock_on_cudamalloc:True"},
                               version)  # type: ignore[arg-type]
    assert report.split and report.effective_text == (
        "max_split_size_mb:256,release_lock_on_cudamalloc:True")


def _shell(env: dict[str, str], lines: list[str], tmp_path: object) -> subprocess.CompletedProcess[str]:
    code = ("import json, os, sys\nfrom IPython.testing.globalipapp import start_ipython\n"
            "ip = start_ipython()\nip.run_line_magic('load_ext', 'allocconf_widget')\n"
            "for line in json.loads(sys.argv[1]):\n"
            "    r = ip.run_cell(line)\n"
            "    print('ERROR', type(r.error_in_exec).__name__, r.error_in_exec)\n"
            "names = ('PYTORCH_CUDA_ALLOC_CONF', 'PYTORCH_HIP_ALLOC_CONF', 'PYTORCH_ALLOC_CONF')\n"
            "print('ENV', json.dumps({n: os.environ[n] for n in names if n in os.environ}))")
    base = {k: v for k, v in os.environ.items() if k not in STATES}
    return subprocess.run([sys.executable, "-c", code, json.dumps(lines)], capture_output=True,
                          text=True, timeout=120, check=False, env={**base, **env},
                          cwd=str(tmp_path))


def _torch_reads(env: dict[str, str]) -> str:
    base = {k: v for k, v in os.environ.items() if k not in STATES}
    done = subprocess.run([sys.executable, "-c", "import torch\n"
                           "print(torch._C._accelerator_getAllocatorSettings())"],
                          capture_output=True, text=True, timeout=120, check=True, env={**base, **env})
    return done.stdout.strip()


ISSUE_ENV = {HIP_VAR: "max_split_size_mb:128", ALLOC_VAR: "expandable_segments:True"}


def test_show_reports_what_torch_runs(tmp_path: object) -> None:
    done = _shell(ISSUE_ENV, ["%allocconf show"], tmp_path)
    requested = next(line for line in done.stdout.splitlines() if line.startswith("Requested:"))
    assert "max_split_size_mb:128" in requested and "expandable" not in requested, done.stdout
    assert _torch_reads(ISSUE_ENV) == "max_split_size_mb:128"


@pytest.mark.parametrize("lines", [
    ["%allocconf set garbage_collection_threshold=0.6"],
    ["import torch", "%allocconf set garbage_collection_threshold=0.6", "%allocconf apply"],
], ids=["before-import", "after-import"])
def test_set_keeps_every_option_torch_was_running(tmp_path: object, lines: list[str]) -> None:
    done = _shell(ISSUE_ENV, lines, tmp_path)
    assert all(line.startswith("ERROR NoneType") for line in done.stdout.splitlines()
               if line.startswith("ERROR")), done.stdout + done.stderr
    env = json.loads(done.stdout.split("ENV ", 1)[1])
    version = installed_torch_version()
    runs = _generic(_torch_reads(env), version)
    assert runs == _generic("max_split_size_mb:128,garbage_collection_threshold:0.6", version), env


def test_set_refuses_when_the_split_cannot_be_kept(tmp_path: object) -> None:
    env = {HIP_VAR: "max_split_size_mb:128", ALLOC_VAR: "release_lock_on_cudamalloc:maybe"}
    done = _shell(env, ["%allocconf set garbage_collection_threshold=0.6"], tmp_path)
    assert "ERROR UsageError" in done.stdout and "not applied" in done.stdout, done.stdout
    assert json.loads(done.stdout.split("ENV ", 1)[1]) == env
