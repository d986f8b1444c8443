"""``%allocconf flight …`` in IPython's real shell, on the CPU build of torch.

What can run here runs for real: arming before ``import torch`` (the import
watcher), the status line that never imports torch or starts CUDA, refusing bad
input, the CPU build saying it cannot record (a CUDA build without a GPU stays armed
until CUDA starts), and the OOM view on the real OOM recorded on an H200
(``allocconf_widget/data/flight_oom_h200``). The one thing a CPU cannot do is run out
of GPU memory: the hand-over test raises torch's own ``OutOfMemoryError`` (``torch.``
from 2.4, ``torch.cuda.`` before) from a cell after putting the recorded capture where
torch's observer would have, and says so.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
from IPython.core.error import UsageError

from allocconf_widget.adapters.flight_history import flight_history
from tests.torch_versions import cuda_build

# IPython 7's test shell sets the terminal title (xterm escapes) on the captured output
_TERMINAL_ESCAPES = re.compile(r"\x1b\][^\x07]*\x07|\x1b\[[0-9;]*[A-Za-z]")


@pytest.fixture(autouse=True)
def _recorder_off(ip):
    flight_history().clear_capture()
    yield
    flight_history().turn_off()
    flight_history().clear_capture()


def magic(ip, line: str, capsys):
    result = ip.run_line_magic("allocconf", f"-r {line}")
    return result, capsys.readouterr().out


def _fresh(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return _TERMINAL_ESCAPES.sub("", proc.stdout)


def test_on_before_torch_arms_without_importing_it_and_the_import_finishes_the_job():
    out = _fresh("""
        import sys
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "allocconf_widget")
        ip.run_line_magic("allocconf", "flight status")
        ip.run_line_magic("allocconf", "flight on --stacks --max-entries 50000")
        print("TORCH", "torch" in sys.modules)
        ip.run_line_magic("allocconf", "flight status")
        import torch
        print("LOADER", type(torch.__loader__).__name__)
        ip.run_line_magic("allocconf", "flight status")
        ip.run_line_magic("allocconf", "flight off")
    """)
    lines = out.splitlines()
    assert "flight recorder off." in lines
    armed = next(ln for ln in lines if ln.startswith("flight recorder armed"))
    assert "when torch is imported and CUDA starts (nothing initialised now)" in armed
    assert "last 50,000 allocator events, with Python stacks" in armed
    assert any(ln.startswith("Memory: at most 50,000 entries") for ln in lines)
    assert "TORCH False" in lines  # turning it on and looking imported nothing
    assert "LOADER SourceFileLoader" in lines  # the watcher left torch's module as it found it
    after_import = lines[lines.index("LOADER SourceFileLoader") + 1]
    if cuda_build():  # e.g. PyPI's 1.13-2.9 wheels on this CPU machine: CUDA may still start
        assert after_import.startswith("flight recorder armed: it starts recording when CUDA starts, "
                                       "before the first allocation (nothing initialised now)")
    else:
        assert after_import == ("flight recorder unavailable: this torch is a CPU-only build (no CUDA "
                                "allocator to record).")
    assert lines[-1] == "flight recorder off (the ring buffer is dropped)."


def test_cuda_malloc_async_in_the_environment_is_refused_with_a_clear_line(monkeypatch, ip, capsys):
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # looks as if torch were not imported
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")
    state, out = magic(ip, "flight on", capsys)
    assert not state.on
    assert "cudaMallocAsync keeps no allocation history" in out
    assert "the OOM view still shows the breakdown" in out


@pytest.mark.parametrize(("line", "message"), [
    ("flight on --max-entries 5", "out of range"),
    ("flight status --stacks", "go with `flight on`"),
    ("flight sideways", "invalid choice"),
    ("flight show", "no OOM has been captured"),
    ("flight export", "no OOM has been captured"),
])
def test_bad_input_is_a_usage_error_and_changes_nothing(ip, line, message):
    before = flight_history().status()
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("allocconf", line)
    assert flight_history().status() == before


def test_demo_shows_the_recorded_oom_as_text_in_a_terminal(ip, capsys):
    _, out = magic(ip, "flight demo", capsys)
    assert out.startswith("Recording (not this kernel): 'fragment' workload on an NVIDIA H200")
    assert "CUDA out of memory on GPU 0" in out
    assert "Recording: Flight recorder:" in out
    assert "Top allocation sites by live bytes at the OOM (by Python frame):" in out
    assert "flight_oom.py" in out and "kept_output" in out
    assert "Segments at the OOM:" in out
    assert "Verdict: under " in out and ": no OOM" in out
    assert "How sure: sure:" in out
    assert flight_history().last_capture() is None  # a recording never becomes this kernel's OOM


def test_a_cell_that_dies_of_oom_gets_the_flight_view(ip, capsys):
    ip.user_ns["_flight_history"] = flight_history
    ip.run_cell(textwrap.dedent("""
        import dataclasses, time, torch
        from allocconf_widget.app.flight import load_demo_oom
        demo = load_demo_oom()
        # What torch's OOM observer would have stored at this moment on a GPU (CPU here).
        _flight_history().set_capture(dataclasses.replace(demo.capture, at=time.time()))
        # torch.OutOfMemoryError from 2.4; torch.cuda.OutOfMemoryError (the same class) before
        raise (getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError)(demo.message)
    """))
    out = capsys.readouterr().out
    assert "CUDA out of memory on GPU 0" in out
    assert "Flight recorder:" in out and "captured at the OOM" in out
    assert "Verdict: under " in out
    capture = flight_history().last_capture()
    assert capture is not None and capture.message.startswith("CUDA out of memory")
    _, shown = magic(ip, "flight show", capsys)
    assert "Verdict: under " in shown
