"""Result rows -> pandas tables: the last value per case and metric, case parameters as
columns, metrics side by side, and two-run comparisons.

Input is the long frame of `reports.results.to_frame` (one row per measurement).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from kvbench.reports.results import BASE_COLUMNS

#: Metrics the runner writes for its own bookkeeping; shown in tables, never plotted.
BOOKKEEPING_METRICS = ("case_wall_time",)


def latest(frame: pd.DataFrame) -> pd.DataFrame:
    """Keep the last row per (run, case, metric): a case measured again after a resume of
    a half-written case supersedes the earlier rows."""
    if frame.empty:
        return frame
    return frame.drop_duplicates(["run_id", "case_key", "metric"], keep="last").reset_index(
        drop=True
    )


def case_columns(frame: pd.DataFrame) -> list[str]:
    """Case-parameter columns that hold a value in at least one row of `frame`."""
    return [
        c
        for c in frame.columns
        if c not in BASE_COLUMNS and not c.startswith("stats.") and frame[c].notna().any()
    ]


def varying(frame: pd.DataFrame, columns: list[str]) -> list[str]:
    """Those of `columns` that take more than one value in `frame`."""
    return [c for c in columns if frame[c].astype(str).nunique(dropna=False) > 1]


def units(frame: pd.DataFrame) -> dict[str, str]:
    """metric -> unit (the first one seen)."""
    return dict(frame.drop_duplicates("metric")[["metric", "unit"]].itertuples(index=False))


def wide(frame: pd.DataFrame, spread: bool = False) -> tuple[list[str], list[str], list[list[Any]]]:
    """One suite's rows as a table: one line per (run, case), one column per metric.

    Returns (case columns, metric columns, rows); the run id is the first case column when
    the frame holds more than one run. Rows are sorted by the case parameters. With
    `spread`, every timed metric (one with repeat statistics) gets a column
    "<metric> q1-q3" after the metrics, holding (q1, q3) pairs.
    """
    frame = latest(frame)
    params = case_columns(frame)
    keys = (["run_id"] if frame["run_id"].nunique() > 1 else []) + params
    metrics = list(dict.fromkeys(frame["metric"]))
    metrics = [m for m in metrics if m not in BOOKKEEPING_METRICS] + [
        m for m in metrics if m in BOOKKEEPING_METRICS
    ]
    table = frame.pivot_table(
        index=["run_id", "case_key"], columns="metric", values="value", aggfunc="last"
    )
    first = frame.drop_duplicates(["run_id", "case_key"]).set_index(["run_id", "case_key"])
    timed: list[str] = []
    bands: dict[str, pd.DataFrame] = {}
    if spread and {"stats.q1", "stats.q3"} <= set(frame.columns):
        for m in metrics:
            sub = frame[(frame["metric"] == m) & frame["stats.q1"].notna()]
            if len(sub):
                timed.append(m)
                bands[m] = sub.set_index(["run_id", "case_key"])[["stats.q1", "stats.q3"]]
    rows = []
    for idx, line in table.iterrows():
        rows.append(
            [idx[0] if k == "run_id" else first.loc[idx, k] for k in keys]
            + [line.get(m, math.nan) for m in metrics]
            + [
                tuple(bands[m].loc[idx]) if idx in bands[m].index else (math.nan, math.nan)
                for m in timed
            ]
        )
    metrics = metrics + [f"{m} q1-q3" for m in timed]
    rows.sort(key=lambda r: [_sort_key(v) for v in r[: len(keys)]])
    return keys, metrics, rows


def _sort_key(v: Any) -> tuple[int, Any]:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return (2, "")
    if isinstance(v, (int, float)):
        return (0, float(v))
    return (1, str(v))


def beside(
    frame: pd.DataFrame, keys: list[str], metrics: list[str], by: str = "impl"
) -> pd.DataFrame:
    """Implementations side by side: one line per unit of work (the `keys` case
    parameters, plus run_id when the frame holds several runs), one column per
    (metric, value of `by`), holding the last value measured. Keys missing from the
    frame are dropped; rows missing a key (NaN) are left out. Empty frame in, empty out.
    """
    frame = latest(frame)
    sub = frame[frame["metric"].isin(metrics)] if not frame.empty else frame
    if sub.empty or by not in sub.columns:
        return pd.DataFrame()
    several = frame["run_id"].nunique() > 1 and "run_id" not in keys
    index = (["run_id"] if several else []) + [k for k in keys if k in sub.columns]
    sub = sub.dropna(subset=[*index, by])
    if sub.empty:
        return pd.DataFrame()
    table = sub.pivot_table(index=index, columns=["metric", by], values="value", aggfunc="last")
    return table.sort_index()


def compare(frame_a: pd.DataFrame, frame_b: pd.DataFrame) -> pd.DataFrame:
    """Rows measured in both runs, side by side: suite, case, metric, unit, a, b, b / a."""
    cols = ["suite", "case_key", "metric", "unit", "value"]
    a = latest(frame_a)[cols]
    b = latest(frame_b)[cols]
    both = a.merge(b, on=["suite", "case_key", "metric", "unit"], suffixes=("_a", "_b"))
    both = both[~both["metric"].isin(BOOKKEEPING_METRICS)]
    ratio = both["value_b"] / both["value_a"].where(both["value_a"] != 0)
    both = both.assign(ratio=ratio)
    return both.sort_values(["suite", "metric", "case_key"]).reset_index(drop=True)


def format_value(value: Any, unit: str = "") -> str:
    """A number for a table cell: integers as integers, else 4 significant digits, with
    SI-style scaling for bytes and B/s."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value)
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(v):
        return ""
    if unit in ("B", "B/s") and abs(v) >= 1024:
        for scale, name in ((2**40, "Ti"), (2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki")):
            if abs(v) >= scale:
                return f"{v / scale:.4g} {name}{unit}"
    if unit == "s" and 0 < abs(v) < 1:
        return f"{v * 1e3:.4g} ms" if abs(v) >= 1e-3 else f"{v * 1e6:.4g} µs"
    if unit == "fraction":
        return f"{v:.2%}" if abs(v) < 10 else f"{v:.4g}"
    if v.is_integer() and abs(v) < 1e15:
        return f"{int(v):,}"
    return f"{v:.4g}"
