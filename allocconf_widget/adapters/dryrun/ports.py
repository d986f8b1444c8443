"""What the dry run's parts may touch: the recording, the notes, and the patches.

A dry run (:class:`.run.DryRun`) is one orchestrator and the parts it enters in order: the
patches that keep the user's real state and CUDA untouched (:mod:`.isolation`, :mod:`.threads`,
:mod:`.entry_points`), the fake-tensor modes that record (:mod:`.recorder`, :mod:`.values`) and
the rules that add what fake tensors cannot show (:mod:`.rules`, :mod:`.attention`). Typing the
parts against these Protocols states in one place what each may read or change of the others,
the way ``core/sim/ports.py`` does for the replay's slow paths; a Protocol costs nothing at run
time.
"""

from __future__ import annotations

from typing import Protocol


class TraceLog(Protocol):
    """The trace being recorded: every part that adds an entry goes through these calls."""

    ops: int  # aten ops dispatched so far
    current: int  # requested bytes live now
    peak: int  # the largest ``current`` so far

    def alloc(self, key: int, size: int, synthetic: str | None = None) -> int:
        """An allocation of ``size`` bytes known by ``key``; returns its fake address.
        ``synthetic``: added by a rule, not seen (viewers show it as the frame's name)."""

    def free(self, key: int) -> None:
        """The allocation known by ``key`` is freed (nothing when it is not live)."""

    def synthetic_key(self) -> int:
        """A key for an allocation no storage stands for (a library's workspace)."""

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()`` was called: an entry the replay reads as that call."""

    def memory_fraction(self, fraction: float) -> None:
        """``set_per_process_memory_fraction`` was called: the replay applies it from here."""

    def reset_peak(self) -> None:
        """``reset_peak_memory_stats()``: what ``max_memory_allocated`` answers starts again."""

    @property
    def peak_since_reset(self) -> int:
        """The largest ``current`` since the last :meth:`reset_peak`."""


class Notes(Protocol):
    """What the dry run tells the user beside its estimate, each said once."""

    def add(self, text: str, key: str | None = None) -> None:
        """Add ``text`` unless a note with the same ``key`` (default: the text) was added."""


class Patch(Protocol):
    """One piece of torch (or Python) machinery a dry run changes while it runs.

    ``__exit__`` puts back exactly what ``__enter__`` changed, whatever happened in between,
    and must not raise: the dry run exits every patch it entered, in reverse order, with
    Ctrl-C held back (:class:`.isolation.SignalsHeld`)."""

    def __enter__(self) -> object: ...

    def __exit__(self, *exc: object) -> None: ...
