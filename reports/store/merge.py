"""Joining shard runs into one run file (`kvbench merge`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from kvbench.reports.store.reader import Run
from kvbench.reports.store.schema import ResultsError, case_key
from kvbench.reports.store.writer import DEFAULT_RESULTS_DIR, ResultWriter


def merge_runs(
    runs: Sequence[Run],
    run_id: str | None = None,
    out_dir: str | os.PathLike[str] = DEFAULT_RESULTS_DIR,
) -> tuple[Path, int, int]:
    """Join shard runs into one new run file; returns (path, rows kept, duplicates).

    The new header records each part's run id and environment and the sum of their
    planned cases; its own environment is the first part's. A (suite, case, metric)
    measured by several parts keeps the first; every part's case statuses are kept.
    """
    if not runs:
        raise ResultsError("nothing to merge: no runs given")
    parts = [{"run_id": r.run_id, "environment": r.environment, "path": str(r.path)} for r in runs]
    writer = ResultWriter(
        run_id,
        out_dir,
        environment=runs[0].environment or {"device": "unknown"},
        header_fields={"merged_from": parts, **_planned(runs)},
    )
    if writer.resumed:
        writer.close()
        raise ResultsError(f"cannot merge into {writer.path}: the run already exists")
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
            for status in run.statuses:
                writer._write_line(status.to_json())
    return writer.path, kept, dupes


def _planned(runs: Sequence[Run]) -> dict[str, int]:
    planned = [r.planned_cases for r in runs]
    if any(p is None for p in planned):
        return {}
    return {"planned_cases": sum(p for p in planned if p is not None)}
