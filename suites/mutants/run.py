"""The mutation session: copy the tree, apply each mutant, run its tests, report.

    python -m kvbench.suites.mutants                  # every mutant (tens of minutes)
    python -m kvbench.suites.mutants --only paged.    # ids containing "paged." (+ canary)
    python -m kvbench.suites.mutants --list

The working tree's files (tracked and untracked-not-ignored, as they are on disk) are
copied to `<work>/tree` once, with a link tree that maps them to `kvbench.*` (the mapping
of pyproject's package-dir, `typecheck.build_tree`), which PYTHONPATH puts ahead of any
installed kvbench. Each mutant is applied to the copy, its tests run in a fresh pytest
process (`-x`, fixed hypothesis seed, no bytecode written, the `guard` plugin), then the
file is restored. The C++ extension builds into `<work>/cpu_ext` (keyed by the sources,
so a C++ mutant gets its own build and the unmutated build is shared by the other
mutants), never the real tree's folder. Last, the tests that killed mutants run once more
on the unmutated copy (the baseline): a test that fails there too proves nothing, and its
kills become errors. (Survivors need no baseline: their tests passed.)

Outcomes: killed (a test failed), survived (all passed), timeout, error (pytest could not
run the selection: a broken entry), stillborn (a C++ mutant that does not build).
Score = killed / (mutants not marked equivalent). Exit status: 0; 1 when the score is
below --min-score, the canary survived, or any mutant errored or was stillborn; 2 for a
broken mutant list; 3 when a killing test also fails unmutated or a run did not import the copy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kvbench.suites.mutants.catalog import MUTANTS
from kvbench.suites.mutants.guard import MARKER, MISWIRED, PROFILE, STILLBORN
from kvbench.suites.mutants.model import CANARY, Mutant, problems
from kvbench.suites.typecheck import TREE, build_tree, package_dirs

#: Default seconds per mutant run (pytest start-up, imports and the selected tests).
TIMEOUT = 300.0
#: Extra seconds for a C++ mutant: the extension builds in the run (minutes on 2 cores).
CPP_BUILD_TIMEOUT = 900.0


@dataclass
class Outcome:
    """One mutant's run."""

    id: str
    file: str
    reason: str
    outcome: str
    seconds: float
    returncode: int | None
    equivalent: str
    tests: list[str]
    killed_by: list[str]
    tail: str


def copy_tree(root: Path, dest: Path) -> None:
    """Copy the working tree's files (git's tracked and untracked-not-ignored list, as on
    disk; everything but out/, venvs and caches without git) to `dest`, fresh."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root, check=True, capture_output=True,
        ).stdout.decode().split("\0")  # fmt: skip
        files = [f for f in listed if f and (root / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = {"out", ".venv", "venv", ".nox", ".git", TREE, ".hypothesis", "__pycache__"}
        files = [
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(root).parts)
        ]
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)


def session_env(tree: Path, work: Path) -> dict[str, str]:
    """The environment of every run: the copy first on the path, no bytecode, the
    session's own C++ build and Triton cache folders."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree / TREE)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"  # a run killed on timeout still shows how far it got
    env["KVBENCH_HYPOTHESIS_PROFILE"] = PROFILE  # no shrinking (`guard.PROFILE`)
    env["KVBENCH_MUTANT_ROOT"] = str(tree)
    env["KVBENCH_CPU_EXT_DIR"] = str(work / "cpu_ext")
    env["TRITON_CACHE_DIR"] = str(work / "triton")
    env.pop("KVBENCH_CPU_KERNEL", None)  # the C++ mutants need the C++ kernel
    if not (shutil.which("nvidia-smi") or Path("/dev/nvidia0").exists()):
        env.setdefault("TRITON_INTERPRET", "1")
    return env


def pytest_command(tests: list[str], k: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
    cmd += ["-p", "kvbench.suites.mutants.guard", "--hypothesis-seed=0", "-m", "not slow"]
    cmd += tests
    if k:
        cmd += ["-k", k]
    return cmd


def run_pytest(cmd: list[str], tree: Path, env: dict[str, str], timeout: float) -> tuple[int | None, float, str]:  # fmt: skip
    """(return code or None on timeout, seconds, output tail) of one pytest process (its
    whole process group is killed on timeout)."""
    shutil.rmtree(tree / ".hypothesis", ignore_errors=True)
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        code = None
    text = out.decode(errors="replace")
    return code, time.perf_counter() - start, text[-3000:]


def classify(code: int | None) -> str:
    if code is None:
        return "timeout"
    return {0: "survived", 1: "killed", MISWIRED: "miswired", STILLBORN: "stillborn"}.get(
        code, "error"
    )


def run_mutant(m: Mutant, tree: Path, env: dict[str, str], mapping: dict[str, str], timeout: float) -> Outcome:  # fmt: skip
    """Apply `m` to the copy, run its tests, restore the file (also on errors)."""
    path = tree / m.file
    original = path.read_bytes()
    marker = tree / MARKER
    try:
        path.write_text(m.apply(original.decode("utf-8")), encoding="utf-8")
        marker.write_text(
            json.dumps({"id": m.id, "file": m.file, "replacement": m.replacement,
                        "package_dir": mapping}),
            encoding="utf-8",
        )  # fmt: skip
        limit = m.timeout or (timeout + (CPP_BUILD_TIMEOUT if m.is_cpp else 0.0))
        code, seconds, tail = run_pytest(pytest_command(list(m.tests), m.k), tree, env, limit)
    finally:
        path.write_bytes(original)
        marker.unlink(missing_ok=True)
    return Outcome(
        m.id, m.file, m.reason, classify(code), round(seconds, 1), code, m.equivalent,
        list(m.tests), failures(tail), "" if code == 1 else tail,
    )  # fmt: skip


def baseline(results: list[Outcome], tree: Path, env: dict[str, str], timeout: float) -> list[str]:  # fmt: skip
    """The tests that killed mutants, run on the unmutated copy (without -x); returns
    those that fail there too (their kills prove nothing)."""
    nodes = sorted({n for r in results if r.outcome == "killed" for n in r.killed_by})
    if not nodes:
        return []
    cmd = [c for c in pytest_command(nodes, None) if c != "-x"]
    code, _, tail = run_pytest(cmd, tree, env, timeout)
    if code == 0:
        return []
    failed = failures(tail)
    return failed or [f"the baseline run ended with {classify(code)} (rc {code}): {tail[-500:]}"]


def failures(text: str) -> list[str]:
    """The node ids pytest's summary reports as FAILED (what killed a mutant)."""
    found = [
        ln.split(" ", 1)[1].split(" - ")[0].strip()
        for ln in text.splitlines()
        if ln.startswith(("FAILED ", "ERROR "))
    ]
    return found[:3]


def summarize(results: list[Outcome]) -> dict[str, object]:
    counted = [r for r in results if not r.equivalent]
    counts = {k: sum(r.outcome == k for r in results) for k in
              ("killed", "survived", "timeout", "error", "stillborn", "miswired")}  # fmt: skip
    killed = sum(r.outcome == "killed" for r in counted)
    return {
        **counts,
        "mutants": len(results),
        "equivalent": len(results) - len(counted),
        "score": killed / len(counted) if counted else 0.0,
        "canary": next((r.outcome for r in results if r.id == CANARY), "not run"),
    }


def table(results: list[Outcome]) -> str:
    """A markdown table of the outcomes."""
    lines = ["| mutant | file | outcome | s | reason |", "|---|---|---|---:|---|"]
    for r in results:
        note = f"{r.outcome} (equivalent)" if r.equivalent else r.outcome
        lines.append(f"| {r.id} | {r.file} | {note} | {r.seconds:.1f} | {r.reason} |")
    return "\n".join(lines)


def select(only: list[str]) -> list[Mutant]:
    """The mutants whose id contains one of `only` (all when empty), the canary first
    and the C++ mutants last."""
    chosen = [m for m in MUTANTS if not only or any(o in m.id for o in only)]
    canary = next(m for m in MUTANTS if m.id == CANARY)
    rest = [m for m in chosen if m.id != CANARY]
    # C++ mutants last: each one rebuilds the extension (minutes)
    return [canary, *(m for m in rest if not m.is_cpp), *(m for m in rest if m.is_cpp)]


def write_report(out: Path, results: list[Outcome], began: float, load_before: list[str], done: bool, **extra: object) -> dict[str, object]:  # fmt: skip
    """Write report.json and report.md for the mutants run so far; returns the summary."""
    summary = summarize(results) | extra
    summary["complete"] = done
    summary["wall_s"] = round(time.perf_counter() - began, 1)
    summary["loadavg_before"] = load_before
    summary["loadavg_now"] = Path("/proc/loadavg").read_text().split()[:3] if load_before else []  # fmt: skip
    summary["python"] = sys.version.split()[0]
    report = {"summary": summary, "mutants": [asdict(r) for r in results]}
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (out / "report.md").write_text(table(results) + "\n", encoding="utf-8")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvbench.suites.mutants")
    parser.add_argument("--root", default=".", help="the repository root (default: .)")
    parser.add_argument("--out", default="out/mutants", help="report folder (default: out/mutants)")
    parser.add_argument("--work", default=None, help="scratch folder (default: <out>/work)")
    parser.add_argument("--only", action="append", default=[], help="run ids containing this")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per mutant")
    parser.add_argument("--min-score", type=float, default=0.95)
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    wrong = problems(MUTANTS, root)
    if wrong:
        print("the mutant list does not fit this tree:\n  " + "\n  ".join(wrong), file=sys.stderr)
        return 2
    mutants = select(args.only)
    if args.list:
        for m in mutants:
            print(f"{m.id:48} {m.file:40} {m.reason}")
        return 0
    out = Path(args.out).resolve()
    work = Path(args.work).resolve() if args.work else out / "work"
    tree = work / "tree"
    began = time.perf_counter()
    load_before = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []  # fmt: skip
    copy_tree(root, tree)
    build_tree(tree)
    mapping = {k: str(v.relative_to(tree)) for k, v in package_dirs(tree).items()}
    env = session_env(tree, work)
    out.mkdir(parents=True, exist_ok=True)
    results: list[Outcome] = []
    summary: dict[str, object] = {}
    for i, m in enumerate(mutants, 1):
        r = run_mutant(m, tree, env, mapping, args.timeout)
        results.append(r)
        print(f"[{i}/{len(mutants)}] {r.outcome:9} {r.seconds:6.1f} s  {m.id}", flush=True)
        # written after every mutant: an interrupted session still leaves its results
        summary = write_report(out, results, began, load_before, done=i == len(mutants))
        if r.outcome == "miswired":
            print(r.tail, file=sys.stderr)
            break
    if not args.no_baseline and summary["killed"]:
        bad = baseline(results, tree, env, args.timeout * 4 + CPP_BUILD_TIMEOUT)
        print(f"baseline (killing tests on the unmutated copy): {len(bad)} fail", flush=True)
        for r in results:
            if r.outcome == "killed" and set(r.killed_by) & set(bad):
                r.outcome = "error"
                r.tail = f"killed by {r.killed_by}, which fail(s) unmutated too"
        complete = summary["complete"] is True
        summary = write_report(out, results, began, load_before, complete, baseline_failures=bad)
        if bad:
            print("tests that fail on the unmutated copy:\n  " + "\n  ".join(bad), file=sys.stderr)
    print(table(results))
    print(json.dumps(summary))
    if summary["miswired"]:
        print("a run did not import the mutated copy (see above): nothing was tested", file=sys.stderr)  # fmt: skip
        return 3
    if summary.get("baseline_failures"):
        return 3
    failed = []
    if summary["canary"] != "killed":
        failed.append(f"the canary {CANARY} was {summary['canary']}, not killed")
    if summary["error"] or summary["stillborn"]:
        failed.append("some mutants errored or did not build (broken entries)")
    if float(summary["score"]) < args.min_score:  # type: ignore[arg-type]
        failed.append(f"score {summary['score']:.1%} < {args.min_score:.0%}")
    for line in failed:
        print(line, file=sys.stderr)
    return 1 if failed else 0
