"""A recording's sidecar checked against its own trace: advice the trace can prove wrong is left out.

A sidecar (``<name>.json`` beside a snapshot) says what the trace cannot: the device's memory,
the memory outside PyTorch at the start, the memory fraction in force, the torch release. It is
advice from an untrusted file. Where the decoded trace shows one of its facts cannot be true,
that fact is ignored, with a note naming it, and the others are kept:

* ``device_total_bytes`` below what the trace held at once (the most it reserved, or allocated
  where segments it held before the trace began are missing), or below the device's room for
  PyTorch at its first OOM (reserved then plus the free memory torch recorded). The free memory
  and fraction read against that total go with it;
* ``free_at_start_bytes`` below what the trace held at once: the device could not have given
  the run that much;
* ``fraction``: its limit below what the run held at once (torch never lets reserved memory
  pass the limit). Not checked where the trace records the run's own fraction calls;
* ``torch``: not a release the replay models, or older than the snapshot's own fields show
  (user_metadata in trace entries is 2.11+, for instance).

Pure: the decision, no I/O; ``app/simulate.file_source`` calls :func:`check_sidecar`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from allocconf_widget._errors import AllocConfError
from allocconf_widget.core.memory.recording import IgnoredFact, SidecarRead
from allocconf_widget.core.units import format_bytes
from allocconf_widget.core.versions import simulated_release

if TYPE_CHECKING:
    from allocconf_widget.core.sim.trace.model import Trace


def check_sidecar(read: SidecarRead, trace: Trace | None, snapshot: Mapping[str, Any]) -> SidecarRead:
    """``read`` less the facts ``trace`` (decoded from ``snapshot``) contradicts, each one
    added to ``read.ignored``; ``read`` itself where there are no facts. ``trace`` None (it
    could not be decoded) checks only the torch release against the snapshot."""
    facts = read.facts
    if facts is None:
        return read
    ignored = list(read.ignored)
    changed: dict[str, Any] = {}
    version_fact = _torch_fact(facts.torch_version, snapshot)
    if version_fact is not None:
        ignored.append(version_fact)
        changed["torch_version"] = None
    total = facts.device_total_bytes
    if trace is not None and total is not None:
        peak = _peak_held(trace)
        usable = trace.inferred_usable_bytes()
        held, why = ((usable, "usable by PyTorch at its first out-of-memory error")
                     if usable is not None and usable > peak else (peak, "held at once"))
        if total < held:
            ignored.append(IgnoredFact("device_total_bytes", str(total), (
                f"the trace shows {format_bytes(held)} {why}, more than that device has; the "
                "free memory and fraction read against it go with it")))
            changed.update(device_total_bytes=None, non_pytorch_bytes=None, fraction=None,
                           limit_known=False)
            ignored = [f for f in ignored if f.key not in ("free_at_start_bytes", "fraction")]
        else:
            # against what the run held only: the room at an OOM can exceed the free memory
            # measured at the start (memory outside PyTorch can shrink meanwhile)
            if facts.non_pytorch_bytes is not None and total - facts.non_pytorch_bytes < peak:
                free = total - facts.non_pytorch_bytes
                ignored.append(IgnoredFact("free_at_start_bytes", str(free), (
                    f"the trace shows {format_bytes(peak)} held at once, more than was free")))
                changed["non_pytorch_bytes"] = None
            limit = int(facts.fraction * total) if facts.fraction is not None else None
            if limit is not None and not trace.limit_changes and limit < peak:
                ignored.append(IgnoredFact("fraction", repr(facts.fraction), (
                    f"its limit, {format_bytes(limit)} of {format_bytes(total)}, is below the "
                    f"{format_bytes(peak)} the trace shows the run held at once")))
                changed.update(fraction=None, limit_known=False)
    if not changed:
        return dataclasses.replace(read, ignored=tuple(ignored))
    return dataclasses.replace(read, facts=dataclasses.replace(facts, **changed),
                               ignored=tuple(ignored))


def _peak_held(trace: Trace) -> int:
    """The most the run held at once: its reserved peak, or its allocated peak where the trace
    lacks a start state (segments held before the trace began are then not in it)."""
    from allocconf_widget.core.sim.capacity import recorded_allocated_peak

    reserved = trace.recorded_reserved_peak()
    if trace.initial_state is not None:
        return reserved
    return max(reserved, recorded_allocated_peak(trace))


def _torch_fact(version: str | None, snapshot: Mapping[str, Any]) -> IgnoredFact | None:
    """The sidecar's torch, where it is no modelled release or older than the snapshot is."""
    if not version:
        return None
    try:
        release = simulated_release(version)
    except AllocConfError as exc:
        return IgnoredFact("torch", version, f"{exc.reason}; the rules are chosen from the trace")
    from allocconf_widget.core.sim.trace.extract import guess_torch_version

    floor, why = guess_torch_version(snapshot)
    if release.key < floor.key:
        return IgnoredFact("torch", version, f"the snapshot was written by torch {floor} or newer "
                           f"({why}); the rules are chosen from the trace")
    return None
