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
from kvbench.suites.peers import registry

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
STANDIN_MARKER = "the stand-in kernel hub"
#: The repository's package folders, each installed as `kvbench.<folder>`.
FOLDERS = ("kernels", "paged", "reference", "reports", "suites", "workloads")
#: The tooling tests: run from a checkout, kept out of the wheel (the conformance suite,
#: which plug-ins run against their own implementations, ships in it).
TOOLING_TESTS = Path("suites", "tests")


def _package_folders() -> set[str]:
    """Every package of the checkout as its installed name (`kvbench.<folder>.<sub>`)."""
    names = {"kvbench"}
    for root in FOLDERS:
        for init in (REPO / root).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO)
            if "_kvbench" in rel.parts or any(p.startswith(".") for p in rel.parts):
                continue
            if rel == TOOLING_TESTS or TOOLING_TESTS in rel.parents:
                continue
            names.add("kvbench." + ".".join(rel.parts))
    return names


def test_every_package_folder_is_listed_in_pyproject():
    """pyproject lists packages explicitly (the mapping needs it): a new folder must be added.
    The tooling tests are not listed: they stay out of the wheel."""
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    assert not [p for p in listed if p.startswith("kvbench.suites.tests")], listed
    assert "kvbench.suites.conformance" in listed
    missing = _package_folders() - listed
    assert not missing, (
        f"add these packages to pyproject.toml [tool.setuptools] packages: {missing}"
    )
    stale = listed - _package_folders()
    assert not stale, f"pyproject.toml lists packages that no longer exist: {stale}"


def test_the_six_folders_map_under_kvbench():
    mapping = PYPROJECT["tool"]["setuptools"]["package-dir"]
    assert mapping == {"kvbench": "suites/_kvbench", **{f"kvbench.{n}": n for n in FOLDERS}}
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
    assert not [n for n in names if n.startswith("kvbench/suites/tests/")], "tooling tests"
    for expected in (
        "kvbench/suites/conftest.py",
        "kvbench/suites/conformance/__init__.py",
        "kvbench/suites/conformance/test_kernels_ops.py",
        "kvbench/__init__.py",
        "kvbench/__main__.py",
        "kvbench/kernels/ops.py",
        # the C++ CPU kernels build at first use from these (the header included by both)
        "kvbench/kernels/cpu_ext/paged_attn.cpp",
        "kvbench/kernels/cpu_ext/paged_attn_fp8.cpp",
        "kvbench/kernels/cpu_ext/vec_exp.h",
        "kvbench/suites/cli/__init__.py",
        "kvbench/suites/cli/simulate.py",
        "kvbench/reports/site_base.html.j2",
        "kvbench/reports/baselines/cpu.json",
        "kvbench/reports/baselines/sm90.json",
        "kvbench/suites/peers/requirements-vllm-cpu.txt",
        # the shipped traces and their licenses: the default bench runs offline
        "kvbench/workloads/data/mooncake_conversation_trace.jsonl.gz",
        "kvbench/workloads/data/AzureLLMInferenceTrace_conv.csv.gz",
        "kvbench/workloads/data/LICENSE-mooncake-APACHE-2.0",
        "kvbench/workloads/data/LICENSE-azure-CC-BY-4.0",
        "kvbench/workloads/data/README.md",
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
    # this environment's site folders, including ones its own .pth files added (a venv
    # layered over another one): a .pth line is not itself searched for further .pth files
    outer = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    lines = dict.fromkeys([sysconfig.get_path("purelib"), *outer])
    (Path(purelib) / "zz_outer.pth").write_text("\n".join(lines) + "\n")
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


def test_a_plugin_that_fails_to_import_is_skipped_with_its_error(monkeypatch, caplog):
    class BrokenPlugin:
        name, value = "brokenplugin", "brokenplugin.adapter:peer_spec"

        def load(self):
            raise ModuleNotFoundError("No module named 'brokenplugin'", name="brokenplugin")

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [BrokenPlugin()])
    with caplog.at_level(logging.WARNING, logger="kvbench.suites.peers.registry"):
        specs = registry.peer_specs()
    assert "brokenplugin" not in specs
    assert "ModuleNotFoundError: No module named 'brokenplugin'" in caplog.text


def test_committed_baselines_import_only_kvbench_names():
    """The frozen kernel source a baseline stores runs as stored: it imports kvbench's
    modules by their `kvbench.` names, so no rewriting of older import names is needed."""
    from kvbench.suites.gate import load_baseline
    from kvbench.suites.gate.timing import load_frozen

    frozen = {}
    for path in sorted((REPO / "reports" / "baselines").glob("*.json")):
        source = load_baseline(path).frozen_source
        if source is not None:
            frozen[path.name] = source
    assert "cpu.json" in frozen, "the CPU baseline freezes its torch kernels"
    for name, source in frozen.items():
        imports = [
            line.split()[1]
            for line in source.splitlines()
            if line.lstrip().startswith(("import ", "from "))
        ]
        stale = [m for m in imports if m.split(".")[0] in FOLDERS]
        assert not stale, f"{name}: frozen source imports {stale}"
        assert any(m.startswith("kvbench.") for m in imports), name
        assert callable(load_frozen(source).paged_decode_attention), name
