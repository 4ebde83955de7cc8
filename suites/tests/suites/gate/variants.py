"""Deliberately heavier kernel variants, for proving that the regression gate fails.

`heavier_decode()` rebuilds the real decode kernel (`kernels.triton_kernels._paged_decode`)
from its own source with one change: right after each K tile is loaded, the same tile is
loaded a second time (a volatile load, so the compiler cannot merge it with the first) and
added in times zero. The result is numerically the same kernel doing strictly more work,
what an accidental double load in a real change looks like. The source is transformed
through `ast`, so it follows whatever the current kernel looks like; it fails loudly if
the kernel no longer has a `k = tl.load(...)` statement.

"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import textwrap
from pathlib import Path


class _DoubleKLoad(ast.NodeTransformer):
    """After every `k = tl.load(...)`, insert `k = k + tl.load(..., volatile=True) * 0.0`."""

    def __init__(self) -> None:
        self.count = 0

    def _visit_body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for stmt in body:
            out.append(self.visit(stmt))
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
                and stmt.targets[0].id == "k"
                and isinstance(stmt.value, ast.Call)
                and ast.unparse(stmt.value.func) == "tl.load"
            ):
                again = ast.Call(
                    func=stmt.value.func,
                    args=stmt.value.args,
                    keywords=[*stmt.value.keywords, ast.keyword("volatile", ast.Constant(True))],
                )
                extra = ast.parse("k = k + _AGAIN * 0.0").body[0]
                extra.value.right.left = again  # type: ignore[attr-defined]
                out.append(extra)
                self.count += 1
        return out

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for name in ("body", "orelse"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                setattr(node, name, self._visit_body(block))
        return node


def heavier_decode(workdir: Path):
    """A JITFunction: the current decode kernel, loading every K tile twice."""
    from triton.runtime.jit import JITFunction

    from kvbench.kernels import triton_kernels

    src = textwrap.dedent(inspect.getsource(triton_kernels._paged_decode))
    tree = ast.parse(src)
    fixer = _DoubleKLoad()
    tree = ast.fix_missing_locations(fixer.visit(tree))
    if fixer.count == 0:
        raise AssertionError(
            "no `k = tl.load(...)` in _paged_decode: update suites/tests/suites/gate/variants.py"
        )
    text = (
        "import triton.language as tl\n"
        "from kvbench.kernels.triton_kernels import NEG_BIG\n\n\n" + ast.unparse(tree) + "\n"
    )
    path = workdir / "heavier_decode_kernel.py"
    path.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("heavier_decode_kernel", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return JITFunction(module._paged_decode)
