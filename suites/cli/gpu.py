"""`kvbench gpu`: the first GPU run in one bounded command (`nox -s gpu` installs the
project and runs it).

    kvbench gpu --dry-run      # any machine: the plan, each part's expected seconds
    kvbench gpu                # a CUDA machine: the run; without CUDA exit 2, one line

On a CUDA machine, from the repository root, it runs in order, each step in its own
process, interrupted (SIGINT, so finished work is kept) at its budget:

1. the gpu-marked conformance tests (`pytest suites/conformance -m gpu`, JUnit XML kept);
2. every Triton kernel case of the default grid (`kvbench bench --only kernel.decode
   kernel.prefill`): each timed with CUDA graphs, with its host cost per call;
3. each measured case beside `kernel.predicted`'s time for this GPU (measured / predicted
   per case and the mean error; H100, H200 and A100 have profiles);
4. the report site over the run.

It then prints a short summary: what passed, the error of the predictions, the host cost
per call, where the files are (`out/gpu/<run-id>/`: logs, tests.xml, comparison.json,
summary.txt, site/; the rows in out/results/<run-id>.jsonl). Exit 0 when every test passed
and every case was measured in time, 1 otherwise, 2 without CUDA.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from kvbench.suites.cli.argtypes import int_range
from kvbench.workloads.errors import ConfigError

NO_CUDA = 2
#: Seconds a step gets after SIGINT to write what it finished, before it is killed.
GRACE_S = 15.0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `gpu` subcommand."""
    from kvbench.kernels.predict import GPUS
    from kvbench.suites.bench.gpu_plan import DEFAULT_REPEATS

    p = subparsers.add_parser(
        "gpu",
        help="the first GPU run in one command: gpu tests, every Triton kernel case timed "
        "with CUDA graphs beside its prediction, the report (--dry-run: the plan)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument(
        "--repeats",
        type=int_range(1, 100),
        default=DEFAULT_REPEATS,
        help="timed repeats per kernel case (%(default)s)",
    )
    p.add_argument(
        "--profile",
        choices=sorted(GPUS),
        help="GPU profile the dry run plans for (default h100; a real run uses its GPU's)",
    )
    p.set_defaults(func=run)


@dataclass(frozen=True)
class StepResult:
    """How a step's process ended: exit status, seconds, and whether its budget cut it."""

    name: str
    rc: int
    seconds: float
    interrupted: bool


def run_step(name: str, argv: list[str], log: Path, budget_s: float) -> StepResult:
    """Run `argv` with its output in `log`; at `budget_s` send SIGINT (pytest and kvbench
    bench keep what they finished), then kill it after GRACE_S."""
    t0 = time.monotonic()
    interrupted = False
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            interrupted = True
            proc.send_signal(signal.SIGINT)
            try:
                rc = proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
    return StepResult(name, rc, time.monotonic() - t0, interrupted)


def _check_root() -> None:
    if not Path("suites/conformance").is_dir():
        raise ConfigError(
            f"run `kvbench gpu` from the repository root (no suites/conformance in {Path.cwd()})"
        )


def dry_run(args: argparse.Namespace) -> int:
    """Print the plan (any machine)."""
    from kvbench.suites.bench import gpu_plan

    _check_root()
    plan = gpu_plan.build_plan(
        profile=args.profile or "h100",
        repeats=args.repeats,
        n_tests=gpu_plan.count_gpu_tests(),
    )
    print(gpu_plan.format_plan(plan))
    return 0


def run(args: argparse.Namespace) -> int:
    """The GPU run (or, with --dry-run, its plan)."""
    if args.dry_run:
        return dry_run(args)
    import torch

    if not torch.cuda.is_available():
        sys.stderr.write(
            "kvbench gpu: no CUDA device here (torch.cuda.is_available() is False); "
            "`kvbench gpu --dry-run` prints the plan on any machine\n"
        )
        return NO_CUDA
    _check_root()
    return gpu_run(args.repeats, torch.cuda.get_device_name(0))


def gpu_run(repeats: int, device_name: str) -> int:
    """The steps on a CUDA machine; returns the exit status."""
    from kvbench.suites.bench import gpu_plan

    profile = gpu_plan.gpu_profile(device_name)
    run_id = time.strftime("gpu-%Y%m%d-%H%M%S")
    folder = Path("out/gpu") / run_id
    folder.mkdir(parents=True, exist_ok=False)
    results = Path("out/results") / f"{run_id}.jsonl"
    py = sys.executable
    budgets = gpu_plan.BUDGETS
    steps = [
        ("tests", [py, "-m", "pytest", "suites/conformance", "-m", "gpu", "-q", "-rfE",
                   "-p", "no:cacheprovider", f"--junitxml={folder / 'tests.xml'}"]),
        ("bench", [py, "-m", "kvbench", "bench", "--only", *gpu_plan.GPU_SWEEPS,
                   "--repeats", str(repeats), "--run-id", run_id, "--no-progress"]),
        ("predict", [py, "-m", "kvbench.suites.bench.gpu_plan", str(results), str(profile),
                     str(folder / "comparison.json")]),
        ("report", [py, "-m", "kvbench", "report", run_id, "--out", str(folder / "site")]),
    ]  # fmt: skip
    print(f"kvbench gpu: {device_name} (profile {profile or 'none'}), files in {folder}/")
    done = []
    for name, argv in steps:
        if name == "predict" and (profile is None or not results.exists()):
            continue
        if name == "report" and not results.exists():
            continue
        print(f"  {name}: running (at most {budgets[name]:.0f} s) ...", flush=True)
        res = run_step(name, argv, folder / f"{name}.log", budgets[name])
        done.append(res)
        cut = ", interrupted at its budget" if res.interrupted else ""
        print(f"  {name}: exit {res.rc} after {res.seconds:.0f} s{cut}", flush=True)
    text, ok = summary(folder, results, done, profile)
    (folder / "summary.txt").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0 if ok else 1


def junit_counts(xml: Path) -> dict[str, int]:
    """passed / failed / errors / skipped from a JUnit XML file (empty when absent)."""
    if not xml.exists():
        return {}
    root = ET.parse(xml).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for s in suites:
        for k in counts:
            counts[k] += int(s.get(k, 0))
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def summary(
    folder: Path, results: Path, steps: list[StepResult], profile: str | None
) -> tuple[str, bool]:
    """The run's short summary and whether everything passed and was measured."""
    from kvbench.reports.store.reader import load_run
    from kvbench.suites.bench import gpu_plan

    by = {s.name: s for s in steps}
    lines = ["kvbench gpu summary"]
    c = junit_counts(folder / "tests.xml")
    tests_ok = bool(c) and c["failures"] == c["errors"] == 0 and not by["tests"].interrupted
    lines.append(
        f"  gpu tests: {c['passed']} passed, {c['failures']} failed, {c['errors']} errors, "
        f"{c['skipped']} skipped"
        + (" (interrupted at its budget)" if by["tests"].interrupted else "")
        if c
        else f"  gpu tests: no result (exit {by['tests'].rc}; see {folder / 'tests.log'})"
    )
    planned = len(gpu_plan.gpu_grid())
    measured = gpu_plan.measured_cases(load_run(results).rows) if results.exists() else {}
    bench = by.get("bench")
    bench_ok = bench is not None and bench.rc == 0 and len(measured) == planned
    lines.append(
        f"  kernel cases: {len(measured)} of {planned} timed"
        + (f" (bench exit {bench.rc})" if bench is not None and bench.rc else "")
        + (" (interrupted at its budget)" if bench is not None and bench.interrupted else "")
    )
    comp = folder / "comparison.json"
    if comp.exists():
        data = json.loads(comp.read_text(encoding="utf-8"))
        for row in data["cases"]:
            shape = " ".join(f"{k}={v}" for k, v in row["case"].items())
            host = f"{row['host_s'] * 1e6:.0f} us" if row["host_s"] is not None else "n/a"
            graph = "graph" if row["cuda_graph"] else "do_bench"
            lines.append(
                f"    {row['sweep']:<15} {shape}: {row['measured_s'] * 1e6:.1f} us measured "
                f"({graph}), {row['predicted_s'] * 1e6:.1f} us predicted, ratio "
                f"{row['ratio']:.2f}, host {host} a call"
            )
        err = data["error"]
        if err:
            lines.append(
                f"  predictions ({profile}): mean |measured/predicted - 1| "
                f"{err['mean_abs_error']:.1%}, median {err['median_abs_error']:.1%}, median "
                f"ratio {err['median_ratio']:.2f} over {int(err['n'])} cases"
            )
    else:
        why = "no profile for this GPU" if profile is None else "the predict step wrote none"
        lines.append(f"  predictions: none ({why})")
    site = folder / "site" / "index.html"
    lines.append(f"  files: {folder}/ (logs, tests.xml, comparison.json, summary.txt)")
    lines.append(f"         {results}" + (f", {site}" if site.exists() else ""))
    ok = tests_ok and bench_ok and all(not s.interrupted and s.rc == 0 for s in steps)
    return "\n".join(lines), ok
