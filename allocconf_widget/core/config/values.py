"""Typed values of allocator options, and checking one value against its option's rules.

Each value is checked twice over: against what torch of the given release
*rejects* (so we never accept a string torch refuses) and against what torch
*accepts but misreads* (``-5`` wrapping to "unlimited", ``1e3`` read as 1,
``12.5`` read as 12, words glued together by deleted spaces). Both kinds are
errors here, with the reason spelled out.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from allocconf_widget._errors import AllocConfError
from allocconf_widget.core.config.options import INT_MAX, Bound, Kind, OptionSpec
from allocconf_widget.core.versions import TorchVersion

_DIGITS = re.compile(r"[0-9]+")
_FLOAT = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
#: the number of an expandable-segment reserve: what ``std::istringstream >> double`` takes whole
_RESERVE_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
ROUNDUP_SLOTS = 16
#: Largest band start (MiB, 2**15) with a slot of its own. Larger starts are folded into it.
ROUNDUP_MAX_BAND = 1 << 15


@dataclass(frozen=True)
class RoundupDivisions:
    """``roundup_power2_divisions``: one division count, or per-band counts.

    ``bands`` holds ``(band_start_mib, divisions)`` pairs in increasing order,
    optionally ending with ``(">", divisions)`` for every larger band.
    """

    uniform: int | None = None
    bands: tuple[tuple[int | str, int], ...] = ()

    def __str__(self) -> str:
        if self.uniform is not None:
            return str(self.uniform)
        return "[" + ",".join(f"{k}:{v}" for k, v in self.bands) + "]"

    def slots(self, version: TorchVersion | tuple[int, int]) -> tuple[int, ...]:
        """The 16 per-size-band division counts torch ``version`` derives.

        Slot ``i`` covers sizes in ``[2**(20+i), 2**(21+i))``. The first band
        also fills every lower slot. ``>`` fills the slots after the last band
        from 2.10 on; the 2.0–2.9 parser starts it *at* the last band's slot,
        overwriting that band (docs/internals/allocator_facts.md §3.2).
        """
        if self.uniform is not None:
            return (self.uniform,) * ROUNDUP_SLOTS
        key = version.key if isinstance(version, TorchVersion) else version
        slots = [0] * ROUNDUP_SLOTS
        last, first = 0, True
        for band, divisions in self.bands:
            if band == ">":
                start = last + 1 if key >= (2, 10) else last
                slots[start:] = [divisions] * (ROUNDUP_SLOTS - start)
                continue
            index = min(max(int(band).bit_length() - 1, 0), ROUNDUP_SLOTS - 1)
            if first:
                slots[:index] = [divisions] * index
                first = False
            slots[index] = divisions
            last = index
        return tuple(slots)


_MAX_DIGITS = 40  # more significant digits than any integer torch reads


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _int_limit(version: TorchVersion) -> int:
    """Largest integer torch's number conversion accepts: stoi up to 2.9, stoull after."""
    return (1 << 64) - 1 if version.new_parser else INT_MAX


def typed(spec_name: str, text: str, sep: str = ":") -> str:
    """The setting as the user typed it: ``name:value`` in a configuration string, ``name=value``
    where the magic took ``name=value``. Fixes are written in torch's ``name:value`` form."""
    return f"{spec_name}{sep}{text}"


def parse_unsigned(spec_name: str, text: str, version: TorchVersion,
                   fix_for: Callable[[int], str | None] | None = None, *, sep: str = ":") -> int:
    """Parse a plain non-negative decimal integer, refusing what torch would misread.

    ``fix_for(n)`` says why the whole number ``n`` would itself be refused (the fix to offer
    instead), or None when it is valid: a fix offered must be a value torch accepts
    (``max_split_size_mb:1.5`` must not suggest ``max_split_size_mb:1``, below the minimum).
    ``sep`` is the separator the user typed between name and value (:func:`typed`).
    """
    if _DIGITS.fullmatch(text):
        # beyond ~20 digits nothing fits torch's integers; int() of 4300+ digits even raises
        value = int(text) if len(text.lstrip("0")) <= _MAX_DIGITS else _int_limit(version) + 1
        if value > _int_limit(version):
            raise AllocConfError(
                f"{typed(spec_name, text, sep)} is too large: torch {version} cannot read numbers above "
                f"{_int_limit(version)}",
                option=spec_name,
                fix=f"use a smaller number, or leave {spec_name} unset",
            )
        return value
    if text.startswith("-") and _DIGITS.fullmatch(text[1:]):
        reason = "torch converts it to an unsigned number, so a negative wraps to a huge value"
        if spec_name.endswith("_mb"):
            reason += " (read as 'unlimited')"
        raise AllocConfError(
            f"{typed(spec_name, text, sep)} is negative: {reason}",
            option=spec_name,
            fix=f"use a positive whole number, or leave {spec_name} unset for torch's default",
        )
    match = re.match(r"[+]?([0-9]+)", text)
    if match:
        kind = "a sign" if text.startswith("+") else (
            "an exponent" if re.fullmatch(r"[0-9.]+[eE][-+]?[0-9]+", text) else
            "a decimal point" if "." in text else f"trailing characters ({text[match.end():]!r})"
        )
        digits = match.group(1)
        read_as = int(digits) if len(digits.lstrip("0")) <= _MAX_DIGITS else _int_limit(version)
        suggestion = _suggest_int(text, read_as)
        instead = fix_for(suggestion) if fix_for is not None else None
        raise AllocConfError(
            f"{typed(spec_name, text, sep)} is not a whole number: it has {kind}, and torch would silently "
            f"read it as {read_as}",
            option=spec_name,
            fix=(f"write a whole number: {instead}" if instead
                 else f"write the whole number you mean, e.g. {spec_name}:{suggestion}"),
        )
    if text.strip().lower() in _DEFAULT_WORDS:  # the panel shows "unlimited" for an unset size
        raise AllocConfError(
            f"{typed(spec_name, repr(text), sep)} is not a number torch reads: it means torch's default",
            option=spec_name,
            fix=f"leave {spec_name} unset (untick it in the panel; %allocconf unset {spec_name}) "
                "for torch's default, or write a whole number, e.g. 512",
        )
    raise AllocConfError(
        f"{typed(spec_name, repr(text), sep)} is not a number",
        option=spec_name,
        fix=f"write a whole number, e.g. {spec_name}:512",
    )


#: words people type for "no limit" / "the default", which torch reads as no number at all
_DEFAULT_WORDS = frozenset({"unlimited", "none", "default", "off", "no", "inf", "infinite", "-"})


def _suggest_int(text: str, read_as: int) -> int:
    try:
        value = float(text.lstrip("+"))
        if math.isfinite(value) and value >= 1:
            return int(value)
    except (ValueError, OverflowError):
        return read_as
    return read_as


def parse_float(spec_name: str, text: str, *, sep: str = ":") -> float:
    """Parse a decimal number as ``std::stod`` would, refusing trailing junk it ignores."""
    if _FLOAT.fullmatch(text):
        value = float(text)
        _check_float_range(spec_name, text, value, sep)
        return value
    if text.lower() in ("nan", "inf", "infinity"):
        raise AllocConfError(f"{typed(spec_name, text, sep)} is not a finite number", option=spec_name,
                             fix=f"write a decimal number, e.g. {spec_name}:0.6")
    match = _FLOAT.match(text)
    if match:
        raise AllocConfError(
            f"{typed(spec_name, text, sep)} has trailing characters {text[match.end():]!r} that torch would "
            f"silently ignore (it would read {match.group(0)})",
            option=spec_name,
            fix=f"write just the number, e.g. {spec_name}:{match.group(0)}",
        )
    raise AllocConfError(f"{typed(spec_name, repr(text), sep)} is not a number", option=spec_name,
                         fix=f"write a decimal number, e.g. {spec_name}:0.6")


def _check_float_range(spec_name: str, text: str, value: float, sep: str = ":") -> None:
    """``std::stod`` throws out_of_range where strtod reports ERANGE: overflow and underflow."""
    mantissa = re.split("[eE]", text, maxsplit=1)[0]
    underflow = value == 0.0 and any(c in "123456789" for c in mantissa)
    if math.isinf(value):
        problem = "is too large for a double: torch fails with an out-of-range error (stod)"
    elif underflow or (value != 0.0 and abs(value) < sys.float_info.min):
        problem = ("is too small for a normal double (subnormal): torch fails with an "
                   "out-of-range error (stod)")
    else:
        return
    shown = text if len(text) <= 40 else f"{text[:20]}…({len(text)} characters)"
    raise AllocConfError(f"{typed(spec_name, shown, sep)} {problem}", option=spec_name,
                         fix=f"write an ordinary decimal number, e.g. {spec_name}:0.6")


def parse_bool(spec_name: str, text: str) -> bool:
    """Only ``True`` and ``False`` (capitalised) are booleans in every torch release."""
    if text in ("True", "False"):
        return text == "True"
    if text.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        meant = "True" if text.lower() in ("true", "1", "yes", "on") else "False"
        raise AllocConfError(
            f"{spec_name} takes True or False, spelled exactly so; torch rejects {text!r}",
            option=spec_name,
            fix=f"write {spec_name}:{meant}",
        )
    raise AllocConfError(f"{spec_name} takes True or False, not {text!r}", option=spec_name,
                         fix=f"write {spec_name}:True or {spec_name}:False")


def check_bound(spec: OptionSpec, value: float, version: TorchVersion,
                large_segment_mb: int = 20, *, sep: str = ":") -> None:
    """Raise if ``value`` is outside what torch ``version`` accepts for ``spec``."""
    bound = spec.bound_in(version)
    if bound is None:
        return
    _check_power_of_two(spec, bound, value, version, sep)
    low = large_segment_mb if isinstance(bound.low, str) else bound.low
    if low is not None and (value < low or (value == low and not bound.low_inclusive)):
        if bound.allow_zero and value == 0:
            return
        needed = f"at least {_fmt(low)}" if bound.low_inclusive else f"more than {_fmt(low)}"
        why = " (its large_segment_size_mb)" if isinstance(bound.low, str) else ""
        raise AllocConfError(
            f"{typed(spec.name, _fmt(value), sep)} is too small: torch {version} needs {needed}"
            f"{' ' + spec.unit if spec.unit else ''}{why}",
            option=spec.name,
            fix=_fix_text(spec, bound, f"{_fmt(low if bound.low_inclusive else low + 1)} or more"),
        )
    high = bound.high
    if high is not None and (value > high or (value == high and not bound.high_inclusive)):
        needed = f"at most {_fmt(high)}" if bound.high_inclusive else f"less than {_fmt(high)}"
        raise AllocConfError(
            f"{typed(spec.name, _fmt(value), sep)} is too large: torch {version} needs {needed}"
            f"{' ' + spec.unit if spec.unit else ''}",
            option=spec.name,
            fix=_fix_text(spec, bound, f"{_fmt(high if bound.high_inclusive else high - 1)} or less"),
        )


def _fix_text(spec: OptionSpec, bound: Bound, int_hint: str) -> str:
    """Integers get the nearest allowed value; fractions get the interval in words."""
    hint = f"a value {bound.describe()}" if spec.kind is Kind.FRACTION else int_hint
    return f"use {hint}{_unset(spec)}"


def _unset(spec: OptionSpec) -> str:
    return f", or leave {spec.name} unset for torch's default ({spec.default})"


def _check_power_of_two(spec: OptionSpec, bound: Bound, value: float, version: TorchVersion,
                        sep: str = ":") -> None:
    if not bound.power_of_two or (bound.allow_zero and value == 0):
        return
    if not _is_power_of_two(int(value)):
        lower = 1 << max(int(value).bit_length() - 1, 0)
        raise AllocConfError(
            f"{typed(spec.name, _fmt(value), sep)} is not a power of two; torch {version} rejects it",
            option=spec.name,
            fix=f"use {lower} or {lower * 2}",
        )


def _fmt(value: float | str) -> str:
    if isinstance(value, str):
        return value
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def parse_reserve(spec_name: str, text: str, *, sep: str = ":") -> str:
    """An expandable-segment reserve as torch 2.15 reads it (``parseReserveSpec``); its
    canonical text back.

    A trailing ``G`` or ``g`` makes the number GiB (``40G``, ``1.5G``); without it the number
    is a fraction of the device's memory (``0.5``; above 1.125, the default, torch caps it at
    the default). The number is what C++'s stream extraction reads in the C locale, with
    nothing left over: an optional sign, digits with an optional decimal point, an optional
    exponent. It must be finite and above 0 (an exponent that underflows to 0 is 0).
    Everything else torch ignores with a warning and keeps its default: refused here.
    """
    gib = text[-1:] in ("G", "g")
    number = text[:-1] if gib else text
    value = float(number) if _RESERVE_NUMBER.fullmatch(number) else math.nan
    if math.isfinite(value) and value > 0:
        shown = repr(value)
        shown = shown[:-2] if shown.endswith(".0") else shown
        return f"{shown}G" if gib else shown
    if math.isinf(value):
        why = "is too large for a double (torch's stream extraction fails on it)"
    elif _RESERVE_NUMBER.fullmatch(number):
        why = "reserves nothing (it is not above 0)"
    else:
        why = "is neither a fraction of device memory like 0.5 nor a size in GiB like 40G or 1.5G"
    raise AllocConfError(
        f"{typed(spec_name, text, sep)} {why}; torch warns \"Ignoring invalid expandable-segment "
        "reserve value\" and keeps its default (9/8 of device memory)",
        option=spec_name,
        fix=f"write e.g. {spec_name}:0.5 or {spec_name}:40G",
    )


def check_kind_matches(spec: OptionSpec, is_list: bool) -> None:
    """Lists are only for roundup_power2_divisions and the reserve-by-class option."""
    takes_list = spec.kind in (Kind.ROUNDUP, Kind.RESERVE_BY_CLASS)
    if is_list and not takes_list:
        raise AllocConfError(f"{spec.name} takes a single value, not a [list]", option=spec.name,
                             fix=f"write {spec.name}:<value> without brackets")
    if not is_list and spec.kind is Kind.RESERVE_BY_CLASS:
        raise AllocConfError(f"{spec.name} takes a list like [name:0.5]", option=spec.name,
                             fix=f"write {spec.name}:[name:0.5]")
