"""The names kvbench's packages had before they moved under `kvbench.`, and the guard that
turns an import of one of them into a clear error.

Why a guard: from a source checkout (the working directory on `sys.path`), `import paged`
would still find the repository folder and import a second copy of kvbench's code next to
`kvbench.paged`, with its own classes and state: a silent mix of two packages. In a wheel
install the old names do not exist at all, and the plug-in loader turns the resulting
ModuleNotFoundError into the same message (`old_name_hint`).

The guard only refuses an old name that resolves to kvbench's own folder: another
distribution's top-level `kernels` (Hugging Face's kernel hub) or `reports` imports as usual.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

OLD_NAMES = frozenset({"workloads", "reference", "paged", "kernels", "reports", "suites"})


def new_name(module: str) -> str | None:
    """`kvbench.<module>` when `module` starts with one of the old top-level names, else None."""
    root = module.split(".", 1)[0]
    return f"kvbench.{module}" if root in OLD_NAMES else None


def old_name_hint(exc: BaseException) -> str | None:
    """A one-line fix when `exc` is an import failure of an old kvbench name, else None."""
    name = getattr(exc, "name", None)
    if not isinstance(exc, ImportError) or not name:
        return None
    fixed = new_name(name)
    if fixed is None:
        return None
    return (
        f"`{name}` is kvbench's old import name: kvbench's modules now live under `kvbench.`"
        f" (import `{fixed}` instead)"
    )


def _locations(spec: importlib.machinery.ModuleSpec | None) -> set[Path]:
    if spec is None:
        return set()
    paths = list(spec.submodule_search_locations or [])
    if not paths and spec.origin:
        paths = [str(Path(spec.origin).parent)]
    return {Path(p).resolve() for p in paths}


class _RefusingLoader(importlib.abc.Loader):
    """Fails the import with the message that names the new module."""

    def __init__(self, message: str) -> None:
        self.message = message

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        raise ImportError(self.message, name=spec.name)

    def exec_module(self, module: ModuleType) -> None:  # pragma: no cover - never reached
        raise ImportError(self.message, name=module.__name__)


class OldNameGuard(importlib.abc.MetaPathFinder):
    """Refuses `import <old name>` when it would import kvbench's own folder again.

    `find_spec` itself never raises: libraries probe names with `importlib.util.find_spec`
    (transformers asks for `kernels`), and a probe must get an answer, not an exception. The
    refusal happens when the module is actually loaded.
    """

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in OLD_NAMES:
            return None
        found = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            found = finder.find_spec(fullname, path, target)
            if found is not None:
                break
        if found is None:
            return None
        ours = _locations(importlib.util.find_spec(f"kvbench.{fullname}"))
        if ours & _locations(found):
            message = old_name_hint(ImportError(name=fullname)) or fullname
            return importlib.machinery.ModuleSpec(
                fullname, _RefusingLoader(message), origin=found.origin
            )
        return None


def install_old_name_guard() -> None:
    """Put one OldNameGuard first on `sys.meta_path` (idempotent)."""
    if not any(isinstance(f, OldNameGuard) for f in sys.meta_path):
        sys.meta_path.insert(0, OldNameGuard())
