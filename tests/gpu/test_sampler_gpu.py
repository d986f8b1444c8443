"""The sampler, the OOM observer and the assistant on a real CUDA device.

Run with ``python -m pytest tests/gpu -m gpu``; everything skips cleanly
without CUDA. Each scenario runs in a **fresh process** (as the allocator
probes do): allocator settings are read once per process, backends are fixed
at import, and the pytest process itself must stay CUDA-free for the other
test tiers. Only torch and this package are needed (no IPython, ipywidgets or
plotly), matching the GPU machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() == 0, reason="needs a CUDA device"),  # NVML, no init
]

REPO = Path(__file__).resolve().parents[2]
# the children import this checkout first, and what the test's own path holds after it
CHILD_PATH = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
GIB = 1 << 30

PRELUDE = """
import json, sys, time, threading
import torch
from allocconf_widget.adapters.sampler import Sampler, OK, WAITING

def emit(**kw):
    print("RESULT " + json.dumps(kw, default=str))

def train(steps, device="cuda", d=512):
    layers = [torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)]
    model = torch.nn.Sequential(*layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i in range(steps):
        batch = 64 * (1 + i % 4)  # varying shapes, so the cache has something to do
        x = torch.randn(batch, 128, d, device=device)
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
    torch.cuda.synchronize()
"""


def run_scenario(code: str, env: dict[str, str] | None = None, timeout: float = 300) -> dict:
    """Run ``PRELUDE + code`` in a fresh interpreter; return what it ``emit()``-ed."""
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")}
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")])
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"scenario failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_sampler_follows_a_real_training_loop_and_never_initialises_cuda_itself():
    out = run_scenario("""
        s = Sampler(interval=0.05).start()
        time.sleep(0.5)
        waiting = (s.status, torch.cuda.is_initialized())
        train(60)
        time.sleep(1.0)  # at least ~20 more samples, whatever the GPU's speed
        s.stop()
        p = s.timeline.render(0)
        true_peak = torch.cuda.memory_stats()["reserved_bytes.all.peak"]
        frag = [f for f in p.series["fragmentation"] if f is not None]
        threads = [t.name for t in threading.enumerate() if t.name.startswith("allocconf")]
        emit(waiting=waiting, status=s.status, samples=s.timeline.samples(0),
             peak_seen=p.peaks["reserved"], true_peak=true_peak,
             allocated_peak_seen=p.peaks["allocated"], frag=frag,
             non_pytorch=s.latest[0].non_pytorch, source=s.latest[0].non_pytorch_source,
             overhead=s.overhead(), threads=threads)
    """)
    assert out["waiting"] == ["waiting_for_cuda", False]
    assert out["status"] == "ok"
    assert out["samples"] >= 10
    assert 0 < out["peak_seen"] <= out["true_peak"]
    assert out["allocated_peak_seen"] <= out["peak_seen"]
    assert out["frag"], "no trace-free snapshot was taken within the budget"
    assert all(0.0 <= f <= 1.0 for f in out["frag"])
    assert out["non_pytorch"] is not None and out["non_pytorch"] > 100 * (1 << 20)  # the CUDA context
    assert out["overhead"]["snapshot_duty"] <= 0.02
    assert out["threads"] == []


def test_settings_stay_open_while_the_sampler_waits():
    """Sampling before CUDA init must not freeze the allocator configuration.

    docs/internals/allocator_facts.md §4.2.
    """
    out = run_scenario("""
        import os
        s = Sampler(interval=0.02).start()
        time.sleep(0.5)  # dozens of rounds before CUDA is up
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  # set late, on purpose
        x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        time.sleep(0.2)
        s.stop()
        emit(expandable=torch.cuda.memory._snapshot()["allocator_settings"].get("expandable_segments"),
             status=s.status)
    """)
    assert out["expandable"] is True
    assert out["status"] == "ok"


def test_step_synchronous_mode_samples_each_optimizer_step_on_cuda():
    out = run_scenario("""
        s = Sampler(step_sync=True, step_budget=0.05).start()
        train(40)
        s.stop()
        p = s.timeline.render(0, max_points=1000)
        emit(steps=s.steps, xs=p.x, x_label=p.x_label, stride=s.overhead()["step_stride"],
             reserved_last=p.series["reserved"][-1])
    """)
    assert out["steps"] == 40
    assert out["x_label"] == "training step"
    assert out["xs"] == sorted(out["xs"]) and out["xs"][-1] <= 40
    assert len(out["xs"]) >= 40 // out["stride"] - 1
    assert out["reserved_last"] > 0


def test_cuda_malloc_async_degrades_to_stats_and_says_so():
    out = run_scenario("""
        s = Sampler(interval=0.05).start()
        train(20)
        time.sleep(0.3)
        s.stop()
        last = s.latest[0]
        emit(backend=torch.cuda.get_allocator_backend(), degraded=s.degraded, snapshots=s.budget.taken,
             disabled=s.budget.disabled, reserved=last.reserved, allocated=last.allocated,
             active=last.active, frag=last.fragmentation, sample_degraded=last.degraded)
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
    assert out["backend"] == "cudaMallocAsync"
    assert "cudaMallocAsync" in (out["degraded"] or "")
    assert out["snapshots"] == 0 and out["disabled"]
    assert out["reserved"] is not None and out["allocated"] is not None
    assert out["active"] is None and out["frag"] is None
    assert "cudaMallocAsync" in (out["sample_degraded"] or "")


def test_oom_observer_and_assistant_explain_a_real_oom(tmp_path):
    out = run_scenario(f"""
        from types import SimpleNamespace
        from allocconf_widget.views.widgets.oom import OomAssistant
        from allocconf_widget.app.exports import write_live_snapshot
        from allocconf_widget.core.memory.snapshot import load_snapshot

        class Events:  # the two methods of IPython's EventManager the assistant uses
            def __init__(self): self.callbacks = {{}}
            def register(self, name, fn): self.callbacks.setdefault(name, []).append(fn)
            def unregister(self, name, fn): self.callbacks[name].remove(fn)

        shell = SimpleNamespace(events=Events())
        before = OomAssistant(shell)
        attached_early = before.attach_observer()  # CUDA not up yet: must refuse
        sampler = Sampler(interval=0.02).start()
        keep = torch.ones(1, device="cuda")  # a live block: its segment survives the OOM path
        torch.cuda.set_per_process_memory_fraction(0.01)
        assistant = OomAssistant(shell)
        assistant.install()
        for fn in shell.events.callbacks["pre_run_cell"]:
            fn(None)
        try:
            torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
            error = None
        except torch.OutOfMemoryError as exc:
            error = exc
        assistant.post_run_cell(SimpleNamespace(error_in_exec=error))
        report = assistant.reports[-1]
        rounds = sampler.rounds
        time.sleep(0.3)  # the sampler lives on after the OOM
        still_sampling = sampler.running and sampler.rounds > rounds and sampler.status == OK
        ooms_seen = sampler.latest[0].num_ooms
        sampler.stop()
        path = write_live_snapshot({str(tmp_path / "oom.pickle")!r}, kind="oom").path
        emit(attached_early=attached_early, observed=report.observed is not None,
             alloc=report.observed.alloc if report.observed else None,
             rules=[a.rule for a in report.advice], headline=report.headline,
             segments=len(load_snapshot(path)["segments"]), still_sampling=still_sampling,
             ooms_seen=ooms_seen)
    """)
    assert out["attached_early"] is False
    assert out["observed"] is True and out["alloc"] >= 4 * GIB
    assert "tried to allocate 4.00 GiB" in out["headline"]
    assert out["rules"][0] == "fraction_limit"
    assert out["segments"] >= 1
    assert out["still_sampling"] is True and out["ooms_seen"] >= 1


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_one_series_per_device():
    out = run_scenario("""
        s = Sampler(interval=0.05).start()
        a = torch.empty(256 << 20, dtype=torch.uint8, device="cuda:0")
        b = torch.empty(512 << 20, dtype=torch.uint8, device="cuda:1")
        time.sleep(0.5)
        s.stop()
        peaks = [s.timeline.peaks(d)["reserved"] for d in (0, 1)]
        emit(devices=s.timeline.devices, r0=peaks[0], r1=peaks[1])
    """)
    assert out["devices"][:2] == [0, 1]
    assert out["r1"] > out["r0"] > 0


def test_a_live_snapshot_is_saved_with_the_facts_its_replay_needs(tmp_path):
    """The monitor's (and the OOM card's) Save snapshot writes a sidecar: `allocconf simulate`
    on the file then takes the torch release, the device's memory and the fraction from it."""
    out = run_scenario(f"""
        from allocconf_widget.app.exports import write_live_snapshot
        train(3)
        torch.cuda.set_per_process_memory_fraction(0.5)
        saved = write_live_snapshot({str(tmp_path / "live.pickle")!r})
        free, total = torch.cuda.mem_get_info(0)
        emit(sidecar=str(saved.sidecar), meta=json.loads(open(saved.sidecar).read()), total=total,
             version=torch.__version__)
    """)
    meta = out["meta"]
    assert out["sidecar"].endswith("live.json")
    assert meta["torch"] == out["version"] and meta["device_total_bytes"] == out["total"]
    assert meta["fraction"] == 0.5 and 0 < meta["free_at_start_bytes"] <= out["total"]
    run = subprocess.run([sys.executable, "-m", "allocconf_widget", "simulate", str(tmp_path / "live.pickle"),
                          "--no-rank", "--workers", "1"], capture_output=True, text=True, timeout=300,
                         check=False, env={**os.environ, "PYTHONPATH": CHILD_PATH})
    assert run.returncode == 0, run.stderr
    assert "from the recording's sidecar live.json" in run.stderr
    assert "device capacity unknown" not in run.stderr
