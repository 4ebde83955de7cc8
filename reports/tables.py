"""Result rows -> pandas tables: the last value per case and metric, case parameters as
columns, metrics side by side, and two-run comparisons.

Input is the long frame of `reports.store.frame.to_frame` (one row per measurement).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kvbench.reports.store.frame import BASE_COLUMNS
from kvbench.workloads.units import format_quantity, format_spread

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
    keys, metrics, rows, cells = wide_with_spread(frame)
    if not spread:
        return keys, metrics, rows
    timed = [j for j in range(len(metrics)) if any(sp[j] is not None for sp in cells)]
    out = [
        row + [(c.q1, c.q3) if (c := sp[j]) is not None else (math.nan, math.nan) for j in timed]
        for row, sp in zip(rows, cells, strict=True)
    ]
    return keys, metrics + [f"{metrics[j]} q1-q3" for j in timed], out


def wide_with_spread(
    frame: pd.DataFrame,
) -> tuple[list[str], list[str], list[list[Any]], list[list[Spread | None]]]:
    """`wide`, plus for every metric cell its repeat spread (q1, q3, n) where the store
    kept one (a parallel list of lists, None where it did not)."""
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
    spread = spreads(frame)
    lines = []
    for idx, line in table.iterrows():
        row = [idx[0] if k == "run_id" else first.loc[idx, k] for k in keys] + [
            line.get(m, math.nan) for m in metrics
        ]
        lines.append((row, [spread.get((idx[0], idx[1], m)) for m in metrics]))
    lines.sort(key=lambda rs: [_sort_key(v) for v in rs[0][: len(keys)]])
    return keys, metrics, [r for r, _ in lines], [sp for _, sp in lines]


@dataclass(frozen=True)
class Spread:
    """Repeat statistics of one measurement: quartiles and the number of repeats."""

    q1: float
    q3: float
    n: int | None

    def overlaps(self, other: Spread) -> bool:
        """Whether the two interquartile ranges overlap (a difference within noise)."""
        return self.q1 <= other.q3 and other.q1 <= self.q3

    def text(self, unit: str = "") -> str:
        return format_spread(self.q1, self.q3, self.n, unit)


def spreads(frame: pd.DataFrame) -> dict[tuple[str, str, str], Spread]:
    """(run_id, case_key, metric) -> Spread for the rows whose stats hold q1 and q3."""
    if frame.empty or "stats.q1" not in frame.columns or "stats.q3" not in frame.columns:
        return {}
    cols = ["run_id", "case_key", "metric", "stats.q1", "stats.q3"]
    n_col = "stats.n" if "stats.n" in frame.columns else None
    sub = frame[[*cols, *([n_col] if n_col else [])]].dropna(subset=["stats.q1", "stats.q3"])
    out = {}
    for rec in sub.itertuples(index=False):
        n = rec[5] if n_col else None
        n = int(n) if n is not None and not (isinstance(n, float) and math.isnan(n)) else None
        out[(rec[0], rec[1], rec[2])] = Spread(float(rec[3]), float(rec[4]), n)
    return out


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


#: What the compare page says of a difference between two runs.
CHANGED, DIFFERS, WITHIN_NOISE, SAME = "changed", "differs", "within noise", "same"
_RANK = {CHANGED: 0, DIFFERS: 1, WITHIN_NOISE: 2, SAME: 3}


def compare(frame_a: pd.DataFrame, frame_b: pd.DataFrame) -> pd.DataFrame:
    """Rows measured in both runs, side by side: suite, case, metric, unit, a, b, b / a,
    the spread of each side (Spread or None) and a verdict:

        changed       the interquartile ranges of the repeats do not overlap;
        differs       a value without repeats (a count, a modeled or compiled figure, a
                      ratio computed from medians) differs: exact for deterministic
                      figures, of unknown noise for derived timings;
        within noise  the interquartile ranges overlap: the runs do not tell them apart;
        same          equal values.

    Sorted changed, differs, within noise, same; largest |log(b / a)| first in each.
    """
    cols = ["run_id", "suite", "case_key", "metric", "unit", "value"]
    a = latest(frame_a)[cols]
    b = latest(frame_b)[cols]
    sa, sb = spreads(latest(frame_a)), spreads(latest(frame_b))
    both = a.merge(b, on=["suite", "case_key", "metric", "unit"], suffixes=("_a", "_b"))
    both = both[~both["metric"].isin(BOOKKEEPING_METRICS)]
    ratio = both["value_b"] / both["value_a"].where(both["value_a"] != 0)
    spread_a = [
        sa.get((r, c, m))
        for r, c, m in zip(both["run_id_a"], both["case_key"], both["metric"], strict=True)
    ]
    spread_b = [
        sb.get((r, c, m))
        for r, c, m in zip(both["run_id_b"], both["case_key"], both["metric"], strict=True)
    ]
    verdicts = []
    for va, vb, xa, xb in zip(both["value_a"], both["value_b"], spread_a, spread_b, strict=True):
        if xa is not None and xb is not None:
            verdicts.append(WITHIN_NOISE if xa.overlaps(xb) else CHANGED)
        else:
            verdicts.append(SAME if va == vb else DIFFERS)
    both = both.assign(ratio=ratio, spread_a=spread_a, spread_b=spread_b, verdict=verdicts)
    size = np.log(both["ratio"].where(both["ratio"] > 0)).abs().fillna(np.inf)
    both = both.assign(_changed=both["verdict"].map(_RANK), _size=-size)
    both = both.sort_values(["_changed", "_size", "suite", "metric", "case_key"])
    return both.drop(columns=["_changed", "_size", "run_id_a", "run_id_b"]).reset_index(drop=True)


def format_value(value: Any, unit: str = "") -> str:
    """A number for a table cell, always with its unit: `workloads.units.format_quantity`
    (the one formatting rule of every page)."""
    return format_quantity(value, unit)
