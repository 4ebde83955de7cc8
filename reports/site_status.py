"""How the cases of the reported runs ended, for the site: failed and skipped cases per
sweep, and per run how many of its planned cases ended ("incomplete: N of M cases" for a
killed run). Built from the status lines of the results store alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvbench.reports.store.reader import Run
from kvbench.reports.store.schema import CaseStatus, Status


@dataclass
class SweepOutcomes:
    """The cases of one sweep that did not end measured (latest status per case)."""

    failed: list[dict[str, str]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)


def _case_text(status: CaseStatus) -> str:
    return ", ".join(f"{k}={v}" for k, v in status.case.items()) or "(no parameters)"


def sweep_outcomes(runs: Sequence[Run]) -> dict[str, SweepOutcomes]:
    """Failed and skipped cases by sweep over `runs` (a case measured in any run, or
    later in the same run, is not listed)."""
    latest: dict[str, tuple[str, CaseStatus]] = {}
    for run in runs:
        for key, status in run.outcomes().items():
            if key not in latest or latest[key][1].status is not Status.MEASURED:
                latest[key] = (run.run_id, status)
    out: dict[str, SweepOutcomes] = {}
    for run_id, status in latest.values():
        if status.status is Status.MEASURED:
            continue
        entry = {"run": run_id, "case": _case_text(status), "message": status.message}
        bucket = out.setdefault(status.suite, SweepOutcomes())
        if status.status is Status.FAILED:
            bucket.failed.append({**entry, "error": status.error})
        else:
            bucket.skipped.append(entry)
    return out


def run_outcomes(run: Run) -> dict[str, Any]:
    """Counts for the index: cases ended / planned, measured, failed, skipped, and the
    line that marks a killed run ("" when the run is complete or its plan is unknown)."""
    outcomes = run.outcomes()
    ended, planned = len(outcomes), run.planned_cases
    counts = {s.value: 0 for s in Status}
    for status in outcomes.values():
        counts[status.status.value] += 1
    incomplete = (
        f"incomplete: {ended} of {planned} cases" if planned is not None and ended < planned else ""
    )
    return {"ended": ended, "planned": planned, **counts, "incomplete": incomplete}
