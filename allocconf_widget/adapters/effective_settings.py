"""Read back the allocator settings torch actually uses, once its allocator is running."""

from __future__ import annotations

from allocconf_widget.adapters import torch_private
from allocconf_widget.adapters.runtime_state import Phase, RuntimeState, detect_state
from allocconf_widget.core.config.conf import AllocConf, parse_conf
from allocconf_widget.core.config.readback import ReadBack, compare


def read_back(requested: AllocConf | str | None = None, *, state: RuntimeState | None = None,
              applied_by_setter: bool = False) -> ReadBack | None:
    """Compare ``requested`` (default: what the environment asks for) with torch's settings.

    Returns None while there is nothing to read: torch not imported or CUDA not
    started (reading earlier would freeze the settings, the very thing we must
    not cause by looking).
    """
    state = state or detect_state()
    torch = torch_private.imported_torch()
    if torch is None or state.phase is not Phase.LIVE:
        return None
    if requested is None:
        requested = state.env.effective_text or ""
    if isinstance(requested, str):
        requested = parse_conf(requested, state.version, warn=False)
    settings = torch_private.effective_settings(torch)
    held = torch_private.last_settings_string(torch)
    if held is None and settings is not None:
        held = settings.get("PYTORCH_CUDA_ALLOC_CONF")
    return compare(requested, settings, held, state.env, torch_private.stats_max_split(torch),
                   applied_by_setter)
