"""The option schema rendered as rows, for the CLI table and the generated docs page.

One function builds the rows; the CLI prints them as aligned text and
``docs/options.md`` is the Markdown rendering of the same rows, regenerated
by ``allocconf options --markdown`` (a test keeps the committed page current).
"""

from __future__ import annotations

from allocconf_widget.core.config import options as opt
from allocconf_widget.core.config.envvars import preferred_variable, read_order
from allocconf_widget.core.versions import KNOWN_RELEASES, TorchVersion, parse_version

_WHEN_READ = {
    opt.Live.IMPORT: "at import torch",
}


def option_rows(version: TorchVersion | None) -> list[dict[str, str]]:
    """One dict per option (every option when ``version`` is None), in canonical order."""
    specs = opt.OPTIONS if version is None else tuple(opt.options_for(version))
    rows = []
    for spec in specs:
        bound = spec.bound_in(version) if version is not None else None
        rows.append({
            "option": spec.name,
            "value": spec.kind.value,
            "default": spec.default,
            "valid": _valid_text(spec, version, bound),
            "releases": spec.releases_text(),
            "scope": _scope_text(spec, version),
            "read": _WHEN_READ.get(spec.live, "at first CUDA use"),
            "runtime": _runtime_text(spec),
            "summary": spec.summary,
            "explanation": spec.explanation,
            "aliases": ", ".join(spec.aliases),
        })
    return rows


def _valid_text(spec: opt.OptionSpec, version: TorchVersion | None, bound: opt.Bound | None) -> str:
    if spec.kind is opt.Kind.BOOL:
        return "True or False"
    if spec.kind is opt.Kind.BACKEND:
        return "native or cudaMallocAsync (ROCm: also hipMallocAsync)"
    if spec.kind is opt.Kind.ROUNDUP:
        return "power of two, or [band:div,...,>:div] (see below)"
    if spec.kind is opt.Kind.RESERVE:
        return ("a fraction of device memory above 0 (0.5; above 1.125 means the default) or a "
                "size in GiB (40G, 1.5G)")
    if spec.kind is opt.Kind.RESERVE_BY_CLASS:
        return "[name:reserve,...]: any name (serve-v2), each reserve as above; [] for none"
    if version is None:
        return "; ".join(f"{f[0]}.{f[1]}+: {b.describe(spec.unit)}" for f, b in spec.bounds)
    return str(bound.describe(spec.unit)) if bound else "any"


def _scope_text(spec: opt.OptionSpec, version: TorchVersion | None) -> str:
    if version is not None:
        return spec.scope_in(version).value
    if spec.scope is opt.Scope.GENERIC:
        return "generic (2.10+); cuda before"
    return "cuda"


def _runtime_text(spec: opt.OptionSpec) -> str:
    if spec.live is opt.Live.IMPORT:
        return "no: restart"
    return f"yes: {spec.live.value}"


_MIN_FLEXIBLE = 22  # the longest word a cell holds (large_segment_size_mb)
_FLEXIBLE = ("valid", "read", "default")
"""Columns that wrap; option names, value kinds and scopes stay whole."""


def _fit_widths(natural: dict[str, int], width: int, gap: int) -> dict[str, int]:
    """Column widths within ``width``: the widest flexible column gives up space first (≥ 12)."""
    widths = dict(natural)
    budget = width - gap * (len(widths) - 1)
    while sum(widths.values()) > budget:
        widest = max(_FLEXIBLE, key=lambda c: widths[c])
        if widths[widest] <= _MIN_FLEXIBLE:
            break  # cannot shrink further: the table is as narrow as it gets
        widths[widest] -= 1
    return widths


def render_text(version: TorchVersion, width: int | None = None) -> str:
    """An aligned plain-text table plus one explanation paragraph per option.

    ``width``: the terminal's columns; long cells wrap onto more lines of the same row and
    the paragraphs wrap, so no line is wider (None: one line per row, however wide).
    """
    import textwrap

    rows = option_rows(version)
    cols = ("option", "value", "default", "valid", "read", "scope")
    natural = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    widths = natural if width is None else _fit_widths(natural, width, 2)
    order = read_order(version)
    intro = (f"Allocator options of torch {version} ({version.build} build). "
             f"Write them to {preferred_variable(version)}; torch reads "
             f"{' > '.join(order.device)} (first one set wins).")
    lines = [*(textwrap.wrap(intro, width) if width else [intro]), ""]
    if width is not None and sum(widths.values()) + 2 * (len(cols) - 1) > width:
        # too narrow for a table: one block per option
        for r in rows:
            lines += textwrap.wrap(f"{r['option']}  ({r['value']}; default {r['default']}; "
                                   f"{r['scope']})", width, subsequent_indent="      ")
            for label in ("valid", "read"):
                lines += textwrap.wrap(f"{label}: {r[label]}", width, initial_indent="    ",
                                       subsequent_indent="      ", break_on_hyphens=False)
    else:
        lines.append("  ".join(c.upper().ljust(widths[c]) for c in cols).rstrip())
        for r in rows:
            cells = {c: textwrap.wrap(r[c], widths[c], break_on_hyphens=False) or [""] for c in cols}
            for i in range(max(len(v) for v in cells.values())):
                parts = [(cells[c][i] if i < len(cells[c]) else "").ljust(widths[c]) for c in cols]
                lines.append("  ".join(parts).rstrip())
    lines.append("")
    for r in rows:
        paragraph = [f"{r['option']}: {r['summary']}", f"    {r['explanation']}",
                     f"    Runtime change: {r['runtime']}."]
        if width is None:
            lines += paragraph
        else:
            lines += textwrap.wrap(paragraph[0], width, subsequent_indent="    ")
            for text in paragraph[1:]:
                lines += textwrap.wrap(text.strip(), width, initial_indent="    ",
                                       subsequent_indent="    ")
    return "\n".join(lines)


def render_markdown() -> str:
    """The docs page: every option across all modelled releases, plus a per-release matrix."""
    rows = option_rows(None)
    out = [
        "# Allocator options by torch release",
        "",
        "<!-- Generated by `allocconf options --markdown > docs/options.md`; do not edit. -->",
        "",
        "Every key `PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF` accepts in torch 1.13 "
        "to 2.15, as modelled by `allocconf_widget.core.config.options`. *Read* says when torch reads "
        "the key; *Runtime* says what torch's runtime setter does with it once the allocator "
        "is running.",
        "",
        "| Option | Value | Default | Valid values | Releases | Scope | Read | Runtime |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(f"| `{r['option']}` | {r['value']} | {r['default']} | {r['valid']} | "
                   f"{r['releases']} | {r['scope']} | {r['read']} | {r['runtime']} |")
    out += ["", "## Which release accepts which option", ""]
    versions = [parse_version(v) for v in KNOWN_RELEASES]
    out.append("| Option | " + " | ".join(str(v) for v in versions) + " |")
    out.append("|---|" + "---|" * len(versions))
    for spec in opt.OPTIONS:
        cells = ["✓" if spec.exists_in(v) else "" for v in versions]
        out.append(f"| `{spec.name}` | " + " | ".join(cells) + " |")
    out += ["", "## What each option does", ""]
    for r in rows:
        alias = f" (also spelled `{r['aliases']}`)" if r["aliases"] else ""
        out += [f"### `{r['option']}`{alias}", "", f"{r['summary']} {r['explanation']}", ""]
    from allocconf_widget.core.config.envvars import RELATED_VARS

    out += ["## Other variables the allocator reads", "",
            "Variables of their own, not keys of the settings string. `%allocconf show` and "
            "`allocconf check --env` say what each one that is set does under the torch in use.", ""]
    for var in RELATED_VARS:
        out += [f"### `{var.name}` (torch {var.since[0]}.{var.since[1]}+, default {var.default})", "",
                var.what, ""]
    return "\n".join(out).rstrip() + "\n"
