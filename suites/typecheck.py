"""Type-check every kvbench package with mypy (`nox -s lint` runs this).

The repository keeps its packages as top-level folders that the wheel installs as
`kvbench.*` (pyproject.toml's `package-dir`), and an editable install maps them with an
import hook that mypy cannot follow. So this builds `.mypy-tree/kvbench/`, a tree of
symbolic links in that mapping (ignored by git, ruff and the docs tests), and runs mypy
on it as the package `kvbench` under pyproject.toml's `[tool.mypy]` settings (strict for
`kvbench.paged` and `kvbench.reference`). Exit status: mypy's.

    python -m kvbench.suites.typecheck            # from the repository root
    python -m kvbench.suites.typecheck --root DIR
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: mypy itself depends on tomli there
    import tomli as tomllib  # type: ignore[import-not-found]  # absent where mypy runs on 3.11+

#: Where the link tree goes, under the repository root.
TREE = ".mypy-tree"


def package_dirs(root: Path) -> dict[str, Path]:
    """pyproject.toml's package-dir: import name -> folder (absolute)."""
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    mapping = config["tool"]["setuptools"]["package-dir"]
    return {name: (root / folder).resolve() for name, folder in mapping.items()}


def build_tree(root: Path) -> Path:
    """(Re)build the link tree and return the folder holding `kvbench/`."""
    tree = root / TREE
    top = tree / "kvbench"
    if top.exists():  # links only; mypy's cache beside it (tree/.mypy_cache) stays
        shutil.rmtree(top)
    dirs = package_dirs(root)
    top.mkdir(parents=True)
    for entry in dirs.pop("kvbench").iterdir():  # the root package's own files
        if entry.suffix in (".py", ".typed"):
            (top / entry.name).symlink_to(entry)
    for name, folder in sorted(dirs.items()):
        parts = name.split(".")[1:]
        (top.joinpath(*parts[:-1])).mkdir(parents=True, exist_ok=True)
        top.joinpath(*parts).symlink_to(folder, target_is_directory=True)
    return tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvbench.suites.typecheck")
    parser.add_argument("--root", default=".", help="the repository root (pyproject.toml)")
    args, extra = parser.parse_known_args(argv)
    root = Path(args.root).resolve()
    tree = build_tree(root)
    cmd = [
        sys.executable, "-m", "mypy", "--config-file", str(root / "pyproject.toml"),
        "-p", "kvbench", *extra,
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=tree, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
