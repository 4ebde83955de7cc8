"""The type check is wired up: `typecheck.py`'s link tree shows mypy every package the
wheel installs, under its `kvbench.*` name, and `nox -s lint` runs it with a pinned mypy.

mypy checks only what the tree shows it, so a package the tree missed would pass the lint
unchecked, silently; these tests fail instead."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvbench.suites import typecheck

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def _folder_of(package: str) -> Path:
    """The repository folder pyproject's package-dir maps `package` to (the longest mapped
    prefix, then the remaining name parts as sub-folders)."""
    mapping: dict[str, str] = SETUPTOOLS["package-dir"]
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        prefix = ".".join(parts[:cut])
        if prefix in mapping:
            return REPO.joinpath(mapping[prefix], *parts[cut:]).resolve()
    raise AssertionError(f"{package} is under no package-dir entry")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The link tree built for a copy of the root (pyproject + links to the folders), so the
    test never touches the checkout's own .mypy-tree."""
    root = tmp_path_factory.mktemp("root")
    (root / "pyproject.toml").write_text(
        (REPO / "pyproject.toml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    for folder in set(SETUPTOOLS["package-dir"].values()):
        top = folder.split("/")[0]
        if not (root / top).exists():
            (root / top).symlink_to(REPO / top, target_is_directory=True)
    return typecheck.build_tree(root)


@pytest.mark.parametrize("package", SETUPTOOLS["packages"])
def test_tree_shows_every_installed_package(tree: Path, package: str) -> None:
    """Each package in pyproject's `packages` is at kvbench/<parts> in the tree, and is the
    folder the wheel installs under that name (its __init__.py included)."""
    where = tree.joinpath(*package.split("."))
    assert (where / "__init__.py").is_file(), f"{package}: no {where}/__init__.py in the tree"
    if package != "kvbench":  # the root is a folder of file links (the next test)
        assert where.resolve() == _folder_of(package)


def test_tree_holds_the_root_package_files(tree: Path) -> None:
    """The root package's modules (suites/_kvbench/*.py) are linked one by one."""
    own = sorted(p.name for p in _folder_of("kvbench").glob("*.py"))
    linked = sorted(p.name for p in (tree / "kvbench").glob("*.py"))
    assert own and linked == own


def _lint_calls() -> list[ast.Call]:
    source = (REPO / "noxfile.py").read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == "lint":
            return [n for n in ast.walk(node) if isinstance(n, ast.Call)]
    raise AssertionError("noxfile.py has no `lint` session")


def _constants(call: ast.Call) -> list[object]:
    return [a.value for a in call.args if isinstance(a, ast.Constant)]


def test_lint_session_runs_the_typecheck() -> None:
    """`nox -s lint` runs `python -m kvbench.suites.typecheck` and installs the lint extra."""
    calls = _lint_calls()
    runs = [_constants(c) for c in calls if ast.unparse(c.func) == "session.run"]
    assert ["python", "-m", "kvbench.suites.typecheck"] in runs, runs
    installs = [c for c in calls if ast.unparse(c.func) == "install_project"]
    assert any("lint" in _constants(c) for c in installs), "lint extra not installed"


def test_mypy_is_pinned_in_the_lint_extra() -> None:
    """One mypy release (a new one finds new errors: CI would turn red by itself)."""
    lint = PYPROJECT["project"]["optional-dependencies"]["lint"]
    mypy = [req for req in lint if req.startswith("mypy")]
    assert len(mypy) == 1 and "==" in mypy[0], lint


def _modules(override: dict[str, object]) -> list[str]:
    """The module names an override applies to (`module` is a string or a list)."""
    module = override.get("module", [])
    if isinstance(module, str):
        return [module]
    assert isinstance(module, list), module
    return [str(name) for name in module]


def test_no_kvbench_module_has_its_errors_ignored() -> None:
    """No `[[tool.mypy.overrides]]` with `ignore_errors = true` names a kvbench module (the
    interim list of suites modules with errors is gone): a module whose errors are ignored
    passes the lint unchecked. Third-party stubs (`ignore_missing_imports`) stay allowed."""
    overrides: list[dict[str, object]] = PYPROJECT["tool"]["mypy"].get("overrides", [])
    ignored = [
        name
        for override in overrides
        if override.get("ignore_errors") is True
        for name in _modules(override)
        if name == "kvbench" or name.startswith("kvbench.")
    ]
    assert ignored == [], f"pyproject.toml ignores the type errors of {ignored}"
