"""Which environment variable torch reads, in which order, and what is wrong with the current ones.

Facts (docs/internals/allocator_facts.md §1, checked on a CUDA build of torch 2.11):

* up to 2.7 only ``PYTORCH_CUDA_ALLOC_CONF`` is read; 2.8–2.9 ROCm builds fall
  back to ``PYTORCH_HIP_ALLOC_CONF``; 2.9's CUDA allocator ignores
  ``PYTORCH_ALLOC_CONF`` silently (pytorch/pytorch#183387);
* from 2.10 the generic keys come from the first *set* variable of CUDA, HIP
  (also on CUDA builds), ALLOC; the CUDA keys and ``backend`` from CUDA, HIP
  (ROCm only), ALLOC. Values are never merged across variables;
* a variable set to the empty string counts as set and shadows the others
  (``PYTORCH_CUDA_ALLOC_CONF=""`` hides ``PYTORCH_ALLOC_CONF``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from allocconf_widget._errors import AllocConfError, printable
from allocconf_widget.core.versions import TorchVersion

CUDA_VAR = "PYTORCH_CUDA_ALLOC_CONF"
HIP_VAR = "PYTORCH_HIP_ALLOC_CONF"
ALLOC_VAR = "PYTORCH_ALLOC_CONF"
ALL_VARS = (CUDA_VAR, HIP_VAR, ALLOC_VAR)


@dataclass(frozen=True)
class RelatedVariable:
    """A variable of its own, beside the allocator's settings, that changes what the caching
    allocator does; ``show`` and ``check --env`` say what it does when it is set."""

    name: str
    since: tuple[int, int]  # the first release that reads it
    default: str
    meanings: dict[str, str]  # each value torch takes, and what it means
    what: str  # what it does, for the option docs

    def describe(self, value: str, version: TorchVersion) -> str:
        """What ``value`` does under torch ``version``, in one line."""
        if version.schema_key < self.since:
            return (f"not read by torch {version} (only from {self.since[0]}.{self.since[1]}): "
                    "it does nothing here")
        meaning = self.meanings.get(value)
        if meaning is None:
            takes = " or ".join(self.meanings)
            return (f"{printable(repr(value), 40, newlines=False)} is not {takes}: torch warns "
                    f"\"Ignoring invalid value for boolean flag\" and keeps its default "
                    f"({self.default})")
        return meaning


#: ``TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC`` (pytorch/pytorch#169487, in 2.10): read with
#: ``c10::utils::check_env`` (``1`` true, ``0`` false, anything else a warning and the default)
#: into a function-local static the first time an expandable segment maps memory
#: (``ExpandableSegment::map``); on unless set, in PyPI's builds (Meta's internal builds: off).
EXPANDABLE_IPC = RelatedVariable(
    name="TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC",
    since=(2, 10),
    default="1: on",
    meanings={
        "1": "expandable segments create their memory shareable: CUDA tensors in them can be "
             "sent to other processes (the default)",
        "0": "expandable segments create their memory without IPC handles: a CUDA tensor in "
             "one cannot be sent to another process",
    },
    what=(
        "Whether expandable segments create their memory with handles another process can open "
        "(POSIX file descriptors, or fabric handles where the GPU has them), so that CUDA "
        "tensors in them can be shared through torch.multiprocessing (DataLoader workers, "
        "reductions across processes). 1 (the default) or 0; with 0 sharing such a tensor "
        "fails (2.14 and 2.15 say \"Cannot share an expandable_segments allocation: IPC handles "
        "are disabled\"). Any other value is ignored with a warning. Read once per process, when "
        "the first expandable segment maps memory: set it before that. Only matters with "
        "expandable_segments:True."
    ),
)
#: every related variable the tool reports, in the order it lists them
RELATED_VARS = (EXPANDABLE_IPC,)


def strip_variable_prefix(text: str) -> tuple[str | None, str]:
    """``PYTORCH_CUDA_ALLOC_CONF=a:1`` (a common paste, ``export`` and quotes too) → (name, ``a:1``)."""
    body = text.strip()
    if body.startswith("export "):
        body = body[len("export "):].lstrip()
    for name in ALL_VARS:
        if body.startswith(name) and body[len(name):len(name) + 1] in ("=", ":"):
            value = body[len(name) + 1:].strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            return name, value
    return None, text


@dataclass(frozen=True)
class ReadOrder:
    """The variables torch ``version`` tries, first set wins, for each kind of key."""

    generic: tuple[str, ...]
    device: tuple[str, ...]

    @property
    def read(self) -> frozenset[str]:
        return frozenset(self.generic) | frozenset(self.device)


@dataclass(frozen=True)
class EnvProblem:
    """Something about the current variables that makes a setting not do what it says."""

    code: str
    variable: str
    message: str

    def __str__(self) -> str:
        return self.message

    @property
    def misread(self) -> bool:
        """A variable torch does not read as written: shadowed by another, split with another
        (each half of the keys from one), or ignored by this release. Said beside every line
        that reports what the environment holds."""
        return self.code in ("shadowed", "split", "ignored")


@dataclass(frozen=True)
class EnvReport:
    """What torch will read from an environment, and what is wrong with it."""

    version: TorchVersion
    set_vars: dict[str, str]
    generic_from: str | None
    device_from: str | None
    problems: tuple[EnvProblem, ...] = field(default=())
    #: the related variables that are set (:data:`RELATED_VARS`), with their values
    related: tuple[tuple[RelatedVariable, str], ...] = field(default=())

    def related_lines(self) -> tuple[str, ...]:
        """One line per related variable that is set: its value and what it does here."""
        return tuple(f"{var.name}={printable(repr(value), 60, newlines=False)}: "
                     f"{var.describe(value, self.version)}" for var, value in self.related)

    @property
    def split(self) -> bool:
        """True when torch reads the generic and the CUDA keys from two different variables."""
        return (self.generic_from is not None and self.device_from is not None
                and self.generic_from != self.device_from)

    @property
    def source(self) -> str:
        """Where the settings torch runs come from, in words (``show``'s ``[from …]``)."""
        if self.split:
            return f"generic keys from {self.generic_from}, CUDA keys from {self.device_from}"
        return self.device_from or self.generic_from or "no variable"

    @property
    def effective_text(self) -> str | None:
        """The settings torch runs, as one string (None when no variable it reads is set).

        From 2.10 the generic keys come from ``generic_from`` and the CUDA keys from
        ``device_from``; when those differ (``PYTORCH_HIP_ALLOC_CONF`` and
        ``PYTORCH_ALLOC_CONF`` set on a CUDA build) torch runs the generic keys of the one
        and the CUDA keys of the other, and this is that combination. Writing it into the
        one variable that wins both halves keeps every option torch was running.
        """
        if self.generic_from is None and self.device_from is None:
            return None
        if not self.split:
            source = self.device_from or self.generic_from
            return None if source is None else self.set_vars[source]
        assert self.generic_from is not None and self.device_from is not None  # split says so
        return combined_text(self.set_vars[self.generic_from], self.set_vars[self.device_from],
                             self.version)


def combined_text(generic_text: str, device_text: str, version: TorchVersion) -> str:
    """The generic keys of ``generic_text`` with the CUDA keys (``backend`` too) of ``device_text``.

    Each half is parsed on its own, as torch parses it; a half that does not parse is
    returned as it is (the environment report names it invalid, and nothing is built on
    it). When the two valid halves clash (a rule between a generic and a CUDA key), the
    result is their plain concatenation, which the caller's parse refuses with the reason.
    """
    from allocconf_widget.core.config import options as opt
    from allocconf_widget.core.config.conf import format_value, parse_conf

    halves = []
    for text, scope in ((generic_text, opt.Scope.GENERIC), (device_text, opt.Scope.CUDA)):
        try:
            conf = parse_conf(text, version, warn=False)
        except AllocConfError:
            return text
        halves.append(",".join(
            f"{name}:{format_value(value)}" for name, value in conf.items()
            if (spec := opt.spec_for(name)) is not None and spec.scope_in(version) is scope))
    joined = ",".join(h for h in halves if h)
    try:
        return parse_conf(joined, version, warn=False).to_string()
    except AllocConfError:
        return joined


def read_order(version: TorchVersion) -> ReadOrder:
    """Variables torch ``version`` reads, in precedence order."""
    rocm = version.build == "rocm"
    key = version.schema_key
    if key >= (2, 10):
        device = (CUDA_VAR, HIP_VAR, ALLOC_VAR) if rocm else (CUDA_VAR, ALLOC_VAR)
        return ReadOrder(generic=(CUDA_VAR, HIP_VAR, ALLOC_VAR), device=device)
    names = (CUDA_VAR, HIP_VAR) if rocm and key >= (2, 8) else (CUDA_VAR,)
    return ReadOrder(generic=names, device=names)


def preferred_variable(version: TorchVersion) -> str:
    """The name to recommend when nothing is set: the documented one that this release honours."""
    return ALLOC_VAR if version.schema_key >= (2, 10) else CUDA_VAR


def variable_to_write(version: TorchVersion, environ: Mapping[str, str]) -> str:
    """The variable a new value must go into so that torch ``version`` actually reads it.

    If a variable torch reads is already set, writing anywhere else would be
    shadowed by it, so we write into the winning one; if the generic and the
    device keys would come from different variables, only the CUDA name wins
    for both.
    """
    order = read_order(version)
    generic = next((n for n in order.generic if n in environ), None)
    device = next((n for n in order.device if n in environ), None)
    if generic is None and device is None:
        return preferred_variable(version)
    if generic == device and generic is not None:
        return generic
    return CUDA_VAR


def check_environment(environ: Mapping[str, str], version: TorchVersion) -> EnvReport:
    """Report which variable torch ``version`` will read and every problem with the set ones."""
    from allocconf_widget.core.config.conf import parse_conf

    order = read_order(version)
    set_vars = {n: environ[n] for n in ALL_VARS if n in environ}
    generic = next((n for n in order.generic if n in set_vars), None)
    device = next((n for n in order.device if n in set_vars), None)
    problems: list[EnvProblem] = []
    for name, value in set_vars.items():
        if name not in order.read:
            problems.append(EnvProblem("ignored", name, _ignored_message(name, version)))
        elif name not in (generic, device):
            winner = device or generic
            empty = " (even though it is empty)" if winner and set_vars[winner] == "" else ""
            same = "" if winner and set_vars[winner] == value else f" ({name}={value!r} is unused)"
            problems.append(EnvProblem(
                "shadowed", name,
                f"{name} is not read: {winner} is also set{empty} and torch {version} reads it "
                f"first{same}"))
    if generic and device and generic != device and set_vars[generic] != set_vars[device]:
        problems.append(EnvProblem(
            "split", generic,
            f"torch {version} takes the generic keys from {generic} and the CUDA keys from "
            f"{device}: each half of your settings is read from a different variable"))
    # each variable torch reads is parsed on its own: with a split, both halves can be wrong
    for source in dict.fromkeys(n for n in (device, generic) if n is not None):
        value = set_vars[source]
        if not value:
            continue
        try:
            parse_conf(value, version, warn=False)
        except AllocConfError as exc:
            problems.append(EnvProblem(
                "invalid", source,
                f"{source}={printable(repr(value), 200)} is not valid for torch {version}: {exc}. "
                "torch fails at the first CUDA allocation (some releases already at import, "
                "pytorch/pytorch#186453)"))
    related = tuple((var, environ[var.name]) for var in RELATED_VARS if var.name in environ)
    return EnvReport(version, set_vars, generic, device, tuple(problems), related)


def _ignored_message(name: str, version: TorchVersion) -> str:
    if name == ALLOC_VAR and version.schema_key == (2, 9):
        return (f"{ALLOC_VAR} is silently ignored by torch 2.9's CUDA allocator "
                f"(pytorch/pytorch#183387); use {CUDA_VAR}")
    if name == ALLOC_VAR:
        return f"{ALLOC_VAR} is read only from torch 2.10; torch {version} needs {CUDA_VAR}"
    return f"{name} is read only by ROCm builds of torch; use {CUDA_VAR}"


def snippets(conf_text: str, variable: str) -> dict[str, str]:
    """Copyable ways to set ``variable`` to ``conf_text`` (or to unset it when empty).

    Keys: ``magic`` (an IPython cell line), ``python`` (before ``import torch``), ``shell``.
    """
    if not conf_text:
        unset = f'import os\nos.environ.pop("{variable}", None)  # before `import torch`'
        return {  # an empty variable still counts as set and would shadow the others
            "magic": unset,
            "python": unset,
            "shell": f"unset {variable}",
        }
    return {
        "magic": f"%env {variable}={conf_text}",
        "python": f'import os\nos.environ["{variable}"] = "{conf_text}"  # before `import torch`\n'
                  "import torch",
        "shell": f"export {variable}='{conf_text}'",
    }
