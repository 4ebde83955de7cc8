"""Derived serving tables: sustained-rate ratios (serving.rate) and the regenerated [PA-deep-dive]
throughput-vs-batch table (serving.batch_table), from result rows alone.

Each table is (title, note, header, rows) with rows of preformatted strings, shown on
its sweep's page under the figures; the claims read the same numbers through
`sustained_ratios` and `batch_peaks`.
"""

from __future__ import annotations

import math

import pandas as pd

from kvbench.reports.derived_table import DerivedTable
from kvbench.reports.serving_measured import calibration_table
from kvbench.reports.serving_vllm_engine import comparison_table, fit_table
from kvbench.reports.tables import latest

BASELINES = ("contiguous-oracle", "contiguous-pow2", "contiguous-max", "static")
#: How the paper names the baselines.
PAPER_NAMES = {
    "contiguous-oracle": "Orca (Oracle)",
    "contiguous-pow2": "Orca (Pow2)",
    "contiguous-max": "Orca (Max)",
    "static": "FasterTransformer-like",
}
#: Every serving system under the name the paper uses (paged kvbench is the paper's vLLM).
SYSTEM_NAMES = {"paged": "vLLM (paged)", **PAPER_NAMES}


def _suite_rows(
    frame: pd.DataFrame, suite: str, metric: str, calibration: str = "fitted"
) -> pd.DataFrame:
    """Latest rows of `suite` / `metric` priced with `calibration`: "fitted" keeps rows
    without the parameter too (runs before it existed), "datasheet" only those marked."""
    sub = latest(frame)
    sub = sub[(sub["suite"] == suite) & (sub["metric"] == metric)]
    if "calibration" not in sub.columns:
        return sub if calibration == "fitted" else sub.iloc[0:0]
    if calibration == "fitted":
        return sub[sub["calibration"].isna() | (sub["calibration"] != "datasheet")]
    return sub[sub["calibration"] == calibration]


def sustained_rates(frame: pd.DataFrame, calibration: str = "fitted") -> pd.DataFrame:
    """sustained_rate per (setup, workload) x system: a wide frame, requests/s."""
    rows = _suite_rows(frame, "serving.rate", "sustained_rate", calibration)
    if rows.empty or not {"setup", "workload", "system"} <= set(rows.columns):
        return pd.DataFrame()
    return rows.pivot_table(
        index=["setup", "workload"], columns="system", values="value", aggfunc="last"
    )


def sustained_below(frame: pd.DataFrame, calibration: str = "fitted") -> pd.DataFrame:
    """sustained_rate_below per (setup, workload) x system: where no rate the search tried
    met the bound, the lowest one tried (the sustained rate lies below it), requests/s."""
    rows = _suite_rows(frame, "serving.rate", "sustained_rate_below", calibration)
    if rows.empty or not {"setup", "workload", "system"} <= set(rows.columns):
        return pd.DataFrame()
    return rows.pivot_table(
        index=["setup", "workload"], columns="system", values="value", aggfunc="last"
    )


def _get(wide: pd.DataFrame, key: tuple[str, str], system: str) -> float:
    if wide.empty or key not in wide.index or system not in wide.columns:
        return math.nan
    return float(wide.loc[key, system])


def rate_text(rate: float, below: float = math.nan) -> str:
    """A sustained rate as a table shows it (requests/s): the rate where the search found
    one; "below X (the lowest rate tried)" where it did not (a `sustained_rate_below` row,
    or an older run's 0, whose lowest rate is not recorded); "-" where no row says."""
    if not math.isnan(rate) and rate > 0:
        return _r(rate)
    if not math.isnan(below):
        return f"below {_r(below)} (the lowest rate tried)"
    if rate == 0:
        return "below the lowest rate tried"
    return "-"


def ratio_text(paged: float, rate: float, below: float = math.nan) -> str:
    """paged / a baseline's sustained rate; "> Nx" where the baseline's rate is only known
    to lie below `below` (so the ratio exceeds paged / below)."""
    if not math.isnan(rate) and rate > 0:
        return _x(paged / rate)
    if not math.isnan(below) and below > 0 and not math.isnan(paged):
        return f"> {paged / below:.2f}x"
    return "-"


def sustained_ratios(frame: pd.DataFrame, calibration: str = "fitted") -> pd.DataFrame:
    """paged's sustained rate over each baseline's, per (setup, workload)."""
    wide = sustained_rates(frame, calibration)
    if wide.empty or "paged" not in wide.columns:
        return pd.DataFrame()
    out = pd.DataFrame(index=wide.index)
    for b in BASELINES:
        if b in wide.columns:
            out[b] = wide["paged"] / wide[b].where(wide[b] > 0)
    return out


def _x(v: float) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}x"


def _r(v: float) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"


def sustained_table(frame: pd.DataFrame) -> DerivedTable | None:
    wide = sustained_rates(frame)
    below = sustained_below(frame)
    if wide.empty or "paged" not in wide.columns:
        return None
    bound = _suite_rows(frame, "serving.rate", "latency_bound")
    note = (
        "Modeled (the engine's time model of the set-up's GPUs at their fitted efficiency: "
        "`kvbench calibrate gpu`; the A100-40GB takes the A100-80GB's fit, an assumption). "
        "Sustained rate: the highest "
        "Poisson rate whose mean normalized latency stays under the bound (10 x the set-up's "
        "one-sequence decode step"
    )
    if not bound.empty:
        per = bound.groupby("setup")["value"].last()
        note += "; " + ", ".join(f"{k}: {1e3 * v:.0f} ms/token" for k, v in per.items())
    note += (
        "). Ratio = vLLM's (paged) sustained rate / the baseline's. 'below X (the lowest "
        "rate tried)': the search halved its start rate five times and even X missed the "
        "bound; the rate lies somewhere below X (its ratio is then at least paged / X)."
    )
    present = set(wide.columns) | set(below.columns)
    systems = ["paged", *[b for b in BASELINES if b in present]]
    table = DerivedTable("Sustained request rate, vLLM (paged) over each baseline", note)
    table.header = ["setup", "workload"] + [f"{SYSTEM_NAMES[s]} [requests/s]" for s in systems]
    table.header += [f"vLLM / {PAPER_NAMES[b]}" for b in systems[1:]]
    for key in wide.index:
        setup, workload = key
        cells = [str(setup), str(workload)]
        cells += [rate_text(_get(wide, key, s), _get(below, key, s)) for s in systems]
        paged = _get(wide, key, "paged")
        cells += [ratio_text(paged, _get(wide, key, b), _get(below, key, b)) for b in systems[1:]]
        table.rows.append(cells)
    return table


# --------------------------------------------------------------------- [PA-deep-dive] batch table

BATCH_SYSTEMS = ("contiguous-max", "paged", "paged-prefix")
BATCH_LABELS = {
    "contiguous-max": "Traditional (tok/s)",
    "paged": "PagedAttention (tok/s)",
    "paged-prefix": "PagedAttention + prefix cache (tok/s)",
}
#: [PA-deep-dive]'s table (A100-80GB, Llama-70B): batch -> tok/s per system; 0 = OOM.
SEED001_BATCH = {
    "batch": (1, 4, 8, 16, 32, 48, 64, 96, 128),
    "contiguous-max": (142, 548, 1047, 1247, 0, 0, 0, 0, 0),
    "paged": (138, 531, 998, 1198, 2891, 3891, 5234, 6102, 6380),
    "paged-prefix": (138, 531, 998, 1198, 2891, 4120, 5890, 7245, 8150),
}


def batch_frame(frame: pd.DataFrame, setup: str = "llama-2-70b-a100-80gb") -> pd.DataFrame:
    """tokens/s per batch x system of serving.batch_table (NaN where it does not fit)."""
    rows = _suite_rows(frame, "serving.batch_table", "tokens_per_second")
    if rows.empty or "setup" not in rows.columns:
        return pd.DataFrame()
    rows = rows[rows["setup"] == setup]
    return rows.pivot_table(index="batch", columns="system", values="value", aggfunc="last")


def batch_peaks(frame: pd.DataFrame) -> dict[str, float]:
    """Peak modeled tokens/s per system over the batch sizes (serving.batch_table)."""
    wide = batch_frame(frame)
    return {} if wide.empty else {s: float(wide[s].max()) for s in wide.columns}


def batch_table(frame: pd.DataFrame) -> DerivedTable | None:
    wide = batch_frame(frame)
    if wide.empty:
        return None
    table = DerivedTable(
        "[PA-deep-dive]'s throughput vs batch size, regenerated (A100-80GB, Llama-70B)",
        "Modeled here (the engine's time model of an A100-80GB at its fitted efficiency, "
        "`kvbench calibrate gpu`, with [PA-deep-dive]'s 35 GB of "
        "weights and 42 GB KV pool) beside the seed's published numbers; 'OOM' where the "
        "contiguous cache cannot hold the batch's max-length reservations.",
    )
    systems = [s for s in BATCH_SYSTEMS if s in wide.columns]
    table.header = ["batch"]
    for s in systems:
        table.header += [f"{BATCH_LABELS[s]} modeled", "[PA-deep-dive]"]
    for b in wide.index:
        cells = [str(int(b))]
        for s in systems:
            v = wide.loc[b, s]
            cells.append("OOM" if math.isnan(v) else f"{v:,.0f}")
            seed = dict(zip(SEED001_BATCH["batch"], SEED001_BATCH[s], strict=True)).get(int(b))
            cells.append("-" if seed is None else ("OOM" if seed == 0 else f"{seed:,}"))
        table.rows.append(cells)
    return table


def calibration_rate_table(frame: pd.DataFrame) -> DerivedTable | None:
    """Sustained rates priced at the datasheet beside the fitted profile (knee cases run
    with both), and paged's ratio over each baseline under each."""
    before, after = sustained_rates(frame, "datasheet"), sustained_rates(frame, "fitted")
    if before.empty or after.empty:
        return None
    table = DerivedTable(
        "Sustained rate before / after GPU calibration (datasheet -> fitted profile)",
        "Modeled both ways on the same traces: 'datasheet' prices the steps at 100% of the "
        "GPU's datasheet HBM bandwidth and FLOP/s with no kernel floor; 'fitted' at the "
        "fractions and per-kernel floor fitted to Vidur's measured linear layers "
        "(`kvbench calibrate gpu`). Ratio columns: paged / baseline under each.",
        [
            "setup",
            "workload",
            "system",
            "datasheet [req/s]",
            "fitted [req/s]",
            "fitted / datasheet",
            "paged / it, datasheet",
            "paged / it, fitted",
        ],
    )
    below0, below1 = sustained_below(frame, "datasheet"), sustained_below(frame, "fitted")
    systems = list(dict.fromkeys([*after.columns, *below1.columns]))
    for key in after.index:
        if key not in before.index:
            continue
        p0, p1 = _get(before, key, "paged"), _get(after, key, "paged")
        for system in systems:
            b, a = _get(before, key, system), _get(after, key, system)
            lo0, lo1 = _get(below0, key, system), _get(below1, key, system)
            if all(math.isnan(v) for v in (a, b, lo0, lo1)):
                continue
            found = a > 0 and b > 0  # both searches found a rate
            table.rows.append(
                [
                    str(key[0]),
                    str(key[1]),
                    str(system),
                    rate_text(b, lo0),
                    rate_text(a, lo1),
                    _x(a / b) if found else "-",
                    ratio_text(p0, b, lo0) if system != "paged" else "-",
                    ratio_text(p1, a, lo1) if system != "paged" else "-",
                ]
            )
    return table


def calibration_batch_table(frame: pd.DataFrame) -> DerivedTable | None:
    """Peak modeled tokens/s per system of serving.batch_table, datasheet vs fitted."""
    rows0 = _suite_rows(frame, "serving.batch_table", "tokens_per_second", "datasheet")
    rows1 = _suite_rows(frame, "serving.batch_table", "tokens_per_second", "fitted")
    if rows0.empty or rows1.empty:
        return None
    p0, p1 = rows0.groupby("system")["value"].max(), rows1.groupby("system")["value"].max()
    table = DerivedTable(
        "Peak tokens/s before / after GPU calibration (datasheet -> fitted profile)",
        "Modeled: the highest tokens/s over the batch sizes, A100-80GB at 100% of its "
        "datasheet peaks vs at its fitted efficiency (`kvbench calibrate gpu`).",
        ["system", "datasheet [tok/s]", "fitted [tok/s]", "fitted / datasheet"],
    )
    for system in p1.index:
        b, a = float(p0.get(system, math.nan)), float(p1[system])
        table.rows.append([str(system), f"{b:,.0f}", f"{a:,.0f}", _x(a / b if b else math.nan)])
    return table


def derived_tables(suite: str, frame: pd.DataFrame) -> list[DerivedTable]:
    """The derived tables of one sweep's page (possibly none)."""
    makers = {
        "serving.rate": (sustained_table, calibration_rate_table),
        "serving.batch_table": (batch_table, calibration_batch_table),
        "serving.measured": (calibration_table,),
        "serving.vllm_engine": (comparison_table, fit_table),
    }.get(suite, ())
    return [t for t in (make(frame) for make in makers) if t is not None]
