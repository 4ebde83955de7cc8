"""The plain-text tables `kvbench simulate` prints (summaries and per-request latency),
shared by the plain and the layer-group model paths (`simulate`, `simulate_spec`)."""

from __future__ import annotations

from kvbench.paged.serving.latency import LATENCY_METRICS, LATENCY_STATS

_COLUMNS = (
    ("cache", "cache", "{}"),
    ("utilization", "util %", "{:.1%}"),
    ("peak_concurrency", "peak", "{}"),
    ("mean_running", "mean run", "{:.1f}"),
    ("preemptions", "preempt", "{}"),
    ("swaps", "swap", "{}"),
    ("recomputes", "recomp", "{}"),
    ("steps", "steps", "{}"),
    ("tokens_per_step", "tok/step", "{:.1f}"),
    ("modeled_seconds", "model s", "{:.1f}"),
    ("tokens_per_second", "tok/s", "{:.0f}"),
    ("wall_seconds", "wall s", "{:.2f}"),
)


def format_table(rows: list[dict]) -> str:
    """A plain-text table of simulation summaries."""
    cells = [[head for _, head, _ in _COLUMNS]]
    for row in rows:
        cells.append([fmt.format(row[key]) for key, _, fmt in _COLUMNS])
    widths = [max(len(r[i]) for r in cells) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_latency(rows: list[dict]) -> str:
    """A plain-text table of each cache's per-request latency (modeled): one line per
    cache and metric, with its mean, p50, p90 and p99."""
    head = ["cache", "latency", "unit", *LATENCY_STATS]
    cells = [head]
    for row in rows:
        for name, unit in LATENCY_METRICS.items():
            values = [f"{row[f'{name}_{s}']:.4f}" for s in LATENCY_STATS]
            cells.append([row["cache"], name, unit, *values])
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    title = (
        "per-request latency, modeled (ttft: to the first token; tpot: per output token after it)"
    )
    return title + "\n" + "\n".join(lines)
