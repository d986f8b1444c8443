"""The lifecycle on a real GPU: each state transition, late variables, the setter, read-back.

Run on a CUDA machine with ``python -m pytest tests/gpu -m gpu -s``; skipped
cleanly without CUDA. Every scenario is a fresh interpreter because the
allocator settings are read once per process. The table printed at the end
is what the closing notes quote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

_PRELUDE = textwrap.dedent("""
    import json, os, sys
    def expandable_now():
        import torch
        x = torch.empty(3 << 20, device="cuda")
        segs = torch.cuda.memory_snapshot()
        return any(s.get("is_expandable") for s in segs)
""")
RESULTS: list[tuple[str, str, str]] = []


def fresh(name: str, code: str, env: dict[str, str] | None = None) -> dict:
    base = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
    script = _PRELUDE + textwrap.dedent(code) + "\nprint('RESULT', json.dumps(out, default=str))\n"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**base, **(env or {})}, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    RESULTS.append((name, json.dumps(out)[:160], "ok"))
    return out


@pytest.fixture(scope="module", autouse=True)
def _print_table():
    yield
    print("\n| scenario | observed |\n|---|---|")
    for name, observed, _ in RESULTS:
        print(f"| {name} | `{observed}` |")


def test_phases_advance_and_looking_freezes_nothing():
    out = fresh("phases", """
        from allocconf_widget.adapters.runtime_state import detect_state
        p = [detect_state().phase.name]
        import torch
        p.append(detect_state().phase.name)
        torch.cuda.is_available(); torch.cuda.memory_stats()
        p.append(detect_state().phase.name)
        # a naive late variable still works: our looking above froze nothing
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        e = expandable_now()
        p.append(detect_state().phase.name)
        out = {"phases": p, "late_env_after_looking_applied": e}
    """)
    assert out["phases"] == ["NOT_IMPORTED", "IMPORTED", "IMPORTED", "LIVE"]
    assert out["late_env_after_looking_applied"] is True


def test_set_before_import_applies_at_first_cuda_use():
    out = fresh("before import", """
        from allocconf_widget.app.session import Session
        from allocconf_widget.core.config.conf import parse_conf
        s = Session(); s.stage(parse_conf("expandable_segments:True,max_split_size_mb:256"))
        import torch
        e = expandable_now()
        from allocconf_widget.adapters.effective_settings import read_back
        rb = read_back("expandable_segments:True,max_split_size_mb:256")
        out = {"expandable": e, "readback_ok": rb.ok, "rows": [(r.option, r.effective) for r in rb.rows]}
    """)
    assert out["expandable"] is True and out["readback_ok"] is True


def test_apply_after_a_silent_freeze_still_works_through_the_setter():
    out = fresh("after memory_snapshot()", """
        import torch
        torch.cuda.memory_snapshot()          # freezes the settings, no flag shows it
        from allocconf_widget.adapters.apply import apply
        from allocconf_widget.core.config.conf import parse_conf
        r = apply(parse_conf("expandable_segments:True"))
        out = {"plan": [p.action.name for p in r.plan], "setter": r.setter_called,
               "expandable": expandable_now()}
    """)
    assert out["plan"] == ["APPLIED_NOW"] and out["expandable"] is True


def test_readback_catches_a_variable_set_too_late():
    out = fresh("naive late variable", """
        import torch
        torch.cuda.get_device_name(0)         # initialises CUDA
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"   # what blog posts say
        e = expandable_now()
        from allocconf_widget.adapters.effective_settings import read_back
        rb = read_back()
        out = {"expandable": e, "ok": rb.ok, "causes": list(rb.causes)}
    """)
    assert out["expandable"] is False and out["ok"] is False
    assert "before the variable got its value" in out["causes"][0]


def test_one_option_change_keeps_the_others_live():
    out = fresh("reset pitfall handled", """
        import torch
        x = torch.empty(1, device="cuda")
        from allocconf_widget.app.session import Session
        from allocconf_widget.adapters.effective_settings import read_back
        from allocconf_widget.core.config.conf import parse_conf
        s = Session()
        s.stage(parse_conf("max_split_size_mb:256,garbage_collection_threshold:0.6")); s.apply(save=None)
        s.update({"expandable_segments": "True"}); r = s.apply(save=None).result
        rb = read_back(r.requested, applied_by_setter=True)
        out = {"setter": r.setter_called, "ok": rb.ok,
               "effective": {row.option: row.effective for row in rb.rows}}
    """)
    assert out["ok"] is True
    assert out["effective"]["max_split_size_mb"] == "256"
    assert out["effective"]["garbage_collection_threshold"] == "0.6"
    assert out["effective"]["expandable_segments"] == "True"


def test_backend_after_import_needs_restart_and_breaks_nothing():
    out = fresh("backend after import", """
        import torch
        from allocconf_widget.app.session import Session
        from allocconf_widget.core.config.conf import parse_conf
        s = Session(); s.stage(parse_conf("backend:cudaMallocAsync,expandable_segments:True"))
        r = s.apply().result
        x = torch.empty(1 << 20, device="cuda")   # would assert if the env held the new backend
        from allocconf_widget.adapters import persist
        out = {"plan": {p.option: p.action.name for p in r.plan}, "restart": r.restart_needed,
               "env": os.environ.get(r.variable), "saved": persist.load().conf.to_string(),
               "backend": torch.cuda.get_allocator_backend(),
               "restart_conf": s.settings_for_restart().to_string(),
               "panel_backend": s.view().staged.get("backend"), "changes": s.view().has_changes}
    """, env={"XDG_CONFIG_HOME": "/tmp/allocconf-gpu-test"})
    assert out["plan"]["backend"] == "NEEDS_RESTART" and out["restart"] is True
    assert "backend" not in (out["env"] or "")
    assert out["saved"].startswith("backend:cudaMallocAsync")
    assert out["backend"] == "native"
    # the environment lacks the backend, but the session (panel, restart) still holds it
    assert out["restart_conf"] == "backend:cudaMallocAsync,expandable_segments:True"
    assert out["panel_backend"] == "cudaMallocAsync" and out["changes"] is False


def test_restart_with_saved_backend_applies_it():
    out = fresh("backend after restart", """
        from allocconf_widget.adapters import persist
        from allocconf_widget.core.config.conf import parse_conf
        persist.save(parse_conf("backend:cudaMallocAsync", warn=False))   # as Apply did before
        from allocconf_widget.views.magic.core import restore_saved_settings
        restore_saved_settings()              # what %load_ext does in the new kernel
        import torch
        x = torch.empty(1 << 20, device="cuda")
        out = {"backend": torch.cuda.get_allocator_backend()}
    """, env={"XDG_CONFIG_HOME": "/tmp/allocconf-gpu-test-restart"})
    assert out["backend"] == "cudaMallocAsync"


def test_readback_flags_a_shadowing_variable():
    out = fresh("two variables", """
        from allocconf_widget.adapters.effective_settings import read_back
        import torch
        x = torch.empty(1, device="cuda")
        rb = read_back("expandable_segments:True")   # what PYTORCH_ALLOC_CONF asked for
        out = {"ok": rb.ok, "causes": list(rb.causes)}
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",
              "PYTORCH_ALLOC_CONF": "expandable_segments:True"})
    assert out["ok"] is False and any("PYTORCH_ALLOC_CONF is not read" in c for c in out["causes"])


def test_memory_fraction_applied_live():
    out = fresh("per_process_memory_fraction live", """
        import torch
        x = torch.empty(1, device="cuda")
        from allocconf_widget.adapters.apply import apply
        from allocconf_widget.core.config.conf import parse_conf
        r = apply(parse_conf("per_process_memory_fraction:0.05"))
        try:
            y = torch.empty(int(0.08 * torch.cuda.get_device_properties(0).total_memory),
                            dtype=torch.uint8, device="cuda"); oom = False
        except torch.OutOfMemoryError:
            oom = True
        out = {"devices": r.fraction_devices, "oom_above_cap": oom}
    """)
    assert out["devices"] == [0] and out["oom_above_cap"] is True
