"""The runtime state machine and apply, each state in a fresh process with the real CPU torch.

The allocator configuration is process-wide and read once, so every scenario
runs in its own interpreter. On this CPU-only build there is no CUDA to
initialise; what can be checked here is that looking never imports torch,
that the right variable is written at the right moment, that invalid input
changes nothing, and that torch's own runtime setter (present on CPU builds,
validating the generic keys) is called with the complete string.
The CUDA transitions are covered by tests/gpu/test_lifecycle_gpu.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

from tests.torch_versions import OPT, READ_VAR, TORCH, TORCH_TEXT, TWO_OPTS, cuda_build


def run_fresh(code: str, env: dict[str, str] | None = None) -> dict:
    base = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
    script = textwrap.dedent(code) + "\nimport json as _j\nprint('RESULT', _j.dumps(out, default=str))\n"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**base, **(env or {})}, check=False)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[7:])


def test_looking_never_imports_torch():
    out = run_fresh(f"""
        import sys
        from allocconf_widget.adapters.runtime_state import detect_state
        from allocconf_widget.adapters.apply import preview
        from allocconf_widget.core.config.conf import parse_conf
        s = detect_state()
        preview(parse_conf({OPT!r}), s)
        out = {{"phase": s.phase.name, "torch_loaded": "torch" in sys.modules}}
    """)
    assert out == {"phase": "NOT_IMPORTED", "torch_loaded": False}


def test_before_import_apply_writes_the_variable_torch_will_read():
    out = run_fresh(f"""
        import os
        from allocconf_widget.adapters.apply import apply
        from allocconf_widget.core.config.conf import parse_conf
        r = apply(parse_conf({TWO_OPTS!r}))
        import torch  # the setting must be in place before this
        out = {{"plan": [p.action.name for p in r.plan], "var": r.variable,
               "env": os.environ.get(r.variable), "setter": r.setter_called}}
    """)
    assert out["var"] == READ_VAR  # the variable this torch reads
    assert out["env"] == TWO_OPTS
    assert out["plan"] == ["AT_FIRST_CUDA_USE", "AT_FIRST_CUDA_USE"]
    assert out["setter"] is None


def test_existing_winning_variable_is_reused_not_shadowed():
    out = run_fresh(f"""
        import os
        from allocconf_widget.adapters.apply import apply
        from allocconf_widget.core.config.conf import parse_conf
        r = apply(parse_conf({OPT!r}))
        out = {{"var": r.variable, "cuda": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
               "alloc": os.environ.get("PYTORCH_ALLOC_CONF")}}
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256"})
    assert out == {"var": "PYTORCH_CUDA_ALLOC_CONF", "cuda": OPT, "alloc": None}


def test_invalid_input_changes_nothing():
    out = run_fresh("""
        import os
        from allocconf_widget import AllocConfError
        from allocconf_widget.adapters.apply import apply
        from allocconf_widget.core.config.conf import parse_conf
        before = dict(os.environ)
        try:
            apply(parse_conf("max_split_size_mb:8"))
            raised = False
        except AllocConfError:
            raised = True
        import torch
        getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)  # torch 2.10+
        out = {"raised": raised, "env_same": dict(os.environ) == before,
               "torch_holds": getter() if getter else None, "asked": getter is not None}
    """, env={"PYTORCH_CUDA_ALLOC_CONF": OPT})
    # torch still holds the variable's value: the rejected string never reached it (a torch
    # without the getter, such as 2.11 and those before 2.10, cannot be asked; the
    # environment is then the whole evidence)
    holds = OPT if out["asked"] else None
    assert out == {"raised": True, "env_same": True, "torch_holds": holds, "asked": out["asked"]}
    if TORCH is not None and TORCH >= (2, 13):
        assert out["asked"]


@pytest.mark.skipif(cuda_build(), reason=f"torch {TORCH_TEXT} here is a CUDA build (PyPI's): "
                    "no CPU build of it to report as one")
def test_cpu_build_is_reported_as_no_cuda_and_stays_usable():
    out = run_fresh("""
        import torch
        from allocconf_widget.adapters.runtime_state import detect_state
        from allocconf_widget.adapters.apply import apply
        from allocconf_widget.core.config.conf import parse_conf
        s = detect_state()
        r = apply(parse_conf("expandable_segments:True"))
        out = {"phase": s.phase.name, "plan": [p.action.name for p in r.plan],
               "initialized": torch.cuda.is_initialized()}
    """)
    assert out == {"phase": "NO_CUDA", "plan": ["NO_CUDA"], "initialized": False}


def test_reset_to_defaults_removes_every_read_variable():
    out = run_fresh("""
        import os
        from allocconf_widget.adapters.apply import apply
        from allocconf_widget.core.config.conf import parse_conf
        apply(parse_conf(""))
        out = {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": OPT})
    # an empty variable would still count as set; every variable this torch reads is gone,
    # so it uses its defaults (before 2.10 torch reads only the CUDA name)
    assert out["PYTORCH_CUDA_ALLOC_CONF"] is None
    if READ_VAR == "PYTORCH_ALLOC_CONF":
        assert out["PYTORCH_ALLOC_CONF"] is None
