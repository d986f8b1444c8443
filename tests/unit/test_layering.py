"""Layering rules a reviewer should not have to check by eye.

* Every private torch name (``torch._C``, ``torch.cuda.memory._snapshot`` …) is used in
  ``adapters/torch_private.py`` only, so a torch upgrade that renames one breaks one file.
* No front end imports another: the CLI, the magic and the widgets share the use cases in
  ``app/`` and the core, never each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "allocconf_widget"
BRIDGE = PACKAGE / "adapters" / "torch_private.py"
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


def test_private_torch_names_only_in_the_bridge():
    offenders = [use for path in _modules() if path != BRIDGE for use in private_torch_uses(path)]
    assert offenders == []


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
    if parts[0] in ("core", "views") and len(parts) > 2:
        return f"{parts[0]}.{parts[1]}"
    return parts[0]


# Which areas each area may import. Anything unlisted is a layering error.
ALLOWED: dict[str, set[str]] = {
    "core": {"core", "_errors"},
    "core.config": {"core", "core.config", "_errors"},
    "core.memory": {"core", "core.memory", "_errors"},
    "core.sim": {"core", "core.config", "core.memory", "core.sim", "_errors"},
    "adapters": {"core", "core.config", "core.memory", "core.sim", "adapters", "_errors"},
    "app": {"core", "core.config", "core.memory", "core.sim", "adapters", "app", "_errors"},
    "views.charts": {"core", "core.memory", "core.sim", "adapters", "app", "views.charts", "_errors"},
    "views.text": {"core", "core.config", "core.memory", "core.sim", "app", "views.text", "_errors"},
    # The three front ends share the renderers (charts, text) and never import each other,
    # except that %allocconf's job is to *display* the panel and the monitor widgets.
    "views.cli": {"core", "core.config", "core.memory", "core.sim", "adapters", "app",
                  "views.text", "views.cli", "_errors", "package"},
    "views.magic": {"core", "core.config", "core.memory", "core.sim", "adapters", "app",
                    "views.text", "views.charts", "views.magic", "views.widgets", "_errors"},
    "views.widgets": {"core", "core.config", "core.memory", "core.sim", "adapters", "app",
                      "views.text", "views.charts", "views.widgets", "_errors"},
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
