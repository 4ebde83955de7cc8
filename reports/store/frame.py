"""A run's rows as a pandas table, and exporting it (CSV or parquet). pandas is imported
lazily."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from kvbench.reports.store.schema import ResultRow, case_key
from kvbench.workloads.errors import ConfigError


class RunRows(Protocol):
    """What a table needs of a run (the reader's `Run` is one): its id and its rows.
    Named here so this module does not import the reader, which imports it."""

    @property
    def run_id(self) -> str: ...

    @property
    def rows(self) -> Iterable[ResultRow]: ...


#: Columns every results DataFrame has, before the case parameters and stats.
BASE_COLUMNS = ("run_id", "suite", "metric", "value", "unit", "time", "case_key")


def iter_rows(runs: Iterable[RunRows]) -> Iterator[tuple[RunRows, ResultRow]]:
    """(run, row) pairs over every row of every run."""
    for run in runs:
        for row in run.rows:
            yield run, row


def to_frame(runs: Iterable[RunRows]) -> Any:
    """Every row of `runs` as one pandas DataFrame.

    Columns: run_id, suite, metric, value, unit, time, case_key, then one column per
    case parameter (named as the parameter; 'case.NAME' if it collides with a base
    column), then 'stats.NAME' per statistic, and 'note' where a row has one (e.g. why
    a kernel backend ran). Missing parameters are NaN / None.
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
        if row.get("note"):
            rec["note"] = row["note"]
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
