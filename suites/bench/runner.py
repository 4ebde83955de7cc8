"""Run sweeps into the results store: plan the cases, shard them, skip measured ones,
measure the rest one case at a time and append each case's rows at once.

Completion marker: after a case's measurements the runner records `case_wall_time`
(seconds the case took). `--resume` treats a case as done only when that row is there,
so a case killed half-way through writing its rows is measured again (the report keeps
the last row per case and metric).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvbench.reports.store.files import DEFAULT_RESULTS_DIR, read_header
from kvbench.reports.store.reader import DONE_METRIC as STORE_DONE_METRIC
from kvbench.reports.store.reader import load_run, resolve_run
from kvbench.reports.store.schema import Status, case_key
from kvbench.reports.store.writer import ResultWriter, check_run_id
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.harness import TimingConfig
from kvbench.suites.bench.registry import Case, Sweep, select
from kvbench.workloads.errors import CaseSkipped, ConfigError

log = logging.getLogger(__name__)

#: Metric written for every measured case, before its status (the resume marker);
#: defined by the results store, which counts it as "measured" in older runs.
DONE_METRIC = STORE_DONE_METRIC


@dataclass(frozen=True)
class Shard:
    """Shard K of N (1-based): keeps planned cases whose index i has i % N == K - 1."""

    k: int
    n: int

    @classmethod
    def parse(cls, spec: str) -> Shard:
        """Parse 'K/N' with 1 <= K <= N; ConfigError names the bad spec."""
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(spec))
        if not m:
            raise ConfigError(f"bad shard {spec!r}: use K/N, e.g. 2/8 (shard 2 of 8)")
        k, n = int(m.group(1)), int(m.group(2))
        if n < 1 or not 1 <= k <= n:
            raise ConfigError(f"bad shard {spec!r}: need 1 <= K <= N (shards are 1-based)")
        return cls(k, n)

    def keeps(self, index: int) -> bool:
        return index % self.n == self.k - 1

    def __str__(self) -> str:
        return f"{self.k}/{self.n}"


@dataclass
class PlannedCase:
    sweep: Sweep
    case: Case

    @property
    def key(self) -> str:
        return case_key(self.sweep.name, self.case)


@dataclass
class BenchPlan:
    """What a bench invocation will do."""

    cases: list[PlannedCase]
    skipped_done: int = 0
    waiting: dict[str, list[str]] = field(default_factory=dict)  # sweep -> missing modules


def plan(
    names: Sequence[str] | None = None,
    *,
    full: bool = False,
    shard: Shard | None = None,
    done_keys: set[str] | None = None,
) -> BenchPlan:
    """The cases to measure: every runnable selected sweep's grid, sharded, minus done."""
    from kvbench.suites.bench import catalog  # noqa: F401  (registers the sweeps)

    waiting: dict[str, list[str]] = {}
    every: list[PlannedCase] = []
    for sw in select(names, full=full):
        missing = sw.missing()
        if missing:
            waiting[sw.name] = missing
            continue
        every.extend(PlannedCase(sw, dict(c)) for c in sw.cases(full))
    if shard is not None:
        every = [pc for i, pc in enumerate(every) if shard.keeps(i)]
    skipped = 0
    if done_keys:
        kept = [pc for pc in every if pc.key not in done_keys]
        skipped = len(every) - len(kept)
        every = kept
    return BenchPlan(every, skipped, waiting)


@dataclass
class BenchResult:
    run_id: str
    path: Path
    measured: int
    skipped_done: int
    failures: list[tuple[str, str]]
    waiting: dict[str, list[str]]
    wall_s: float


def done_case_keys(path: Path) -> set[str]:
    """Cases of a run file that finished (their DONE_METRIC row is there)."""
    run = load_run(path)
    return {case_key(r["suite"], r["case"]) for r in run.rows if r["metric"] == DONE_METRIC}


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def run_bench(
    names: Sequence[str] | None = None,
    *,
    full: bool = False,
    shard: Shard | None = None,
    resume: str | None = None,
    run_id: str | None = None,
    out_dir: str | Path = DEFAULT_RESULTS_DIR,
    device: torch.device | None = None,
    timing: TimingConfig | None = None,
    progress: bool = True,
    seed: int = 0,
) -> BenchResult:
    """Measure the planned cases, appending each case's rows as soon as it is measured.

    `resume` names an existing run (id, prefix or path): its finished cases are skipped
    and new rows are appended to its file. Every case ends in a status line: measured;
    failed (the error's class and message: logged and listed in `failures`); or skipped
    (a `CaseSkipped`, e.g. a peer that cannot run it, with its reason). Only measured
    cases count as done, so a later resume retries the others. The first header records
    how many cases the run plans (`planned_cases`), so a killed run shows as incomplete.
    """
    started = time.perf_counter()
    session = 0
    done: set[str] = set()
    if resume is not None:
        if run_id is not None:
            raise ConfigError("give either --resume RUN or --run-id ID, not both")
        path = resolve_run(resume, out_dir, kind="bench")
        header = read_header(path)
        if not isinstance(header.get("bench"), dict) or header.get("kind") != "header":
            raise ConfigError(
                f"cannot resume {path}: its first line is not the header of a `kvbench bench` "
                "run (a results file of another command, or not a results file at all)"
            )
        if header.get("merged_from"):
            raise ConfigError(f"cannot resume {path}: it is a merged run; resume its shards")
        done = done_case_keys(path)
        session = 1 + len(load_run(path).resumes)
        out_dir, run_id = path.parent, path.name.removesuffix(".jsonl")
    elif run_id is not None:
        existing = Path(out_dir) / f"{check_run_id(run_id)}.jsonl"
        if existing.exists():
            raise ConfigError(
                f"run {run_id!r} already exists ({existing}); continue it with --resume "
                f"{run_id}, or pick another --run-id"
            )
    the_plan = plan(names, full=full, shard=shard, done_keys=done)
    for name, missing in the_plan.waiting.items():
        log.warning(
            "sweep %s is waiting for %s (not importable here); skipped", name, ", ".join(missing)
        )
    dev = device or default_device()
    header = {
        "bench": {
            "sweeps": list(names) if names else "all",
            "full": full,
            "shard": str(shard) if shard else None,
            "seed": seed,
            "waiting": the_plan.waiting,
            # what produced each sweep's numbers, as the sweep declares it (the reports
            # read it from here: reports.provenance)
            "produced": {sw.name: list(sw.produced) for sw in _selected(names)},
            "descriptions": {
                "copy_peak": "copy bandwidth of the device (a 64 MiB buffer copied into "
                "another; bytes read plus bytes written per second). The kernel sweeps "
                "divide each kernel's achieved bandwidth by it (bandwidth_fraction), so "
                "100% means as fast as a plain copy: on a CPU with the copy timed in the "
                "same repeats as the kernel (copy_peak_paired, a median of per-repeat "
                "fractions), on a GPU with the copy measured once per process (this "
                "suite's rows).",
                **{sw.name: sw.description for sw in _selected(names)},
            },
        },
        # the whole plan (cases a resume skips as done included): "N of M cases"
        "planned_cases": len(the_plan.cases) + the_plan.skipped_done,
    }
    failures: list[tuple[str, str]] = []
    measured = 0
    with ResultWriter(run_id, out_dir, header_fields=header) as writer:
        ctx = BenchContext(dev, timing or TimingConfig(), full, writer, session, seed)
        bar = _progress(len(the_plan.cases), progress, writer.run_id)
        try:
            for pc in the_plan.cases:
                if bar is not None:
                    bar.set_postfix_str(pc.sweep.name, refresh=False)
                t0 = time.perf_counter()
                try:
                    rows = list(pc.sweep.measure(dict(pc.case), ctx))
                except Exception as exc:  # a broken case must not lose the rest of the run
                    writer.record_failure(pc.sweep.name, pc.case, exc)
                    if not isinstance(exc, CaseSkipped):
                        log.warning("%s %s failed: %s", pc.sweep.name, pc.case, exc)
                        failures.append(
                            (f"{pc.sweep.name} {pc.case}", f"{type(exc).__name__}: {exc}")
                        )
                else:
                    for m in rows:
                        writer.record(
                            pc.sweep.name, pc.case, m.metric, m.value, m.unit, m.stats, m.note
                        )
                    writer.record(
                        pc.sweep.name, pc.case, DONE_METRIC, time.perf_counter() - t0, "s"
                    )
                    writer.record_status(pc.sweep.name, pc.case, Status.MEASURED)
                    measured += 1
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
    return BenchResult(
        writer.run_id,
        writer.path,
        measured,
        the_plan.skipped_done,
        failures,
        the_plan.waiting,
        time.perf_counter() - started,
    )


def _selected(names: Sequence[str] | None) -> list[Sweep]:
    from kvbench.suites.bench import catalog  # noqa: F401

    return select(names)


def _progress(total: int, enabled: bool, run_id: str):  # type: ignore[no-untyped-def]
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"bench {run_id}", unit="case", dynamic_ncols=True)
