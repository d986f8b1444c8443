"""The function mode of a dry run: what fake tensors cannot do by themselves, at torch's API.

* ``.item()`` / ``float()`` / formatting a float scalar whose value the fake mode does not know
  (printing a loss) gives :data:`PLACEHOLDER` and a note naming the line: memory does not
  depend on a logged value (1.0, not 0.0: code divides by such values, e.g. Adam's bias
  correction ``1 - beta ** step``). torch's own warning that such a read "is almost definitely
  a bug" is not shown: the dry run says what it did instead;
* a gradient scaler's found-inf flag reads 0.0, the dry run's "no inf found", so
  ``scaler.step(optimizer)`` steps the optimizer as a healthy GPU step does (noted);
* setting ``.grad``, ``.data`` or ``requires_grad`` on a real tensor is noted first and undone
  when the dry run ends (:class:`.isolation.RealTensorAttributes`);
* ``scaled_dot_product_attention`` runs the kernel the profiled GPU would choose
  (:mod:`.attention`);
* in the CPU stand-in, "cuda" becomes the stand-in's device (:mod:`.standin`); on a CPU-only
  build without it, an op that would record autograd history on a fake CUDA tensor stops with
  a message (that build aborts the interpreter there).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

from allocconf_widget._errors import DryRunError
from allocconf_widget.adapters.dryrun.isolation import RealTensorAttributes, SignalsHeld
from allocconf_widget.adapters.dryrun.log import caller_line
from allocconf_widget.adapters.dryrun.ports import Notes
from allocconf_widget.adapters.dryrun.recorder import Recording
from allocconf_widget.adapters.dryrun.tensors import (
    data_dependent_errors,
    function_mode_base,
    is_fake_tensor,
    tree_leaves,
)

#: what a float the dry run cannot know reads as (``loss.item()``)
PLACEHOLDER = 1.0
#: tensor attributes whose setting on a real tensor is undone afterwards
_ATTRIBUTES = frozenset(("grad", "data", "requires_grad"))

#: calls that read or move a tensor without recording autograd history (safe on a CPU build)
_NO_AUTOGRAD = frozenset((
    "__get__", "__set__", "_has_compatible_shallow_copy_type", "to", "cuda", "detach", "detach_",
    "requires_grad_", "size", "dim", "numel", "stride", "storage_offset", "untyped_storage",
    "element_size", "is_contiguous", "is_floating_point", "is_complex", "data_ptr", "__repr__",
    "__format__", "__deepcopy__", "__reduce_ex__", "__setstate__", "__len__", "__hash__", "__eq__",
    "zero_", "fill_", "copy_", "normal_", "uniform_", "kaiming_uniform_", "new_empty",
    "new_zeros", "empty_like", "zeros_like", "ones_like", "type", "float", "half", "bfloat16",
))


def values_class(torch: ModuleType, recording: Recording, notes: Notes, attributes: RealTensorAttributes,
                 *, refuse_autograd: str | None, attention: Callable[..., Any] | None,
                 standin: Any = None, signals: SignalsHeld | None = None) -> type:
    """The function mode class for one dry run. ``refuse_autograd``: the message an op that
    would record gradients on a fake CUDA tensor stops with (a CPU-only build), or None."""
    base = function_mode_base(torch)
    floats = {torch.Tensor.item, torch.Tensor.__float__}
    fmt = torch.Tensor.__format__
    moves = {torch.Tensor.to, torch.Tensor.cuda}
    unknown = data_dependent_errors()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    requires_grad_ = torch.Tensor.requires_grad_

    def note_value(what: str) -> None:
        line = caller_line()
        notes.add(f"{what} at {line} gave {PLACEHOLDER}: a dry run has no values (memory does not "
                  "depend on it unless the code branches on it)", key=line)

    def read_value(func: Any, args: Any, kwargs: Any) -> Any:
        first = args[0]
        try:  # a constant the fake mode tracks (an optimizer's step count) has a value
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return func(*args, **kwargs)
        except unknown:
            if recording.is_found_inf(first):
                notes.add("a gradient scaler's check for inf/NaN gradients read \"none found\" (a dry run "
                          "has no values): the optimizer stepped, as on a healthy GPU step", key="found_inf")
                return 0.0 if func is not fmt else format(0.0, args[1] if len(args) > 1 else "")
            if func is fmt:
                note_value("formatting a tensor")
                return format(PLACEHOLDER, args[1] if len(args) > 1 else "")
            note_value(".item()" if func is torch.Tensor.item else "float()")
            return PLACEHOLDER

    class Values(base):  # type: ignore[misc, valid-type]
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if signals is None:
                return self._call(func, types, args, kwargs)
            signals.op_starts()  # a Ctrl-C while torch's C++ runs the op waits for its end
            try:
                return self._call(func, types, args, kwargs)
            finally:
                signals.op_ends()

        def _call(self, func: Any, _types: Any, args: Any, kwargs: Any) -> Any:
            kwargs = kwargs or {}
            first = args[0] if args else None
            if isinstance(first, torch.Tensor):
                if is_fake_tensor(first):
                    scalar = first.numel() == 1
                    if (scalar and (first.dtype.is_floating_point or recording.is_found_inf(first))
                            and (func in floats or func is fmt)):
                        return read_value(func, args, kwargs)
                elif func is requires_grad_ or (getattr(func, "__name__", "") == "__set__"
                                                and getattr(getattr(func, "__self__", None), "__name__", "")
                                                in _ATTRIBUTES):
                    name = ("requires_grad" if func is requires_grad_
                            else str(func.__self__.__name__))
                    attributes.note(first, name)
            if func is sdpa and attention is not None:
                return attention(args, kwargs)
            if standin is not None:
                return standin.call(func, args, kwargs)
            if refuse_autograd is not None:
                moved = _cpu_build_move(torch, func, moves, args, kwargs)
                if moved is not None:
                    return moved
                if torch.is_grad_enabled() and getattr(func, "__name__", "") not in _NO_AUTOGRAD:
                    _refuse_autograd(torch, args, kwargs, refuse_autograd)
            return func(*args, **kwargs)

    return Values


def _cpu_build_move(torch: ModuleType, func: Any, moves: set[Any], args: Any, kwargs: Any) -> Any:
    """``.to("cuda")`` / ``.cuda()`` on a CPU-only build: an empty fake CUDA tensor (that build
    cannot copy to a device it lacks; a dry run needs no values)."""
    if func not in moves or not args or not isinstance(args[0], torch.Tensor):
        return None
    tensor = args[0]
    if tensor.device.type == "cuda":
        return None
    rest = [*args[1:], *kwargs.values()]
    target = "cuda" if func is torch.Tensor.cuda else None
    for value in rest:
        is_device = isinstance(value, str | torch.device) and torch.device(value).type == "cuda"
        if is_device or (isinstance(value, torch.Tensor) and value.device.type == "cuda"):
            target = "cuda"
    if target is None:
        return None
    dtype = next((v for v in rest if isinstance(v, torch.dtype)), tensor.dtype)
    out = torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=dtype, device="cuda")
    return out.requires_grad_(tensor.requires_grad) if dtype.is_floating_point else out


def _refuse_autograd(torch: ModuleType, args: Any, kwargs: Any, message: str) -> None:
    for leaf in tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad and leaf.device.type == "cuda":
            raise DryRunError(message.format(line=caller_line()))
