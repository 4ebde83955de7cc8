"""fp8 KV summary tables for the report: speed and accuracy cost of the fp8 decode
(kernel.decode_fp8), and capacity / sustained rate with fp8 KV beside float16
(serving.kv_dtype). Each sits on its sweep's page (`derived_tables`), under the page's
provenance tag; every cell carries its unit, and timed ratios their spread (q1-q3, n).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from kvbench.reports.derived_table import DerivedTable
from kvbench.reports.tables import format_value, latest
from kvbench.workloads.units import format_quantity, format_spread

DECODE = "kernel.decode_fp8"
SERVING = "serving.kv_dtype"
DECODE_KEYS = ("kv_dtype", "scales", "head_spread", "batch", "ctx_len")


def _wide(frame: pd.DataFrame, suite: str, keys: tuple[str, ...]) -> dict[tuple, dict[str, Any]]:
    """(case key values) -> metric -> row (a dict of the row's columns), latest rows."""
    sub = latest(frame)
    sub = sub[sub["suite"] == suite]
    out: dict[tuple, dict[str, Any]] = {}
    for rec in sub.to_dict("records"):
        if any(k not in rec for k in keys):
            continue
        out.setdefault(tuple(rec[k] for k in keys), {})[rec["metric"]] = rec
    return out


def _value(metrics: dict[str, Any], name: str, unit: str = "", spread: bool = False) -> str:
    rec = metrics.get(name)
    if rec is None:
        return ""
    text = format_quantity(rec["value"], unit or rec.get("unit", ""))
    if spread:
        sp = format_spread(rec.get("stats.q1"), rec.get("stats.q3"), rec.get("stats.n"))
        text += f" ({sp})" if sp else ""
    return text


def _ratio(rec: dict[str, Any] | None) -> str:
    if rec is None or not isinstance(rec.get("value"), (int, float)):
        return ""
    text = f"{rec['value']:.2f}x"
    q1, q3, n = rec.get("stats.q1"), rec.get("stats.q3"), rec.get("stats.n")
    if isinstance(q1, float) and isinstance(q3, float) and not math.isnan(q1):
        count = f", n={int(n)}" if isinstance(n, (int, float)) and not math.isnan(n) else ""
        text += f" [{q1:.2f}-{q3:.2f}{count}]"
    return text


def decode_table(frame: pd.DataFrame) -> DerivedTable | None:
    """fp8 decode against 16-bit decode of the same K/V: paired time ratios, bytes, copy-peak
    fraction and the accuracy cost."""
    cases = _wide(frame, DECODE, DECODE_KEYS)
    if not cases:
        return None
    table = DerivedTable(
        "fp8 decode: speed against float16 / bfloat16 and accuracy cost",
        "Time ratios: on the CPU, medians of per-repeat ratios, fp8 and the 16-bit kernel "
        "timed alternately in one process [q1-q3, n]; on a GPU (Triton), the ratio of "
        "the two kernels' CUDA-graph medians (each one's q1-q3 is in the sweep's table). "
        "Bytes per call are K/V plus queries, outputs and tables; copy-peak fraction = the "
        "fp8 kernel's bytes per second over a plain copy's (on the CPU timed in the same "
        "repeats). Errors are ||out - exact|| / ||exact||"
        " against float64 attention over the unquantized K/V (the 16-bit pools' own "
        "rounding beside), and against float64 over the dequantized K/V (the kernel's "
        "semantics).",
    )
    table.header = [
        "format",
        "scales",
        "head spread",
        "batch",
        "context",
        "fp8 / fp16 time",
        "fp8 / bf16 time",
        "bytes/call fp8",
        "bytes/call fp16",
        "copy-peak fraction",
        "error fp8",
        "error fp16 pool",
        "error fp8 vs dequantized",
    ]
    for key in sorted(cases, key=str):
        m = cases[key]
        table.rows.append(
            [format_value(k) for k in key]
            + [
                _ratio(m.get("ratio_fp8_vs_float16")),
                _ratio(m.get("ratio_fp8_vs_bfloat16")),
                _value(m, "bytes_per_call_fp8"),
                _value(m, "bytes_per_call_float16"),
                _value(m, "bandwidth_fraction"),
                _value(m, "rel_err_fp8_vs_exact_fp64"),
                _value(m, "rel_err_float16_vs_exact_fp64"),
                _value(m, "rel_err_fp8_vs_dequantized_fp64"),
            ]
        )
    return table


def serving_table(frame: pd.DataFrame) -> DerivedTable | None:
    """KV slots and sustained rate per set-up and system, float16 beside fp8."""
    cases = _wide(frame, SERVING, ("setup", "system", "kv_dtype"))
    if not cases:
        return None
    pairs = sorted({(s, sy) for s, sy, _ in cases})
    table = DerivedTable(
        "fp8 KV beside float16: capacity and sustained rate",
        "KV slots: closed form (the set-up's KV memory / bytes per token of the dtype). "
        "Sustained rate: modeled (the engine's time model at the profile's fitted "
        "efficiency; the highest ShareGPT Poisson rate whose mean normalized latency stays "
        "under 10 x the one-sequence decode step; weights stay float16 and fp8's "
        "dequantization arithmetic is not priced).",
    )
    table.header = [
        "setup",
        "system",
        "KV slots fp16",
        "KV slots fp8",
        "sustained fp16",
        "sustained fp8",
        "fp8 / fp16 rate",
    ]
    for setup, system in pairs:
        a = cases.get((setup, system, "float16"), {})
        b = cases.get((setup, system, "fp8_e4m3"), {})
        ra, rb = a.get("sustained_rate"), b.get("sustained_rate")
        ratio = ""
        if ra is not None and rb is not None and ra["value"]:
            ratio = f"{rb['value'] / ra['value']:.2f}x"
        table.rows.append(
            [
                str(setup),
                str(system),
                _value(a, "kv_slots"),
                _value(b, "kv_slots"),
                _value(a, "sustained_rate"),
                _value(b, "sustained_rate"),
                ratio,
            ]
        )
    return table


def derived_tables(suite: str, frame: pd.DataFrame) -> list[DerivedTable]:
    """The fp8 summary table of one sweep's page (possibly none)."""
    maker = {DECODE: decode_table, SERVING: serving_table}.get(suite)
    table = maker(frame) if maker is not None else None
    return [table] if table is not None else []
