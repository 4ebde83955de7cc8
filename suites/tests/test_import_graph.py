"""The import graph of kvbench's own modules: imports point down the layers of
docs/layout.md, and no two files import each other, directly or around a circle. Every
import counts: module level, inside functions (a circle hidden in a function is still a
circle) and under `TYPE_CHECKING` (a type-only circle still means two modules that
cannot be understood one without the other)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: folder -> installed package, in layer order: each may import only those after it.
LAYERS = (
    ("suites", "kvbench.suites"),
    ("reports", "kvbench.reports"),
    ("paged", "kvbench.paged"),
    ("reference", "kvbench.reference"),
    ("kernels", "kvbench.kernels"),
    ("workloads", "kvbench.workloads"),
)


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    root = parts[:2] == ["suites", "_kvbench"]  # the root package kvbench
    parts = ["kvbench", *(parts[2:] if root else parts)]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _files() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for folder, _ in LAYERS:
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT).parts
            if rel[:2] == ("suites", "tests") or "__pycache__" in rel:
                continue
            out[_module_of(path)] = path
    return out


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """kvbench modules `module` imports (a `from pkg import name` of a submodule counts
    as importing that submodule)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            names = [target] + [f"{target}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def _graph() -> dict[str, set[str]]:
    files = _files()
    known = set(files)
    return {m: _imports(m, p, known) for m, p in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            # a package's __init__ importing its own submodules is how packages work
            if v == w.rpartition(".")[0] or w == v.rpartition(".")[0]:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _layer(module: str) -> int:
    for i, (_, pkg) in enumerate(LAYERS):
        if module == pkg or module.startswith(pkg + "."):
            return i
    return -1  # the root package kvbench (suites/_kvbench) sits with suites


def test_no_import_circle_between_files() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import circles (each a set of files that import each other):\n" + (
        "\n".join(" <-> ".join(c) for c in cycles)
    )


def test_imports_point_down_the_layers() -> None:
    upward = [
        f"{m} imports {t}"
        for m, targets in _graph().items()
        for t in targets
        if _layer(m) >= 0 and _layer(t) >= 0 and _layer(t) < _layer(m)
    ]
    assert not upward, "imports pointing up the layers of docs/layout.md:\n" + "\n".join(upward)


def test_the_finder_sees_a_planted_circle(tmp_path: Path) -> None:
    """The checks can fail: a two-file circle and an upward import are found."""
    graph = {"kvbench.paged.a": {"kvbench.paged.b"}, "kvbench.paged.b": {"kvbench.paged.a"}}
    assert _cycles(graph) == [["kvbench.paged.a", "kvbench.paged.b"]]
    assert _layer("kvbench.workloads.x") > _layer("kvbench.paged.a")
    assert len(_graph()) > 200  # every module was parsed
