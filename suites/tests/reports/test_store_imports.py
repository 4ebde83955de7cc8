"""The results store's modules import one another without a cycle, at module level only:
each module can be read (and imported) after the ones it names, and no function hides an
import of a sibling to dodge a cycle."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import kvbench.reports.store as store

STORE = Path(store.__file__).parent
PREFIX = "kvbench.reports.store."


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(store modules imported at module level at run time, ones imported inside functions
    or classes); imports under `if TYPE_CHECKING:` count as neither."""
    tree = ast.parse(path.read_text())
    top: set[str] = set()
    nested: set[str] = set()

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom) and (child.module or "").startswith(PREFIX):
                (nested if inside else top).add(child.module.removeprefix(PREFIX))
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.startswith(PREFIX):
                        (nested if inside else top).add(alias.name.removeprefix(PREFIX))
            scope = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            visit(child, inside or scope)

    visit(tree, False)
    return top, nested


def test_store_modules_import_without_a_cycle():
    graph = {}
    for path in sorted(STORE.glob("*.py")):
        if path.name == "__init__.py":
            continue
        top, nested = _imports(path)
        assert not nested, f"{path.name} imports {sorted(nested)} inside a function"
        graph[path.stem] = top
    assert {"reader", "writer", "frame", "files"} <= graph.keys()
    assert "reader" not in graph["writer"] and "reader" not in graph["frame"]
    order = list(graph_order(graph))
    assert order.index("files") < order.index("writer") < order.index("merge")
    assert order.index("frame") < order.index("reader")


def graph_order(graph: dict[str, set[str]]) -> tuple[str, ...]:
    """The modules in an import order (graphlib raises CycleError on a cycle)."""
    return tuple(graphlib.TopologicalSorter(graph).static_order())
