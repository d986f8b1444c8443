"""The allocator configuration value: parse, validate, compare, merge and print.

:func:`parse_conf` is strict by design. Its rule: never accept a string the
given torch release rejects, and also refuse strings torch accepts but
misreads. Everything it accepts is returned as an immutable :class:`AllocConf`
whose :meth:`AllocConf.to_string` is canonical (schema order, normalised
numbers), so ``parse_conf(c.to_string()) == c``.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from allocconf_widget._errors import AllocConfError, AllocConfWarning
from allocconf_widget.core.config import options as opt
from allocconf_widget.core.config.tokens import C_WHITESPACE_TEXT, Token, tokenize
from allocconf_widget.core.config.traps import ConfWarning, find_traps
from allocconf_widget.core.config.values import (
    ROUNDUP_MAX_BAND,
    RoundupDivisions,
    check_bound,
    check_kind_matches,
    parse_bool,
    parse_float,
    parse_reserve,
    parse_unsigned,
)
from allocconf_widget.core.versions import TorchVersion, VersionLike, default_version, resolve_version

Value = int | float | bool | str | RoundupDivisions | tuple[tuple[str, str], ...]

__all__ = ["AllocConf", "Change", "ConfWarning", "RoundupDivisions", "parse_conf"]


@dataclass(frozen=True)
class Change:
    """One option's difference between two configurations (``None`` = unset)."""

    option: str
    before: Value | None
    after: Value | None

    def __str__(self) -> str:
        def show(v: Value | None) -> str:
            return "unset" if v is None else format_value(v)

        return f"{self.option}: {show(self.before)} -> {show(self.after)}"


@dataclass(frozen=True, eq=False)
class AllocConf:
    """An immutable, validated allocator configuration for one torch release.

    Entries are kept in the schema's canonical order. Equality and hashing use
    the entries only: the same settings are equal whatever release checked them.
    """

    entries: tuple[tuple[str, Value], ...] = ()
    torch_version: TorchVersion = field(default_factory=default_version)
    warnings: tuple[ConfWarning, ...] = ()

    # -- mapping-like access ------------------------------------------------
    def get(self, name: str, default: Any = None) -> Any:
        """The value of ``name`` (ints are MiB for *_mb keys), or ``default`` when unset."""
        name = opt.canonical_name(name)
        for key, value in self.entries:
            if key == name:
                return value
        return default

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def items(self) -> tuple[tuple[str, Value], ...]:
        """``(name, value)`` pairs in canonical order."""
        return self.entries

    def as_dict(self) -> dict[str, Value]:
        """A plain dict copy of the entries."""
        return dict(self.entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AllocConf) and self.entries == other.entries

    def __hash__(self) -> int:
        return hash(self.entries)

    # -- text ----------------------------------------------------------------
    def to_string(self) -> str:
        """The canonical ``key:value,...`` string torch reads."""
        return ",".join(f"{key}:{format_value(value)}" for key, value in self.entries)

    def __str__(self) -> str:
        return self.to_string()

    def __repr__(self) -> str:
        return f"AllocConf({self.to_string()!r}, torch={self.torch_version})"

    # -- derivation ----------------------------------------------------------
    def merge(self, other: AllocConf) -> AllocConf:
        """A new configuration with ``other``'s options overriding or adding to these.

        The result is validated again (two valid halves can clash, e.g. a
        ``large_segment_size_mb`` above the other half's ``max_split_size_mb``).
        """
        merged = dict(self.entries)
        merged.update(other.entries)
        return _reparse(merged, self.torch_version)

    def for_release(self, torch_version: VersionLike) -> AllocConf:
        """This configuration as another torch release takes it: each option and value is
        checked against that release's rules on its own, without parsing a string again.

        Raises:
            AllocConfError: that release has no such option or refuses a value.
        """
        version = resolve_version(torch_version)
        if (version.key, version.build) == (self.torch_version.key, self.torch_version.build):
            return self
        large_segment = int(self.get("large_segment_size_mb") or 20)
        values: dict[str, Value] = {}
        for name, value in self.entries:
            spec = _lookup(Token(name, 0), version)
            values[spec.name] = _value(spec, tokenize(format_value(value), version), version, large_segment)
        ordered = tuple(sorted(values.items(), key=lambda kv: opt.canonical_index(kv[0])))
        found = (*_version_warnings(version), *find_traps(dict(ordered), version))
        return AllocConf(ordered, version, tuple(found))

    def with_changes(self, changes: Mapping[str, Any], *,
                     typed_with: Mapping[str, str] | None = None) -> AllocConf:
        """A copy with several options set (text or typed values) or unset (``None``), validated once.

        Each name is checked (with "did you mean") and each text value on its own first:
        a ``,`` or ``:`` outside brackets would otherwise splice further options into the
        rebuilt string. The result is parsed once, however many options change.
        ``typed_with`` maps a name to the separator the user typed after it (the magic's
        ``name=value``): a message about its value quotes it that way; ``:`` otherwise.
        """
        merged = dict(self.entries)
        problems: list[AllocConfError] = []  # every one, not the first: one retry fixes them all
        passed: dict[str, Any] = {}
        seps: dict[str, str] = {}
        for name, value in changes.items():
            try:
                canonical = check_option_name(name, self.torch_version)
                if value is None:
                    merged.pop(canonical, None)
                    continue
                if isinstance(value, str):
                    _check_single_value(canonical, value, self.torch_version)
            except AllocConfError as exc:
                problems.append(exc)
                continue
            merged[canonical] = value
            passed[canonical] = value
            if typed_with and name in typed_with:
                seps[canonical] = typed_with[name]
        first: AllocConfError | None = None
        if not problems:
            try:
                return _reparse(merged, self.torch_version, seps)
            except AllocConfError as exc:
                # the position is in the rebuilt string, which the user never saw: drop it
                first = (exc if exc.option not in changes or exc.position is None
                         else AllocConfError(exc.reason, option=exc.option, fix=exc.fix))
        # each value that passed on its own, parsed alone beside the options that stay: a
        # range or a flag is checked only there, so every bad value is reported at once
        kept = {k: v for k, v in self.entries if k not in passed}
        for canonical, value in passed.items():
            try:
                _reparse({**kept, canonical: value}, self.torch_version, seps)
            except AllocConfError as exc:
                problems.append(AllocConfError(exc.reason, option=exc.option, fix=exc.fix))
        if first is not None and len(problems) <= 1:
            raise first  # one problem (or options that fail only together): torch's own words
        if len(problems) == 1:
            raise problems[0]
        raise AllocConfError(f"{len(problems)} problems: "
                             + "; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1)),
                             option=problems[0].option)

    def without(self, *names: str) -> AllocConf:
        """A copy with the given options unset (back to torch's defaults)."""
        drop = {opt.canonical_name(n) for n in names}
        return _reparse({k: v for k, v in self.entries if k not in drop}, self.torch_version)

    def diff(self, other: AllocConf) -> tuple[Change, ...]:
        """Options whose value differs from ``self`` to ``other``, in canonical order."""
        theirs = other.as_dict()
        mine = self.as_dict()
        names = sorted(set(mine) | set(theirs), key=opt.canonical_index)
        return tuple(Change(n, mine.get(n), theirs.get(n)) for n in names
                     if mine.get(n) != theirs.get(n))


def check_option_name(name: str, torch_version: VersionLike = None) -> str:
    """The canonical name of option ``name`` in that torch; raises with "did you mean" otherwise."""
    version = resolve_version(torch_version)
    name = name.strip(C_WHITESPACE_TEXT)
    if not name:
        raise AllocConfError("an option name is missing (nothing before the '=' or ':')",
                             fix="write name=value, e.g. expandable_segments=True")
    tokenize(name, version)  # names invisible characters instead of "unknown option"
    return _lookup(Token(name, 0), version).name


def conf_from_values(values: Mapping[str, str], torch_version: VersionLike = None) -> AllocConf:
    """One configuration from per-option texts (a form's fields), each value checked on its own."""
    version = resolve_version(torch_version)
    for name, value in values.items():
        _check_single_value(name, value, version)
    return parse_conf(",".join(f"{k}:{v}" for k, v in values.items()), torch_version, warn=False)


def _check_single_value(name: str, value: str, version: TorchVersion) -> None:
    try:
        tokenize(value, version)  # invisible characters and glued words, placed in the value
    except AllocConfError as exc:
        raise AllocConfError(f"in the value of {name}: {exc.reason}" + (
            f" (at character {exc.position + 1} of the value)" if exc.position is not None else ""),
            option=name, fix=exc.fix) from None
    depth = 0
    for index, char in enumerate(value):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth == 0 and char in ",:":
            raise AllocConfError(
                f"the value given for {name} contains {char!r}, which would start another option",
                option=name, position=index,
                fix=f"give one value per option, e.g. {name}=<value> other_option=<value>")
    if not value.strip():
        raise AllocConfError(f"no value given for {name}", option=name,
                             fix=f"write {name}=<value>, or {name}=default to unset it")


def format_value(value: Value) -> str:
    """Canonical text of one value."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ",".join(f"{k}:{v}" for k, v in value) + "]"
    return str(value)


def parse_conf(text: str, torch_version: VersionLike = None, *, warn: bool = True) -> AllocConf:
    """Parse and validate a ``PYTORCH_CUDA_ALLOC_CONF`` string for a torch release.

    Args:
        text: the configuration, e.g. ``"expandable_segments:True,max_split_size_mb:512"``.
        torch_version: ``"2.11"``, ``(2, 11)`` … Defaults to the installed torch (read
            without importing it), else the newest release modelled. A release newer
            than the model is checked with the newest rules and a warning.

        warn: emit the traps found as AllocConfWarning (the panel, which re-parses on
            every keystroke, turns this off and shows ``.warnings`` itself).

    Returns:
        The configuration; known traps (duplicate keys, options that do nothing
        together) are in ``.warnings``.

    Raises:
        AllocConfError: torch of that release would reject or misread the string.
            The error names the option, the character position and a fix.
    """
    conf = _parse(text, resolve_version(torch_version))
    if warn:
        for warning in conf.warnings:
            warnings.warn(str(warning), AllocConfWarning, stacklevel=2)
    return conf


# ---------------------------------------------------------------- internals
def _version_warnings(version: TorchVersion) -> tuple[ConfWarning, ...]:
    if version.known:
        return ()
    newest = f"{version.schema_key[0]}.{version.schema_key[1]}"
    return (ConfWarning("unknown-version", None,
                        f"torch {version} is newer than allocconf_widget's model; "
                        f"checking with the rules of torch {newest}"),)


def _reparse(values: Mapping[str, Any], version: TorchVersion,
             seps: Mapping[str, str] | None = None) -> AllocConf:
    text = ",".join(f"{k}:{v if isinstance(v, str) else format_value(v)}" for k, v in values.items())
    return _parse(text, version, seps)


#: Parsed configurations by (text, release): an AllocConf is immutable, so the environment's
#: variable, read again by every view of one action, is parsed once while it stays the same.
_PARSED: dict[tuple[str, tuple[int, int], str], AllocConf] = {}
_PARSED_MAX = 64
_MAX_CACHED_TEXT = 4096


def _parse(text: str, version: TorchVersion, seps: Mapping[str, str] | None = None) -> AllocConf:
    if not isinstance(text, str):
        raise AllocConfError(f"expected a configuration string, got {type(text).__name__}")
    key = (text, version.key, version.build)
    cached = _PARSED.get(key)
    if cached is not None:
        return cached
    conf = _parse_text(text, version, seps or {})
    if len(text) <= _MAX_CACHED_TEXT:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[key] = conf
    return conf


def _parse_text(text: str, version: TorchVersion, seps: Mapping[str, str]) -> AllocConf:
    """The parser proper (torch's grammar and bounds for ``version``); see :func:`parse_conf`.
    ``seps``: the separator typed after each option where it was not ``:``, for messages."""
    raw = _split_items(tokenize(text, version), text)
    large_segment = _large_segment_mb(raw, version, seps)
    values: dict[str, Value] = {}
    seen: dict[str, int] = {}
    found: list[ConfWarning] = list(_version_warnings(version))
    for key_tok, value_toks in raw:
        spec = _lookup(key_tok, version)
        if spec.name in seen:
            found.append(ConfWarning(
                "duplicate", spec.name,
                f"{spec.name} is given twice (characters {seen[spec.name]} and {key_tok.pos}); "
                "torch uses the last one"))
        seen[spec.name] = key_tok.pos
        values[spec.name] = _value(spec, value_toks, version, large_segment, seps.get(spec.name, ":"))
    ordered = tuple(sorted(values.items(), key=lambda kv: opt.canonical_index(kv[0])))
    conf = AllocConf(ordered, version)
    found.extend(find_traps(conf.as_dict(), version))
    return AllocConf(ordered, version, tuple(found))


def _split_items(tokens: list[Token], text: str) -> list[tuple[Token, list[Token]]]:
    """Group tokens into ``key : value`` items, enforcing the separators torch expects."""
    items: list[tuple[Token, list[Token]]] = []
    i, n = 0, len(tokens)
    while i < n:
        key = tokens[i]
        if not key.is_word:
            raise _empty_or_stray(key)
        if "=" in key.text:
            name, _, rest = key.text.partition("=")
            raise AllocConfError(
                f"'{key.text}' uses '=' between option and value; torch expects ':' and fails "
                "with an internal assert on '='", option=name or None, position=key.pos + len(name),
                fix=f"write {name}:{rest}" if rest else "write key:value")
        if i + 1 >= n or tokens[i + 1].text != ":":
            where = tokens[i + 1].pos if i + 1 < n else len(text)
            raise AllocConfError(f"expected ':' after option name {key.text!r}", option=key.text,
                                 position=where, fix=f"write {key.text}:<value>")
        i += 2
        if i >= n or tokens[i].text in (",", ":", "]"):
            raise AllocConfError(f"{key.text} has no value after ':'", option=key.text,
                                 position=tokens[i].pos if i < n else len(text),
                                 fix=f"write {key.text}:<value>, or remove it")
        if tokens[i].text == "[":
            end = _closing_bracket(tokens, i, key, text)
            value = tokens[i:end + 1]
            i = end + 1
        else:
            value = [tokens[i]]
            i += 1
        items.append((key, value))
        if i < n:
            if tokens[i].text != ",":
                raise AllocConfError(
                    f"unexpected {tokens[i].text!r} after the value of {key.text}",
                    option=key.text, position=tokens[i].pos, fix=_after_value_fix(key, tokens, i, text))
            if i + 1 >= n:
                raise AllocConfError("the string ends with a comma", position=tokens[i].pos,
                                     fix="remove the trailing comma")
            i += 1
    return items


def _after_value_fix(key: Token, tokens: list[Token], i: int, text: str) -> str:
    """The fix for text after a value: per-band lists (``256:2,>:8``) need their brackets."""
    if tokens[i].text == ":" and key.text.strip().lower() == "roundup_power2_divisions":
        start = tokens[i - 1].pos
        # the bands run up to the next option name (band starts are numbers or '>')
        end = next((t.pos for t in tokens[i:] if t.is_word and t.text[:1].isalpha()), len(text))
        bands = text[start:end].strip().rstrip(",")
        return (f"per-band divisions are a list: wrap the bands in [ ], e.g. "
                f"{key.text}:[{bands}]")
    return "separate settings with a single comma: key:value,key:value"


def _empty_or_stray(tok: Token) -> AllocConfError:
    if tok.text == ",":
        return AllocConfError("empty setting (a comma with nothing before it)", position=tok.pos,
                              fix="remove the extra comma")
    return AllocConfError(f"unexpected {tok.text!r} where an option name should be",
                          position=tok.pos, fix="write settings as key:value,key:value")


def _closing_bracket(tokens: list[Token], start: int, key: Token, text: str) -> int:
    for j in range(start + 1, len(tokens)):
        if tokens[j].text == "]":
            return j
        if tokens[j].text == "[":
            raise AllocConfError("lists cannot be nested", option=key.text, position=tokens[j].pos,
                                 fix="write a flat list like [256:1,512:2,>:8]")
    raise AllocConfError(f"the list for {key.text} is not closed with ']'", option=key.text,
                         position=len(text), fix="add the closing ']'")


def _lookup(key: Token, version: TorchVersion) -> opt.OptionSpec:
    spec = opt.spec_for(key.text)
    if spec is not None and spec.exists_in(version):
        return spec
    if spec is not None:
        if spec.until is not None and version.schema_key > spec.until:
            reason = f"existed only in torch {spec.releases_text().replace(' only', '')}"
            fix = f"remove {spec.name}" + (
                "; to stop rounding large requests use the list form of roundup_power2_divisions "
                "with 0 for the large bands, e.g. roundup_power2_divisions:[256:4,>:0] (torch 2.4+)"
                if spec.name == "roundup_bypass_threshold_mb" else "")
        else:
            reason = f"needs torch {spec.since[0]}.{spec.since[1]} or newer"
            fix = f"upgrade torch, or remove {spec.name}"
        raise AllocConfError(f"{key.text} {reason}; torch {version} rejects it",
                             option=key.text, position=key.pos, fix=fix)
    raise AllocConfError(f"unknown option {key.text!r}{_never_note(key.text)}",
                         option=key.text, position=key.pos, fix=_suggest(key.text, version))


def _never_note(name: str) -> str:
    note = opt.NEVER_KEYS.get(name)
    return f" (it {note})" if note else ""


def _suggest(name: str, version: TorchVersion) -> str:
    if name in opt.KNOWN_MISTAKES:
        target = opt.KNOWN_MISTAKES[name]
        if target == "backend":
            return "write backend:cudaMallocAsync"
        return f"did you mean {target}?"
    if name.lower() != name and opt.spec_for(name.lower()):
        return f"option names are lower case: {name.lower()}"
    names = [s.name for s in opt.options_for(version)]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]}?"
    return f"options torch {version} knows: {', '.join(names)}"


def _large_segment_mb(raw: list[tuple[Token, list[Token]]], version: TorchVersion,
                      seps: Mapping[str, str]) -> int:
    """torch 2.11+ parses large_segment_size_mb first; other bounds depend on it."""
    spec = opt.spec_for("large_segment_size_mb")
    assert spec is not None
    value = 20
    if spec.exists_in(version):
        for key, toks in raw:
            if key.text == spec.name and len(toks) == 1:
                value = int(_value(spec, toks, version, 20, seps.get(spec.name, ":")))  # type: ignore[arg-type]
    return value


def _value(spec: opt.OptionSpec, toks: list[Token], version: TorchVersion,
           large_segment: int, sep: str = ":") -> Value:
    """The value of one option; ``sep`` is how the user wrote it (``:``, or the magic's ``=``),
    so a message quotes it as typed."""
    try:
        check_kind_matches(spec, toks[0].text == "[")
        if spec.kind is opt.Kind.ROUNDUP:
            return _roundup(spec, toks, version, sep)
        if spec.kind is opt.Kind.RESERVE_BY_CLASS:
            return _reserve_by_class(spec, toks, sep)
        text = toks[0].text
        if spec.kind is opt.Kind.BOOL:
            return parse_bool(spec.name, text)
        if spec.kind is opt.Kind.BACKEND:
            return _backend(spec, text, version)
        if spec.kind is opt.Kind.RESERVE:
            return parse_reserve(spec.name, text, sep=sep)
        if spec.kind is opt.Kind.FRACTION:
            number = parse_float(spec.name, text, sep=sep)
            check_bound(spec, number, version, sep=sep)
            return number
        integer = parse_unsigned(spec.name, text, version, _bound_fix(spec, version, large_segment),
                                 sep=sep)
        check_bound(spec, integer, version, large_segment, sep=sep)
        return integer
    except AllocConfError as exc:
        if exc.position is None:
            raise AllocConfError(exc.reason, option=exc.option, position=toks[0].pos,
                                 fix=exc.fix) from None
        raise


def _bound_fix(spec: opt.OptionSpec, version: TorchVersion,
               large_segment: int = 20) -> Callable[[int], str | None]:
    """For :func:`parse_unsigned`: the fix when a suggested whole number is itself refused."""
    def fix_for(value: int) -> str | None:
        try:
            check_bound(spec, value, version, large_segment)
        except AllocConfError as exc:
            return exc.fix
        return None
    return fix_for


def _backend(spec: opt.OptionSpec, text: str, version: TorchVersion) -> str:
    allowed = ["native", "cudaMallocAsync"] + (["hipMallocAsync"] if version.build == "rocm" else [])
    if text in allowed:
        return text
    close = difflib.get_close_matches(text, allowed, n=1, cutoff=0.5)
    hint = "native" if text == "cudaMalloc" else (close[0] if close else allowed[0])
    raise AllocConfError(f"unknown backend {text!r}; torch {version} knows {' and '.join(allowed)}",
                         option=spec.name, fix=f"write backend:{hint}")


def _list_pairs(spec: opt.OptionSpec, toks: list[Token]) -> list[tuple[Token, Token]]:
    """``[a:b,c:d]`` → [(a, b), (c, d)], strictly."""
    inner = toks[1:-1]
    if not inner:
        raise AllocConfError(f"the list for {spec.name} is empty; an empty list sets nothing",
                             option=spec.name, position=toks[0].pos, fix=f"remove {spec.name}")
    pairs = []
    for start in range(0, len(inner), 4):
        group = inner[start:start + 4]
        ok = (len(group) >= 3 and group[0].is_word and group[1].text == ":" and group[2].is_word
              and (len(group) == 3 or group[3].text == ","))
        if not ok or (len(group) == 4 and start + 4 >= len(inner)):
            where = group[min(len(group) - 1, 1)].pos if group else toks[-1].pos
            raise AllocConfError(f"malformed list for {spec.name}", option=spec.name, position=where,
                                 fix="write [band:divisions,...], e.g. [256:1,512:2,>:8]"
                                 if spec.kind is opt.Kind.ROUNDUP else "write [name:0.5,...]")
        pairs.append((group[0], group[2]))
    return pairs


def _roundup(spec: opt.OptionSpec, toks: list[Token], version: TorchVersion,
             sep: str = ":") -> RoundupDivisions:
    if toks[0].text != "[":
        value = parse_unsigned(spec.name, toks[0].text, version, _bound_fix(spec, version), sep=sep)
        check_bound(spec, value, version, sep=sep)
        return RoundupDivisions(uniform=value)
    if version.schema_key < (2, 0):
        raise AllocConfError(f"the list form of {spec.name} needs torch 2.0 or newer",
                             option=spec.name, position=toks[0].pos,
                             fix=f"give one number, e.g. {spec.name}:4")
    bands: list[tuple[int | str, int]] = []
    for band_tok, div_tok in _list_pairs(spec, toks):
        divisions = _band_divisions(spec, div_tok, version)
        if band_tok.text == ">":
            if not bands:
                raise AllocConfError(
                    f"'>' must follow at least one size band in {spec.name}; torch releases read "
                    "a lone '>' differently", option=spec.name, position=band_tok.pos,
                    fix=f"to use one value for every size write {spec.name}:{divisions or 1}")
            bands.append((">", divisions))
            continue
        if bands and bands[-1][0] == ">":
            raise AllocConfError(f"'>' must be the last entry of {spec.name}", option=spec.name,
                                 position=band_tok.pos, fix="move the '>' entry to the end")
        band = _band_start(spec, band_tok, version)
        if bands and band <= int(bands[-1][0]):
            raise AllocConfError(
                f"size bands of {spec.name} must increase ({band} comes after {bands[-1][0]}); "
                "torch applies them in the order written, which silently mixes them up",
                option=spec.name, position=band_tok.pos, fix="list the bands in increasing order")
        bands.append((band, divisions))
    return RoundupDivisions(bands=tuple(bands))


def _band_start(spec: opt.OptionSpec, tok: Token, version: TorchVersion) -> int:
    try:
        band = parse_unsigned(spec.name, tok.text, version)
    except AllocConfError as exc:
        raise AllocConfError(f"size band {tok.text!r}: {exc.reason}", option=spec.name,
                             position=tok.pos, fix=exc.fix) from None
    if band == 0 or band & (band - 1):
        raise AllocConfError(f"size band {band} of {spec.name} is not a power of two (MiB); torch "
                             f"{version} rejects it", option=spec.name, position=tok.pos,
                             fix="use band starts like 64, 128, 256, 512, 1024")
    if band > ROUNDUP_MAX_BAND:
        raise AllocConfError(
            f"size band {band} MiB of {spec.name} is beyond the last band torch tracks "
            f"({ROUNDUP_MAX_BAND} MiB = 32 GiB); torch silently folds it into that band",
            option=spec.name, position=tok.pos, fix=f"use {ROUNDUP_MAX_BAND} or '>'")
    return band


def _band_divisions(spec: opt.OptionSpec, tok: Token, version: TorchVersion) -> int:
    value = parse_unsigned(spec.name, tok.text, version)
    if value == 0:
        if version.schema_key < (2, 4):
            raise AllocConfError(f"0 (no rounding) in a {spec.name} list needs torch 2.4 or newer",
                                 option=spec.name, position=tok.pos, fix="use 1 for minimal rounding")
        return 0
    if value & (value - 1):
        lower = 1 << (value.bit_length() - 1)
        raise AllocConfError(f"divisions {value} in {spec.name} is not a power of two; torch "
                             f"{version} rejects it", option=spec.name, position=tok.pos,
                             fix=f"use {lower} or {lower * 2}")
    return value


def _reserve_by_class(spec: opt.OptionSpec, toks: list[Token], sep: str = ":") -> tuple[tuple[str, str], ...]:
    """``[name:reserve,...]`` as torch 2.15 reads it: any word names a class (``serve-v2``), a
    trailing comma is allowed, ``[]`` sets no class; each reserve as
    :func:`~.values.parse_reserve` reads it (torch skips a bad one with a warning: refused)."""
    inner = toks[1:-1]
    pairs: list[tuple[str, str]] = []
    i = 0
    while i < len(inner):
        group = inner[i:i + 3]
        if len(group) < 3 or not (group[0].is_word and group[1].text == ":" and group[2].is_word):
            where = group[min(len(group) - 1, 1)].pos if group else toks[-1].pos
            raise AllocConfError(f"malformed list for {spec.name}", option=spec.name, position=where,
                                 fix=f"write {spec.name}:[name:0.5,other:40G]")
        try:
            reserve = parse_reserve(spec.name, group[2].text, sep=sep)
        except AllocConfError as exc:
            raise AllocConfError(f"class {group[0].text!r}: {exc.reason}", option=spec.name,
                                 position=group[2].pos, fix=exc.fix) from None
        pairs.append((group[0].text, reserve))
        i += 3
        if i < len(inner):
            if inner[i].text != ",":
                raise AllocConfError(f"malformed list for {spec.name}: expected ',' after the "
                                     f"reserve of {group[0].text!r}", option=spec.name,
                                     position=inner[i].pos, fix=f"write {spec.name}:[name:0.5,other:40G]")
            i += 1
    return tuple(pairs)
