"""The dispatch mode that records: every new GPU storage an allocation, its finalizer the free.

A ``TorchDispatchMode`` stacked on the fake-tensor mode sees every aten op with its outputs:
each untyped storage it has not seen is an allocation of ``nbytes()`` (the size the caching
allocator is asked for), and a ``weakref.finalize`` on the storage's Python object (which
PyTorch keeps alive exactly as long as the storage) is its free. Two more things happen here
because only the dispatcher sees them:

* an op that writes to a *real* tensor (``ema.mul_(0.99)`` on a CPU copy of the weights:
  fake-tensor mode runs ops without fake inputs for real) is handed that tensor's fake
  instead, so the user's tensor keeps its values;
* the ``found_inf`` tensors a gradient scaler fills are noted, so that reading one gives the
  dry run's "no inf found" (:mod:`.values`) and the optimizer steps.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from allocconf_widget.adapters.dryrun.log import Log
from allocconf_widget.adapters.dryrun.rules import Rules, op_name
from allocconf_widget.adapters.dryrun.tensors import (
    dispatch_mode_base,
    is_fake_tensor,
    tree_leaves,
    written_arguments,
)

#: the op a gradient scaler's unscale runs; its second argument is the found-inf flag it fills
_UNSCALE = "_amp_foreach_non_finite_check_and_unscale_"
#: the recorder reports progress after this many ops
PROGRESS_EVERY = 512


@dataclass
class Recording:
    """What the recorder, the value mode and the answered ``torch.cuda`` calls share."""

    log: Log
    fake: Any  # the FakeTensorMode
    rules: Rules | None = None
    counted: Callable[[Any], bool] = field(default=lambda _t: False)
    #: in the CPU stand-in: decides which new storages stand for GPU memory
    classify: Callable[[Any, Any, Any], None] | None = None
    #: the CPU stand-in (:class:`.standin.Standin`), whose fake mode must see true devices
    standin: Any = None
    #: id → weak reference of each found-inf flag (not a WeakSet: it compares tensors with ==)
    _found_inf: dict[int, weakref.ref[Any]] = field(default_factory=dict)
    progress: Callable[[int], None] | None = None
    _written: dict[Any, tuple[tuple[int, ...], tuple[str, ...]]] = field(default_factory=dict)

    def note_found_inf(self, tensor: Any) -> None:
        self._found_inf[id(tensor)] = weakref.ref(tensor)

    def is_found_inf(self, tensor: Any) -> bool:
        held = self._found_inf.get(id(tensor))
        return held is not None and held() is tensor

    def written(self, func: Any) -> tuple[tuple[int, ...], tuple[str, ...]]:
        found = self._written.get(func)
        if found is None:
            found = self._written[func] = written_arguments(func)
        return found


def recorder_class(torch: ModuleType) -> type:
    base = dispatch_mode_base()

    def fake_of(recording: Recording, value: Any) -> Any:
        if isinstance(value, torch.Tensor) and not is_fake_tensor(value):
            return recording.fake.from_tensor(value)
        if isinstance(value, list | tuple):
            return type(value)(fake_of(recording, v) for v in value)
        return value

    class Recorder(base):  # type: ignore[misc, valid-type]
        """Gives every new GPU storage an address and an ``alloc``; its finalizer, the free."""

        def __init__(self, recording: Recording) -> None:
            super().__init__()
            self.recording = recording

        def __torch_dispatch__(self, func: Any, _types: Any, args: Any = (), kwargs: Any = None) -> Any:
            recording = self.recording
            kwargs = kwargs or {}
            positions, names = recording.written(func)
            if positions:
                args = tuple(fake_of(recording, a) if i in positions else a for i, a in enumerate(args))
                kwargs = {k: fake_of(recording, v) if k in names else v for k, v in kwargs.items()}
            rules = recording.rules
            if rules is not None:
                rules.before(func, args)
            if recording.standin is not None:
                with recording.standin.fake_dispatch():
                    out = func(*args, **kwargs)
            else:
                out = func(*args, **kwargs)
            log = recording.log
            log.ops += 1
            if recording.progress is not None and not log.ops % PROGRESS_EVERY:
                recording.progress(log.ops)
            if positions and op_name(func) == _UNSCALE and len(args) > 1:
                recording.note_found_inf(args[1])
            if recording.classify is not None:
                recording.classify(func, args, out)
            # a kernel's workspace is taken once the output it works for exists
            borrowed = rules.after(func, args, out) if rules is not None else {}
            counted = recording.counted
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor) and counted(leaf):
                    storage = leaf.untyped_storage()
                    key = id(storage)
                    size = int(storage.nbytes())
                    if key not in log.live and size > 0:  # zero bytes: no allocation
                        log.alloc(key, size)
                        log.finalizers[key] = weakref.finalize(storage, log.free, key)
                if rules is not None and borrowed:
                    workspace = borrowed.pop(id(leaf), None)
                    if workspace is not None:
                        rules.borrow(workspace)
            if rules is not None:
                for workspace in borrowed.values():  # an output that was no new allocation
                    rules.borrow(workspace)
            return out

    return Recorder
