"""Known traps: settings torch accepts that do nothing, or do harm, in combination.

These are warnings, not errors: the string is valid and the user may have
reasons. Each message says what happens and what to do about it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from allocconf_widget.core.config import options as opt
from allocconf_widget.core.versions import TorchVersion


@dataclass(frozen=True)
class ConfWarning:
    """A trap found in a configuration: a short code, the option it concerns and the explanation."""

    code: str
    option: str | None
    message: str

    def __str__(self) -> str:
        return self.message


def find_traps(values: Mapping[str, object], version: TorchVersion) -> list[ConfWarning]:
    """Warnings for ``values`` (canonical option name → parsed value) under ``version``."""
    found: list[ConfWarning] = []
    if values.get("expandable_segments") is True and "max_split_size_mb" in values:
        found.append(ConfWarning(
            "split-with-expandable", "max_split_size_mb",
            "max_split_size_mb together with expandable_segments:True can let reserved memory "
            "grow without bound while little is allocated (pytorch/pytorch#123548; a random "
            "alloc/free workload on an H200 reserved 139.24 GiB instead of 9.09 GiB). Drop "
            "max_split_size_mb: expandable segments already limit fragmentation."))
    gc = values.get("garbage_collection_threshold")
    fraction = values.get("per_process_memory_fraction")
    if gc is not None and (fraction is None or (isinstance(fraction, float) and fraction >= 1.0)):
        where = ("per_process_memory_fraction below 1 in this string, or "
                 if opt.spec_for("per_process_memory_fraction") and version >= (2, 10) else "")
        found.append(ConfWarning(
            "gc-without-fraction", "garbage_collection_threshold",
            "garbage_collection_threshold does nothing unless a memory fraction below 1 is set "
            f"({where}torch.cuda.set_per_process_memory_fraction(...) in your code); measured on "
            "an H200 it changed nothing without one."))
    if "max_non_split_rounding_mb" in values and "max_split_size_mb" not in values:
        found.append(ConfWarning(
            "rounding-without-split", "max_non_split_rounding_mb",
            "max_non_split_rounding_mb only affects blocks at or above max_split_size_mb, which "
            "is unset (unlimited), so it does nothing here."))
    if values.get("backend") == "cudaMallocAsync":
        ignored = [name for name in values
                   if (spec := opt.spec_for(name)) is not None and spec.native_only]
        if ignored:
            found.append(ConfWarning(
                "native-only-under-async", ignored[0],
                f"backend:cudaMallocAsync ignores {', '.join(ignored)}: they tune the native "
                "caching allocator only" + (" (from 2.10 torch ignores some of them silently)"
                                            if version >= (2, 10) else "")))
    cached = values.get("pinned_max_cached_size_mb")
    round_limit = values.get("pinned_max_round_threshold_mb")
    if isinstance(cached, int) and isinstance(round_limit, int) and round_limit > cached:
        found.append(ConfWarning(
            "pinned-round-above-cache", "pinned_max_round_threshold_mb",
            f"pinned_max_round_threshold_mb ({round_limit}) is above pinned_max_cached_size_mb "
            f"({cached}); blocks above the cache limit are never rounded, so the larger value "
            "has no effect beyond it."))
    return found
