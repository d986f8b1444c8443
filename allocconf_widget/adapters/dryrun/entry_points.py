"""The dry run's answers to ``torch.cuda``, ``torch.cuda.memory`` and ``torch.accelerator``.

``core/dryrun/entry_points.TABLE`` says, for every public name, whether the dry run answers it,
lets it run (harmless) or refuses it; :class:`EntryPointsAnswered` puts that table in force
while the dry run runs and every original back afterwards. Two more patches guard what the
table cannot list:

* ``torch.cuda._lazy_init`` (what every real CUDA start goes through, from Python and from
  torch's C++ tensor factories) refuses, naming the call, or naming the thread when a thread
  outside the dry run tries to start CUDA meanwhile;
* ``torch.compile`` returns the model unchanged (fake tensors run eagerly), with a note.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType, SimpleNamespace
from typing import Any

from allocconf_widget._errors import DryRunError
from allocconf_widget.adapters.dryrun.log import caller_line, frame_line
from allocconf_widget.adapters.dryrun.ports import Notes, TraceLog
from allocconf_widget.core.dryrun.entry_points import (
    ACCELERATOR,
    ANSWERED,
    CUDA,
    MEMORY,
    REFUSED,
    TABLE,
    lookup,
)
from allocconf_widget.core.dryrun.profiles import GpuProfile


class ForeignThreadCudaError(DryRunError):
    """A thread the dry run does not cover tried to start CUDA while it ran."""


def refusal(qualified: str, why: str) -> Callable[..., Any]:
    """A stand-in for ``qualified`` that stops the dry run with one line."""

    def refused(*_args: Any, **_kwargs: Any) -> Any:
        raise DryRunError(f"{qualified}() cannot run in a dry run ({why}); called at {caller_line()}. "
                          "Move it out of the dry-run step")

    refused.__name__ = qualified.rsplit(".", 1)[-1]
    return refused


class _ClassStandIn(type):
    """The metaclass of what stands for a class of the table (``torch.cuda.CUDAGraph``).

    A function in a class's place broke code that uses the class as a class while the step
    runs: ``torch.cuda.CUDAGraph | None`` in an annotation (transformers' generation module,
    imported lazily by ``from_pretrained``) raised TypeError, and so did ``isinstance``. The
    stand-in is a class: calling it calls the table's function inside the dry run and the
    class itself in other threads; ``isinstance``, ``issubclass``, ``X | None`` and the class's
    attributes are the original's."""

    _original: type
    _call: Callable[..., Any]
    _in_dry_run: Callable[[], bool]

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls._call(*args, **kwargs) if cls._in_dry_run() else cls._original(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._original)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls._original)

    def __getattr__(cls, name: str) -> Any:
        return getattr(cls._original, name)


def class_stand_in(original: type, call: Callable[..., Any], in_dry_run: Callable[[], bool]) -> type:
    """A class standing for ``original`` whose instances, inside the dry run, come from ``call``."""
    return _ClassStandIn(original.__name__, (), {
        "_original": original, "_call": staticmethod(call), "_in_dry_run": staticmethod(in_dry_run),
        "__module__": original.__module__, "__qualname__": original.__qualname__,
        "__doc__": original.__doc__})


def _index(torch: ModuleType, device: Any, what: str) -> int:
    """The device index ``device`` names; anything but GPU 0 is refused (one GPU is predicted)."""
    if device is None:
        return 0
    if isinstance(device, int):
        index = device
    else:
        try:
            parsed = torch.device(device) if isinstance(device, str) else device
        except (RuntimeError, TypeError):
            return 0
        index = getattr(parsed, "index", None) or 0
    if index not in (0, -1):
        raise DryRunError(f"{what}({device!r}): a dry run predicts one GPU, device 0; called at "
                          f"{caller_line()}. Dry-run the step for one GPU")
    return 0


class Answers:
    """What the answered names reply, from the profile and the recording."""

    def __init__(self, torch: ModuleType, profile: GpuProfile, log: TraceLog, notes: Notes,
                 conf_text: str) -> None:
        self.torch, self.profile, self.log, self.notes, self.conf = torch, profile, log, notes, conf_text
        self.fraction = 1.0

    # ------------------------------------------------------------ the profile
    def properties(self) -> Any:
        p = self.profile
        major, minor = p.capability
        return SimpleNamespace(name=p.name, total_memory=p.total_bytes, major=major, minor=minor,
                               multi_processor_count=p.multiprocessors, is_integrated=False,
                               is_multi_gpu_board=False, L2_cache_size=50 << 20, gcnArchName="",
                               uuid="dry-run", warp_size=32, max_threads_per_multi_processor=2048)

    def free_and_total(self) -> tuple[int, int]:
        p = self.profile
        return max(p.usable_bytes - self.log.current, 0), p.total_bytes

    def arch(self) -> str:
        major, minor = self.profile.capability
        return f"{major}{minor}"

    # ------------------------------------------------------------ the recording
    def stats(self) -> dict[str, Any]:
        log = self.log
        current, peak = log.current, log.peak_since_reset
        stats: dict[str, Any] = {"num_alloc_retries": 0, "num_ooms": 0, "num_sync_all_streams": 0}
        for kind in ("allocated_bytes", "active_bytes", "reserved_bytes", "requested_bytes"):
            stats[f"{kind}.all.current"] = current
            stats[f"{kind}.all.peak"] = peak
        return stats

    def nested_stats(self) -> dict[str, Any]:
        nested: dict[str, Any] = {}
        for key, value in self.stats().items():
            node = nested
            *parents, last = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
        return nested

    def summary(self, *_args: Any, **_kwargs: Any) -> str:
        from allocconf_widget.core.units import format_bytes

        return (f"a dry run on {self.profile.name}: {format_bytes(self.log.current)} allocated now, "
                f"{format_bytes(self.log.peak_since_reset)} at the peak (reserved memory is the "
                "replay's to predict)")

    def unmeasurable(self, name: str) -> Callable[..., int]:
        def zero(*_args: Any, **_kwargs: Any) -> int:
            self.notes.add(f"torch.cuda.{name}() read 0: a dry run has no GPU to measure", key=f"cuda.{name}")
            return 0

        return zero

    def set_fraction(self, fraction: Any, device: Any = None) -> None:
        _index(self.torch, device, "set_per_process_memory_fraction")
        if not isinstance(fraction, int | float) or not 0 <= fraction <= 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        self.fraction = float(fraction)
        self.log.memory_fraction(float(fraction))

    def empty_cache(self, *_args: Any) -> None:
        self.log.empty_cache()

    def elapsed(self, *_args: Any) -> float:
        self.notes.add("a CUDA event's elapsed_time() read 0.0: a dry run has no timings", key="elapsed")
        return 0.0

    def rng_state(self, *_args: Any) -> Any:
        return self.torch.zeros(16, dtype=self.torch.uint8, device="cpu")

    def history(self, *_args: Any, **_kwargs: Any) -> None:
        self.notes.add("torch.cuda.memory._record_memory_history() did nothing: the dry run records every "
                       "allocation anyway (run.save() writes the snapshot)", key="history")

    def backend(self) -> str:
        return "cudaMallocAsync" if "cudaMallocAsync" in self.conf.replace(" ", "") else "native"

    def functions(self) -> dict[str, Callable[..., Any]]:
        """Each answered name's function (classes included), by name; the table says which
        module holds which."""
        torch, p = self.torch, self.profile
        major, minor = p.capability
        device_cls, stream_cls = _device_class(torch), _stream_class(torch, self)
        event_cls = _event_class(self)
        dtypes = {torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
                  torch.int16, torch.int32, torch.int64, torch.bool}

        def one_gpu(what: str) -> Callable[..., int]:
            return lambda device=None, *_a: _index(torch, device, what)

        def no_op(*_args: Any, **_kwargs: Any) -> None:
            return None

        answers: dict[str, Callable[..., Any]] = {
            "get_device_properties": lambda *_a, **_k: self.properties(),
            "get_device_capability": lambda *_a, **_k: (major, minor),
            "get_device_name": lambda *_a, **_k: p.name,
            "is_bf16_supported": lambda including_emulation=True: including_emulation or p.bf16_native,
            "is_tf32_supported": lambda: p.capability >= (8, 0),
            "get_arch_list": lambda: [f"sm_{self.arch()}"],
            "get_gencode_flags": lambda: f"-gencode compute=compute_{self.arch()},code=sm_{self.arch()}",
            "mem_get_info": lambda *_a, **_k: self.free_and_total(),
            "is_available": lambda *_a, **_k: True,
            "device_count": lambda *_a, **_k: 1,
            "current_device": lambda *_a: 0,
            "set_device": one_gpu("set_device"),
            "device": device_cls,
            "device_of": lambda _obj: device_cls(None),
            "can_device_access_peer": lambda *_a: False,
            "memory_allocated": lambda *_a, **_k: self.log.current,
            "max_memory_allocated": lambda *_a, **_k: self.log.peak_since_reset,
            "memory_reserved": lambda *_a, **_k: self.log.current,
            "max_memory_reserved": lambda *_a, **_k: self.log.peak_since_reset,
            "memory_cached": lambda *_a, **_k: self.log.current,
            "max_memory_cached": lambda *_a, **_k: self.log.peak_since_reset,
            "memory_stats": lambda *_a, **_k: self.stats(),
            "memory_stats_as_nested_dict": lambda *_a, **_k: self.nested_stats(),
            "memory_summary": self.summary,
            "memory_snapshot": lambda *_a, **_k: [],
            "device_memory_used": lambda *_a, **_k: self.log.current + p.context_bytes,
            "list_gpu_processes": lambda *_a, **_k: "GPU:0\nno processes (a dry run)",
            "reset_peak_memory_stats": lambda *_a: self.log.reset_peak(),
            "reset_max_memory_allocated": lambda *_a: self.log.reset_peak(),
            "reset_max_memory_cached": lambda *_a: self.log.reset_peak(),
            "reset_accumulated_memory_stats": no_op,
            "empty_cache": self.empty_cache,
            "set_per_process_memory_fraction": self.set_fraction,
            "get_per_process_memory_fraction": lambda *_a: self.fraction,
            "Stream": stream_cls,
            "Event": event_cls,
            "StreamContext": _stream_context_class(),
            "stream": lambda stream=None: _stream_context_class()(stream),
            "current_stream": lambda *_a, **_k: stream_cls(),
            "default_stream": lambda *_a, **_k: stream_cls(),
            "set_stream": no_op,
            "is_current_stream_capturing": lambda: False,
            "synchronize": no_op,
            "ipc_collect": no_op,
            "set_sync_debug_mode": no_op,
            "get_sync_debug_mode": lambda: 0,
            "get_rng_state": self.rng_state,
            "get_rng_state_all": lambda: [self.rng_state()],
            "set_rng_state": no_op,
            "set_rng_state_all": no_op,
            "initial_seed": lambda: int(torch.initial_seed()),
            "host_memory_stats": lambda: {},
            "host_memory_stats_as_nested_dict": lambda: {},
            "reset_accumulated_host_memory_stats": no_op,
            "reset_peak_host_memory_stats": no_op,
            "get_allocator_backend": self.backend,
            "check_error": _check_error,
            "_record_memory_history": self.history,
        }
        for name in ("utilization", "memory_usage", "temperature", "power_draw", "clock_rate"):
            answers[name] = self.unmeasurable(name)
        accelerator: dict[str, Callable[..., Any]] = {
            "current_accelerator": lambda *_a, **_k: torch.device("cuda"),
            "get_device_capability": lambda *_a: {"supported_dtypes": set(dtypes)},
            "get_memory_info": lambda *_a: self.free_and_total(),
            "current_device_idx": lambda *_a: 0,
            "current_device_index": lambda *_a: 0,
            "set_device_idx": one_gpu("torch.accelerator.set_device_idx"),
            "set_device_index": one_gpu("torch.accelerator.set_device_index"),
            "device_index": device_cls,
            "empty_host_cache": no_op,
        }
        return {**answers, **{f"{ACCELERATOR}.{k}": v for k, v in accelerator.items()}}


def _check_error(res: int) -> None:
    if res != 0:
        raise RuntimeError(f"CUDA error: status {res}")


def _device_class(torch: ModuleType) -> type:
    class DryDevice:
        """``with torch.cuda.device(0):`` in a dry run: device 0, nothing to switch."""

        def __init__(self, device: Any = None) -> None:
            self.idx = _index(torch, device, "torch.cuda.device")

        def __enter__(self) -> DryDevice:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    return DryDevice


def _stream_context_class() -> type:
    class DryStreamContext:
        """``with torch.cuda.stream(s):`` in a dry run: every allocation stays on stream 0."""

        def __init__(self, stream: Any = None) -> None:
            self.stream = stream

        def __enter__(self) -> Any:
            return self.stream

        def __exit__(self, *exc: object) -> None:
            return None

    return DryStreamContext


def _stream_class(torch: ModuleType, answers: Answers) -> type:
    event_cls = _event_class(answers)

    class DryStream:
        """A stream of a dry run: waits and records do nothing (fake tensors have no work)."""

        cuda_stream = 0
        stream_id = 0
        device_index = 0
        device_type = 1

        def __init__(self, device: Any = None, priority: int = 0, **_kwargs: Any) -> None:
            _index(torch, device, "torch.cuda.Stream")
            self.device = torch.device("cuda", 0)
            self.priority = priority

        def wait_event(self, _event: Any) -> None:
            return None

        def wait_stream(self, _stream: Any) -> None:
            return None

        def record_event(self, event: Any = None) -> Any:
            return event if event is not None else event_cls()

        def query(self) -> bool:
            return True

        def is_capturing(self) -> bool:
            return False

        def synchronize(self) -> None:
            return None

        def __enter__(self) -> DryStream:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    return DryStream


def _event_class(answers: Answers) -> type:
    class DryEvent:
        """An event of a dry run: recorded and waited on at once, no timings."""

        def __init__(self, enable_timing: bool = False, **_flags: bool) -> None:
            self.enable_timing = enable_timing

        def record(self, _stream: Any = None) -> None:
            return None

        def wait(self, _stream: Any = None) -> None:
            return None

        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            return None

        def elapsed_time(self, _end: Any) -> float:
            return answers.elapsed()

        def ipc_handle(self) -> Any:
            return refusal("torch.cuda.Event.ipc_handle", "needs the driver (starts CUDA)")()

    return DryEvent


class EntryPointsAnswered:
    """While entered, every name of the table does what the table says (a :class:`.ports.Patch`).

    ``in_dry_run()`` says whether the calling thread runs inside the dry run (its modes are
    pushed); a CUDA start from any other thread is refused and remembered (:attr:`foreign`)."""

    def __init__(self, torch: ModuleType, answers: Answers, in_dry_run: Callable[[], bool]) -> None:
        self._torch = torch
        self._answers = answers
        self._in_dry_run = in_dry_run
        self._saved: list[tuple[Any, str, Any]] = []
        self.foreign: list[str] = []

    def _set(self, owner: Any, name: str, value: Any, *, every_thread: bool = False) -> None:
        """Put ``value`` in place of ``owner.name`` for threads inside the dry run; other threads
        (a monitor sampling the real allocator) still reach torch's own function, unless
        ``every_thread``. A class answered by a class is replaced for all threads (``isinstance``
        needs a class); one answered or refused by a function gets a :func:`class_stand_in`."""
        if owner is None or not hasattr(owner, name):
            return
        original = getattr(owner, name)
        self._saved.append((owner, name, original))
        if isinstance(original, type) and not isinstance(value, type):
            setattr(owner, name, class_stand_in(original, value, self._in_dry_run))
            return
        if every_thread or isinstance(value, type) or not callable(original):
            setattr(owner, name, value)
            return
        in_dry_run = self._in_dry_run

        def chosen(*args: Any, **kwargs: Any) -> Any:
            return value(*args, **kwargs) if in_dry_run() else original(*args, **kwargs)

        chosen.__name__ = getattr(original, "__name__", name)
        chosen.__doc__ = getattr(original, "__doc__", None)
        setattr(owner, name, chosen)

    def __enter__(self) -> EntryPointsAnswered:
        torch = self._torch
        try:
            self._patch(torch)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _patch(self, torch: ModuleType) -> None:
        modules = {CUDA: torch.cuda, MEMORY: sys.modules.get("torch.cuda.memory"),
                   ACCELERATOR: getattr(torch, "accelerator", None)}
        answers = self._answers.functions()
        for row in TABLE:
            owner = modules.get(row.module)
            if row.kind == ANSWERED:
                key = f"{ACCELERATOR}.{row.name}" if row.module == ACCELERATOR and \
                    f"{ACCELERATOR}.{row.name}" in answers else row.name
                self._set(owner, row.name, answers[key])
            elif row.kind == REFUSED:
                self._set(owner, row.name, refusal(row.qualified, row.what))
        for module_name, owner in modules.items():  # a newer torch's names the table lacks
            for name in getattr(owner, "__all__", ()):
                value = getattr(owner, name, None)
                unknown = lookup(module_name, name) is None
                if unknown and callable(value) and not isinstance(value, ModuleType):
                    self._set(owner, name, refusal(f"{module_name}.{name}", "not in the dry run's table "
                                                   "of torch.cuda calls"))
        original = getattr(torch.cuda, "_lazy_init", None)
        if original is not None:
            guard = self._lazy_init_guard()
            for name, module in list(sys.modules.items()):
                if (name == "torch.cuda" or name.startswith("torch.cuda.")) and \
                        getattr(module, "_lazy_init", None) is original:
                    self._set(module, "_lazy_init", guard, every_thread=True)

    def _lazy_init_guard(self) -> Callable[[], None]:
        def refused() -> None:
            if self._in_dry_run():
                raise DryRunError(f"this call would start CUDA (and fix the allocator settings), which a "
                                  f"dry run must not; called at {caller_line()}. Move it out of the "
                                  "dry-run step")
            thread = threading.current_thread()
            line = frame_line(sys._getframe(1))
            self.foreign.append(f"{thread.name!r} at {line}")
            raise ForeignThreadCudaError(
                f"a thread outside the dry run ({thread.name!r}) tried to start CUDA at {line} while the "
                "dry run ran: refused (CUDA stays down). Start such threads inside the dry-run step, or "
                "stop them before it")

        return refused

    def __exit__(self, *exc: object) -> None:
        while self._saved:
            owner, name, value = self._saved.pop()
            setattr(owner, name, value)


@contextmanager
def compile_uncompiled(torch: ModuleType, notes: Notes) -> Iterator[None]:
    """``torch.compile`` returns the model (or the decorator) unchanged, with a note."""

    def compile_stub(model: Any = None, **_options: Any) -> Any:
        notes.add("torch.compile ran uncompiled (eager) in the dry run: compiled kernels allocate "
                  "differently (usually less)", key="compile")
        return model if model is not None else (lambda fn: fn)

    saved = getattr(torch, "compile")  # noqa: B009  (a module given as a parameter)
    setattr(torch, "compile", compile_stub)  # noqa: B010
    try:
        yield
    finally:
        setattr(torch, "compile", saved)  # noqa: B010
