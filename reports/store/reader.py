"""Reading runs: load and validate a results file (`load_run`), find runs by id, prefix
or 'latest', list them (`summarize`).

Every line is parsed with the typed records of `kvbench.reports.store.schema`. Corrupt or
truncated lines are skipped and reported with file and line number; a file from a newer
schema is refused.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.reports.store.files import DEFAULT_RESULTS_DIR, read_header, run_files
from kvbench.reports.store.frame import to_frame
from kvbench.reports.store.schema import (
    CaseStatus,
    RecordError,
    ResultRow,
    ResultsError,
    RunHeader,
    Status,
    case_key,
    check_schema,
)

log = logging.getLogger(__name__)

#: The metric of the row the bench writes when a case has been measured (kept for runs
#: written before status lines existed).
DONE_METRIC = "case_wall_time"


class RunNotFoundError(ResultsError, FileNotFoundError):
    """No results file matches the run id or path given."""


@dataclass(frozen=True)
class LineProblem:
    """A line of a results file that could not be used, and why."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass
class Run:
    """A loaded results file.

    Attributes:
        path: the file.
        run_id: the run's id (from its header, else from the file name).
        header: the first header line (empty if it was missing or corrupt).
        resumes: headers of later processes that appended to the run.
        rows: valid measurement rows (`ResultRow`, read like dicts), in file order.
        statuses: how each finished case ended, in file order (`CaseStatus`).
        problems: lines skipped, each with its line number and reason.
    """

    path: Path
    run_id: str
    header: dict[str, Any] = field(default_factory=dict)
    resumes: list[dict[str, Any]] = field(default_factory=list)
    rows: list[ResultRow] = field(default_factory=list)
    statuses: list[CaseStatus] = field(default_factory=list)
    problems: list[LineProblem] = field(default_factory=list)

    @property
    def environment(self) -> dict[str, Any]:
        """The environment recorded in the run's header ({} if unknown)."""
        env = self.header.get("environment")
        return dict(env) if isinstance(env, dict) else {}

    @property
    def created(self) -> str:
        """When the run started (ISO 8601 UTC), or '' if unknown."""
        return str(self.header.get("created", ""))

    @property
    def suites(self) -> list[str]:
        """Suites with at least one row, in first-seen order."""
        return list(dict.fromkeys(r["suite"] for r in self.rows))

    def case_keys(self, suite: str | None = None) -> set[str]:
        """Canonical keys of the cases measured (optionally in one suite), for resuming."""
        return {
            case_key(r["suite"], r["case"])
            for r in self.rows
            if suite is None or r["suite"] == suite
        }

    def frame(self) -> Any:
        """The run's rows as a pandas DataFrame (see `kvbench.reports.store.frame`)."""
        return to_frame([self])

    def outcomes(self) -> dict[str, CaseStatus]:
        """Each finished case's last status, by case key. Runs written before status
        lines existed count a case with the bench's `case_wall_time` row as measured."""
        out: dict[str, CaseStatus] = {}
        for row in self.rows:
            if row.metric == DONE_METRIC:
                out[row.key] = CaseStatus(row.suite, row.case, Status.MEASURED)
        for status in self.statuses:
            out[status.key] = status
        return out

    @property
    def planned_cases(self) -> int | None:
        """How many cases the run set out to measure (its first process's plan), or None
        when the header does not say."""
        planned = self.header.get("planned_cases")
        return planned if isinstance(planned, int) else None

    def completeness(self) -> tuple[int, int | None]:
        """(cases that ended, cases planned): fewer ended than planned means the run was
        killed (or is still running)."""
        return len(self.outcomes()), self.planned_cases


def load_run(path: str | os.PathLike[str], *, strict: bool = False) -> Run:
    """Load and validate one results file.

    Corrupt or truncated lines are skipped and listed in `Run.problems` (with file and
    line number) and logged at INFO level; with `strict=True` the first one raises
    ResultsError instead. A newer schema raises SchemaVersionError. A missing file
    raises RunNotFoundError.
    """
    p = Path(path)
    if not p.is_file():
        raise RunNotFoundError(f"no results file at {p}")
    run = Run(path=p, run_id=p.name.removesuffix(".jsonl"))
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ResultsError(f"cannot read results file {p}: {exc}") from exc
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for lineno, data in enumerate(lines, start=1):
        problem = _parse_line(run, p, lineno, data, is_last=lineno == len(lines))
        if problem is not None:
            issue = LineProblem(str(p), lineno, problem)
            if strict:
                raise ResultsError(str(issue))
            log.info("%s", issue)  # callers report problems their own way (-v logs each)
            run.problems.append(issue)
    return run


def _parse_line(run: Run, path: Path, lineno: int, data: bytes, *, is_last: bool) -> str | None:
    if not data.strip():
        return "blank line"
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        torn = " (truncated: the writer was probably killed mid-line)" if is_last else ""
        return f"not valid JSON{torn}: {exc}"
    except RecursionError:
        return "not valid JSON: nested too deeply"
    if not isinstance(obj, dict):
        return f"line is a JSON {type(obj).__name__}, not an object"
    try:
        check_schema(obj, f"{path}:{lineno}")
        return _add_record(run, path, lineno, obj)
    except RecordError as exc:
        return str(exc)


def _add_record(run: Run, path: Path, lineno: int, obj: dict[str, Any]) -> str | None:
    kind = obj.get("kind")
    if kind == "row":
        run.rows.append(ResultRow.from_json(obj))
        return None
    if kind == "status":
        run.statuses.append(CaseStatus.from_json(obj))
        return None
    if kind == "header":
        if run.header:
            return "a second 'header' line (only the first line may be a header)"
        header = RunHeader.from_json(obj)
        if lineno != 1:
            run.problems.append(
                LineProblem(str(path), lineno, "header is not on line 1 (used anyway)")
            )
        run.header = obj
        if header.run_id:
            run.run_id = header.run_id
        return None
    if kind == "resume":
        RunHeader.from_json(obj)
        run.resumes.append(obj)
        return None
    return f"unknown line kind {kind!r:.40}"


def latest_run(
    results_dir: str | os.PathLike[str] = DEFAULT_RESULTS_DIR, kind: str | None = None
) -> Path:
    """The most recently started run in `results_dir` (by its header's `created` time),
    optionally only among runs whose header has a `kind` entry ("bench" for runs of
    `kvbench bench`, "gate" for the gate's)."""
    folder = Path(results_dir)
    best: tuple[str, float, str] | None = None
    chosen: Path | None = None
    for f in run_files(folder):
        header = read_header(f)
        if kind is not None and kind not in header:
            continue
        key = (str(header.get("created", "")), f.stat().st_mtime, f.name)
        if best is None or key > best:
            best, chosen = key, f
    if chosen is None:
        what = f"{kind} runs" if kind else "runs"
        hint = "; run `kvbench bench` first" if kind in (None, "bench") else ""
        raise RunNotFoundError(f"no {what} in {folder}{hint}")
    return chosen


def resolve_run(
    ref: str | os.PathLike[str],
    results_dir: str | os.PathLike[str] = DEFAULT_RESULTS_DIR,
    kind: str | None = None,
) -> Path:
    """The results file a run reference names: a path to a file, a run id in
    `results_dir`, a unique prefix of one, or 'latest' (see `latest_run`; `kind`
    narrows it, e.g. to bench runs)."""
    text = os.fspath(ref)
    p = Path(text)
    if p.is_file():
        return p
    folder = Path(results_dir)
    if text == "latest":
        return latest_run(folder, kind)
    exact = folder / f"{text}.jsonl"
    if exact.is_file():
        return exact
    matches = [f for f in run_files(folder) if f.name.startswith(text)]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        names = ", ".join(f.name.removesuffix(".jsonl") for f in matches[:5])
        raise ResultsError(f"run {text!r} is ambiguous in {folder}: {names}")
    raise RunNotFoundError(f"no run {text!r}: not a file and not a run id in {folder}")


def load_runs(
    refs: Sequence[str | os.PathLike[str]] | None = None,
    results_dir: str | os.PathLike[str] = DEFAULT_RESULTS_DIR,
) -> list[Run]:
    """Load the runs named by `refs` (see `resolve_run`), or every run in `results_dir`."""
    paths = [resolve_run(r, results_dir) for r in refs] if refs else run_files(results_dir)
    return [load_run(p) for p in paths]


@dataclass(frozen=True)
class RunSummary:
    """One line of `kvbench results`."""

    run_id: str
    path: str
    created: str
    device: str
    cpu_model: str
    git_revision: str
    git_dirty: bool | None
    rows: int
    suites: tuple[str, ...]
    problems: int
    resumes: int
    failed: int = 0
    skipped: int = 0
    ended: int = 0
    planned: int | None = None

    @property
    def incomplete(self) -> bool:
        """Whether fewer cases ended than the run planned (a killed run)."""
        return self.planned is not None and self.ended < self.planned


def summarize(run: Run) -> RunSummary:
    """The listing entry for a loaded run."""
    env = run.environment
    outcomes = run.outcomes()
    return RunSummary(
        run_id=run.run_id,
        path=str(run.path),
        created=run.created,
        device=str(env.get("device", "?")),
        cpu_model=str(env.get("cpu_model", "?")),
        git_revision=str(env.get("git_revision") or "-")[:12],
        git_dirty=env.get("git_dirty"),
        rows=len(run.rows),
        suites=tuple(run.suites),
        problems=len(run.problems),
        resumes=len(run.resumes),
        failed=sum(s.status is Status.FAILED for s in outcomes.values()),
        skipped=sum(s.status is Status.SKIPPED for s in outcomes.values()),
        ended=len(outcomes),
        planned=run.planned_cases,
    )
