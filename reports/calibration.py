"""The GPU calibration page (sweep calibration.gpu), from result rows alone: predicted
vs measured scatter per GPU and the held-out error by num_tokens and by TP.

Rows carry, per case (gpu, model, tp, num_tokens), `<group>_measured_us` (Vidur's median,
measured on a GPU, not here), `<group>_datasheet_us` and `<group>_fitted_us` (predicted
by kvbench), and `held_out` (1 when the fit did not use the case's model).
"""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd

from kvbench.reports.derived_table import DerivedTable
from kvbench.reports.figures import plt
from kvbench.reports.tables import latest

SUITE = "calibration.gpu"
LINEAR = ("qkv", "o", "up", "down")
TOKEN_BANDS = ((1, 1), (2, 16), (17, 128), (129, 512), (513, 1024), (1025, 4096))
CANNOT_SAY = (
    "What this data cannot say: attention (prefill and decode attention kernels) is not "
    "in this copy of Vidur's profiles, so the step model's KV-read and attention terms "
    "stay priced at the fitted HBM fraction without a check; the engine's fixed step cost "
    "(1 ms: scheduling, sampling, launches outside the layers) is an assumption, not a "
    "measurement; elementwise ops (norms, rope, act, add) are shown but not fitted. "
    "Measured times are Vidur's medians (measured on A100 / H100 GPUs by Vidur, MIT), "
    "predicted ones kvbench's."
)


def points(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (gpu, model, tp, num_tokens, group): measured, datasheet, fitted (us)
    and held_out; empty without calibration.gpu rows."""
    sub = latest(frame[frame["suite"] == SUITE]) if len(frame) else frame
    need = {"gpu", "model", "tp", "num_tokens"}
    if sub.empty or not need <= set(sub.columns):
        return pd.DataFrame()
    keys = ["gpu", "model", "tp", "num_tokens"]
    wide = sub.pivot_table(index=keys, columns="metric", values="value", aggfunc="last")
    out = []
    for key, row in wide.iterrows():
        for g in (*LINEAR, "norms", "rope", "act", "add"):
            m = row.get(f"{g}_measured_us", math.nan)
            if isinstance(m, float) and math.isnan(m):
                continue
            out.append(
                {
                    **dict(zip(keys, key, strict=True)),
                    "group": g,
                    "measured": m,
                    "datasheet": row.get(f"{g}_datasheet_us", math.nan),
                    "fitted": row.get(f"{g}_fitted_us", math.nan),
                    "held_out": bool(row.get("held_out", 0) > 0),
                }
            )
    return pd.DataFrame(out)


def _band(t: float) -> str:
    for lo, hi in TOKEN_BANDS:
        if lo <= t <= hi:
            return f"{lo}" if lo == hi else f"{lo}-{hi}"
    return "other"


def _mae(sub: pd.DataFrame, which: str) -> float:
    if sub.empty:
        return math.nan
    return float(np.mean(np.abs(sub[which] / sub["measured"] - 1)))


def _pct(v: float) -> str:
    return "-" if math.isnan(v) else f"{100 * v:.1f}%"


def error_tables(frame: pd.DataFrame) -> list[DerivedTable]:
    """Held-out linear-layer MAE per GPU, by num_tokens band and by TP (datasheet ->
    fitted), and the per-GPU summary."""
    pts = points(frame)
    if pts.empty:
        return []
    lin = pts[pts["group"].isin(LINEAR) & pts["held_out"]].copy()
    lin["band"] = lin["num_tokens"].map(_band)
    gpus = sorted(lin["gpu"].unique())
    summary = DerivedTable(
        "Held-out error of the linear layers per GPU (predicted vs measured)",
        "Mean |predicted / measured - 1| over QKV, O, up and down projections, every TP and "
        "num_tokens of the rows, for models the fit did not use (fit on one Llama-2 size, "
        "judged on the other). Datasheet: kvbench's roofline at 100% of the peaks; fitted: "
        "the per-kernel model under the fitted HBM / FLOP fractions and floor. The sweep "
        "samples num_tokens at powers of two (13 of Vidur's 261 values), which weights small "
        "token counts, where the fit is weakest, more than `kvbench calibrate gpu`'s "
        "figure over every row. " + CANNOT_SAY,
        ["gpu", "points", "datasheet MAE", "fitted MAE"],
    )
    for g in gpus:
        s = lin[lin["gpu"] == g]
        summary.rows.append([g, str(len(s)), _pct(_mae(s, "datasheet")), _pct(_mae(s, "fitted"))])
    out = [summary]
    for col, title, values in (
        ("band", "num_tokens", [_band(lo) for lo, _ in TOKEN_BANDS]),
        ("tp", "TP", sorted(lin["tp"].unique())),
    ):
        t = DerivedTable(
            f"Held-out linear-layer error by {title} (datasheet -> fitted)",
            "Mean |predicted / measured - 1| (predicted by kvbench, measured by Vidur on the GPU).",
            ["gpu", *[str(int(v)) if not isinstance(v, str) else v for v in values]],
        )
        for g in gpus:
            cells = [g]
            for v in values:
                s = lin[(lin["gpu"] == g) & (lin[col] == v)]
                cells.append(f"{_pct(_mae(s, 'datasheet'))} -> {_pct(_mae(s, 'fitted'))}")
            t.rows.append(cells)
        out.append(t)
    return out


def scatter_svgs(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """(title, SVG) per GPU: predicted vs measured time of the held-out linear layers,
    datasheet and fitted, log-log with the y = x line."""
    pts = points(frame)
    if pts.empty:
        return []
    out = []
    for g in sorted(pts["gpu"].unique()):
        s = pts[(pts["gpu"] == g) & pts["group"].isin(LINEAR) & pts["held_out"]]
        if s.empty:
            continue
        title = f"Predicted vs measured linear-layer time, {g} (held-out models)"
        fig, ax = plt.subplots(figsize=(5.6, 4.6))
        try:
            ax.scatter(s["measured"], s["datasheet"], s=6, alpha=0.5, label="datasheet roofline")
            ax.scatter(s["measured"], s["fitted"], s=6, alpha=0.5, label="fitted model")
            lo = float(min(s["measured"].min(), s["datasheet"].min(), s["fitted"].min()))
            hi = float(max(s["measured"].max(), s["datasheet"].max(), s["fitted"].max()))
            ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, label="predicted = measured")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("measured on the GPU (Vidur median) [us per layer]")
            ax.set_ylabel("predicted by kvbench [us per layer]")
            ax.set_title(title, fontsize=9)
            ax.legend(fontsize=7, loc="upper left")
            fig.tight_layout()
            buf = io.StringIO()
            fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "kvbench"})
        finally:
            plt.close(fig)
        text = buf.getvalue()
        out.append((title, text[text.index("<svg") :]))
    return out
