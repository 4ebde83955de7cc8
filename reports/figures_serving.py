"""Serving figures drawn the way the vLLM paper draws them (its Figure 12), beyond what a
`figure_specs.FigureSpec` line chart can say:

* serving.rate, one figure per (set-up, workload): mean normalized latency against request
  rate with the latency bound drawn and each system's sustained rate marked, beside TTFT
  (p50) and throughput against rate; systems under the paper's names in every legend;
* serving.batch_table: the modeled tokens/s against batch size beside [PA-deep-dive]'s published
  values (dashed, crosses), so the gap is visible at a glance.

Every figure here is modeled (the engine's time model on the set-up's GPUs); titles say so.
"""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from kvbench.reports.serving import BATCH_LABELS, SEED001_BATCH, SYSTEM_NAMES
from kvbench.reports.tables import latest

#: Draw order and colour of the serving.rate systems (the paper's legend order).
RATE_SYSTEMS = ("paged", "contiguous-oracle", "contiguous-pow2", "contiguous-max", "static")
_COLORS = dict(zip(RATE_SYSTEMS, matplotlib.color_sequences["tab10"], strict=False))


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(
        buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": "kvbench"}
    )
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _metric(rows: pd.DataFrame, metric: str) -> pd.DataFrame:
    return rows[rows["metric"] == metric]


def rate_figures(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """(title, SVG) per (set-up, workload) of the serving.rate rows (see the module
    docstring); [] without grid rows."""
    rows = latest(frame[frame["suite"] == "serving.rate"])
    if rows.empty or not {"setup", "workload", "system", "rate"} <= set(rows.columns):
        return []
    out = []
    for (setup, workload), sub in rows.groupby(["setup", "workload"], sort=True):
        grid = sub[sub["rate"].notna()]
        if grid.empty:
            continue
        title = f"{setup}, {workload}-like (modeled): latency, TTFT and throughput vs rate"
        out.append((title, _rate_figure(sub, grid, title)))
    return out


def _rate_figure(sub: pd.DataFrame, grid: pd.DataFrame, title: str) -> str:
    fig, axes = plt.subplots(1, 3, figsize=(12.0, 3.6))
    panels = (
        ("normalized_latency", "mean normalized latency [s/token]", True),
        ("ttft_p50", "TTFT p50 [s]", True),
        ("tokens_per_second", "throughput [output tokens/s]", False),
    )
    bound = _metric(sub, "latency_bound")["value"]
    knees = _metric(sub, "sustained_rate")
    for ax, (metric, ylabel, logy) in zip(axes, panels, strict=True):
        for system in RATE_SYSTEMS:
            g = _metric(grid[grid["system"] == system], metric).sort_values("rate")
            if g.empty:
                continue
            ax.plot(g["rate"], g["value"], marker="o", ms=3, color=_COLORS[system],
                    label=SYSTEM_NAMES[system])  # fmt: skip
            if metric == "normalized_latency":
                knee = knees[knees["system"] == system]["value"]
                if not knee.empty:  # the sustained rate: where the line crosses the bound
                    ax.axvline(float(knee.iloc[-1]), color=_COLORS[system], ls=":", lw=1)
        if metric == "normalized_latency" and not bound.empty:
            ax.axhline(float(bound.iloc[-1]), color="black", ls="--", lw=1,
                       label=f"latency bound {1e3 * float(bound.iloc[-1]):.0f} ms/token")  # fmt: skip
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel("request rate [requests/s]")
        ax.set_ylabel(ylabel)
    axes[0].set_title("dotted: each system's sustained rate", fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8,
               bbox_to_anchor=(0.5, -0.08))  # fmt: skip
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _svg(fig)


def batch_table_figure(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """(title, SVG) of serving.batch_table's modeled tokens/s beside [PA-deep-dive]'s values."""
    rows = latest(frame[frame["suite"] == "serving.batch_table"])
    rows = rows[rows["metric"] == "tokens_per_second"]
    if rows.empty or not {"batch", "system"} <= set(rows.columns):
        return []
    title = "Throughput vs batch size, Llama-70B on A100-80GB: modeled here vs [PA-deep-dive]"
    fig, ax = plt.subplots(figsize=(7.0, 3.8))
    colors = matplotlib.color_sequences["tab10"]
    for i, system in enumerate(BATCH_LABELS):
        g = rows[rows["system"] == system].sort_values("batch")
        name = BATCH_LABELS[system].replace(" (tok/s)", "")
        if not g.empty:
            ax.plot(g["batch"], g["value"], marker="o", ms=3, color=colors[i],
                    label=f"{name}, modeled")  # fmt: skip
        seed = [
            (b, v)
            for b, v in zip(SEED001_BATCH["batch"], SEED001_BATCH[system], strict=True)
            if v > 0
        ]
        if seed:
            xs, ys = zip(*seed, strict=True)
            ax.plot(
                xs, ys, ls="--", marker="x", ms=5, color=colors[i], label=f"{name}, [PA-deep-dive]"
            )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("batch size [requests]")
    ax.set_ylabel("throughput [tokens/s]")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return [(title, _svg(fig))]


def extra_figures(suite: str, frame: pd.DataFrame) -> list[tuple[str, str]]:
    """The figures of this module for `suite` (possibly none)."""
    make = {"serving.rate": rate_figures, "serving.batch_table": batch_table_figure}.get(suite)
    return make(frame) if make else []
