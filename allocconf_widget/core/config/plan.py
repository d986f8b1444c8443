"""Deciding, per option, how a requested configuration can take effect in a given runtime phase.

Pure logic (no torch): the adapter feeds in the phase and what torch can do,
gets back a plan, and then carries it out. Keeping the decision here lets the
panel show "what Apply will do" for every option before anything is touched.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from allocconf_widget.core.config import options as opt
from allocconf_widget.core.config.conf import AllocConf, format_value
from allocconf_widget.core.versions import TorchVersion


class Action(enum.Enum):
    """What applying an option does, as the user should read it."""

    APPLIED_NOW = "applied now"
    AT_FIRST_CUDA_USE = "takes effect at first CUDA use"
    AT_IMPORT = "takes effect at import torch"
    NEEDS_RESTART = "needs a restart"
    NOT_SUPPORTED = "not supported by this torch"
    NO_CUDA = "no effect: this torch build has no CUDA"
    UNCHANGED = "unchanged"


@dataclass(frozen=True)
class RuntimeFacts:
    """The runtime facts the plan depends on (from ``adapters.runtime_state``)."""

    version: TorchVersion
    torch_imported: bool
    cuda_built: bool
    live: bool
    can_set_live: bool
    load_time_backend: str | None


@dataclass(frozen=True)
class OptionPlan:
    """One option's change and how it will take effect."""

    option: str
    before: str | None
    after: str | None
    action: Action
    detail: str = ""

    def __str__(self) -> str:
        before = self.before if self.before is not None else "unset"
        after = self.after if self.after is not None else "unset"
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.option}: {before} → {after}: {self.action.value}{detail}"


#: Values that restore torch's default for keys the runtime setter does not reset by itself.
#: The generic parser resets max_split_size, roundup divisions and the GC threshold (and from
#: 2.11 max_non_split_rounding) on every call; everything else keeps its last value.
_RESTORE_DEFAULT: dict[str, str] = {
    "expandable_segments": "False",
    "release_lock_on_cudamalloc": "False",
    "pinned_use_cuda_host_register": "False",
    "pinned_num_register_threads": "1",
    "pinned_use_background_threads": "False",
    "graph_capture_record_stream_reuse": "False",
    "large_segment_size_mb": "20",
    "per_process_memory_fraction": "1.0",
    "throw_on_cudamalloc_oom": "False",
    "pinned_free_catch_all": "False",
    "pinned_max_round_threshold_mb": str(opt.MAX_MIB),
    "pinned_max_cached_size_mb": str(opt.MAX_MIB),
}
_RESET_BY_SETTER = {"max_split_size_mb", "roundup_power2_divisions", "garbage_collection_threshold"}


def reset_by_setter(name: str, version: TorchVersion) -> bool:
    """Keys every setter call returns to default when the string omits them."""
    return name in _RESET_BY_SETTER or (name == "max_non_split_rounding_mb" and version >= (2, 11))


def restore_default_text(name: str, version: TorchVersion) -> str | None:
    """What to send so the setter puts ``name`` back to its default, or None if impossible."""
    if reset_by_setter(name, version):
        return ""  # omitting it is enough
    if name == "max_non_split_rounding_mb" and version >= (2, 10):
        return "20"  # 2.10 allows >= 20; 2.6–2.9 require > 20 so 20 cannot be written
    return _RESTORE_DEFAULT.get(name)


def plan_apply(current: AllocConf, requested: AllocConf, facts: RuntimeFacts) -> tuple[OptionPlan, ...]:
    """How each option that differs between ``current`` and ``requested`` will take effect."""
    plans = []
    for change in current.diff(requested):
        before = None if change.before is None else format_value(change.before)
        after = None if change.after is None else format_value(change.after)
        action, detail = _decide(change.option, after, facts)
        plans.append(OptionPlan(change.option, before, after, action, detail))
    return tuple(plans)


def _decide(name: str, after: str | None, facts: RuntimeFacts) -> tuple[Action, str]:
    spec = opt.spec_for(name)
    if spec is None or not spec.exists_in(facts.version):
        since = f" (torch {spec.releases_text()})" if spec else ""
        return Action.NOT_SUPPORTED, f"torch {facts.version} does not know {name}{since}"
    if not facts.torch_imported:
        if spec.live is opt.Live.IMPORT:
            return Action.AT_IMPORT, "read when torch is imported"
        return Action.AT_FIRST_CUDA_USE, "torch reads the variable when CUDA starts"
    if not facts.cuda_built:
        return Action.NO_CUDA, "kept in the environment for child processes and restarts"
    if spec.live is opt.Live.IMPORT:
        wanted = after or "native"
        if wanted == (facts.load_time_backend or "native"):
            return Action.UNCHANGED, f"torch already runs the {wanted} backend"
        return Action.NEEDS_RESTART, f"backend was fixed to {facts.load_time_backend} at import"
    if not facts.can_set_live:
        if facts.live:
            return Action.NEEDS_RESTART, "this torch has no runtime setter"
        return Action.AT_FIRST_CUDA_USE, "this torch has no runtime setter; set before CUDA starts"
    if after is None and restore_default_text(name, facts.version) is None:
        return Action.NEEDS_RESTART, "torch's setter cannot put this option back to its default"
    return Action.APPLIED_NOW, _live_detail(spec, facts)


def _live_detail(spec: opt.OptionSpec, facts: RuntimeFacts) -> str:
    if not facts.live:
        return "through torch's runtime setter, before CUDA starts"
    if spec.live is opt.Live.CONSTRUCTION:
        return "allocators exist already: also set through torch.cuda.set_per_process_memory_fraction"
    if spec.live is opt.Live.NEW_SEGMENTS:
        return "new segments only; existing ones keep their kind"
    if spec.live is opt.Live.PINNED:
        return "pinned host memory allocated from now on"
    return "next allocations"


def setter_string(current: AllocConf, requested: AllocConf, facts: RuntimeFacts) -> str:
    """The complete string for torch's runtime setter.

    Every call resets some options it does not mention (docs/internals/allocator_facts.md §4.5), so
    the whole requested configuration is sent, plus explicit defaults for
    options being unset that the setter would otherwise leave as they were.
    ``backend`` is left out: the setter asserts if it differs from the load-time one.
    """
    parts = [f"{k}:{format_value(v)}" for k, v in requested.items() if k != "backend"]
    for name in current:
        if name not in requested and name != "backend":
            restore = restore_default_text(name, facts.version)
            if restore:
                parts.append(f"{name}:{restore}")
    return ",".join(parts)
