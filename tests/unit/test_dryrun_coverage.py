"""Nothing of the step is skipped silently or run outside the dry run.

* a gradient scaler (fp16 AMP) steps the optimizer: its inf check reads "none found" (noted), so
  Adam's state is in the estimate as it is on a healthy GPU step;
* a thread the step starts (a prefetcher) runs inside the dry run: its tensors are fakes and its
  allocations are in the trace; a thread that was running before and tries to start CUDA meanwhile
  is refused, and the dry run names it;
* ``torch.cuda.empty_cache()`` is an entry of the trace that the replay releases the cache at;
* ``torch.cuda.is_available()`` is True inside (and the real answer afterwards), so
  ``"cuda" if torch.cuda.is_available() else "cpu"`` puts the step on the GPU.

On this machine (no GPU) the default is the CPU stand-in, which records training steps.
"""

from __future__ import annotations

import queue
import threading

import pytest

from allocconf_widget._errors import DryRunError
from allocconf_widget.core.units import GIB, MIB
from tests.torch_versions import needs_torch

torch = pytest.importorskip("torch")
pytestmark = needs_torch((2, 4), "the dry run")


def _adam_step(scaler_on: bool) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).to("cuda")
    opt = torch.optim.Adam(model.parameters())
    scaler = torch.amp.GradScaler("cuda", enabled=scaler_on)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(torch.randn(64, 1024, device="cuda")).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


def test_a_gradient_scaler_steps_the_optimizer_and_says_so():
    """The scaler read its found-inf flag as the placeholder 1.0 and skipped ``optimizer.step()``:
    Adam's two state buffers per parameter were missing and the step "fitted" far below."""
    import allocconf_widget

    with allocconf_widget.dry_run("t4", progress=False) as plain:
        _adam_step(scaler_on=False)
    with allocconf_widget.dry_run("t4", progress=False) as scaled:
        _adam_step(scaler_on=True)
    weights = (1024 * 4096 + 4096 + 4096 * 1024 + 1024) * 4
    # weights, gradients, and Adam's exp_avg and exp_avg_sq: four copies at the optimizer step
    assert plain.trace.peak_requested >= 4 * weights
    assert scaled.trace.peak_requested >= plain.trace.peak_requested
    assert any("gradient scaler" in n and "optimizer stepped" in n for n in scaled.all_notes())
    assert not any("gradient scaler" in n for n in plain.all_notes())


def test_a_thread_the_step_starts_runs_inside_the_dry_run():
    """A prefetcher thread ran outside the dispatch modes (they are per thread): real tensors, and
    on a GPU real CUDA; its allocations were missing from the prediction."""
    import allocconf_widget

    batches: queue.Queue = queue.Queue()
    with allocconf_widget.dry_run("t4", progress=False) as run, torch.no_grad():
        def prefetch() -> None:
            for _ in range(2):
                batches.put(torch.randn(256, 1024).to("cuda", non_blocking=True))

        worker = threading.Thread(target=prefetch, name="prefetcher")
        worker.start()
        worker.join()
        got = [batches.get_nowait() for _ in range(2)]
        assert all(type(t).__name__ == "FakeTensor" and t.device.type == "cuda" for t in got)
    sizes = [e["size"] for e in run.trace.entries if e["action"] == "alloc"]
    assert sizes.count(256 * 1024 * 4) == 2  # both batches are in the trace
    assert torch.cuda.is_initialized() is False


def test_a_thread_from_before_that_starts_cuda_meanwhile_is_refused_and_named():
    import allocconf_widget

    go, done = threading.Event(), threading.Event()
    seen: list[BaseException] = []

    def loader() -> None:
        go.wait(10)
        try:
            torch.empty(8, device="cuda")
        except BaseException as exc:
            seen.append(exc)
        done.set()

    worker = threading.Thread(target=loader, name="old-loader", daemon=True)
    worker.start()
    dry = allocconf_widget.dry_run("t4", progress=False)
    with pytest.raises(DryRunError) as caught, dry, torch.no_grad():
        torch.empty(4, device="cuda")
        go.set()
        assert done.wait(10)
    worker.join(5)
    message = str(caught.value)
    assert "'old-loader'" in message and "tried to start CUDA" in message and "\n" not in message
    assert seen and isinstance(seen[0], DryRunError)
    assert torch.cuda.is_initialized() is False


def test_empty_cache_is_in_the_trace_and_the_replay_releases_there():
    """``empty_cache()`` left nothing in the trace: a step that empties a 1 GiB cache before a
    2 GiB phase was predicted at 3 GiB reserved."""
    import allocconf_widget

    def phases(empty: bool) -> int:
        with allocconf_widget.dry_run("t4", progress=False) as run, torch.no_grad():
            first = torch.empty(GIB, dtype=torch.uint8, device="cuda")
            del first
            if empty:
                torch.cuda.empty_cache()
            torch.empty(2 * GIB, dtype=torch.uint8, device="cuda")
        return run.predict("").peak_reserved

    assert phases(empty=True) < 2 * GIB + 64 * MIB < 3 * GIB <= phases(empty=False)


def test_is_available_is_true_inside_and_the_real_answer_after():
    import allocconf_widget

    real = torch.cuda.is_available()
    with allocconf_widget.dry_run("t4", progress=False) as run, torch.no_grad():
        device = "cuda" if torch.cuda.is_available() else "cpu"
        torch.zeros(1024, device=device)
    assert device == "cuda" and run.trace.allocations == 1
    assert torch.cuda.is_available() is real


def test_threads_outside_the_dry_run_still_read_the_real_torch_cuda():
    """A monitor sampling the real allocator while a dry run runs must not read the dry run's
    answers (its allocations, its profile)."""
    import allocconf_widget

    go, done = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def monitor() -> None:
        go.wait(10)
        seen["allocated"] = torch.cuda.memory_allocated()
        seen["available"] = torch.cuda.is_available()
        done.set()

    worker = threading.Thread(target=monitor, name="monitor", daemon=True)
    worker.start()
    with allocconf_widget.dry_run("t4", progress=False), torch.no_grad():
        held = torch.empty(1 << 20, device="cuda")
        inside = (torch.cuda.memory_allocated(), torch.cuda.is_available())
        go.set()
        assert done.wait(10)
    worker.join(5)
    assert held.shape == (1 << 20,) and inside == (4 << 20, True)
    assert seen == {"allocated": 0, "available": torch.cuda.is_available()}
