"""nox sessions of kvbench: `nox -l` lists them.

On a machine without CUDA every session installs the CPU build of torch (torch==2.13.0,
which this project's CI machines hold on local disk; a plain `torch` would pull a multi-GB
CUDA build) and sets TRITON_INTERPRET=1 so Triton kernels run in the interpreter. On a
machine with CUDA it installs the regular torch and leaves the interpreter off.
Override the torch requirement with KVBENCH_TORCH_SPEC (e.g. "torch==2.13.0+cpu").
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.options.reuse_venv = "yes"
nox.options.sessions = ["conformance", "lint"]

PYTHON = ["3.11", "3.12", "3.10"]
CPU_TORCH = "torch==2.13.0"


def has_cuda() -> bool:
    """True when this machine has an NVIDIA driver (checked without importing torch)."""
    if os.environ.get("KVBENCH_FORCE_CPU"):
        return False
    return bool(shutil.which("nvidia-smi")) or Path("/dev/nvidia0").exists()


def _python() -> str | None:
    """The first listed Python that exists here (nox errors on a missing interpreter)."""
    for version in PYTHON:
        if shutil.which(f"python{version}"):
            return version
    return None


def install_project(session: nox.Session, *extras: str) -> None:
    """Install torch for this machine, then kvbench (editable) with `extras`."""
    torch_spec = os.environ.get("KVBENCH_TORCH_SPEC") or ("torch" if has_cuda() else CPU_TORCH)
    session.install(torch_spec)
    target = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", target)
    if not has_cuda():
        session.env["TRITON_INTERPRET"] = "1"


@nox.session(python=_python())
def conformance(session: nox.Session) -> None:
    """Is every implementation correct? The conformance suite (pytest + hypothesis).

    Posargs go to pytest; `--thorough` (first) switches hypothesis to the thorough profile,
    e.g. `nox -s conformance -- --thorough -k paged`.
    """
    install_project(session, "test")
    args = list(session.posargs)
    if args[:1] == ["--thorough"]:
        session.env["KVBENCH_HYPOTHESIS_PROFILE"] = "thorough"
        args = args[1:]
    session.run("pytest", "suites/conformance", *args)


@nox.session(python=_python())
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree."""
    session.install("ruff")
    session.run("ruff", "check", ".", *session.posargs)
    session.run("ruff", "format", "--check", ".")
