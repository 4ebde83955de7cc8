"""The results store: one JSON line per measurement, appended as it is measured.

A run is one file, ``out/results/<run-id>.jsonl``:

* line 1 is a header: ``{"kind": "header", "schema": 1, "run_id": ..., "created": ...,
  "environment": {...}}`` where the environment names the device, CPU model, torch /
  triton / python versions, git revision and dirty flag; a bench run adds
  ``planned_cases``, how many cases it set out to measure;
* every other line is a measurement row::

      {"kind": "row", "schema": 1, "suite": "kernel.decode", "case": {"block_size": 16},
       "metric": "time", "value": 1.2e-4, "unit": "s",
       "stats": {"median": 1.2e-4, "q1": ..., "q3": ..., "n": 20}, "time": "..."}

  a case status (``{"kind": "status", "suite": ..., "case": ..., "status": "measured" |
  "failed" | "skipped", "error": ..., "message": ...}``: how a case ended), or a
  ``"resume"`` header, written when a later process appends to the same run
  (``kvbench bench --resume RUN``), with that process's environment.

Each line is written with one ``write`` call, then flushed and fsynced, so killing the
writer at any moment loses at most the line being written; a torn last line is reported
by the loader (file and line number) and every other line still loads. A writer that
re-opens a file whose last line is torn starts on a fresh line.

The schema is versioned: a file written by a newer kvbench (a higher ``schema``) is
refused with a message naming both versions rather than half-read.

The store's code lives in `kvbench.reports.store` (schema, environment, writer, reader,
frame, merge); this module is its public face, so ``from kvbench.reports.results import
ResultWriter`` keeps working. Nothing here imports ``paged`` or ``kernels``.
"""

from __future__ import annotations

from kvbench.reports.store.environment import collect_environment, git_state, new_run_id, utc_now
from kvbench.reports.store.frame import (
    BASE_COLUMNS,
    export_frame,
    iter_rows,
    parquet_available,
    to_frame,
)
from kvbench.reports.store.merge import merge_runs
from kvbench.reports.store.reader import (
    DONE_METRIC,
    LineProblem,
    Run,
    RunNotFoundError,
    RunSummary,
    latest_run,
    load_run,
    load_runs,
    resolve_run,
    run_files,
    summarize,
)
from kvbench.reports.store.schema import (
    SCHEMA_VERSION,
    STATUSES,
    CaseStatus,
    RecordError,
    ResultRow,
    ResultsError,
    RunHeader,
    SchemaVersionError,
    case_key,
)
from kvbench.reports.store.writer import DEFAULT_RESULTS_DIR, ResultWriter, check_run_id

__all__ = [
    "BASE_COLUMNS",
    "DEFAULT_RESULTS_DIR",
    "DONE_METRIC",
    "SCHEMA_VERSION",
    "STATUSES",
    "CaseStatus",
    "LineProblem",
    "RecordError",
    "ResultRow",
    "ResultWriter",
    "ResultsError",
    "Run",
    "RunHeader",
    "RunNotFoundError",
    "RunSummary",
    "SchemaVersionError",
    "case_key",
    "check_run_id",
    "collect_environment",
    "export_frame",
    "git_state",
    "iter_rows",
    "latest_run",
    "load_run",
    "load_runs",
    "merge_runs",
    "new_run_id",
    "parquet_available",
    "resolve_run",
    "run_files",
    "summarize",
    "to_frame",
    "utc_now",
]
