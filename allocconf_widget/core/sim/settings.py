"""Settings for the allocator replay simulator, and the per-release rules they imply.

:class:`SimSettings` holds plain byte values, not option strings, so the engine
never parses anything and the same object can be built from a parsed
configuration string, from a snapshot's ``allocator_settings`` read-back, or by
hand in a test. :class:`EngineRules` turns settings plus a device size into the
handful of numbers the hot loop compares against; the release differences of
docs/internals/allocator_facts.md §6.14 live in :meth:`EngineRules.derive` and nowhere else.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from allocconf_widget.core.numbers import int_or_none
from allocconf_widget.core.units import MIB
from allocconf_widget.core.versions import SIM_DEFAULT, TorchVersion, parse_version, simulated_release

MIN_BLOCK = 512  # kMinBlockSize: rounding unit and smallest block
SMALL_SIZE = MIB  # kSmallSize: rounded sizes up to this use the small pool
SMALL_BUFFER = 2 * MIB  # kSmallBuffer: small-pool segment and expandable page
LARGE_BUFFER = 20 * MIB  # kLargeBuffer: (1, 10) MiB segment before 2.11
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc: from here segments fit the request
ROUND_LARGE = 2 * MIB  # kRoundLarge
NUM_SLOTS = 16  # kRoundUpPowerOfTwoIntervals
UNLIMITED = 1 << 64  # stands in for SIZE_MAX (max_split_size unset)



class ConfLike(Protocol):
    """What :meth:`SimSettings.from_conf` needs from ``core.config.conf``'s parsed object."""

    @property
    def torch_version(self) -> TorchVersion: ...

    def get(self, key: str) -> Any: ...


def readback_fraction(settings: Mapping[str, Any] | None) -> float | None:
    """The memory fraction ``snapshot["allocator_settings"]`` says was in force (torch releases
    that take ``per_process_memory_fraction`` in the settings string), or None."""
    s: Mapping[str, Any] = settings or {}
    fraction = _opt_float(s.get("per_process_memory_fraction"))
    if fraction is None:
        text = s.get("PYTORCH_CUDA_ALLOC_CONF")
        fraction = _opt_float(scan_conf_pairs(text if isinstance(text, str) else "").get(
            "per_process_memory_fraction"))
    return fraction if fraction is None or 0 <= fraction <= 1 else None


def round_size(n: int, slots: tuple[int, ...], division_needs_two: bool) -> int:
    """torch's ``round_size``: 512-byte rounding or power-of-two divisions.

    ``division_needs_two`` selects the newer test ``d > 1`` (a slot of 1 means
    plain 512-byte rounding); older releases tested ``d > 0`` and returned a
    size with d == 1 unrounded, which we reproduce rather than "fix".
    """
    if n < MIN_BLOCK:
        return MIN_BLOCK
    d = slots[min(max(n.bit_length() - 21, 0), NUM_SLOTS - 1)]
    if (d > 1 if division_needs_two else d > 0) and n > MIN_BLOCK * d:
        if d <= 1 or n & (n - 1) == 0:
            return n
        low = 1 << (n.bit_length() - 1)
        step = low >> (d.bit_length() - 1)
        if step == 0:
            return low << 1
        return -(-n // step) * step
    return -(-n // MIN_BLOCK) * MIN_BLOCK


@dataclass(frozen=True)
class SimSettings:
    """Allocator settings in bytes, as the simulator consumes them.

    ``None`` means "unset / torch default" where the default depends on the
    release (``max_non_split_rounding_bytes``) or means "no limit"
    (``max_split_bytes``, ``per_process_memory_fraction``).
    """

    max_split_bytes: int | None = None
    max_non_split_rounding_bytes: int | None = None
    roundup_slots: tuple[int, ...] = (0,) * NUM_SLOTS
    gc_threshold: float = 0.0
    expandable_segments: bool = False
    large_segment_bytes: int = LARGE_BUFFER
    per_process_memory_fraction: float | None = None
    throw_on_cudamalloc_oom: bool = False
    torch_version: TorchVersion = SIM_DEFAULT
    label: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        slots = tuple(int(v) for v in self.roundup_slots)
        if len(slots) != NUM_SLOTS or min(slots) < 0:
            raise ValueError("roundup_slots must be 16 non-negative ints (one per size range)")
        object.__setattr__(self, "roundup_slots", slots)
        if self.max_split_bytes is not None and self.max_split_bytes <= 0:
            raise ValueError("max_split_bytes must be positive or None")
        if not 0.0 <= self.gc_threshold < 1.0:
            raise ValueError("gc_threshold must be in [0, 1)")
        frac = self.per_process_memory_fraction
        if frac is not None and not 0.0 <= frac <= 1.0:
            raise ValueError("per_process_memory_fraction must be in [0, 1]")
        if self.large_segment_bytes <= 0:
            raise ValueError("large_segment_bytes must be positive")
        object.__setattr__(self, "torch_version", parse_version(self.torch_version))

    # ------------------------------------------------------------ constructors
    @classmethod
    def from_conf(cls, conf: ConfLike, *, label: str | None = None) -> SimSettings:
        """Build from a parsed configuration (``core.config.conf.parse_conf`` result)."""
        version = parse_version(conf.torch_version)
        backend = conf.get("backend")
        if backend not in (None, "native"):
            from allocconf_widget._errors import AllocConfError

            raise AllocConfError(
                f"backend:{backend} hands memory to the CUDA driver's pool; "
                "the replay simulator models only the native caching allocator",
                option="backend",
                fix="remove backend:... (or use backend:native) to simulate",
            )
        divisions = conf.get("roundup_power2_divisions")
        slots = tuple(divisions.slots(conf.torch_version)) if divisions is not None else None
        return cls(
            max_split_bytes=_mib(conf.get("max_split_size_mb")),
            max_non_split_rounding_bytes=_mib(conf.get("max_non_split_rounding_mb")),
            roundup_slots=slots or (0,) * NUM_SLOTS,
            gc_threshold=float(conf.get("garbage_collection_threshold") or 0.0),
            expandable_segments=bool(conf.get("expandable_segments")),
            large_segment_bytes=_mib(conf.get("large_segment_size_mb")) or LARGE_BUFFER,
            per_process_memory_fraction=_opt_float(conf.get("per_process_memory_fraction")),
            throw_on_cudamalloc_oom=bool(conf.get("throw_on_cudamalloc_oom")),
            torch_version=version,
            label=label,
        )

    @classmethod
    def from_string(cls, text: str, torch_version: Any) -> SimSettings:
        """Parse ``text`` with ``core.config.conf.parse_conf`` and convert it.

        Its traps are not warned about here: a replay says itself what a setting does (a GC
        threshold replayed under a memory fraction is not "doing nothing"), and the front end
        that took ``text`` from the user shows them where they apply (``parse_conf``'s warnings).
        """
        from allocconf_widget.core.config.conf import parse_conf

        version = simulated_release(torch_version)
        conf = parse_conf(text, torch_version=version, warn=False)
        return cls.from_conf(conf, label=text)

    @classmethod
    def from_allocator_settings(
        cls, settings: Mapping[str, Any] | None, torch_version: Any
    ) -> SimSettings:
        """Build from ``snapshot["allocator_settings"]`` (the effective read-back).

        The read-back lacks some keys (``large_segment_size_mb``,
        ``max_non_split_rounding_mb``, the 2.10+ CUDA keys); those are taken
        from the last settings string it carries, read tolerantly, because a
        malformed string there was already accepted by torch.
        """
        version = parse_version(torch_version)
        s: Mapping[str, Any] = settings or {}
        text = s.get("PYTORCH_CUDA_ALLOC_CONF")
        pairs = scan_conf_pairs(text if isinstance(text, str) else "")
        max_split = _text_int(s.get("max_split_size"))
        if max_split is None:
            max_split = _mib(_text_int(pairs.get("max_split_size_mb")))
        if max_split is not None and not 0 < max_split < (1 << 63):
            max_split = None  # -1 / SIZE_MAX: no limit (the loader refuses other values)
        non_split = _text_int(s.get("max_non_split_rounding_size", s.get("max_non_split_rounding")))
        if non_split is None:
            non_split = _mib(_text_int(pairs.get("max_non_split_rounding_mb")))
        large = _text_int(s.get("large_segment_size"))
        if large is None:
            large = _mib(_text_int(pairs.get("large_segment_size_mb")))
        gc = _opt_float(s.get("garbage_collection_threshold"))
        if gc is None:
            gc = _opt_float(pairs.get("garbage_collection_threshold"))
        expandable = s.get("expandable_segments")
        if expandable is None:
            expandable = pairs.get("expandable_segments") == "True"
        throw = s.get("throw_on_cudamalloc_oom")
        if throw is None:
            throw = pairs.get("throw_on_cudamalloc_oom") == "True"
        return cls(
            max_split_bytes=max_split,
            max_non_split_rounding_bytes=non_split,
            roundup_slots=_slots_from_readback(s.get("roundup_power2_divisions")),
            gc_threshold=gc if gc is not None and 0.0 <= gc < 1.0 else 0.0,
            expandable_segments=bool(expandable),
            large_segment_bytes=large if large is not None and 0 < large < (1 << 63) else LARGE_BUFFER,
            per_process_memory_fraction=readback_fraction(settings),
            throw_on_cudamalloc_oom=bool(throw),
            torch_version=version,
            label=_recorded_label(text, pairs, s),
        )

    def describe(self) -> str:
        """The settings as a short option string (for tables and error messages)."""
        if self.label is not None:
            return self.label or "(defaults)"
        parts: list[str] = []
        if self.max_split_bytes is not None:
            parts.append(f"max_split_size_mb:{self.max_split_bytes // MIB}")
        if self.max_non_split_rounding_bytes is not None:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding_bytes // MIB}")
        if any(self.roundup_slots):
            parts.append(f"roundup_power2_divisions:{list(self.roundup_slots)}")
        if self.gc_threshold:
            parts.append(f"garbage_collection_threshold:{self.gc_threshold}")
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.large_segment_bytes != LARGE_BUFFER:
            parts.append(f"large_segment_size_mb:{self.large_segment_bytes // MIB}")
        if self.per_process_memory_fraction is not None:
            parts.append(f"per_process_memory_fraction:{self.per_process_memory_fraction}")
        if self.throw_on_cudamalloc_oom:
            parts.append("throw_on_cudamalloc_oom:True")
        return ",".join(parts) or "(defaults)"


#: read-back keys and the option of the settings string each one comes from
_READBACK_OPTIONS = (("max_split_size", "max_split_size_mb"),
                     ("garbage_collection_threshold", "garbage_collection_threshold"),
                     ("expandable_segments", "expandable_segments"))


def _recorded_label(text: object, pairs: Mapping[str, str], readback: Mapping[str, Any]) -> str | None:
    """The recorded settings string as the row's name, where it names what is replayed: a
    string with control characters (a crafted file: escape sequences reached the terminal),
    or one the read-back values contradict (a crafted file, or torch's ``_set_allocator_settings``
    called with part of the options after the variable: the string is only the last call's)
    gives None, and :meth:`SimSettings.describe` names the values instead."""
    if not isinstance(text, str) or not text.isprintable():
        return None
    for key, option in _READBACK_OPTIONS:
        held = readback.get(key)
        if held is None:
            continue
        said = pairs.get(option)
        if key == "max_split_size":
            held_bytes = _text_int(held)
            unlimited = held_bytes is None or not 0 < held_bytes < (1 << 63)
            agrees = said is None if unlimited else _mib(_text_int(said)) == held_bytes
        elif key == "expandable_segments":
            agrees = bool(held) == (said == "True")
        else:
            agrees = _opt_float(held) == (_opt_float(said) if said is not None else 0.0)
        if not agrees:
            return None
    return text


@dataclass(frozen=True)
class EngineRules:
    """Settings resolved against a torch release and a device: what the engine compares.

    Every version-dependent decision (docs/internals/allocator_facts.md §6.14) is made here once,
    so the hot loop only reads plain numbers and flags.
    """

    slots: tuple[int, ...]
    division_needs_two: bool
    max_split: int
    oversize_slack: int
    large_segment: int
    tie_by_address: bool
    expandable: bool
    expandable_private_pools: bool
    allowed_max: int | None
    gc_threshold: float
    reject_limit: int | None
    usable: int | None
    device_total: int | None
    #: ≤ 2.9 (the ``set_fraction`` flag): any fraction sets a limit, even 1.0
    any_fraction_limits: bool = False

    @property
    def gc_enabled(self) -> bool:
        """GC runs (and the reuse clock ticks) only with a limit and a threshold."""
        return self.allowed_max is not None and self.gc_threshold > 0.0

    @classmethod
    def derive(
        cls, s: SimSettings, device_total: int | None, non_pytorch_bytes: int = 0
    ) -> EngineRules:
        """Apply the release differences table to ``s`` for a device of ``device_total`` bytes."""
        v = s.torch_version
        large_segment = s.large_segment_bytes if v >= (2, 11) else LARGE_BUFFER
        if v <= (2, 5):
            slack = LARGE_BUFFER  # constant kLargeBuffer in the oversize test
        elif s.max_non_split_rounding_bytes is not None:
            slack = s.max_non_split_rounding_bytes
        else:
            slack = large_segment if v >= (2, 11) else LARGE_BUFFER
        fraction = s.per_process_memory_fraction
        allowed_max: int | None = None
        # ≤2.9 (set_fraction flag): any call sets a limit, even 1.0; later only < 1.0.
        if fraction is not None and device_total is not None and (v <= (2, 9) or fraction < 1.0):
            allowed_max = int(fraction * device_total)
        reject_limit: int | None = None
        if s.throw_on_cudamalloc_oom and v >= (2, 12) and device_total is not None:
            reject_limit = int((1.0 if fraction is None else fraction) * device_total)
        usable = None if device_total is None else max(device_total - non_pytorch_bytes, 0)
        return cls(
            slots=s.roundup_slots,
            division_needs_two=v >= (2, 4),
            max_split=s.max_split_bytes if s.max_split_bytes is not None else UNLIMITED,
            oversize_slack=slack,
            large_segment=large_segment,
            tie_by_address=v <= (2, 11),
            expandable=s.expandable_segments and v >= (2, 1),
            expandable_private_pools=v >= (2, 11),
            allowed_max=allowed_max,
            gc_threshold=s.gc_threshold,
            reject_limit=reject_limit,
            usable=usable,
            device_total=device_total,
            any_fraction_limits=v <= (2, 9),
        )

    def with_fraction(self, fraction: float) -> EngineRules:
        """These rules after the program called ``set_per_process_memory_fraction(fraction)``
        mid-run (the trace's ``limit`` rows): the allocator's limit, and the
        ``throw_on_cudamalloc_oom`` limit that follows it, change from that call on."""
        if self.device_total is None:
            return self
        allowed = (int(fraction * self.device_total)
                   if self.any_fraction_limits or fraction < 1.0 else None)
        reject = self.reject_limit
        if reject is not None:
            reject = int(fraction * self.device_total)
        return dataclasses.replace(self, allowed_max=allowed, reject_limit=reject)

    def segment_bytes(self, rounded: int) -> int:
        """``get_allocation_size``: the size of a new classic segment for a rounded request."""
        if rounded <= SMALL_SIZE:
            return SMALL_BUFFER
        if rounded < MIN_LARGE_ALLOC:
            return self.large_segment
        return -(-rounded // ROUND_LARGE) * ROUND_LARGE

    def expandable_reserve(self) -> int:
        """VA bytes one expandable segment reserves: 9/8 of the device (big if unknown)."""
        total = self.device_total if self.device_total is not None else 1 << 44
        return total + total // 8


# ---------------------------------------------------------------- helpers
def _mib(value: int | None) -> int | None:
    return None if value is None else int(value) * MIB



def _text_int(value: Any) -> int | None:
    return int_or_none(value, from_text=True)


def _opt_float(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def scan_conf_pairs(text: str) -> dict[str, str]:
    """Split ``key:value,...`` loosely (brackets kept whole); last duplicate wins.

    Used only on strings torch already accepted (the read-back), so it does not
    validate; ``core.config.conf`` is the real parser.
    """
    pairs: dict[str, str] = {}
    depth, start = 0, 0
    text = "".join(text.split())
    for pos, ch in enumerate(text + ","):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0:
            item = text[start:pos]
            start = pos + 1
            key, sep, value = item.partition(":")
            if sep:
                pairs[key] = value
    return pairs


def _slots_from_readback(value: Any) -> tuple[int, ...]:
    """Read ``roundup_power2_divisions`` as snapshots report it (dict keyed by MiB)."""
    slots = [0] * NUM_SLOTS
    if isinstance(value, Mapping):
        for key, v in value.items():
            k = _text_int(key)
            d = _text_int(v)
            if k is None or d is None or k <= 0 or d < 0:
                continue
            slots[min(max(k.bit_length() - 1, 0), NUM_SLOTS - 1)] = d
    elif isinstance(value, list | tuple) and len(value) == NUM_SLOTS:
        slots = [max(_text_int(v) or 0, 0) for v in value]
    elif (d := _text_int(value)) is not None and d > 0:
        slots = [d] * NUM_SLOTS
    return tuple(slots)
