"""``forge/`` has no import cycles: every arrow between its modules points one way.

The graph is read from the source with ``ast``, every import counted: those inside
functions and those under ``if TYPE_CHECKING:`` too, so neither a lazy import nor a
type-only one can hide a cycle (a circle drawn only for the type checker is still
two modules that cannot be understood apart, and the next refactor that needs the
name at run time turns it into an import-time failure).
"""

from __future__ import annotations

import ast
from pathlib import Path

import forge

PACKAGE = Path(forge.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    found: set[str] = set()
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
        pending.extend(ast.iter_child_nodes(node))
    return {name for name in found if name in known and name != module}


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(files)
    return {
        name: _imports(ast.parse(path.read_text()), name, path.name == "__init__.py", known)
        for name, path in files.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that starts and ends at the same module."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for nxt in sorted(graph.get(name, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state and (cycle := visit(name)):
            return cycle
    return None


def test_forge_has_no_import_cycles() -> None:
    graph = import_graph()
    assert "forge.stores.sqlite" in graph["forge.stores"]  # function-level imports count
    assert "forge.stores.migrations" in graph["forge.stores.sqlite"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_migrations_is_a_leaf_of_the_stores() -> None:
    graph = import_graph()
    deps = graph["forge.stores.migrations"]
    leaves = {"forge.stores.base", "forge.stores.agent_sql", "forge.stores.migration_steps"}
    assert not {d for d in deps if d.startswith("forge.stores")} - leaves
    steps = graph["forge.stores.migration_steps"]  # the DDL: step 6's SQL text at most
    assert not {d for d in steps if d.startswith("forge")} - {"forge.stores.agent_sql"}
    assert not {d for d in graph["forge.stores.agent_sql"] if d.startswith("forge")}


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_relative_and_type_checking_imports_are_read_right() -> None:
    known = {"p", "p.a", "p.b", "p.c"}
    tree = ast.parse("from . import a\nfrom .b import x\nif TYPE_CHECKING:\n    from p import c\n")
    assert _imports(tree, "p", True, known) == {"p.a", "p.b", "p.c"}
    assert _imports(ast.parse("from . import b"), "p.a", False, known) == {"p.b"}


#: What each part of ``forge`` may import (besides itself): the README's layer
#: table. ``forge.errors`` and ``forge.clocks`` are leaves every layer may use,
#: ``forge.serialize`` one the wire and the stores share; the core uses nothing.
LAYERS: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "errors": frozenset(),
    "clocks": frozenset(),
    "logs": frozenset(),
    "serialize": frozenset(),
    "__main__": frozenset({"cli"}),
    "wire": frozenset({"core", "errors", "serialize", "stores.base"}),
    "settings": frozenset({"errors", "wire"}),
    "stores": frozenset({"core", "errors", "serialize"}),
    "loaders": frozenset({"core", "errors"}),
    "client": frozenset({"core", "errors", "settings", "stores", "wire"}),
    "params": frozenset({"core", "errors", "loaders"}),
    "agent": frozenset({"client", "core", "errors", "params", "settings", "stores"}),
    "takeover": frozenset(),
    "spinner": frozenset(),
    "queue_text": frozenset({"core", "wire"}),
    "render": frozenset({"core", "queue_text", "wire"}),
    "sim": frozenset({"core", "stores"}),
    "services": frozenset(
        {"client", "core", "errors", "loaders", "render", "settings", "stores", "wire"}
    ),
    "cli": frozenset(
        {
            "agent",
            "client",
            "core",
            "errors",
            "loaders",
            "params",
            "queue_text",
            "render",
            "services",
            "settings",
            "sim",
            "spinner",
            "stores",
            "wire",
        }
    ),
}


def _part(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def _allowed(source: str, target: str) -> bool:
    here, there = _part(source), _part(target)
    if there == here or target == "forge":
        return True
    rules = LAYERS[here]
    return there in rules or any(
        target == f"forge.{r}" or target.startswith(f"forge.{r}.") for r in rules
    )


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        if _part(source) in LAYERS
        for target in targets
        if not _allowed(source, target)
    )


def test_every_part_of_forge_imports_only_the_layers_below_it() -> None:
    graph = import_graph()
    assert {_part(m) for m in graph if _part(m)} <= set(LAYERS), "a new part needs a row"
    assert layer_violations(graph) == []


def test_the_layer_check_sees_an_upward_import() -> None:
    graph = {
        "forge.core.reconcile": {"forge.wire.contract"},
        "forge.wire.views": {"forge.stores.sql"},
    }
    assert layer_violations(graph) == [
        "forge.core.reconcile -> forge.wire.contract",
        "forge.wire.views -> forge.stores.sql",
    ]
