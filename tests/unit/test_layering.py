"""Layering rules a reviewer should not have to check by eye.

* Every private torch name (``torch._C``, ``torch.cuda.memory._snapshot`` …) is used in
  ``adapters/torch_private.py`` and the dry run's own package ``adapters/dryrun/`` only, so a
  torch upgrade that renames one breaks one of them.
* No front end imports another: the CLI, the magic and the widgets share the use cases in
  ``app/`` and the core, never each other.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "allocconf_widget"
BRIDGE = PACKAGE / "adapters" / "torch_private.py"
#: the dry run's fake-tensor machinery: private torch APIs through and through
DRY_RUN = PACKAGE / "adapters" / "dryrun"
TORCH_ROOTS = {"torch", "memory", "cuda", "_C"}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def private_torch_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    label = path.relative_to(PACKAGE) if path.is_relative_to(PACKAGE) else path.name
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__") and _root_name(node) in TORCH_ROOTS):
            found.append(f"{label}:{node.lineno} .{node.attr}")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch"):
            names = [a.name for a in node.names if a.name.startswith("_")]
            if names or any(part.startswith("_") for part in node.module.split(".")):
                found.append(f"{label}:{node.lineno} from {node.module}")
    return found


def _bridges(path: Path) -> bool:
    return path == BRIDGE or path.is_relative_to(DRY_RUN)


def test_private_torch_names_only_in_the_bridge():
    offenders = [use for path in _modules() if not _bridges(path) for use in private_torch_uses(path)]
    assert offenders == []


def test_the_dry_run_package_is_a_bridge_and_nothing_else_is():
    """The allowance covers the dry run's package and no other adapter."""
    assert _bridges(DRY_RUN / "run.py") and _bridges(BRIDGE)
    assert not _bridges(PACKAGE / "adapters" / "recorder.py")
    assert not _bridges(PACKAGE / "app" / "dryrun.py")


def test_the_check_sees_a_private_call(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from torch._C import x\n"
                      "def f(torch, memory):\n"
                      "    torch.cuda.memory._snapshot()\n"
                      "    memory._record_memory_history(enabled=None)\n")
    assert private_torch_uses(sample) == ["sample.py:1 from torch._C", "sample.py:3 ._snapshot",
                                          "sample.py:4 ._record_memory_history"]


# ---------------------------------------------------------------- layers and front ends

def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _package_imports(path: Path) -> set[str]:
    """Every allocconf_widget module ``path`` imports, type-checking-only imports included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                out.add(candidate if _is_module(candidate) else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("allocconf_widget.")}


def _is_module(dotted: str) -> bool:
    rel = Path(*dotted.split("."))
    return (PACKAGE.parent / rel).with_suffix(".py").exists() or (PACKAGE.parent / rel).is_dir()


def _area(module: str) -> str:
    """The layer or front end a module belongs to: ``core.config``, ``views.cli``, ``app`` …"""
    parts = module.split(".")[1:]
    if not parts:
        return "package"
    if parts[:2] == ["adapters", "frontend"]:
        return "adapters.frontend"  # front-end detection: the one adapter views may use
    if parts[0] in ("core", "views") and len(parts) > 2:
        return f"{parts[0]}.{parts[1]}"
    return parts[0]


# Which areas each area may import. Anything unlisted is a layering error.
ALLOWED: dict[str, set[str]] = {
    "core": {"core", "_errors"},
    "core.config": {"core", "core.config", "_errors"},
    "core.memory": {"core", "core.memory", "_errors"},
    "core.dryrun": {"core", "core.dryrun", "_errors"},
    "core.sim": {"core", "core.config", "core.memory", "core.sim", "_errors"},
    "adapters.frontend": {"core", "core.config", "core.memory", "core.sim", "core.dryrun", "adapters",
                          "adapters.frontend", "_errors"},
    "adapters": {"core", "core.config", "core.memory", "core.sim", "core.dryrun", "adapters", "_errors",
                 "adapters.frontend"},
    "app": {"core", "core.config", "core.memory", "core.sim", "core.dryrun", "adapters", "app", "_errors",
            "adapters.frontend"},
    "views.charts": {"core", "core.memory", "core.sim", "core.dryrun", "app", "views.charts", "views.text",
                     "_errors", "adapters.frontend"},
    "views.text": {"core", "core.config", "core.memory", "core.sim", "core.dryrun", "app", "views.text",
                   "_errors", "adapters.frontend"},
    # The three front ends share the renderers (charts, text) and never import each other,
    # except that %allocconf's job is to *display* the panel and the monitor widgets.
    "views.cli": {"core", "core.config", "core.memory", "core.sim", "core.dryrun", "app", "views.text",
                  "views.cli", "_errors", "package", "adapters.frontend"},
    "views.python": {"core", "core.config", "core.memory", "core.sim", "core.dryrun", "app", "views.text",
                     "views.python", "_errors", "adapters.frontend"},
    "views.magic": {"core", "core.config", "core.memory", "core.sim", "core.dryrun", "app", "views.text",
                    "views.charts", "views.magic", "views.widgets", "_errors", "adapters.frontend"},
    "views.widgets": {"core", "core.config", "core.memory", "core.sim", "core.dryrun", "app", "views.text",
                      "views.charts", "views.widgets", "_errors", "adapters.frontend"},
}


def _area_of_path(path: Path) -> str:
    return _area(_module_name(path))


def _layered_modules() -> list[Path]:
    return [p for p in _modules() if _area_of_path(p) in ALLOWED]


@pytest.mark.parametrize("path", _layered_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_module_imports_only_what_its_layer_may(path):
    mine = _area_of_path(path)
    wrong = sorted(f"{m} ({_area(m)})" for m in _package_imports(path)
                   if _area(m) not in ALLOWED[mine] | {"_version"})
    assert wrong == [], f"{mine} may not import {wrong}"


def test_every_module_belongs_to_a_known_layer():
    areas = {_area_of_path(p) for p in _modules()}
    assert areas - set(ALLOWED) <= {"package", "views", "_errors", "__main__", "_version"}, areas


def test_no_import_cycles_between_modules():
    """Type-checking-only imports count: a cycle there is still a design knot."""
    graph = {_module_name(p): {m for m in _package_imports(p) if m != _module_name(p)} for p in _modules()}
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert cycles == []


# ---------------------------------------------------------------- what views may import

VIEWS = PACKAGE / "views"
#: Views draw: they may import the front-end libraries, never the GPU stack. torch and NVML are
#: reached through ``adapters/`` (``torch_private``, ``nvml``, ``runtime_state`` …), so a view
#: cannot initialise CUDA or freeze the allocator settings by looking. ruff's TID251 bans these
#: in core/ and app/; views/ is exempt there because it may import IPython, ipywidgets and
#: plotly, so this test holds the rest of the rule for it.
VIEW_BANNED = ("torch", "pynvml", "numpy")
_PROBES = {"import_module", "find_spec", "__import__", "get"}

#: Known, listed for issue 20's rewrite of the monitor (app/monitor.py chooses live vs replay):
#: to be emptied there, not added to.
VIEW_KNOWN: set[str] = set()  # none left: the monitor's GPU check moved to app/monitor


def _banned(name: str) -> bool:
    return name.split(".", maxsplit=1)[0] in VIEW_BANNED


def view_gpu_imports(path: Path) -> list[str]:
    """Imports of torch/pynvml/numpy in a view, lazy ones and name-string probes included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    label = path.relative_to(VIEWS) if path.is_relative_to(VIEWS) else path.name
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{label}:import {a.name}" for a in node.names if _banned(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and _banned(node.module):
            found.append(f"{label}:from {node.module}")
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = (func.attr if isinstance(func, ast.Attribute)
                    else func.id if isinstance(func, ast.Name) else "")
            first = node.args[0]
            if (name in _PROBES and isinstance(first, ast.Constant) and isinstance(first.value, str)
                    and _banned(first.value) and (name != "get" or _root_name(func) == "sys")):
                found.append(f"{label}:{name}({first.value!r})")
    return found


def test_views_never_import_torch_or_nvml():
    found = {hit.replace("\\", "/") for path in sorted(VIEWS.rglob("*.py")) if "__pycache__" not in path.parts
             for hit in view_gpu_imports(path)}
    assert sorted(found - VIEW_KNOWN) == [], "go through allocconf_widget.adapters instead"


def test_the_view_check_sees_lazy_imports_and_probes(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import ipywidgets as W\n"
                      "def f():\n"
                      "    import torch\n"
                      "    from pynvml import nvmlInit\n"
                      "    import importlib, sys\n"
                      "    importlib.util.find_spec('torch')\n"
                      "    sys.modules.get('torch')\n"
                      "    importlib.import_module('numpy.linalg')\n"
                      "    d = {}; d.get('torch')\n")
    assert view_gpu_imports(sample) == [
        "sample.py:import torch", "sample.py:from pynvml", "sample.py:find_spec('torch')",
        "sample.py:get('torch')", "sample.py:import_module('numpy.linalg')"]


# ---------------------------------------------------------------- the picture in docs/architecture.md

def _architecture_picture() -> str:
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    return text.split("```", 2)[1]


def test_the_architecture_picture_names_every_module():
    """A module added without drawing it (or a module deleted but still drawn) fails here."""
    picture = _architecture_picture()
    words = set(re.findall(r"[a-z_]+", picture))
    missing = [str(p.relative_to(PACKAGE)) for p in _modules()
               if p.stem not in ("__init__", "__main__", "_errors", "_version") and p.stem not in words]
    assert missing == [], "add these modules to the picture in docs/architecture.md"
