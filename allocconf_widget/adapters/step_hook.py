"""One global optimizer step hook for every sampler, removed only when that is safe.

torch keeps global post-step hooks in an ``OrderedDict`` and iterates over it
inside every ``optimizer.step()``. Removing a hook from another thread while
the training thread iterates raises ``RuntimeError: OrderedDict mutated during
iteration`` *in the user's training step*, and a monitor's Stop button runs on
a widget-callback thread (a kernel subshell on ipykernel 7, docs/internals/notebook_facts.md §5),
exactly while training runs. So: one dispatcher hook per process, registered
on first use; samplers join and leave our own list (iterated as a copy); the
torch hook is removed only from the main thread when no sampler is left, and
otherwise stays registered and inert (one no-op call per step) until a later
start/stop on the main thread releases it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from allocconf_widget.adapters import torch_private

StepCallback = Callable[[Any, Any, Any], None]

_lock = threading.Lock()
_callbacks: list[StepCallback] = []
_handle: list[Any] = []  # torch's RemovableHandle of the dispatcher, when registered


def _dispatch(optimizer: Any, args: Any, kwargs: Any) -> None:
    for callback in list(_callbacks):  # a copy: samplers may leave from other threads
        callback(optimizer, args, kwargs)


def join(torch: ModuleType, callback: StepCallback) -> bool:
    """Call ``callback`` after every optimizer step; False if this torch has no global hook."""
    with _lock:
        if not _handle:
            handle = torch_private.register_step_hook(torch, _dispatch)
            if handle is None:
                return False
            _handle.append(handle)
        if callback not in _callbacks:
            _callbacks.append(callback)
    return True


def leave(callback: StepCallback) -> None:
    """Stop calling ``callback``; drop torch's hook too if that is safe now."""
    with _lock:
        while callback in _callbacks:
            _callbacks.remove(callback)
    release_if_idle()


def release_if_idle() -> bool:
    """Remove the dispatcher from torch when no sampler needs it and we are on the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    with _lock:
        if _callbacks or not _handle:
            return False
        _handle.pop().remove()
    return True


def registered() -> bool:
    """Whether the dispatcher is currently registered with torch (for tests and status)."""
    with _lock:
        return bool(_handle)
