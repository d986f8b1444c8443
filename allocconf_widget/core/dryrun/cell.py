"""What a dry-run cell reads and binds, from its source (Python's own symbol tables).

Two users: the namespace copy, which copies only the tensors, models and optimizers the cell
reads (a dataset it never touches is not copied), and the batch planner, which sets the batch
variable before each run and must refuse a cell that binds the variable itself (a script's
``BATCH = 64`` at its top would run 64 at every plan size) or reads it only as a function's
own parameter or local.

Standard library only.
"""

from __future__ import annotations

import ast
import symtable
from dataclasses import dataclass


def _tables(source: str) -> symtable.SymbolTable | None:
    try:
        return symtable.symtable(source, "<dry-run cell>", "exec")
    except (SyntaxError, ValueError):
        return None


def global_reads(source: str) -> set[str] | None:
    """Names ``source`` reads from its globals: at the top level, and in its functions and
    classes where they are not their own. None when the source does not compile (the caller
    copies everything then)."""
    top = _tables(source)
    if top is None:
        return None
    names: set[str] = set()
    pending = [(top, True)]
    while pending:
        table, is_top = pending.pop()
        for symbol in table.get_symbols():
            if symbol.is_referenced() and (is_top or symbol.is_global()):
                names.add(symbol.get_name())
        pending.extend((child, False) for child in table.get_children())
    return names


@dataclass(frozen=True)
class VariableUse:
    """How a cell uses the variable the planner sets."""

    reads: bool  # the cell reads the notebook's value (at its top level, or as a global)
    bound_at: int | None = None  # the line where the cell binds it itself (1-based), if it does
    shadowed_in: str | None = None  # a function of the cell that has its own variable of that name


def variable_use(source: str, name: str) -> VariableUse | None:
    """How ``source`` uses the global ``name``; None when the source does not compile."""
    top = _tables(source)
    if top is None:
        return None
    reads = False
    bound = False
    shadowed: str | None = None
    pending = [(top, True)]
    while pending:
        table, is_top = pending.pop()
        try:
            symbol = table.lookup(name)
        except KeyError:
            symbol = None
        if symbol is not None:
            if is_top:
                reads = reads or symbol.is_referenced()
                bound = bound or symbol.is_assigned() or symbol.is_imported() or symbol.is_namespace()
            elif symbol.is_declared_global():
                reads = reads or symbol.is_referenced()
                bound = bound or symbol.is_assigned()
            elif symbol.is_global():
                reads = reads or symbol.is_referenced()
            elif ((symbol.is_local() or symbol.is_parameter()) and shadowed is None
                  and table.get_type() == "function"):
                shadowed = table.get_name()
        pending.extend((child, False) for child in table.get_children())
    return VariableUse(reads, _binding_line(source, name) if bound else None, shadowed)


def _binding_line(source: str, name: str) -> int | None:
    """The first line that binds ``name`` at the top level (or as a declared global)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    lines: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store | ast.Del):
            lines.append(node.lineno)
        elif isinstance(node, ast.alias) and (node.asname or node.name.split(".")[0]) == name:
            lines.append(getattr(node, "lineno", 1))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.ExceptHandler) \
                and node.name == name:
            lines.append(node.lineno)
    return min(lines) if lines else None
