"""The results store: one JSON line per measurement, appended as it is measured.

A run is one file, ``out/results/<run-id>.jsonl``:

* line 1 is a header: ``{"kind": "header", "schema": 1, "run_id": ..., "created": ...,
  "environment": {...}}`` where the environment names the device, CPU model, torch /
  triton / python versions, git revision and dirty flag;
* every other line is either a measurement row::

      {"kind": "row", "schema": 1, "suite": "kernel.decode", "case": {"block_size": 16},
       "metric": "time", "value": 1.2e-4, "unit": "s",
       "stats": {"median": 1.2e-4, "q1": ..., "q3": ..., "n": 20}, "time": "..."}

  or a ``"resume"`` header, written when a later process appends to the same run
  (``kvbench bench --resume RUN``), with that process's environment.

Each line is written with one ``write`` call, then flushed and fsynced, so killing the
writer at any moment loses at most the line being written; a torn last line is reported
by the loader (file and line number) and every other line still loads. A writer that
re-opens a file whose last line is torn starts on a fresh line.

The schema is versioned: a file written by a newer kvbench (a higher ``schema``) is
refused with a message naming both versions rather than half-read.

This module imports nothing from ``paged`` or ``kernels``; torch is imported lazily, and
only to name the device in the environment.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.metadata
import json
import logging
import math
import os
import platform
import re
import secrets
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.workloads.errors import ConfigError, KVBenchError

log = logging.getLogger(__name__)

#: Version of the line format this module writes and the newest it can read.
SCHEMA_VERSION = 1

#: Where runs go unless told otherwise (relative to the working directory).
DEFAULT_RESULTS_DIR = "out/results"

#: Columns every results DataFrame has, before the case parameters and stats.
BASE_COLUMNS = ("run_id", "suite", "metric", "value", "unit", "time", "case_key")

_SCALAR_TYPES = (str, int, float, bool, type(None))


class ResultsError(KVBenchError):
    """A results file or run cannot be used (missing, empty, unreadable)."""


class SchemaVersionError(ResultsError):
    """A results file was written with a newer schema than this kvbench reads."""


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
        rows: valid measurement rows, in file order.
        problems: lines skipped, each with its line number and reason.
    """

    path: Path
    run_id: str
    header: dict[str, Any] = field(default_factory=dict)
    resumes: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
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
        """The run's rows as a pandas DataFrame (see `to_frame`)."""
        return to_frame([self])


# --------------------------------------------------------------------------- helpers


def utc_now() -> str:
    """The current UTC time, ISO 8601 with seconds and a Z."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_run_id() -> str:
    """A fresh, sortable run id: UTC time plus 6 random hex digits."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(3)}"


_RUN_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")


def check_run_id(run_id: str) -> str:
    """`run_id` if it is a usable run id (a file name: letters, digits, '-', '_' and '.',
    not starting with '.', at most 200 characters); else ConfigError naming it."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise ConfigError(
            f"invalid run id {run_id!r}: use up to 200 letters, digits, '-', '_' and '.' "
            "(not starting with '.')"
        )
    return run_id


_check_run_id = check_run_id


def case_key(suite: str, case: Mapping[str, Any]) -> str:
    """A canonical string naming one case of one suite (sorted keys, compact JSON)."""
    return json.dumps([suite, dict(case)], sort_keys=True, separators=(",", ":"))


def _git(args: Sequence[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The git revision of `cwd` (default: this package's checkout) and whether the work
    tree has uncommitted changes. Revision None outside a repository or before the
    first commit."""
    where = Path(cwd) if cwd is not None else Path(__file__).resolve().parent.parent
    revision = _git(["rev-parse", "HEAD"], where)
    status = _git(["status", "--porcelain", "--untracked-files=no"], where)
    dirty = bool(status) if status is not None and revision is not None else None
    return {"git_revision": revision, "git_dirty": dirty}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def collect_environment(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Where and with what a run is measured: device, CPU, versions, git state.

    Imports torch (lazily) to name the CUDA device when there is one. `extra` entries
    (e.g. a copy-bandwidth peak) are added on top.
    """
    env: dict[str, Any] = {
        "device": "cpu",
        "cuda": False,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "triton": _version("triton"),
        "kvbench": _version("kvbench"),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
        "time": utc_now(),
    }
    try:
        import torch

        env["torch"] = torch.__version__
        if torch.cuda.is_available():
            env["cuda"] = True
            env["device"] = torch.cuda.get_device_name(0)
            env["cuda_version"] = torch.version.cuda
        env["torch_threads"] = torch.get_num_threads()
    except Exception as exc:  # torch missing or broken: the run still records the rest
        log.warning("could not query torch for the environment: %s", exc)
    env.update(git_state())
    if extra:
        env.update(extra)
    return env


def _finite_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be finite, got {value!r}")
    return float(value) if isinstance(value, float) else value


def _check_case(case: Any) -> dict[str, Any]:
    if not isinstance(case, Mapping):
        raise ConfigError(f"case must be a dict of parameters, got {type(case).__name__}")
    out: dict[str, Any] = {}
    for key, val in case.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"case parameter names must be non-empty strings, got {key!r}")
        if not isinstance(val, _SCALAR_TYPES):
            raise ConfigError(
                f"case parameter {key!r} must be a str, number, bool or None, got {val!r}"
            )
        if isinstance(val, float) and not math.isfinite(val):
            raise ConfigError(f"case parameter {key!r} must be finite, got {val!r}")
        out[key] = val
    return out


def _check_stats(stats: Any) -> dict[str, float | int] | None:
    if stats is None:
        return None
    if not isinstance(stats, Mapping):
        raise ConfigError(f"stats must be a dict or None, got {type(stats).__name__}")
    return {str(k): _finite_number(f"stats[{k!r}]", v) for k, v in stats.items()}


def _check_unit(unit: Any) -> str:
    if not isinstance(unit, str):
        raise ConfigError(f"unit must be a string ('' for a pure number), got {unit!r}")
    return unit


def _check_name(what: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what} must be a non-empty string, got {value!r}")
    return value


# --------------------------------------------------------------------------- writing


class ResultWriter:
    """Appends measurements of one run to ``<out_dir>/<run_id>.jsonl``.

    A new run id writes a header line with the environment. An existing run id (resume)
    appends a ``resume`` line with this process's environment instead, after mending a
    torn last line. Every line is flushed and fsynced before `record` returns.

    Use as a context manager or call `close()`.
    """

    def __init__(
        self,
        run_id: str | None = None,
        out_dir: str | os.PathLike[str] = DEFAULT_RESULTS_DIR,
        *,
        environment: Mapping[str, Any] | None = None,
        extra_environment: Mapping[str, Any] | None = None,
        header_fields: Mapping[str, Any] | None = None,
    ) -> None:
        """Open (creating if needed) the run file.

        Args:
            run_id: the run to write; a new id when None. An existing file is appended to.
            out_dir: folder of result files.
            environment: use this instead of `collect_environment()` (tests, merges).
            extra_environment: entries added to the collected environment.
            header_fields: extra top-level header entries (e.g. the bench arguments).
        """
        self.run_id = _check_run_id(run_id) if run_id is not None else new_run_id()
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / f"{self.run_id}.jsonl"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        env = dict(environment) if environment is not None else collect_environment()
        if extra_environment:
            env.update(extra_environment)
        self.environment = env
        self.resumed = self.path.exists() and self.path.stat().st_size > 0
        check_appendable(self.path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.rows_written = 0
        if self.resumed:
            self._mend_torn_tail()
        header = {
            "kind": "resume" if self.resumed else "header",
            "schema": SCHEMA_VERSION,
            "run_id": self.run_id,
            "created": utc_now(),
            "environment": env,
        }
        if header_fields:
            header.update({k: v for k, v in header_fields.items() if k not in header})
        self._write_line(header)

    def _mend_torn_tail(self) -> None:
        with open(self.path, "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            last = fh.read(1)
        if last != b"\n":
            log.warning(
                "%s: last line is torn (a killed writer); continuing on a new line", self.path
            )
            self._raw_write(b"\n")

    def _raw_write(self, data: bytes) -> None:
        if self._fd is None:
            raise ResultsError(f"results file {self.path} is closed")
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)

    def _write_line(self, obj: Mapping[str, Any]) -> None:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str)
        self._raw_write(text.encode("utf-8") + b"\n")

    def record(
        self,
        suite: str,
        case: Mapping[str, Any],
        metric: str,
        value: float,
        unit: str,
        stats: Mapping[str, float | int] | None = None,
    ) -> dict[str, Any]:
        """Append one measurement and make it durable; returns the row written.

        Args:
            suite: which sweep or suite measured it, e.g. "kernel.decode".
            case: the case parameters (str / number / bool / None values).
            metric: what was measured, e.g. "time", "bandwidth_fraction".
            value: the measured value (finite).
            unit: its unit, e.g. "s", "B/s", "fraction", "tokens".
            stats: repeat statistics (median, q1, q3, n, min, max, ...), finite numbers.

        Raises ConfigError for a bad argument (nothing is written).
        """
        row = {
            "kind": "row",
            "schema": SCHEMA_VERSION,
            "suite": _check_name("suite", suite),
            "case": _check_case(case),
            "metric": _check_name("metric", metric),
            "value": _finite_number("value", value),
            "unit": _check_unit(unit),
            "stats": _check_stats(stats),
            "time": utc_now(),
        }
        self._write_line(row)
        self.rows_written += 1
        return row

    def record_many(
        self,
        suite: str,
        case: Mapping[str, Any],
        metrics: Iterable[tuple[str, float, str] | tuple[str, float, str, Mapping[str, Any]]],
    ) -> None:
        """Record several metrics of one case: (metric, value, unit[, stats]) tuples."""
        for item in metrics:
            self.record(suite, case, *item)  # type: ignore[arg-type]

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        with contextlib.suppress(Exception):
            self.close()


# --------------------------------------------------------------------------- reading

_ROW_FIELDS: dict[str, tuple[type, ...]] = {
    "suite": (str,),
    "case": (dict,),
    "metric": (str,),
    "value": (int, float),
    "unit": (str,),
}


def _validate_row(obj: dict[str, Any]) -> str | None:
    """None if `obj` is a valid row, else why not."""
    for name, types in _ROW_FIELDS.items():
        if name not in obj:
            return f"row has no {name!r} field"
        val = obj[name]
        if isinstance(val, bool) or not isinstance(val, types):
            return f"field {name!r} has the wrong type ({type(val).__name__}: {val!r:.60})"
    if not obj["suite"] or not obj["metric"]:
        return "empty suite or metric"
    if not math.isfinite(obj["value"]):
        return f"value is not finite ({obj['value']!r})"
    for key, val in obj["case"].items():
        if not isinstance(val, _SCALAR_TYPES):
            return f"case parameter {key!r} is not a scalar ({val!r:.60})"
    stats = obj.get("stats")
    if stats is not None:
        if not isinstance(stats, dict):
            return "field 'stats' is not an object"
        for key, val in stats.items():
            if isinstance(val, bool) or not isinstance(val, (int, float)):
                return f"stats[{key!r}] is not a number ({val!r:.60})"
    return None


def _check_schema(obj: dict[str, Any], path: Path, lineno: int) -> str | None:
    schema = obj.get("schema")
    if isinstance(schema, bool) or not isinstance(schema, int):
        return f"missing or non-integer 'schema' ({schema!r:.40})"
    if schema > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{path}:{lineno}: written with results schema {schema}, but this kvbench reads "
            f"schema {SCHEMA_VERSION} or older; upgrade kvbench to read it"
        )
    if schema < 1:
        return f"unknown schema {schema}"
    return None


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
    bad_schema = _check_schema(obj, path, lineno)
    if bad_schema:
        return bad_schema
    kind = obj.get("kind")
    if kind == "header":
        if run.header:
            return "a second 'header' line (only the first line may be a header)"
        if lineno != 1:
            run.problems.append(
                LineProblem(str(path), lineno, "header is not on line 1 (used anyway)")
            )
        if not isinstance(obj.get("environment"), dict):
            return "header has no 'environment' object"
        run.header = obj
        if isinstance(obj.get("run_id"), str) and obj["run_id"]:
            run.run_id = obj["run_id"]
        return None
    if kind == "resume":
        run.resumes.append(obj)
        return None
    if kind == "row":
        why = _validate_row(obj)
        if why:
            return why
        obj.setdefault("stats", None)
        obj.setdefault("time", "")
        run.rows.append(obj)
        return None
    return f"unknown line kind {kind!r:.40}"


def check_appendable(path: str | os.PathLike[str]) -> None:
    """Refuse (ResultsError) to append to an existing, non-empty file that is not a
    kvbench results file (its first line is no results header): a writer would mix rows
    into someone else's file."""
    p = Path(path)
    if p.is_dir():
        raise ResultsError(f"cannot write results to {p}: it is a folder")
    if p.is_file() and p.stat().st_size > 0 and read_header(p).get("kind") != "header":
        raise ResultsError(
            f"cannot append to {p}: its first line is not a kvbench results header (not a "
            "results file, or a damaged one); nothing was written"
        )


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The first line of a results file as a dict ({} when it is not a JSON object).
    Reads at most 16 MiB, so a binary file without newlines costs little."""
    try:
        with open(path, "rb") as fh:
            obj = json.loads(fh.readline(16 * 2**20).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    return obj if isinstance(obj, dict) else {}


_header_of = read_header


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
        header = _header_of(f)
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


def run_files(results_dir: str | os.PathLike[str] = DEFAULT_RESULTS_DIR) -> list[Path]:
    """Result files in `results_dir`, sorted by name (run ids sort by start time)."""
    folder = Path(results_dir)
    if not folder.is_dir():
        return []
    return sorted(f for f in folder.glob("*.jsonl") if f.is_file())


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


def summarize(run: Run) -> RunSummary:
    """The listing entry for a loaded run."""
    env = run.environment
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
    )


def iter_rows(runs: Iterable[Run]) -> Iterator[tuple[Run, dict[str, Any]]]:
    """(run, row) pairs over every row of every run."""
    for run in runs:
        for row in run.rows:
            yield run, row


def to_frame(runs: Iterable[Run]) -> Any:
    """Every row of `runs` as one pandas DataFrame.

    Columns: run_id, suite, metric, value, unit, time, case_key, then one column per
    case parameter (named as the parameter; 'case.NAME' if it collides with a base
    column), then 'stats.NAME' per statistic. Missing parameters are NaN / None.
    """
    import pandas as pd

    records: list[dict[str, Any]] = []
    for run, row in iter_rows(runs):
        rec: dict[str, Any] = {
            "run_id": run.run_id,
            "suite": row["suite"],
            "metric": row["metric"],
            "value": float(row["value"]),
            "unit": row["unit"],
            "time": row.get("time", ""),
            "case_key": case_key(row["suite"], row["case"]),
        }
        for key, val in row["case"].items():
            rec[f"case.{key}" if key in BASE_COLUMNS or key.startswith("stats.") else key] = val
        for key, val in (row.get("stats") or {}).items():
            rec[f"stats.{key}"] = val
        records.append(rec)
    if not records:
        return pd.DataFrame(columns=list(BASE_COLUMNS))
    frame = pd.DataFrame.from_records(records)
    ordered = list(BASE_COLUMNS) + [c for c in frame.columns if c not in BASE_COLUMNS]
    return frame[ordered]


def parquet_available() -> bool:
    """Whether pandas can write parquet here (pyarrow or fastparquet installed)."""
    import importlib.util

    return any(importlib.util.find_spec(m) is not None for m in ("pyarrow", "fastparquet"))


def export_frame(frame: Any, path: str | os.PathLike[str]) -> Path:
    """Write `frame` as CSV (.csv) or parquet (.parquet; needs pyarrow or fastparquet)."""
    out = Path(path)
    suffix = out.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise ConfigError(f"cannot export to {out}: use a .csv or .parquet file name")
    if suffix == ".parquet" and not parquet_available():
        raise ConfigError(
            f"cannot write {out}: parquet export needs pyarrow (pip install pyarrow); "
            "use a .csv file name instead"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".csv":
        frame.to_csv(out, index=False)
    else:
        frame.to_parquet(out, index=False)
    return out


def _shard_of(run: Run) -> tuple[int, int]:
    """(K, N) of a shard run's `bench.shard` "K/N"; ResultsError when it is not one."""
    bench = run.header.get("bench")
    spec = bench.get("shard") if isinstance(bench, dict) else None
    m = re.fullmatch(r"(\d+)/(\d+)", spec) if isinstance(spec, str) else None
    if m is None:
        raise ResultsError(
            f"cannot merge {run.path}: it is not a shard of `kvbench bench --shard K/N` "
            "(its header names no shard)"
        )
    return int(m.group(1)), int(m.group(2))


#: Bench options every shard of one run shares (the shard spec aside).
_SHARED_BENCH_OPTIONS = ("sweeps", "full", "seed")


def check_shards(runs: Sequence[Run], *, allow_incomplete: bool = False) -> list[int]:
    """Check `runs` are the shards of one sharded bench: each a `--shard K/N` run, all of
    the same sweeps, grid and seed and the same N, no shard (or file) twice, and every K
    from 1 to N present unless `allow_incomplete`. Returns the missing K (sorted);
    raises ResultsError naming the first problem."""
    if not runs:
        raise ResultsError("nothing to merge: no runs given")
    seen_paths: dict[Path, str] = {}
    for run in runs:
        where = run.path.resolve()
        if where in seen_paths:
            raise ResultsError(f"run {run.run_id} ({run.path}) is given twice")
        seen_paths[where] = run.run_id
    shards = [_shard_of(r) for r in runs]
    first_bench = runs[0].header["bench"]
    n = shards[0][1]
    by_k: dict[int, Run] = {}
    for run, (k, nn) in zip(runs, shards, strict=True):
        if nn != n:
            raise ResultsError(
                f"cannot merge shards of different splits: {runs[0].run_id} is shard "
                f"{shards[0][0]}/{n}, {run.run_id} is shard {k}/{nn}"
            )
        for key in _SHARED_BENCH_OPTIONS:
            mine, theirs = run.header["bench"].get(key), first_bench.get(key)
            if mine != theirs:
                raise ResultsError(
                    f"cannot merge shards of different runs: {runs[0].run_id} has {key}="
                    f"{theirs!r}, {run.run_id} has {key}={mine!r}"
                )
        if k in by_k:
            raise ResultsError(f"shard {k}/{n} is given twice: {by_k[k].run_id} and {run.run_id}")
        by_k[k] = run
    missing = [k for k in range(1, n + 1) if k not in by_k]
    if missing and not allow_incomplete:
        raise ResultsError(
            f"incomplete set: shard(s) {', '.join(f'{k}/{n}' for k in missing)} missing "
            "(pass them too, or --allow-incomplete to merge what there is, marked incomplete)"
        )
    return missing


def merge_runs(
    runs: Sequence[Run],
    run_id: str | None = None,
    out_dir: str | os.PathLike[str] = DEFAULT_RESULTS_DIR,
    *,
    allow_incomplete: bool = False,
) -> tuple[Path, int, int]:
    """Join the shards of one sharded bench into one new run file; returns (path, rows
    kept, duplicates).

    Everything is checked before anything is written (see `check_shards`; a `run_id`
    whose file exists is refused), so a refused merge changes no file. The new header is
    a bench header (so `kvbench report` takes the merged run as the latest bench run)
    recording each part's run id and environment, and the shards that are missing when
    `allow_incomplete`; its environment is the first part's. A (suite, case, metric)
    measured by several parts keeps the first.
    """
    missing = check_shards(runs, allow_incomplete=allow_incomplete)
    rid = check_run_id(run_id) if run_id is not None else new_run_id()
    target = Path(out_dir) / f"{rid}.jsonl"
    if target.exists():
        raise ResultsError(f"cannot merge into {target}: the run already exists")
    parts = [{"run_id": r.run_id, "environment": r.environment, "path": str(r.path)} for r in runs]
    bench = dict(runs[0].header["bench"])
    planned = [r.header["bench"].get("planned_cases") for r in runs]
    bench.update(
        shard=None,
        merged_shards=len(runs),
        missing_shards=[f"{k}/{_shard_of(runs[0])[1]}" for k in missing],
        planned_cases=sum(planned) if all(isinstance(x, int) for x in planned) else None,
        descriptions={
            k: v for r in runs for k, v in (r.header["bench"].get("descriptions") or {}).items()
        },
        waiting={k: v for r in runs for k, v in (r.header["bench"].get("waiting") or {}).items()},
    )
    writer = ResultWriter(
        rid,
        out_dir,
        environment=runs[0].environment or {"device": "unknown"},
        header_fields={"merged_from": parts, "bench": bench},
    )
    seen: set[tuple[str, str]] = set()
    kept = dupes = 0
    with writer:
        for run in runs:
            for row in run.rows:
                key = (case_key(row["suite"], row["case"]), row["metric"])
                if key in seen:
                    dupes += 1
                    continue
                seen.add(key)
                line = dict(row)
                line["source_run"] = run.run_id
                writer._write_line(line)
                kept += 1
    return writer.path, kept, dupes


__all__ = [
    "DEFAULT_RESULTS_DIR",
    "SCHEMA_VERSION",
    "LineProblem",
    "ResultWriter",
    "ResultsError",
    "Run",
    "RunNotFoundError",
    "RunSummary",
    "SchemaVersionError",
    "case_key",
    "check_appendable",
    "check_run_id",
    "check_shards",
    "collect_environment",
    "export_frame",
    "git_state",
    "latest_run",
    "load_run",
    "load_runs",
    "merge_runs",
    "new_run_id",
    "parquet_available",
    "read_header",
    "resolve_run",
    "run_files",
    "summarize",
    "to_frame",
]
