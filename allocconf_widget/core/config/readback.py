"""Comparing what the user asked for with what torch's allocator actually uses.

Input is plain data from the adapter: the ``allocator_settings`` dict of a
snapshot (effective parsed values), the last settings string torch holds and
``memory_stats()["max_split_size"]``. Output says, per option, whether it
took, and if not, the most likely reason — the silent failures users hit:
the wrong variable name for their release, a second variable winning, a
variable set after torch had already read its settings, a later overwrite.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from allocconf_widget._errors import AllocConfError
from allocconf_widget.core.config.conf import AllocConf, RoundupDivisions, format_value, parse_conf
from allocconf_widget.core.config.envvars import EnvReport
from allocconf_widget.core.units import MIB

_SLOT_KEYS = tuple(str(1 << i) for i in range(16))


@dataclass(frozen=True)
class ReadBackRow:
    """One option: requested and effective values (text), whether they agree, and why not."""

    option: str
    requested: str
    effective: str
    ok: bool
    note: str = ""


@dataclass(frozen=True)
class ReadBack:
    """The comparison for a whole configuration."""

    rows: tuple[ReadBackRow, ...]
    held_string: str | None
    causes: tuple[str, ...] = ()

    @property
    def mismatches(self) -> tuple[ReadBackRow, ...]:
        return tuple(r for r in self.rows if not r.ok)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def summary(self) -> str:
        if self.ok:
            return "read back: every requested option is in effect"
        lines = [f"NOT in effect: {r.option} asked {r.requested}, torch uses {r.effective}"
                 + (f" ({r.note})" if r.note else "") for r in self.mismatches]
        return "\n".join(lines + [f"likely cause: {c}" for c in self.causes])


def _effective_value(name: str, settings: Mapping[str, Any]) -> tuple[str, bool] | None:
    """(text, is_default) of an option from a snapshot's allocator_settings, if it is exposed."""
    if name == "max_split_size_mb" and "max_split_size" in settings:
        raw = int(settings["max_split_size"])
        return ("unset (unlimited)", True) if raw < 0 else (str(raw // MIB), False)
    if name == "garbage_collection_threshold" and "garbage_collection_threshold" in settings:
        value = float(settings["garbage_collection_threshold"])
        return ("unset (off)", True) if value == 0 else (repr(value), False)
    if name == "roundup_power2_divisions" and isinstance(settings.get(name), Mapping):
        slots = tuple(int(settings[name].get(k, 0)) for k in _SLOT_KEYS)
        return ("unset (off)", True) if not any(slots) else (_slots_text(slots), False)
    if name in settings and isinstance(settings[name], bool | int):
        return format_value(settings[name]), False
    return None


def _slots_text(slots: tuple[int, ...]) -> str:
    return "[" + ",".join(f"{1 << i}:{v}" for i, v in enumerate(slots)) + "]"


def _requested_text(value: Any, version: Any) -> str:
    if isinstance(value, RoundupDivisions):
        return _slots_text(value.slots(version))
    return format_value(value)


_DEFAULT_TEXT = {"max_split_size_mb": "unset (unlimited)", "garbage_collection_threshold": "unset (off)",
                 "roundup_power2_divisions": "unset (off)", "expandable_segments": "False",
                 "release_lock_on_cudamalloc": "False", "pinned_use_cuda_host_register": "False",
                 "graph_capture_record_stream_reuse": "False", "pinned_num_register_threads": "1"}


def compare(requested: AllocConf, settings: Mapping[str, Any] | None, held_string: str | None,
            env: EnvReport | None = None, stats_max_split: int | None = None,
            applied_by_setter: bool = False) -> ReadBack:
    """Compare ``requested`` with torch's effective ``settings`` and the string it holds."""
    version = requested.torch_version
    held = _parse_held(held_string, requested)
    rows = []
    names = list(requested) + [n for n in _DEFAULT_TEXT if n not in requested]
    for name in names:
        value = requested.get(name)
        want = _DEFAULT_TEXT[name] if value is None else _requested_text(value, version)
        got = _effective_value(name, settings or {})
        if got is None:
            if value is None:
                continue
            in_held = held is not None and held.get(name) == value
            rows.append(ReadBackRow(name, want, "in torch's settings string" if in_held else "unknown",
                                    ok=in_held or held is None,
                                    note="" if in_held else "torch does not report this option"))
            continue
        rows.append(ReadBackRow(name, want, got[0], ok=got[0] == want))
    rows = [_stats_note(r, stats_max_split) for r in rows]
    bad = [r for r in rows if not r.ok]
    causes = _causes(requested, held_string, env, applied_by_setter) if bad else ()
    return ReadBack(tuple(rows), held_string, causes)


def _parse_held(held_string: str | None, requested: AllocConf) -> AllocConf | None:
    if held_string is None:
        return None
    try:
        return parse_conf(held_string, requested.torch_version, warn=False)
    except AllocConfError:
        return None


def _stats_note(row: ReadBackRow, stats_max_split: int | None) -> ReadBackRow:
    if row.option != "max_split_size_mb" or stats_max_split is None or not row.ok:
        return row
    stats_text = "unset (unlimited)" if stats_max_split < 0 else str(stats_max_split // MIB)
    if stats_text == row.effective:
        return row
    return ReadBackRow(row.option, row.requested, row.effective, row.ok,
                       f"memory_stats()['max_split_size'] still shows {stats_text}: torch keeps the "
                       "value from when the allocator was created, but uses the new one")


def _causes(requested: AllocConf, held: str | None, env: EnvReport | None,
            applied_by_setter: bool) -> tuple[str, ...]:
    causes = [p.message for p in (env.problems if env else ()) if p.code in ("ignored", "shadowed", "split")]
    if held is not None and held != requested.to_string():
        if env is not None and env.effective_text == requested.to_string() and not applied_by_setter:
            causes.append(
                f"torch read its settings ({held!r}) before the variable got its value: something "
                "such as memory_snapshot(), get_device_name() or mem_get_info() ran first. Apply "
                "again with %allocconf apply, which uses torch's runtime setter")
        else:
            causes.append(f"torch holds {held!r}: the settings were changed after they were applied "
                          "(another library calling torch's runtime setter?)")
    return tuple(causes) or ("torch did not report why",)
