"""The source tree's layout: adapters use the public API only, and no module imports form a cycle.

Both checks read the source with ``ast`` (nothing is imported): every ``import`` and
``from ... import`` counts, at module level or inside a function, except under
``if TYPE_CHECKING:``, which never runs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import agentguard

SRC = Path(agentguard.__file__).parent
PACKAGE = "agentguard"
INTEGRATIONS = f"{PACKAGE}.integrations"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, at any depth (``if TYPE_CHECKING:`` left out)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                yield from _import_nodes(ast.Module(body=[child], type_ignores=[]))
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from _import_nodes(node)


def _imports(module: str) -> Iterator[tuple[str, str | None]]:
    """``(module imported, name imported from it or None)`` for each agentguard import."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield alias.name, None
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        if base.split(".")[0] != PACKAGE:
            continue
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            # `from package import submodule` imports the submodule; otherwise a name of base
            yield (submodule, None) if submodule in MODULES else (base, alias.name)


def _private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split("."))


def test_adapters_import_only_public_modules_and_names() -> None:
    """Every module under agentguard.integrations imports public agentguard modules and names
    only (the integrations package's own private helpers aside)."""
    adapters = [m for m in MODULES if m == INTEGRATIONS or m.startswith(INTEGRATIONS + ".")]
    assert f"{INTEGRATIONS}.openai" in adapters
    offences = []
    for module in adapters:
        for target, name in _imports(module):
            if target == INTEGRATIONS or target.startswith(INTEGRATIONS + "."):
                continue  # the adapters' own helpers (_lazy, _tiers, a package's own modules)
            if _private(target) or (name is not None and name.startswith("_")):
                offences.append(f"{module} imports {target}{'.' + name if name else ''}")
    assert offences == []


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        graph[module] = {target for target, _ in _imports(module) if target in MODULES}
        graph[module].discard(module)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order, the first repeated), or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found is not None:
                    return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module)
            if found is not None:
                return found
    return None


def test_the_source_tree_has_no_import_cycles() -> None:
    """No agentguard module reaches itself through its imports (function-level ones included)."""
    graph = _graph()
    assert graph["agentguard.guard._pipeline"] >= {"agentguard.transport"}  # the graph is read
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or ())


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check above can fail: a two-module loop is reported."""
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
