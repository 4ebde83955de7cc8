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
import re
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


_OLD_IMPORT = re.compile(
    r"^(?P<indent>[ \t]*)(?P<kw>from|import)[ \t]+(?P<name>"
    + "|".join(sorted(OLD_NAMES))
    + r")(?=[\s.])",
    re.MULTILINE,
)


def modernize_imports(source: str) -> str:
    """`source` with every import statement of an old name rewritten to `kvbench.<name>`.

    For code kvbench itself stored before the rename (a gate baseline freezes the source of
    its torch kernels): the code is unchanged, only where it imports from moved.
    """
    return _OLD_IMPORT.sub(lambda m: f"{m['indent']}{m['kw']} kvbench.{m['name']}", source)


def _locations(spec: importlib.machinery.ModuleSpec | None) -> set[Path]:
    if spec is None:
        return set()
    paths = list(spec.submodule_search_locations or [])
    if not paths and spec.origin:
        paths = [str(Path(spec.origin).parent)]
    return {Path(p).resolve() for p in paths}


class _OldNameModule(ModuleType):
    """What an old name imports as: nothing of kvbench, and every use names the new module.

    It has no `__file__` and no `__version__`, which is how libraries that probe for a
    package of that name (transformers asks for `kernels`) recognise a folder that merely
    shadows the name on `sys.path`: they conclude it is not installed, where a refusal at
    import time would have crashed their own import.
    """

    def __getattr__(self, attr: str) -> object:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        raise ImportError(old_name_hint(ImportError(name=f"{self.__name__}.{attr}")))


class _OldNameLoader(importlib.abc.Loader):
    """Loads an old top-level name as an empty `_OldNameModule`; refuses its submodules."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        if "." in spec.name:
            raise ImportError(old_name_hint(ImportError(name=spec.name)), name=spec.name)
        module = _OldNameModule(spec.name)
        module.__path__ = []  # a package, so `import paged.cache` comes back to the guard
        return module

    def exec_module(self, module: ModuleType) -> None:
        return None


class OldNameGuard(importlib.abc.MetaPathFinder):
    """Stops an old name from importing kvbench's own folder a second time.

    `find_spec` never raises (a probe must get an answer): an old top-level name that
    resolves to kvbench's folder gets an empty module whose every attribute names the new
    module, and a submodule of it (`import paged.cache`) fails with that message.
    """

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        root = fullname.split(".", 1)[0]
        if root not in OLD_NAMES:
            return None
        if "." in fullname:
            if isinstance(sys.modules.get(root), _OldNameModule):
                return importlib.machinery.ModuleSpec(fullname, _OldNameLoader())
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
        if _locations(importlib.util.find_spec(f"kvbench.{fullname}")) & _locations(found):
            return importlib.machinery.ModuleSpec(fullname, _OldNameLoader(), is_package=True)
        return None


def install_old_name_guard() -> None:
    """Put one OldNameGuard first on `sys.meta_path` (idempotent)."""
    if not any(isinstance(f, OldNameGuard) for f in sys.meta_path):
        sys.meta_path.insert(0, OldNameGuard())
