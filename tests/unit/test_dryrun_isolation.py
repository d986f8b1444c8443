"""A dry run leaves the user's real state exactly as it was, whatever happens: a property.

The step below does what the dry run must not let through (in-place arithmetic with a Python
number on a real tensor held outside the notebook's names, a seed, schedulers that rewrite the
user's own optimizer's groups, a model switched to eval, a thread, ``empty_cache()``, a memory
fraction, a real optimizer stepping). Each example interrupts it with a real SIGINT (Ctrl-C) at a
randomly drawn point, the dry run's own start and finish included, or not at all; afterwards a
fingerprint of every real tensor's values and flags, every generator, the optimizer's groups and
state, the model's flags, torch's thread state and every function the dry run patches must equal
the one taken before, and torch must still compute and differentiate on real tensors.
"""

from __future__ import annotations

import random
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.torch_versions import needs_fake_cuda, needs_torch

torch = pytest.importorskip("torch")
pytestmark = needs_torch((2, 4), "the dry run")

PACKAGE = str(Path(__file__).resolve().parents[2] / "allocconf_widget")
HERE = str(Path(__file__).resolve())


class World:
    """The user's real objects, held the ways notebooks hold them."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.model(torch.randn(2, 8)).sum().backward()
        self.opt.step()  # real momentum buffers
        self.ema = {"weight": self.model[0].weight.detach().clone()}
        self.frozen = torch.ones(3, requires_grad=True)

    def tensors(self) -> dict[str, Any]:
        found = {f"param.{n}": p for n, p in self.model.named_parameters()}
        found["ema"] = self.ema["weight"]
        found["frozen"] = self.frozen
        for i, state in enumerate(self.opt.state.values()):
            found[f"momentum.{i}"] = state["momentum_buffer"]
        return found


def _patched_objects() -> dict[str, Any]:
    """Every function or attribute a dry run replaces, by name."""
    import importlib

    import torch.cuda.memory

    try:
        table = importlib.import_module("allocconf_widget.core.dryrun.entry_points").TABLE
    except ImportError:  # a release without the table: the functions named below still count
        table = ()

    owners = {"torch.cuda": torch.cuda, "torch.cuda.memory": torch.cuda.memory,
              "torch.accelerator": getattr(torch, "accelerator", None)}
    found = {row.qualified: getattr(owners[row.module], row.name, None) for row in table}
    from torch._subclasses import fake_tensor

    for name, module in sys.modules.items():
        if name == "torch.cuda" or name.startswith("torch.cuda."):
            found[f"{name}._lazy_init"] = getattr(module, "_lazy_init", None)
    found.update({
        "torch.compile": torch.compile, "init_gpu_context": getattr(fake_tensor, "init_gpu_context", None),
        "Module._apply": torch.nn.Module._apply, "swap_tensors": torch.utils.swap_tensors,
        "utils.weakref": getattr(torch.utils, "weakref"),  # noqa: B009 "Thread.start": threading.Thread.start,
        "FakeTensor.device": fake_tensor.FakeTensor.__dict__["device"],
        "autocast.__enter__": torch.amp.autocast_mode.autocast.__enter__,
        "autocast.__exit__": torch.amp.autocast_mode.autocast.__exit__,
        "foreach types": tuple(sys.modules["torch.optim.optimizer"]._foreach_supported_types),
        "SIGINT": signal.getsignal(signal.SIGINT),
    })
    return {k: v if isinstance(v, tuple) else id(v) for k, v in found.items()}


def fingerprint(world: World) -> dict[str, Any]:
    tensors = {}
    for name, t in world.tensors().items():
        grad = t.grad.detach().clone() if t.grad is not None else None
        tensors[name] = (type(t).__name__, t.detach().clone(), t.requires_grad, grad, t.device.type)
    groups = [({k: v for k, v in g.items() if k != "params"}, [id(p) for p in g["params"]])
              for g in world.opt.param_groups]
    state = {id(p): {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in s.items()}
             for p, s in world.opt.state.items()}
    tracker = torch.cuda._lazy_seed_tracker
    return {
        "tensors": tensors,
        "cpu rng": torch.get_rng_state().clone(),
        "python rng": random.getstate(),
        "cuda queue": [call for call, _ in torch.cuda._queued_calls],
        "cuda seeds": {k: (v[0] if isinstance(v, tuple) else v) for k, v in vars(tracker).items()
                       if not isinstance(v, list)},
        "groups": groups, "opt attrs": sorted(vars(world.opt)), "state": state,
        "modules": [(m.training, sorted(m._parameters), sorted(vars(m))) for m in world.model.modules()],
        "params": [id(p) for p in world.model.parameters()],
        "grad mode": torch.is_grad_enabled(), "default dtype": torch.get_default_dtype(),
        "meta flag": torch._C._meta_in_tls_dispatch_include(),
        "autocast": (torch.is_autocast_enabled("cuda"), torch.is_autocast_enabled("cpu"),
                     torch.is_autocast_cache_enabled()),
        "cuda started": torch.cuda.is_initialized(),
        "patches": _patched_objects(),
    }


def assert_same(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert before.keys() == after.keys()
    for key, was in before.items():
        now = after[key]
        if key == "tensors":
            assert was.keys() == now.keys()
            for name, (kind, value, grad_flag, grad, device) in was.items():
                kind2, value2, grad_flag2, grad2, device2 = now[name]
                assert (kind, grad_flag, device) == (kind2, grad_flag2, device2), name
                assert torch.equal(value, value2), f"{name} changed"
                assert (grad is None) == (grad2 is None) and (grad is None or torch.equal(grad, grad2)), name
        elif key == "cpu rng":
            assert torch.equal(was, now), key
        elif key == "state":
            assert was.keys() == now.keys()
            for p, values in was.items():
                for k, v in values.items():
                    other = now[p][k]
                    assert torch.equal(v, other) if isinstance(v, torch.Tensor) else v == other, (key, k)
        else:
            assert was == now, key


def torch_still_works() -> None:
    assert torch.equal(torch.ones(3) + 1, torch.full((3,), 2.0))
    weight = torch.ones(2, requires_grad=True)
    (weight * 3).sum().backward()
    assert torch.equal(weight.grad, torch.full((2,), 3.0))


def step(world: World, *, standin: bool) -> None:
    """Everything a dry-run step must not do to the real world (see the module docstring)."""
    world.ema["weight"].mul_(0.99)
    world.ema["weight"].add_(1.0)
    world.frozen.requires_grad_(False)
    torch.manual_seed(7)
    random.seed(7)
    torch.optim.lr_scheduler.OneCycleLR(world.opt, max_lr=1.0, total_steps=10)
    torch.optim.lr_scheduler.CyclicLR(world.opt, 0.01, 0.1)
    world.model.eval()
    model = world.model.to("cuda")
    made: list[Any] = []
    worker = threading.Thread(target=lambda: made.append(torch.empty(64, device="cuda")), name="prefetch")
    worker.start()
    worker.join()
    torch.cuda.set_per_process_memory_fraction(0.5)
    batch = torch.randn(4, 8, device="cuda")
    if standin:
        model(batch).sum().backward()
        world.opt.step()
    else:
        with torch.no_grad():
            model(batch)
    torch.cuda.empty_cache()


class InterruptAt:
    """Deliver a real SIGINT at the ``n``-th traced event (a call anywhere, or a line of ours or of
    this test), as a Ctrl-C lands at whatever bytecode runs then; ``n`` None: count only."""

    def __init__(self, n: int | None) -> None:
        self.n = n
        self.count = 0
        self.marks: list[int] = []
        self._previous: Any = None

    def mark(self) -> None:
        """Note where the step starts and ends (the dry run's own start and finish lie outside)."""
        self.marks.append(self.count)

    def _local(self, _frame: Any, _event: str, _arg: Any) -> Any:
        self._tick()
        return self._local if self.n is None or self.count < self.n else None

    def _global(self, frame: Any, _event: str, _arg: Any) -> Any:
        self._tick()
        name = frame.f_code.co_filename
        if name.startswith(PACKAGE) or name == HERE:
            return self._local
        return None

    def _tick(self) -> None:
        self.count += 1
        if self.n is not None and self.count == self.n:
            signal.raise_signal(signal.SIGINT)

    def __enter__(self) -> InterruptAt:
        self._previous = sys.gettrace()  # a coverage tool's, if one runs
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self._previous)


def _dry_run(standin: bool) -> Any:
    import inspect

    import allocconf_widget

    takes = inspect.signature(allocconf_widget.dry_run).parameters
    options = {k: v for k, v in {"standin": standin, "progress": False}.items() if k in takes}
    return allocconf_widget.dry_run("t4", **options)


def run_once(world: World, *, standin: bool, at: int | None) -> InterruptAt:
    tracer = InterruptAt(at)
    try:
        with tracer, _dry_run(standin):
            tracer.mark()
            step(world, standin=standin)
            tracer.mark()
    except KeyboardInterrupt:
        pass
    except Exception:  # the step stopped with an error: the property holds after any exit
        tracer.marks += [tracer.count] * (2 - len(tracer.marks))
    return tracer


@pytest.fixture(scope="module")
def events() -> dict[bool, tuple[int, int, int]]:
    """Where one uninterrupted dry run of the step starts the step, ends it, and ends, counted in
    traced events, per kind."""
    found = {}
    for standin in (True, False):
        tracer = run_once(World(), standin=standin, at=None)
        found[standin] = (tracer.marks[0], tracer.marks[1], tracer.count)
    return found


#: where an interrupt lands: the dry run's own start, the user's step, its own finish
PHASES = ("start", "step", "finish")


# a Ctrl-C that lands inside a finalizer (a storage freed) is reported by Python as unraisable,
# as it is in a notebook: it is lost, not a state left changed
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(standin=st.booleans(), phase=st.sampled_from((*PHASES, "none")), where=st.floats(0.0, 1.0))
def test_real_state_is_exactly_as_before_after_any_interrupt(events, standin, phase, where):
    start, end, total = events[standin]
    bounds = {"start": (1, start), "step": (start, end), "finish": (end, total + 1)}
    at = None
    if phase != "none":
        low, high = bounds[phase]
        at = low + int(where * max(high - low - 1, 0))
    world = World()
    before = fingerprint(world)
    run_once(world, standin=standin, at=at)
    assert_same(before, fingerprint(world))
    torch_still_works()


def test_the_step_changes_everything_the_fingerprint_reads_when_run_for_real():
    """The property is not vacuous: outside a dry run, the same operations on real tensors
    change the fingerprint (the EMA, the seeds, the optimizer's groups, the model's flags)."""
    world = World()
    before = fingerprint(world)
    world.ema["weight"].mul_(0.99)
    torch.manual_seed(7)
    torch.optim.lr_scheduler.OneCycleLR(world.opt, max_lr=1.0, total_steps=10)
    world.model.eval()
    after = fingerprint(world)
    for key in ("cpu rng", "groups", "modules"):
        with pytest.raises(AssertionError):
            assert_same({key: before[key]}, {key: after[key]})
    assert not torch.equal(before["tensors"]["ema"][1], after["tensors"]["ema"][1])


@pytest.mark.parametrize("standin", [True, pytest.param(False, marks=needs_fake_cuda)])
def test_without_an_interrupt_the_step_runs_to_its_end_and_is_recorded(standin):
    import allocconf_widget

    world = World()
    before = fingerprint(world)
    with allocconf_widget.dry_run("t4", standin=standin, progress=False) as run:
        step(world, standin=standin)
    assert_same(before, fingerprint(world))
    actions = [e["action"] for e in run.trace.entries]
    assert actions.count("segment_free") == 1  # empty_cache(), in the trace
    assert run.trace.fraction_changes and run.trace.fraction_changes[0]["fraction"] == 0.5
    assert torch.cuda.is_initialized() is False


@pytest.mark.parametrize("standin", [True, pytest.param(False, marks=needs_fake_cuda)])
def test_a_ctrl_c_inside_an_ops_dispatch_stops_the_step_and_the_process_lives(standin):
    """torch's C++ calls back into Python while an op runs (``__torch_dispatch__``); an
    exception raised there can end the process. A Ctrl-C landing there stops the step once the
    op returns instead, and everything is as before."""
    import allocconf_widget

    landed: list[str] = []

    def interrupt_in_dispatch(frame: Any, _event: str, _arg: Any) -> None:
        if not landed and frame.f_code.co_name == "__torch_dispatch__":
            landed.append(frame.f_code.co_filename)
            signal.raise_signal(signal.SIGINT)

    world = World()
    before = fingerprint(world)
    finished = False
    previous = sys.gettrace()
    with pytest.raises(KeyboardInterrupt), allocconf_widget.dry_run("t4", standin=standin, progress=False):
        sys.settrace(interrupt_in_dispatch)
        try:
            step(world, standin=standin)
            finished = True
        finally:
            sys.settrace(previous)
    assert landed and not finished
    assert_same(before, fingerprint(world))
    torch_still_works()
