"""torch's fake-tensor machinery, reached by name in one place.

The fake-tensor mode, the dispatch and function mode bases, the errors fake tensors raise where
values are needed and the per-thread mode stacks are private torch APIs. Every name the dry run
needs of them is here, each feature-detected where releases differ; ``tests/unit/
test_layering.py`` allows private torch names in this package and ``adapters/torch_private.py``
only.
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any


def dispatch_keys_preserved(torch: ModuleType) -> Any:
    """torch's ``_PreserveDispatchKeyGuard``: the thread's dispatch-key sets (what is included,
    such as Meta while a fake op runs, and excluded, such as Autograd below it) as they were on
    entry, put back on exit. A Ctrl-C between a fake op's context manager entering and its
    ``with`` taking hold leaves that generator suspended; finalized later, its own guard would
    restore the sets of *inside* an op, and autograd would stop working in the user's next
    training step. A no-op context where torch lacks it."""
    guard = getattr(getattr(torch, "_C", None), "_PreserveDispatchKeyGuard", None)
    return guard() if guard is not None else contextlib.nullcontext()


def fake_mode(device_free: bool = True) -> Any:
    """A ``FakeTensorMode`` that turns real tensors it meets into fakes (a model built on the CPU
    before the dry run can be moved to "cuda" inside it), and never touches the GPU.

    FakeTensorMode avoids the device only where no GPU is visible (``avoid_device_init``).
    With one, it *constant-propagates*: a one-element tensor made by ``torch.tensor``
    (BatchNorm's ``num_batches_tracked``, the scalars transformers builds) keeps a real value,
    and moving it to "cuda" runs the real copy on the GPU from C++, which starts the CUDA
    runtime and the caching allocator (they read and freeze ``PYTORCH_CUDA_ALLOC_CONF``) while
    ``torch.cuda.is_initialized()`` stays False (``benchmarks/gpu/probe_freeze.py``). The
    subclass always answers True, as on a machine without a GPU: constants are not copied to
    the device, and ``torch.tensor(..., device="cuda")`` stays fake.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not device_free:
        return FakeTensorMode(allow_non_fake_inputs=True)

    class DeviceFreeFakeTensorMode(FakeTensorMode):
        @property
        def avoid_device_init(self) -> bool:
            return True

        @avoid_device_init.setter
        def avoid_device_init(self, _value: bool) -> None:
            """Releases that assign it in ``__init__`` (a plain attribute there) keep ours."""

    return DeviceFreeFakeTensorMode(allow_non_fake_inputs=True)


def dispatch_mode_base() -> type:
    """``TorchDispatchMode``: sees every aten op after autograd, with its outputs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def function_mode_base(torch: ModuleType) -> type:
    """``TorchFunctionMode``: sees every torch call before C++ dispatch (``Tensor.item`` …)."""
    mode: type = torch.overrides.TorchFunctionMode
    return mode


def data_dependent_errors() -> tuple[type[BaseException], ...]:
    """The errors fake tensors raise where an op needs real values (``.item()``, ``nonzero``)."""
    from torch._subclasses import fake_tensor

    names = ("DataDependentOutputException", "DynamicOutputShapeException")
    found: list[type[BaseException]] = [getattr(fake_tensor, n) for n in names if hasattr(fake_tensor, n)]
    try:
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

        found.append(GuardOnDataDependentSymNode)
    except ImportError:
        pass
    return tuple(found)


def is_fake_tensor(value: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(value, FakeTensor)


def fake_tensor_type() -> type:
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor


def tree_leaves(value: Any) -> list[Any]:
    from torch.utils._pytree import tree_leaves as leaves

    return list(leaves(value))


def written_arguments(func: Any) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Positions and keyword names of the arguments ``func`` (an aten overload) writes to, read
    from its schema (``Tensor(a!)``); ``((), ())`` where it has no schema."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return (), ()
    positions: list[int] = []
    names: list[str] = []
    for index, argument in enumerate(schema.arguments):
        alias = argument.alias_info
        if alias is not None and alias.is_write:
            positions.append(index)
            names.append(argument.name)
    return tuple(positions), tuple(names)


# ---------------------------------------------------------------- the modes of another thread

def current_fake_mode(torch: ModuleType) -> Any:
    """The fake-tensor mode this thread runs under, or None."""
    getter = getattr(torch._C, "_get_dispatch_mode", None)
    key = getattr(getattr(torch._C, "_TorchDispatchModeKey", None), "FAKE", None)
    if getter is None or key is None:
        return None
    return getter(key)


def mode_stacks(torch: ModuleType) -> tuple[list[Any], list[Any]] | None:
    """This thread's dispatch and function mode stacks, outermost first; None where this torch
    cannot hand them to another thread."""
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        dispatch = list(_get_current_dispatch_mode_stack())
        functions = [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]
    except (ImportError, AttributeError, RuntimeError):
        return None
    return dispatch, functions


@contextlib.contextmanager
def modes_pushed(torch: ModuleType, stacks: tuple[list[Any], list[Any]]) -> Any:
    """Run the body of a new thread under ``stacks`` (:func:`mode_stacks` of the thread that
    started it): the same mode objects, pushed without entering them again (autograd's own
    worker threads inherit the caller's modes the same way)."""
    from torch.utils._python_dispatch import _pop_mode, _push_mode

    dispatch, functions = stacks
    pushed_dispatch: list[Any] = []
    pushed_functions = 0
    try:
        for mode in dispatch:
            _push_mode(mode)
            pushed_dispatch.append(mode)
        for mode in functions:
            torch._C._push_on_torch_function_stack(mode)
            pushed_functions += 1
        yield
    finally:
        for _ in range(pushed_functions):
            torch._C._pop_torch_function_stack()
        for mode in reversed(pushed_dispatch):
            _pop_mode(getattr(mode, "_mode_key", None))
