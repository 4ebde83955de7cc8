"""serving.vllm_engine's page tables: vLLM's engine measured here beside kvbench's
prediction of the same run, per trace (steps, per-step error, TTFT / TPOT / end-to-end
percentiles, prefix-hit tokens, load), and the fitted CPU time model with its sources.
Every column names its provenance: "measured here" (vLLM's run, timed on this machine)
or "predicted" (kvbench's decisions and fitted time model)."""

from __future__ import annotations

import math

import pandas as pd

from kvbench.reports.coefficient_table import CoefficientRow, coefficient_table
from kvbench.reports.derived_table import DerivedTable
from kvbench.reports.tables import latest

SUITE = "serving.vllm_engine"


def _values(rows: pd.DataFrame, trace: str, side: str) -> dict[str, float]:
    sub = rows[(rows["trace"] == trace) & (rows["side"] == side)]
    return dict(zip(sub["metric"], sub["value"], strict=False))


def _ms(v: float | None) -> str:
    return "-" if v is None or math.isnan(v) else f"{v * 1e3:,.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None or math.isnan(v) else f"{v * 100:+.1f}%"


def _stats(rows: pd.DataFrame, trace: str, side: str, metric: str) -> str:
    """'median [q1-q3] n' of a metric's repeat statistics, in ms."""
    sub = rows[(rows["trace"] == trace) & (rows["side"] == side) & (rows["metric"] == metric)]
    if sub.empty or "stats.median" not in sub.columns:
        return "-"
    st = sub.iloc[0]

    def ms(key: str) -> float:
        v = st.get(f"stats.{key}", math.nan)
        return float(v) * 1e3 if v is not None else math.nan

    n = st.get("stats.n", 0)
    n = 0 if n is None or (isinstance(n, float) and math.isnan(n)) else int(n)
    return f"{ms('median'):.1f} [{ms('q1'):.1f}-{ms('q3'):.1f}] n={n}"


def _rows(frame: pd.DataFrame) -> pd.DataFrame:
    rows = latest(frame[frame["suite"] == SUITE])
    if "trace" not in rows.columns or "side" not in rows.columns:
        return rows.iloc[0:0]
    return rows[rows["trace"].notna()]


def comparison_table(frame: pd.DataFrame) -> DerivedTable | None:
    """Per held-out trace: vLLM measured here against kvbench predicted."""
    rows = _rows(frame)
    if rows.empty:
        return None
    table = DerivedTable(
        "vLLM's engine measured here against kvbench's prediction, per held-out trace",
        "Measured here: vLLM 0.32's offline engine on this CPU, each step's serving-thread "
        "CPU time (median [q1-q3] over the steps); latencies on that clock, every request "
        "at t = 0. Predicted: kvbench's vllm-v1 engine's decisions (memory-only, vLLM's "
        "blocks and budgets), each step priced by the CPU time model fitted to other vLLM "
        "runs, its host terms at the host speed probed beside vLLM's step. Per-step error: "
        "mean |predicted - measured| / measured over the steps (goal <= 15%); latency "
        "errors: (predicted - "
        "measured) / measured (goal within 15%); load: 1-minute load average.",
        [
            "trace", "steps measured here / predicted", "divergent steps (predicted)",
            "step time, measured here [ms]", "per-step error (predicted)",
            "TTFT p50 / p90 measured here [ms]", "TTFT p50 / p90 predicted [ms]",
            "TPOT p50 / p90 measured here [ms]", "TPOT p50 / p90 predicted [ms]",
            "latency errors TTFT p50 / p90, TPOT p50 / p90 (predicted)",
            "prefix-hit tokens measured here / predicted", "load",
        ],
        numeric_columns=(),
    )  # fmt: skip
    for trace in sorted(rows["trace"].unique()):
        m, p = _values(rows, trace, "vllm"), _values(rows, trace, "kvbench")
        if not m or not p:
            continue
        errs = ", ".join(
            _pct(p.get(f"{w}_error")) for w in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")
        )
        table.rows.append(
            [
                str(trace),
                f"{m.get('steps', math.nan):,.0f} / {p.get('steps', math.nan):,.0f}",
                f"{p.get('divergent_steps', math.nan):,.0f}",
                _stats(rows, trace, "vllm", "step_time_mean"),
                f"{p.get('step_error_mean', math.nan) * 100:.1f}% (without the host probe "
                f"{p.get('step_error_mean_constant', math.nan) * 100:.1f}%)",
                f"{_ms(m.get('ttft_p50'))} / {_ms(m.get('ttft_p90'))}",
                f"{_ms(p.get('ttft_p50'))} / {_ms(p.get('ttft_p90'))}",
                f"{_ms(m.get('tpot_p50'))} / {_ms(m.get('tpot_p90'))}",
                f"{_ms(p.get('tpot_p50'))} / {_ms(p.get('tpot_p90'))}",
                errs,
                f"{m.get('prefix_hit_tokens', math.nan):,.0f} + "
                f"{m.get('prefix_hit_tokens_recomputed', math.nan):,.0f} recomputed / "
                f"{p.get('prefix_hit_tokens', math.nan):,.0f} + "
                f"{p.get('prefix_hit_tokens_recomputed', math.nan):,.0f}",
                f"{m.get('load_average_1min', math.nan):.1f}",
            ]
        )
    return table if table.rows else None


#: The coefficients shown, each with its source (`coefficient_table.CoefficientRow`).
FIT_ROWS: tuple[CoefficientRow, ...] = (
    ("fitted_step_overhead", "fixed per-step cost", "ms", 1e3,
     "fitted to the fit traces' vLLM steps (measured here), at the median host speed"),
    ("fitted_seq_overhead", "cost per scheduled sequence", "ms", 1e3,
     "fitted (as above): vLLM's per-request host work each step and the sampled row"),
    ("fitted_prefill_step_overhead", "cost of a step with a prefill chunk", "ms", 1e3,
     "fitted (as above): what a step carrying a prefill chunk costs beyond its FLOPs"),
    ("fitted_compute_host_exponent", "host speed's power on the memory / compute term",
     "exponent", 1.0, "fitted (as above), in [0, 1]: 0 = that term ignores the probe"),
    ("fitted_bandwidth", "bandwidth", "GB/s", 1e-9, "fitted (as above)"),
    ("fitted_flops", "FLOP/s", "GFLOP/s", 1e-9, "fitted (as above)"),
    ("fit_step_error_mean", "fit-set mean |per-step error|", "%", 1e2,
     "the fitted model on the steps it was fitted to"),
    ("fit_steps", "fit steps", "steps", 1.0, "counted (vLLM's steps of the fit traces)"),
    ("host_probe_median", "host probe (fixed work between steps)", "ms", 1e3,
     "measured here between every two vLLM steps: each step is priced at its two "
     "bracketing probes over this median"),
    ("constant_fit_step_error_mean", "fit-set error without the host probe", "%", 1e2,
     "the same steps fitted with every step at the median speed (diagnostic)"),
    ("num_gpu_blocks", "vLLM's KV blocks (32 tokens)", "blocks", 1.0,
     "read from vLLM's engine (num_gpu_blocks); kvbench gets one fewer (vLLM's null block)"),
    ("load_average_1min", "load average (1 min)", "processes", 1.0, "read at the fit's end"),
)  # fmt: skip


def fit_table(frame: pd.DataFrame) -> DerivedTable | None:
    """The fitted CPU time model's coefficients with their sources."""
    return coefficient_table(
        frame,
        SUITE,
        FIT_ROWS,
        title="The CPU time model of the prediction, fitted to other vLLM runs",
        note="step seconds = h x (fixed + per-sequence x sequences + prefill-step x [a prefill "
        "chunk in the step]) + h^power x max(bytes read / bandwidth, FLOPs / FLOP/s) "
        "(paged.serving.calibration), h = the median host probe around the "
        "step over its fit-set median (measured, never fitted); FLOPs = 2 x the layers' "
        "parameters per token + attention.",
        required="fitted_step_overhead",
    )
