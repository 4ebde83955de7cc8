"""Figures of the report: matplotlib line and bar charts rendered to SVG text.

`render` draws one `figure_specs.FigureSpec` (which sweep, x parameter, metrics, fixed
case parameters, scales) from a results frame. Every case parameter that still varies
becomes part of the series label, so a figure never silently mixes cases; a crowded line
figure is split into panels. The specs themselves, per sweep, are `reports.figure_specs`.
"""

from __future__ import annotations

import io
import math
import warnings
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.transforms import ScaledTranslation

from kvbench.reports.figure_specs import FigureSpec
from kvbench.reports.serving import SYSTEM_NAMES
from kvbench.reports.tables import BOOKKEEPING_METRICS, case_columns, latest, varying

plt.rcParams.update(
    {
        "svg.hashsalt": "kvbench",  # deterministic element ids
        "svg.fonttype": "path",  # no font dependency in the browser
        "figure.dpi": 100,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "font.size": 9,
    }
)


#: x-axis labels with units for the case parameters figures are drawn against (a
#: parameter that is a name, such as `model` or `impl`, is shown as it is).
X_LABELS: dict[str, str] = {
    "rate": "request rate [requests/s]",
    "batch": "batch size [requests]",
    "block_size": "block size [tokens]",
    "ctx_len": "context length [tokens]",
    "context": "context length [tokens]",
    "seq_len": "sequence length [tokens]",
    "avg_len": "mean request length [tokens]",
    "n": "samples per request (n)",
    "width": "beam width",
    "capacity_tokens": "prefix-cache capacity [tokens]",
    "time_scale": "time scale [x the trace's own arrival rate]",
    "t_s": "modeled time [s]",
    "window_s": "trace replayed [first s of arrivals]",
}


def _suite_rows(frame: pd.DataFrame, spec: FigureSpec) -> pd.DataFrame:
    return latest(frame[frame["suite"] == spec.suite])


def _select(suite_rows: pd.DataFrame, spec: FigureSpec) -> pd.DataFrame:
    """The rows `spec` draws, out of its suite's (`_suite_rows`)."""
    sub = suite_rows
    for key, val in spec.fixed.items():
        if key in sub.columns:
            sub = sub[sub[key] == val]
    sub = sub[sub["metric"].isin(spec.metrics) & ~sub["metric"].isin(BOOKKEEPING_METRICS)]
    shared = sub["metric"].isin(spec.shared)
    if not shared.any():
        return sub
    once = sub[shared].drop_duplicates(subset=[spec.x, "metric"]).copy()
    for col in case_columns(once):
        if col != spec.x and col not in spec.fixed:
            once[col] = None  # no series of its own: the label is the metric's name
    return pd.concat([sub[~shared], once])


#: Legend names of metrics where a figure draws several (the metric names themselves are
#: the tables' column names); serving.measured's pairs read measured vs modeled at a glance.
METRIC_NAMES: dict[str, str] = {
    "time_paged": "paged kernel, scattered blocks",
    "time_paged_contiguous_layout": "paged kernel, contiguous layout",
    "time_contiguous": "SDPA on contiguous K/V",
    "bandwidth_fraction": "paged kernel",
    "contiguous_bandwidth_fraction": "SDPA on contiguous K/V",
    "tokens_per_second": "measured here",
    "tokens_per_second_modeled": "modeled (CPU-fitted time model)",
    "normalized_latency": "measured here",
    "normalized_latency_modeled": "modeled (CPU-fitted time model)",
    "saved_fraction": "counted here",
    "published_saved_fraction": "published ([PA-deep-dive])",
    "swap_seconds": "swap out + in",
    "recompute_seconds": "recompute prefill",
}


def _label(parts: list[tuple[str, Any]]) -> str:
    out = []
    for k, v in parts:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue  # a parameter this series' cases do not have (e.g. SDPA's block size)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if k in ("system", "cache") and v in SYSTEM_NAMES:  # the paper's names, as tables say
            out.append(SYSTEM_NAMES[v])
            continue
        if k == "metric":
            out.append(METRIC_NAMES.get(str(v), str(v)))
            continue
        out.append(f"{k}={v}" if k != "run_id" else str(v))
    return ", ".join(out) or "value"


def _key_label(keys: list[str], key: Any) -> str:
    """The legend label of one groupby key over `keys`."""
    return _label(list(zip(keys, key if isinstance(key, tuple) else (key,), strict=True)))


def _series_colors(suite_rows: pd.DataFrame, keys: list[str], drawn: list[str]) -> dict[str, Any]:
    """Series label -> line color. Colors follow the sorted labels of all the suite's series,
    not the order one figure draws them in, so a series keeps its color in every figure of
    a page; where series are told apart by metric (labels that differ from figure to
    figure) they follow the `drawn` order. tab10, or tab20 past ten series."""
    if keys and "metric" not in keys and all(k in suite_rows.columns for k in keys):
        rows = suite_rows[~suite_rows["metric"].isin(BOOKKEEPING_METRICS)]
        groups = rows.groupby(keys, dropna=False, sort=False)
        labels = sorted({_key_label(keys, k) for k, _ in groups})
    else:
        labels = drawn
    paired = _measured_modeled_pairs(labels)
    if paired:  # one colour per series; the line style (solid / dashed) tells the kind
        series = list(dict.fromkeys(paired.values()))
        cmap = plt.get_cmap("tab10" if len(series) <= 10 else "tab20")
        return {label: cmap(series.index(paired[label]) % cmap.N) for label in labels}
    cmap = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    return {label: cmap(i % cmap.N) for i, label in enumerate(labels)}


def _measured_modeled_pairs(labels: list[str]) -> dict[str, str]:
    """label -> its series without the kind, where every label reads 'measured here, X' or
    'modeled (...), X' and both kinds appear (serving.measured); {} otherwise."""
    split = {label: label.split(", ", 1) for label in labels}
    if not labels or any(len(parts) != 2 for parts in split.values()):
        return {}
    kinds = {parts[0].split(" (")[0] for parts in split.values()}
    if kinds != {"measured here", "modeled"}:
        return {}
    return {label: parts[1] for label, parts in split.items()}


#: At most this many series share one axes; past it a line figure is split into panels
#: by one parameter (colours would repeat and a legend would not be read).
MAX_SERIES = 8


def _facet_key(sub: pd.DataFrame, series_keys: list[str]) -> str | None:
    """The series parameter to split a crowded figure by: the one leaving the fewest
    panels with at most MAX_SERIES series each (None when no single split does)."""
    best: tuple[int, str] | None = None
    for key in series_keys:
        if key in ("metric", "run_id"):
            continue
        rest = [k for k in series_keys if k != key]
        worst = max(
            (part.groupby(rest, dropna=False).ngroups if rest else 1)
            for _, part in sub.groupby(key, dropna=False)
        )
        panels = sub[key].nunique(dropna=False)
        if worst <= MAX_SERIES and panels <= 4 and (best is None or panels < best[0]):
            best = (panels, key)
    return best[1] if best else None


def render(frame: pd.DataFrame, spec: FigureSpec) -> str | None:
    """The figure as SVG text, or None when the frame holds nothing for it. A line figure
    with more than MAX_SERIES series is split into panels by one parameter (`_facet_key`)."""
    suite_rows = _suite_rows(frame, spec)
    sub = _select(suite_rows, spec)
    if sub.empty or spec.x not in sub.columns or sub[spec.x].isna().all():
        return None
    params = [c for c in case_columns(sub) if c != spec.x and c not in spec.ignore]
    series_keys = (["run_id"] if sub["run_id"].nunique() > 1 else []) + varying(sub, params)
    if len(spec.metrics) > 1:
        series_keys = ["metric", *series_keys]
    if spec.kind != "bar" and series_keys:  # a line needs two points: single cases stay in
        points = sub.groupby(series_keys, dropna=False)[spec.x].transform("nunique")  # the table
        if bool((points >= 2).any()):
            sub = sub[points >= 2]
            series_keys = [k for k in series_keys if k == "metric" or k in varying(sub, [k])]
            if "run_id" in series_keys and sub["run_id"].nunique() < 2:
                series_keys.remove("run_id")
    n_series = sub.groupby(series_keys, dropna=False).ngroups if series_keys else 1
    facet = _facet_key(sub, series_keys) if spec.kind != "bar" and n_series > MAX_SERIES else None
    panels = list(sub.groupby(facet, dropna=False, sort=True)) if facet else [(None, sub)]
    keys = [k for k in series_keys if k != facet]
    fig, axes = plt.subplots(
        1, len(panels), figsize=(7.0 if len(panels) == 1 else 3.6 * len(panels), 3.8),
        sharey=True, squeeze=False,
    )  # fmt: skip
    try:
        for ax, (value, part) in zip(axes[0], panels, strict=True):
            groups = list(part.groupby(keys, dropna=False, sort=True)) if keys else [((), part)]
            if spec.kind == "bar":
                _bars(ax, groups, keys, spec)
            else:
                labels = [_key_label(keys, key) for key, _ in groups]
                colors = _series_colors(suite_rows, keys, labels)
                for label, (_, g) in zip(labels, groups, strict=True):
                    g = g.sort_values(spec.x)
                    style = "--" if "modeled" in label else "-"  # measured solid, modeled dashed
                    (line,) = ax.plot(g[spec.x], g["value"], marker="o", ms=3, label=label,
                                      color=colors.get(label), ls=style)  # fmt: skip
                    _spread(ax, g, spec.x, line.get_color())
            _axes(ax, spec, part)
            if facet:
                ax.set_title(_label([(facet, value)]), fontsize=8)
            if len(groups) > 1 or keys:
                _legend(ax, spec, groups)
        axes[0][0].set_ylabel(spec.ylabel or ", ".join(spec.metrics))
        if facet:
            fig.suptitle(spec.title, fontsize=10)
        else:
            axes[0][0].set_title(spec.title)
        with warnings.catch_warnings():
            # a legend taller than the figure (preempt.swap_vs_recompute: 20 series below
            # one axes) cannot fit: matplotlib then keeps its default margins, and
            # savefig's bbox_inches="tight" grows the canvas around the legend, which
            # reads better than axes squeezed to make room (checked with report-shots)
            warnings.filterwarnings("ignore", "Tight layout not applied", UserWarning)
            fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(
            buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": "kvbench"}
        )
    finally:
        plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _legend(ax: Any, spec: FigureSpec, groups: list) -> None:
    ncol = 1 if len(groups) < 8 else 2
    if spec.kind == "bar" and not spec.logy:  # room above the bars for the legend
        rows = -(-len(groups) // ncol)
        ax.set_ylim(top=ax.get_ylim()[1] * (1 + 0.08 * rows))
    if spec.kind == "bar":
        ax.legend(fontsize=7, loc="best", ncol=ncol)
    else:  # below the axes and their x label (a fixed 0.45 in: short axes too), never
        # over the data or the label
        below = ax.transAxes + ScaledTranslation(0, -0.45, ax.figure.dpi_scale_trans)
        ax.legend(
            fontsize=7, loc="upper left", bbox_to_anchor=(0.0, 0.0), bbox_transform=below, ncol=1
        )


def _axes(ax: Any, spec: FigureSpec, rows: pd.DataFrame) -> None:
    """Scales, integer ticks for integer parameters, and y limits a reader expects: a
    linear y axis includes zero (a truncated axis makes a 4% spread look large), and a
    share that never exceeds 100% is not drawn up to 104%."""
    if spec.logx and spec.kind != "bar":
        ax.set_xscale("log", base=spec.logx_base)
    if spec.logy:
        ax.set_yscale("log")
    xs = pd.to_numeric(rows[spec.x], errors="coerce").dropna()
    decades = spec.logx and spec.logx_base == 10  # 10^4..10^9: matplotlib's decade labels
    if spec.kind != "bar" and not decades and not xs.empty and bool((xs == xs.round()).all()):
        ticks = sorted(set(xs))
        if spec.logx and len(ticks) <= 12:
            ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        elif not spec.logx:
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.xaxis.set_major_formatter(
            matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}" if v == round(v) else "")
        )
    if spec.percent:  # minor ticks too: a log axis labels them, in 10^x form otherwise
        ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.PercentFormatter(1.0, decimals=0))
        if spec.logy:  # 2, 3 and 5 per decade: labels that never crowd the major ones
            ax.yaxis.set_minor_locator(matplotlib.ticker.LogLocator(subs=(2.0, 3.0, 5.0)))
    if not spec.logy:
        lo, hi = ax.get_ylim()
        values = rows["value"].dropna()
        top = hi
        if spec.percent and not values.empty and float(values.max()) <= 1.0 and hi > 1.0:
            top = 1.0 + 0.01 * (1.0 - min(lo, 0.0))  # just room for a line at 100%
        ax.set_ylim(min(lo, 0.0), max(top, 0.0))
    ax.set_xlabel(X_LABELS.get(spec.x, spec.x))


def _yerr(g: pd.DataFrame) -> Any:
    """Asymmetric error bars from the median down to q1 and up to q3 (None without stats)."""
    if "stats.q1" not in g.columns or "stats.q3" not in g.columns:
        return None
    q1, q3 = g["stats.q1"], g["stats.q3"]
    if q1.isna().all() or q3.isna().all():
        return None
    lower = (g["value"] - q1).clip(lower=0).fillna(0)
    upper = (q3 - g["value"]).clip(lower=0).fillna(0)
    return [lower.to_numpy(), upper.to_numpy()]


def spread_note(frame: pd.DataFrame, spec: FigureSpec) -> str:
    """What the figure's bands and error bars show ('' without repeat statistics)."""
    sub = _select(_suite_rows(frame, spec), spec)
    if sub.empty or "stats.q1" not in sub.columns or sub["stats.q1"].isna().all():
        return ""
    n = sub["stats.n"].dropna() if "stats.n" in sub.columns else pd.Series(dtype=float)
    if n.empty:
        return "points are medians; the shaded band (error bars on bar charts) spans q1–q3 of the repeats"
    lo, hi = int(n.min()), int(n.max())
    count = f"n = {lo}" if lo == hi else f"n = {lo}–{hi}"
    return f"points are medians; the shaded band (error bars on bar charts) spans q1–q3 of the repeats ({count} per point)"


def _spread(ax: Any, g: pd.DataFrame, x: str, color: str) -> None:
    """Shade the q1-q3 band of timed rows (their repeat statistics), where present."""
    if not {"stats.q1", "stats.q3"} <= set(g.columns):
        return
    band = g[[x, "stats.q1", "stats.q3"]].dropna()
    if len(band):
        ax.fill_between(band[x], band["stats.q1"], band["stats.q3"], color=color, alpha=0.2, lw=0)


def _bars(ax: Any, groups: list, series_keys: list[str], spec: FigureSpec) -> None:
    cats = list(dict.fromkeys(str(v) for g in groups for v in g[1][spec.x]))
    width = 0.8 / max(1, len(groups))
    for i, (key, g) in enumerate(groups):
        vals = {str(x): v for x, v in zip(g[spec.x], g["value"], strict=True)}
        err = _yerr(g)
        lows = dict(zip(map(str, g[spec.x]), err[0], strict=True)) if err is not None else {}
        highs = dict(zip(map(str, g[spec.x]), err[1], strict=True)) if err is not None else {}
        xs = [j + i * width for j in range(len(cats))]
        ax.bar(
            xs,
            [vals.get(c, math.nan) for c in cats],
            width,
            yerr=[[lows.get(c, 0) for c in cats], [highs.get(c, 0) for c in cats]]
            if err is not None
            else None,
            capsize=2,
            label=_key_label(series_keys, key),
        )
    ax.set_xticks([j + width * (len(groups) - 1) / 2 for j in range(len(cats))])
    ax.set_xticklabels(
        cats, rotation=20 if len(cats) > 4 else 0, ha="right" if len(cats) > 4 else "center"
    )
