"""A fitted time model's coefficients as one page table: quantity, value, unit, source.

Two sweeps fit the step-time model and show what they fitted: serving.measured (fitted
to kvbench's own replays on this CPU, `reports.serving_measured`) and serving.vllm_engine
(fitted to vLLM's steps, `reports.serving_vllm_engine`). Each keeps its own rows (which
coefficients, in what unit, and where each came from); reading the calibration case's
rows and formatting each value in its unit happens here, once, so the two tables cannot
drift apart in how they pick rows or show numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from kvbench.reports.derived_table import DerivedTable
from kvbench.reports.tables import latest

#: One coefficient: (metric, quantity shown, unit shown, scale from the stored unit to the
#: unit shown, source: measured here, fitted to what, counted, read from where).
CoefficientRow = tuple[str, str, str, float, str]

#: Units shown as whole counts with thousands separators (1,284), not to 3 significant
#: digits (1.28e+03).
COUNT_UNITS = ("steps", "blocks")


def coefficient_table(
    frame: pd.DataFrame,
    suite: str,
    rows: Sequence[CoefficientRow],
    *,
    title: str,
    note: str,
    required: str,
) -> DerivedTable | None:
    """The coefficients `rows` of `suite`'s calibration case (its latest rows with a
    `calibration` parameter, where the column exists), each with its unit and source;
    None when the case did not record the metric `required`. A coefficient the case did
    not record (or recorded as NaN) is left out."""
    latest_rows = latest(frame[frame["suite"] == suite])
    if "calibration" in latest_rows.columns:
        latest_rows = latest_rows[latest_rows["calibration"].notna()]
    values = dict(zip(latest_rows["metric"], latest_rows["value"], strict=False))
    if required not in values:
        return None
    table = DerivedTable(title, note, ["quantity", "value", "unit", "source"], numeric_columns=(1,))
    for metric, quantity, unit, scale, source in rows:
        v = values.get(metric)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        shown = f"{v * scale:,.0f}" if unit in COUNT_UNITS else f"{v * scale:,.3g}"
        table.rows.append([quantity, shown, unit, source])
    return table
