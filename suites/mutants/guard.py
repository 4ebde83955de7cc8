"""pytest plugin of the mutation session: proves a run imports the mutated copy.

The runner starts pytest with `-p kvbench.suites.mutants.guard` and KVBENCH_MUTANT_ROOT
set to the copy. Before any test is collected this checks that `kvbench` and each of its
packages load from the copy (not from an editable install of another tree), that no
bytecode is written (a stale .pyc of the unmutated file could otherwise be reused), and
that the module of the mutated file is the copy's file holding the replacement; for a
C++ mutant, that the extension was built here from the copy's sources, into the
session's own build folder. A failed check ends pytest with MISWIRED (or STILLBORN when
the mutated C++ does not build), which the runner turns into a loud failure, never into
"killed". Outside the runner (no KVBENCH_MUTANT_ROOT) it does nothing.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

#: pytest exit status: the run does not test the mutated copy.
MISWIRED = 86
#: pytest exit status: a C++ mutant did not build (the kernel fell back to torch).
STILLBORN = 87
#: The file the runner writes into the copy naming the applied mutant.
MARKER = ".mutant.json"
#: The hypothesis profile of mutation runs (KVBENCH_HYPOTHESIS_PROFILE, which
#: suites/conftest.py loads): the ci profile's examples without shrinking (a mutant is
#: killed by the first failing example; shrinking one can take minutes) and without the
#: example database (one mutant's failures must not be replayed against the next).
PROFILE = "mutants"
settings.register_profile(
    PROFILE,
    max_examples=25,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: Packages whose files must all come from the copy.
PACKAGES = (
    "kvbench",
    "kvbench.workloads",
    "kvbench.reference",
    "kvbench.kernels",
    "kvbench.paged",
    "kvbench.suites",
)


def module_name(relative: str, mapping: dict[str, str]) -> str:
    """The import name of a repository file under pyproject's package-dir `mapping`
    (import name -> folder): `paged/cache.py` -> `kvbench.paged.cache`."""
    path = Path(relative)
    found = [
        (len(Path(folder).parts), name, Path(folder))
        for name, folder in mapping.items()
        if Path(folder) in path.parents
    ]
    if not found:
        raise ValueError(f"{relative} lies in no package of pyproject's package-dir")
    _, name, base = max(found)
    rest = path.relative_to(base).with_suffix("").parts
    if rest[-1] == "__init__":
        rest = rest[:-1]
    return ".".join((name, *rest))


def _under(path: str | None, root: Path) -> bool:
    return path is not None and Path(path).resolve().is_relative_to(root)


def check(root: Path) -> tuple[int, list[str]]:
    """(exit status, problems) of this process against the copy at `root`; (0, []) if sound."""
    out: list[str] = []
    if not sys.dont_write_bytecode:
        out.append("bytecode is written (set PYTHONDONTWRITEBYTECODE=1)")
    for name in PACKAGES:
        mod = importlib.import_module(name)
        if not _under(mod.__file__, root):
            out.append(f"{name} is imported from {mod.__file__}, not from the copy {root}")
    marker = root / MARKER
    if not marker.is_file():
        return (MISWIRED if out else 0), out
    info = json.loads(marker.read_text(encoding="utf-8"))
    target = (root / info["file"]).resolve()
    if info["replacement"] not in target.read_text(encoding="utf-8"):
        out.append(f"{info['file']} in the copy does not hold mutant {info['id']}")
    if info["file"].endswith(".py"):
        name = module_name(info["file"], info["package_dir"])
        mod = importlib.import_module(name)
        if mod.__file__ is None or Path(mod.__file__).resolve() != target:
            out.append(f"{name} is imported from {mod.__file__}, not from {target}")
    elif not out:
        from kvbench.kernels import cpu_paged

        source = Path(cpu_paged._SOURCE).resolve()
        if source.parent != target.parent:
            out.append(f"the C++ kernel builds from {source.parent}, not from {target.parent}")
        ext_root = Path(os.environ.get("KVBENCH_CPU_EXT_DIR", "")).resolve()
        if not os.environ.get("KVBENCH_CPU_EXT_DIR") or ext_root == Path.home():
            out.append("KVBENCH_CPU_EXT_DIR is not set to the session's own build folder")
        if out:
            return MISWIRED, out
        status = cpu_paged.status()
        if status.path != "cpp":
            return STILLBORN, [f"mutant {info['id']} did not build: {status.reason}"]
        built = Path(status.build_dir).resolve()
        if built.parent != ext_root or built != cpu_paged._build_dir().resolve():
            out.append(f"the C++ kernel was loaded from {built}, not built from the copy")
    return (MISWIRED if out else 0), out


def pytest_configure(config: pytest.Config) -> None:
    """Stop pytest before collection when the run would not test the mutated copy."""
    root = os.environ.get("KVBENCH_MUTANT_ROOT")
    if not root:
        return
    code, found = check(Path(root).resolve())
    if code:
        pytest.exit("kvbench mutants guard: " + "; ".join(found), returncode=code)
