"""Names, colours and number formats shared by the plotly charts and the inline-SVG charts.

Both renderers draw the same timeline, so a user switching between them (or
between JupyterLab and Colab) sees the same colours, labels and units.
"""

from __future__ import annotations

import math

from allocconf_widget.core.units import GIB, KIB, MIB, TIB, format_bytes

BYTE_SERIES: tuple[str, ...] = ("reserved", "allocated", "active", "non_pytorch")
"""Byte series drawn on the left axis, back to front."""
RATIO_SERIES: tuple[str, ...] = ("cached_share", "fragmentation")
"""Ratio series drawn on the right axis (a share, in percent)."""

LABELS = {
    "reserved": "reserved",
    "allocated": "allocated",
    "active": "active",
    "requested": "requested",
    "non_pytorch": "non-PyTorch",
    "cached_share": "cached, unallocated (% of reserved)",
    "fragmentation": "external fragmentation",
}

HELP = {
    "reserved": "memory PyTorch's caching allocator holds from the GPU (what runs out)",
    "allocated": "memory occupied by live tensors (rounded to allocator blocks)",
    "active": "allocated plus blocks freed but still used by another stream",
    "non_pytorch": "GPU memory outside PyTorch's allocator: CUDA context, libraries"
    " (device-wide figures also include other processes)",
    "cached_share": "(reserved − allocated) / reserved: cached memory no tensor uses",
    "fragmentation": "1 − largest free block / free cached memory, from a memory snapshot",
}

COLORS = {
    "reserved": "#1f77b4",
    "allocated": "#ff7f0e",
    "active": "#d62728",
    "requested": "#bcbd22",
    "non_pytorch": "#7f7f7f",
    "cached_share": "#9467bd",
    "fragmentation": "#2ca02c",
    "oom": "#d62728",
    "unsure": "#e6a700",  # a setting whose outcome the replay cannot decide (handler, timing, path)
    "cell": "rgba(31,119,180,0.10)",
    "note": "#8c8c8c",
    "idle": "rgba(140,140,140,0.18)",
}

STATE_COLORS = {
    "active_allocated": "#ff7f0e",
    "active_pending_free": "#d62728",
    "inactive": "#c7d7ea",
}
STATE_LABELS = {
    "active_allocated": "allocated",
    "active_pending_free": "pending free (other stream)",
    "inactive": "free (cached)",
}

_BYTE_UNITS = ((TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB"), (1, "B"))


def byte_unit(peak: float) -> tuple[int, str]:
    """The binary unit to label an axis whose values reach ``peak`` bytes."""
    for factor, name in _BYTE_UNITS:
        if peak >= factor:
            return factor, name
    return 1, "B"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (1, 2, 5 × 10ⁿ) covering ``[lo, hi]``."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0]
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, count)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    return ticks


def format_tick(value: float) -> str:
    """Short tick text: ``2``, ``2.5``, ``0.25``."""
    if value == int(value):
        return f"{int(value)}"
    return f"{value:.2f}".rstrip("0").rstrip(".")


def format_x(value: float, x_label: str) -> str:
    """Seconds as ``<s> s`` below two minutes, then ``m:ss`` / ``h:mm:ss``; steps as plain numbers."""
    if "step" in x_label:
        return f"{int(value):,}"
    if value < 120:
        return f"{value:.0f} s" if value >= 10 or value == int(value) else f"{value:.1f} s"
    minutes, seconds = divmod(int(value), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def format_value(name: str, value: float | None) -> str:
    """A series value for a status line or legend: bytes or a percentage."""
    if value is None:
        return "n/a"
    if name in RATIO_SERIES:
        return f"{value * 100:.1f}%"
    return format_bytes(value)
