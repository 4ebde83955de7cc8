"""serving.kv_specs on the page: windowed attention against full attention, per trace and
model, as one summary table and one figure (from result rows alone).

The sweep serves each model twice on the same trace and KV budget: with its published
attention layout (sliding windows; `windowed_layers` > 0) and with every window widened
to full attention. Per (trace, model) the page sets the two side by side:

* KV memory per running request: the time-averaged pages held per running request of
  the burst run (`pages_per_running_request`) x the page's bytes (`page_bytes`); the
  saving is 1 - windowed / full;
* peak concurrency (requests running in one step, burst run);
* sustained rate (requests/s; marked where it reached the rate the trace can offer, so
  the model could have sustained more);
* burst throughput (output tokens/s over the burst run's makespan).

Every number is modeled: counted pages and requests of the engine's simulation, times
from its time model of an A100-80GB (`reports.provenance`: serving.kv_specs is MODELED).
Rows of runs before `windowed_layers` existed tell the layouts apart by their
`attention` parameter ("spec" windowed, "full" full).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from kvbench.reports.derived_table import DerivedTable
from kvbench.reports.tables import latest

SUITE = "serving.kv_specs"
MIB = 2**20
#: A sustained rate within this fraction of the trace's offered limit hit that limit.
AT_LIMIT = 0.99
TRACE_NAMES = {"sharegpt": "ShareGPT-like", "mooncake": "Mooncake conversation"}
METRICS = (
    "pages_per_running_request",
    "page_bytes",
    "peak_concurrency",
    "sustained_rate",
    "rate_limit",
    "burst_tokens_per_second",
    "windowed_layers",
    "utilization",
)


@dataclass(frozen=True)
class Side:
    """One layout of one (trace, model): the values the summary shows."""

    layout: str
    kv_per_request: float  # bytes, time-averaged per running request
    peak_concurrency: float  # requests
    sustained_rate: float  # requests/s
    rate_limit: float  # requests/s the trace offers (NaN where not recorded)
    tokens_per_second: float  # output tokens/s, burst run
    utilization: float  # fraction

    @property
    def at_limit(self) -> bool:
        """The sustained rate reached the most the trace offers (a lower bound)."""
        return not math.isnan(self.rate_limit) and self.sustained_rate >= (
            AT_LIMIT * self.rate_limit
        )


@dataclass(frozen=True)
class Pair:
    """(trace, requests, model): its windowed and full-attention sides."""

    trace: str
    requests: int
    model: str
    windowed: Side
    full: Side

    @property
    def saved(self) -> float:
        """Fraction of the full-attention KV per running request the windows save."""
        return 1.0 - self.windowed.kv_per_request / self.full.kv_per_request

    @property
    def trace_label(self) -> str:
        return f"{TRACE_NAMES.get(self.trace, self.trace)} [{self.requests:,}]"


def _is_windowed(case: pd.Series, values: dict[str, float]) -> bool:
    if "windowed_layers" in values and not math.isnan(values["windowed_layers"]):
        return values["windowed_layers"] > 0
    return str(case.get("attention")) != "full"


def pairs(frame: pd.DataFrame) -> list[Pair]:
    """The (trace, model) pairs that have both a windowed and a full-attention case, in
    trace then model order (ShareGPT-like first)."""
    rows = latest(frame[frame["suite"] == SUITE])
    need = {"trace", "model", "attention", "requests"}
    if rows.empty or not need <= set(rows.columns):
        return []
    sides: dict[tuple[str, int, str], dict[bool, Side]] = {}
    for _, case in rows.groupby("case_key", sort=False):
        first = case.iloc[0]
        values = {str(m): float(v) for m, v in zip(case["metric"], case["value"], strict=True)}
        if not {"pages_per_running_request", "page_bytes"} <= set(values):
            continue
        key = (str(first["trace"]), int(first["requests"]), str(first["model"]))
        side = Side(
            str(first["attention"]),
            values["pages_per_running_request"] * values["page_bytes"],
            values.get("peak_concurrency", math.nan),
            values.get("sustained_rate", math.nan),
            values.get("rate_limit", math.nan),
            values.get("burst_tokens_per_second", math.nan),
            values.get("utilization", math.nan),
        )
        sides.setdefault(key, {})[_is_windowed(first, values)] = side
    order = {t: i for i, t in enumerate(TRACE_NAMES)}
    out = [
        Pair(t, n, m, s[True], s[False])
        for (t, n, m), s in sides.items()
        if True in s and False in s
    ]
    return sorted(out, key=lambda p: (order.get(p.trace, len(order)), p.trace, p.model))


def _num(v: float, digits: int = 4) -> str:
    return "-" if math.isnan(v) else f"{v:,.{digits}g}"


def _rate(side: Side) -> str:
    """The sustained rate; "≥ r" where it reached the trace's offered limit."""
    text = _num(side.sustained_rate)
    return f"≥ {text}" if side.at_limit else text


def summary_table(frame: pd.DataFrame) -> DerivedTable | None:
    """Windowed vs full attention per (trace, model) (module docstring); None without a
    complete pair."""
    found = pairs(frame)
    if not found:
        return None
    layouts = {p.model: (p.windowed.layout, p.full.layout) for p in found}
    table = DerivedTable(
        "Summary: windowed vs full attention, per trace and model",
        "Modeled (nothing measured): the serving engine simulates the trace over one KV "
        "pool and prices its steps with its time model of an A100-80GB at the fitted "
        "profile (runs since the time model took attention layouts: a windowed layer's "
        "query reads at most its window of KV); pages and requests are counted in that "
        "simulation. 'windowed': the "
        "model's published attention layout ("
        + "; ".join(f"{m}: {w}" for m, (w, _) in layouts.items())
        + "); 'full': the same model with every window widened to full attention. KV per "
        "running request: pages held per running request, averaged over the burst run's "
        "steps, x the page's bytes (a page: 16 tokens of one layer group); saved = 1 - "
        "windowed / full. Peak concurrency and burst throughput: every request arriving "
        "at t = 0. Sustained rate: the highest Poisson rate whose mean normalized latency "
        "stays under 10 x the model's one-token decode step, found by geometric bisection "
        "to 10% (rates closer than that are not told apart); '≥': the search reached the "
        "most the trace slice offers (requests / arrival window), a lower bound.",
        [
            "trace [requests]",
            "model",
            "KV per running request, windowed [MiB]",
            "full [MiB]",
            "KV saved by the window [%]",
            "peak concurrency, windowed [requests]",
            "full [requests]",
            "sustained rate, windowed [requests/s]",
            "full [requests/s]",
            "burst throughput, windowed [output tokens/s]",
            "full [output tokens/s]",
        ],
    )
    for p in found:
        w, f = p.windowed, p.full
        table.rows.append(
            [
                p.trace_label,
                p.model,
                f"{w.kv_per_request / MIB:,.1f}",
                f"{f.kv_per_request / MIB:,.1f}",
                f"{100 * p.saved:.1f}",
                _num(w.peak_concurrency),
                _num(f.peak_concurrency),
                _rate(w),
                _rate(f),
                _num(w.tokens_per_second),
                _num(f.tokens_per_second),
            ]
        )
    return table


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(
        buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": "kvbench"}
    )
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def summary_figure(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """(title, SVG): three panels (KV per running request, peak concurrency, sustained
    rate), a pair of bars (windowed, full) per (trace, model); [] without a pair."""
    found = pairs(frame)
    if not found:
        return []
    title = (
        "Windowed vs full attention per trace and model (modeled: engine simulation, "
        "A100-80GB time model)"
    )
    panels = (
        ("KV per running request [MiB]", lambda s: s.kv_per_request / MIB),
        ("peak concurrency [requests]", lambda s: s.peak_concurrency),
        ("sustained rate [requests/s]", lambda s: s.sustained_rate),
    )
    fig, axes = plt.subplots(1, 3, figsize=(14.0, 4.6))
    labels = [f"{TRACE_NAMES.get(p.trace, p.trace).split()[0]}\n{p.model}" for p in found]
    xs = range(len(found))
    width = 0.38
    colors = matplotlib.color_sequences["tab10"]
    for ax, (ylabel, get) in zip(axes, panels, strict=True):
        for k, (name, pick) in enumerate(
            (
                ("windowed (published layout)", lambda p: p.windowed),
                ("full attention", lambda p: p.full),
            )
        ):
            pos = [x + (k - 0.5) * width for x in xs]
            vals = [get(pick(p)) for p in found]
            bars = ax.bar(pos, vals, width, color=colors[k], label=name)
            if ylabel.startswith("sustained"):
                for bar, p in zip(bars, found, strict=True):
                    if pick(p).at_limit:
                        bar.set_hatch("//")
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_yscale("log")
    axes[0].set_title("KV saved by the window: " + ", ".join(
        f"{p.model} on {TRACE_NAMES.get(p.trace, p.trace).split()[0]} {100 * p.saved:.1f}%"
        for p in found
    ), fontsize=8, wrap=True)  # fmt: skip
    axes[1].set_title("every request arriving at t = 0", fontsize=8)
    axes[2].set_title("hatched: reached the trace's offered limit (a lower bound)", fontsize=8)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=2, fontsize=8,
               bbox_to_anchor=(0.5, -0.06))  # fmt: skip
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return [(title, _svg(fig))]


def derived_tables(suite: str, frame: pd.DataFrame) -> list[DerivedTable]:
    """The summary table of serving.kv_specs' page (none for other sweeps)."""
    if suite != SUITE:
        return []
    table = summary_table(frame)
    return [] if table is None else [table]


def extra_figures(suite: str, frame: pd.DataFrame) -> list[tuple[str, str]]:
    """The summary figure of serving.kv_specs' page (none for other sweeps)."""
    return summary_figure(frame) if suite == SUITE else []
