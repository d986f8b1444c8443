"""The dry run: the user's own step on fake tensors, recorded, with nothing real touched.

Under ``FakeTensorMode`` a tensor on "cuda" has a shape, a dtype and a storage size but no
memory and no values, and dispatch follows the CUDA keys (CUDA autocast policy, the foreach
optimizer default, CUDA meta kernels). :class:`DryRun` enters, in order, the patches that keep
the user's real state as it was (:mod:`.isolation`), answer or refuse ``torch.cuda``
(:mod:`.entry_points`), take threads along (:mod:`.threads`), and the modes that record
(:mod:`.recorder`, :mod:`.values`); on exit it leaves them in reverse order. Both happen with
Ctrl-C held back, so an interrupt at any moment leaves torch exactly as it was.

Where no GPU is visible and the step trains, the CPU stand-in (:mod:`.standin`) takes the fake
CUDA tensors' place. docs/dryrun.md lists what a dry run cannot see and how far it was measured.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Any

from allocconf_widget._errors import DryRunError
from allocconf_widget.adapters.dryrun import entry_points, isolation, tensors
from allocconf_widget.adapters.dryrun.log import Log, NoteList, user_line
from allocconf_widget.adapters.dryrun.ports import Patch
from allocconf_widget.adapters.dryrun.recorder import Recording, recorder_class
from allocconf_widget.adapters.dryrun.rules import Rules, rule_notes
from allocconf_widget.adapters.dryrun.values import values_class
from allocconf_widget.core.dryrun.profiles import GpuProfile
from allocconf_widget.core.versions import parse_version

#: the oldest torch 2.x the dry run accepts (older fake-tensor modes lack what it uses)
MIN_TORCH_MINOR = 4
#: the oldest torch whose fake mode moves a tensor to a fake GPU without the CUDA runtime;
#: older releases call it (a driverless machine fails there, a GPU's would start CUDA), so
#: they dry-run on the CPU stand-in, which never names a CUDA device to torch
FAKE_CUDA_MIN = (2, 10)


@dataclass(frozen=True)
class DryRunTrace:
    """What one dry run recorded: the trace entries and what is known about them."""

    entries: list[dict[str, Any]]
    ops: int  # aten ops dispatched
    seconds: float  # wall time of the user's code under the dry run
    peak_requested: int  # largest sum of live requested bytes
    live_at_end: int  # requested bytes still allocated when the dry run ended
    profile: GpuProfile
    torch_version: str
    conf_text: str  # the allocator settings in the environment when the dry run ran
    notes: tuple[str, ...] = ()
    cuda_was_initialized: bool = False  # CUDA had started before the dry run (settings frozen)
    standin: bool = False  # recorded by the CPU stand-in (a coarser estimate)
    fraction_changes: tuple[dict[str, Any], ...] = ()  # set_per_process_memory_fraction calls
    cudnn_preferred: bool = False  # SDPA tried cuDNN attention first (core/dryrun/attention)

    @property
    def allocations(self) -> int:
        return sum(1 for e in self.entries if e["action"] == "alloc")


class DryRun:
    """``with DryRun(profile) as run: <the user's step>``, then ``run.trace``.

    Not re-entrant. Tensors created inside are fakes: they hold no memory and no values, and
    stay fakes after the block (rebuild the model for the real run). ``standin``: run on the
    CPU stand-in (a runtime without a GPU; a training step). ``progress(ops)``: called every few
    hundred ops while the step runs.
    """

    def __init__(self, profile: GpuProfile, *, frames: bool = True, rules: bool = True, standin: bool = False,
                 progress: Any = None) -> None:
        self.profile = profile
        self.trace: DryRunTrace | None = None
        self.standin = standin
        self._use_rules = rules
        self._progress = progress
        self._rules: Rules | None = None
        self._stack: contextlib.ExitStack | None = None
        self._signals: isolation.SignalsHeld | None = None
        self._log = Log(frames=frames)
        self._notes = NoteList()
        self._torch: ModuleType | None = None
        self._answers: entry_points.EntryPointsAnswered | None = None
        self._fake: Any = None
        self._start = 0.0
        self._was_initialized = False
        self._cudnn_preferred = False
        self._conf = ""

    # ------------------------------------------------------------ entering
    def __enter__(self) -> DryRun:
        import torch  # the user's step needs it anyway; importing it fixes only `backend`

        release = parse_version(str(torch.__version__))
        if release < (2, MIN_TORCH_MINOR):
            raise DryRunError(f"a dry run needs torch 2.{MIN_TORCH_MINOR} or newer (fake tensors; "
                              f"verified on 2.4, 2.6, 2.9, 2.10, 2.11 and 2.13); this is {torch.__version__}")
        if not self.standin and release < FAKE_CUDA_MIN:
            raise DryRunError(f"fake CUDA tensors need torch {FAKE_CUDA_MIN[0]}.{FAKE_CUDA_MIN[1]} or newer: "
                              f"torch {torch.__version__} calls the CUDA runtime to move a tensor to a fake "
                              "GPU, which would start CUDA. Fix: leave out standin=False (the CPU stand-in "
                              "runs this torch)")
        self._torch = torch
        signals = self._signals = isolation.SignalsHeld().__enter__()
        try:
            self._stack = self._enter_all(torch)
        except BaseException:
            signals.release()
            raise
        if signals.pending:  # a Ctrl-C came while torch was being patched: undo it all, then stop
            self._stack.close()
            self._stack = None
            signals.release()
            raise KeyboardInterrupt
        self._start = time.perf_counter()
        signals.holding = False  # the step runs: a Ctrl-C stops it (at a safe point)
        return self

    def _enter_all(self, torch: ModuleType) -> contextlib.ExitStack:
        self._was_initialized = _cuda_initialized(torch)
        self._conf = _env_conf()
        cpu_only = not _cuda_built(torch)
        notes = self._notes
        if self.standin:
            why = (f"torch {torch.__version__} has no fake CUDA tensors that leave CUDA unstarted"
                   if parse_version(str(torch.__version__)) < FAKE_CUDA_MIN else
                   "no GPU here" if not gpu_visible() else "standin=True asked for it")
            notes.add(f"a CPU stand-in (coarser estimate): {why}, so the step ran on fake CPU tensors "
                      f"counted as the CUDA memory they stand for, autocast(\"cuda\") applied with CUDA's "
                      f"rules, attention and workspaces from the {self.profile.name} profile")
        elif cpu_only:
            notes.add(f"this torch ({torch.__version__}) is a CPU-only build: the dry run follows CUDA's "
                      "dispatch but cannot record a backward pass (the CPU stand-in can)")
        if self._was_initialized:
            notes.add("CUDA had already started in this process: the allocator settings are fixed; the "
                      "prediction still holds for a fresh process")
        stack = contextlib.ExitStack()
        try:
            self._enter_patches(torch, stack, cpu_only)
        except BaseException:
            stack.close()
            raise
        return stack

    def _enter_patches(self, torch: ModuleType, stack: contextlib.ExitStack, cpu_only: bool) -> None:
        from allocconf_widget.adapters.dryrun.attention import (
            attention_function,
            attention_inside_functions,
            build_cudnn_preferred,
            cudnn_preferred_for,
        )
        from allocconf_widget.adapters.dryrun.threads import ThreadsFollowed

        notes, log = self._notes, self._log
        stack.enter_context(tensors.dispatch_keys_preserved(torch))  # exits last of all
        attributes = isolation.RealTensorAttributes()
        kept: list[Patch] = [isolation.TorchDefaultsRestored(torch), isolation.UserObjectsRestored(torch),
                             attributes, isolation.TorchWarningsQuiet(), isolation.GpuContextInitBlocked(),
                             isolation.FakeParameterSwaps(torch), isolation.FakeForeachDefault(torch)]
        for patch in kept:  # the user's state, noted before anything of the step runs
            stack.enter_context(patch)
        fake = self._fake = tensors.fake_mode()

        def in_dry_run() -> bool:
            return tensors.current_fake_mode(torch) is fake

        answers = entry_points.Answers(torch, self.profile, log, notes, self._conf)
        self._answers = stack.enter_context(entry_points.EntryPointsAnswered(torch, answers, in_dry_run))
        stack.enter_context(entry_points.compile_uncompiled(torch, notes))
        stack.enter_context(ThreadsFollowed(torch, notes, in_dry_run))
        standin = None
        if self.standin:
            from allocconf_widget.adapters.dryrun.standin import CudaAutocastOnCpu, Standin, StandinDevices

            standin = Standin(torch, log, notes)
            stack.enter_context(StandinDevices(standin))
            stack.enter_context(CudaAutocastOnCpu(torch, standin, notes))
            counted = standin.counted
            is_gpu = standin.is_gpu
        else:
            def counted(tensor: Any) -> bool:
                return bool(tensor.device.type == "cuda")

            is_gpu = counted
        build, _how = build_cudnn_preferred(torch)
        self._cudnn_preferred = cudnn_preferred_for(self.profile, build)
        attention = attention_function(torch, self.profile, notes, is_gpu, self._cudnn_preferred)
        stack.enter_context(fake)
        self._rules = (Rules(torch, log, self.profile, is_gpu, backward_thread=self.standin)
                       if self._use_rules else None)
        recording = Recording(log=log, fake=fake, rules=self._rules, counted=counted,
                              classify=standin.classify if standin is not None else None, standin=standin,
                              progress=self._progress)
        stack.enter_context(recorder_class(torch)(recording))
        refuse = None if (self.standin or not cpu_only) else (
            f"this torch ({torch.__version__}) is a CPU-only build: it cannot record gradients on fake CUDA "
            "tensors (at {line}). " + _STANDIN_HINT)
        if refuse is not None:  # that build aborts in autocast's weight cache on fake CUDA tensors
            torch.set_autocast_cache_enabled(False)
        values = values_class(torch, recording, notes, attributes, refuse_autograd=refuse,
                              attention=attention, standin=standin, signals=self._signals)()
        if standin is not None and attention is not None:  # fake CUDA tensors dispatch by CUDA's rules
            stack.enter_context(attention_inside_functions(torch, attention, values))
        stack.enter_context(values)

    # ------------------------------------------------------------ leaving
    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Stop recording and put everything back; an error the dry run caused becomes a
        :class:`DryRunError` that names the user's line (other errors pass through)."""
        torch = self._torch
        assert torch is not None
        seconds = time.perf_counter() - self._start
        signals, self._signals = self._signals, None
        assert signals is not None
        signals.holding = True  # a Ctrl-C now is delivered once everything is back
        try:
            if isinstance(exc, KeyboardInterrupt) and tb is not None:
                # a Ctrl-C landing as one of torch's context managers had entered but before its
                # ``with`` took hold leaves that generator suspended, its dispatch guards on, and
                # referenced from the traceback the shell keeps (%debug); finalized at a random later
                # moment it would reset dispatch state under the user's next training step.
                # Dropping the frames' locals finalizes it here, before the dispatch keys go back.
                traceback.clear_frames(tb)
            if self._stack is not None:
                self._stack.close()
                self._stack = None
            log = self._log
            log.close()
            self.trace = DryRunTrace(
                entries=log.entries, ops=log.ops, seconds=seconds, peak_requested=log.peak,
                live_at_end=log.current, profile=self.profile, torch_version=str(torch.__version__),
                conf_text=self._conf, notes=tuple(self._notes.items + rule_notes(self._rules)),
                cuda_was_initialized=self._was_initialized, standin=self.standin,
                fraction_changes=tuple(log.fraction_changes), cudnn_preferred=self._cudnn_preferred)
        finally:
            signals.release()
        foreign = self._answers.foreign if self._answers is not None else []
        if isinstance(exc, DryRunError):
            raise type(exc)(str(exc)) from None  # one line: not the torch frames it passed through
        if exc is None:
            if foreign:
                raise entry_points.ForeignThreadCudaError(
                    f"a thread outside the dry run tried to start CUDA while it ran ({foreign[0]}): refused, "
                    "CUDA stays down, but that thread's work is not in the estimate. Start such threads "
                    "inside the dry-run step, or stop them before it")
            return
        problem = _explain(torch, exc, tb)
        if problem is not None:
            raise problem from None


def _cuda_built(torch: ModuleType) -> bool:
    version = getattr(torch, "version", None)
    return bool(getattr(version, "cuda", None) or getattr(version, "hip", None))


def _cuda_initialized(torch: ModuleType) -> bool:
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # a broken CUDA setup must not break looking
        return False


def _env_conf() -> str:
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        value = os.environ.get(name)
        if value is not None:
            return value
    return ""


#: how a step that fake CUDA tensors cannot run here goes on
_STANDIN_HINT = ("Dry-run it on the CPU stand-in, the default where no GPU is visible (leave out "
                 "standin=False)")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""


def _explain(torch: ModuleType, exc: BaseException, tb: TracebackType | None) -> DryRunError | None:
    """Why the user's code stopped under the dry run, naming their line; None: not ours."""
    where = user_line(tb) or "a line of your code"
    if isinstance(exc, tensors.data_dependent_errors()):
        return DryRunError(f"the dry run stopped at {where}: this op needs real tensor values "
                           f"({type(exc).__name__}: {_first_line(exc)}), which a dry run does not have "
                           "(e.g. nonzero, boolean-mask indexing, .tolist(), branching on a tensor). Move "
                           "it out of the dry-run step, or use a fixed-size equivalent")
    text = str(exc)
    if "not linked with support for cuda" in text or "Torch not compiled with CUDA" in text:
        return DryRunError(
            f"the dry run stopped at {where}: this torch ({torch.__version__}) is a CPU-only build and "
            f"cannot run this op on fake CUDA tensors. {_STANDIN_HINT}")
    if "hasPrimaryContext" in text or "valid device index" in text:
        return DryRunError(
            f"the dry run stopped at {where}: the backward pass of fake CUDA tensors needs a visible GPU "
            f"(this machine has none). {_STANDIN_HINT}")
    if "Uninitialized" in text:
        return DryRunError(
            f"the dry run stopped at {where}: a lazy module's parameters (nn.LazyLinear …) cannot be "
            "made on fake tensors. Run one real forward pass on the CPU before the dry run (it "
            "materializes them), or give the layer its input size (nn.Linear)")
    if isinstance(exc, Exception) and (_raised_in_torch(torch, tb) or "tensor subclass" in text):
        return DryRunError(f"the dry run stopped at {where}: {type(exc).__name__}: {_first_line(exc)} (on "
                           "fake tensors, which have no values and no data)")
    return None


def _raised_in_torch(torch: ModuleType, tb: TracebackType | None) -> bool:
    """The innermost frame of ``tb`` is torch's own (not the user's code raising)."""
    from pathlib import Path

    root = str(Path(str(torch.__file__)).parent)
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return last is not None and last.startswith(root)


def standin_needed() -> bool:
    """Whether a dry run left to choose takes the CPU stand-in: no GPU a fake CUDA backward
    could use, or a torch whose fake CUDA tensors would start CUDA (before :data:`FAKE_CUDA_MIN`)."""
    import torch

    return not gpu_visible() or parse_version(str(torch.__version__)) < FAKE_CUDA_MIN


def gpu_visible() -> bool:
    """A CUDA build that sees a GPU (``is_available()`` asks the driver; CUDA does not start)."""
    import torch

    if not _cuda_built(torch):
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # a broken driver is no GPU
        return False
