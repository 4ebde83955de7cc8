"""Figures: what a reader compares across the figures of one page."""

from __future__ import annotations

import re
import warnings

import pandas as pd

from kvbench.reports import figures
from kvbench.reports.figure_specs import FigureSpec


def test_a_series_keeps_its_color_in_every_figure_of_a_suite() -> None:
    """A series drawn in two figures of one suite has one color, even where the other
    figure lacks a series (SDPA has no ratio to itself) that would shift the draw order."""
    rows = []
    for impl in ("kvbench", "sdpa_contiguous", "vllm"):
        for ctx in (128, 512):
            case = {"run_id": "r", "suite": "peers.cpu_decode", "impl": impl, "context": ctx}
            key = f"{impl}-{ctx}"
            rows.append({**case, "case_key": key, "metric": "time", "value": 1.0, "unit": "s"})
            if impl != "sdpa_contiguous":
                rows.append({**case, "case_key": key, "metric": "ratio_vs_sdpa", "value": 2.0,
                             "unit": "ratio"})  # fmt: skip
    frame = pd.DataFrame(rows)

    def spec(metric: str) -> FigureSpec:
        return FigureSpec("peers.cpu_decode", metric, "context", (metric,), logx=True)

    def line_colors(svg: str) -> list[str]:
        return re.findall(r"stroke: (#[0-9a-f]{6}); stroke-width: 1\.5", svg)

    time_svg = figures.render(frame, spec("time"))
    ratio_svg = figures.render(frame, spec("ratio_vs_sdpa"))
    assert time_svg and ratio_svg
    time_colors = list(dict.fromkeys(line_colors(time_svg)))
    ratio_colors = list(dict.fromkeys(line_colors(ratio_svg)))
    assert len(time_colors) == 3 and len(ratio_colors) == 2
    # kvbench and vllm: the first and third series of the time figure
    assert ratio_colors == [time_colors[0], time_colors[2]]


def _decode_rows(
    dtypes: tuple[str, ...], batches: tuple[int, ...], value: float = 0.1
) -> pd.DataFrame:
    rows = []
    for dt in dtypes:
        for b in batches:
            for ctx in (128, 512, 2048):
                key = f"{dt}-{b}-{ctx}"
                rows.append({"run_id": "r", "suite": "kernel.decode", "case_key": key,
                             "dtype": dt, "batch": b, "ctx_len": ctx, "block_size": 16,
                             "metric": "paging_overhead", "value": value, "unit": "fraction"})  # fmt: skip
    return pd.DataFrame(rows)


def _axes_count(svg: str) -> int:
    return len(set(re.findall(r'<g id="(axes_\d+)">', svg)))


def test_a_crowded_figure_is_split_into_panels_of_at_most_eight_series() -> None:
    spec = FigureSpec("kernel.decode", "t", "ctx_len", ("paging_overhead",), logx=True,
                              percent=True)  # fmt: skip
    few = figures.render(_decode_rows(("float32",), (1, 8, 16)), spec)
    many = figures.render(_decode_rows(("float32", "bfloat16", "float16"), (1, 2, 4, 8, 16)), spec)
    assert few and many
    assert _axes_count(few) == 1
    assert _axes_count(many) == 3  # 15 series: one panel per dtype, 5 series each


def test_integer_ticks_and_a_flat_share_not_drawn_past_100_percent() -> None:
    spec = FigureSpec("kernel.decode", "t", "ctx_len", ("paging_overhead",), logx=True,
                              percent=True)  # fmt: skip
    svg = figures.render(_decode_rows(("float32",), (8,), value=1.0), spec)
    assert svg
    import matplotlib.pyplot as plt

    # the same axes drawn directly: ticks at the data's integer x values, y capped near 100%
    fig, ax = plt.subplots()
    rows = _decode_rows(("float32",), (8,), value=1.0)
    ax.plot(rows["ctx_len"], rows["value"])
    figures._axes(ax, spec, rows)
    assert list(ax.get_xticks()) == [128, 512, 2048]
    assert ax.get_ylim()[0] == 0.0 and ax.get_ylim()[1] <= 1.011
    plt.close(fig)


def test_measured_and_modeled_lines_of_one_series_share_a_colour() -> None:
    """serving.measured draws each system measured (solid) and modeled (dashed): the pair
    gets one colour, so a reader matches them at a glance; other figures are unchanged."""
    labels = [
        "measured here, Orca (Max)",
        "measured here, vLLM (paged)",
        "modeled (CPU-fitted time model), Orca (Max)",
        "modeled (CPU-fitted time model), vLLM (paged)",
    ]
    colors = figures._series_colors(pd.DataFrame(), ["metric", "system"], labels)
    assert colors[labels[0]] == colors[labels[2]] and colors[labels[1]] == colors[labels[3]]
    assert colors[labels[0]] != colors[labels[1]]
    plain = ["paged kernel, block_size=16", "SDPA on contiguous K/V, block_size=16"]
    other = figures._series_colors(pd.DataFrame(), ["metric", "block_size"], plain)
    assert other[plain[0]] != other[plain[1]]


def test_a_legend_taller_than_the_figure_is_drawn_whole_and_quietly() -> None:
    """20 series no single parameter splits into panels of at most eight (preempt's swap
    vs recompute: 2 metrics x 10 profiles): one axes, its legend of 20 entries below it,
    taller than the figure. The SVG holds every entry, and matplotlib's "Tight layout not
    applied" does not reach the `kvbench report` output (savefig's tight bbox grows the
    canvas around the legend instead)."""
    rows = []
    for metric in ("swap", "recompute"):
        for p in range(10):
            for n in (128, 512, 2048):
                rows.append({"run_id": "r", "suite": "preempt.swap_vs_recompute",
                             "case_key": f"p{p}-{n}", "profile": f"p{p}", "seq_len": n,
                             "metric": metric, "value": float(n * (p + 1)), "unit": "s"})  # fmt: skip
    spec = FigureSpec("preempt.swap_vs_recompute", "cost", "seq_len", ("swap", "recompute"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        svg = figures.render(pd.DataFrame(rows), spec)
    assert svg is not None and _axes_count(svg) == 1
    for metric in ("swap", "recompute"):
        for p in range(10):
            assert f"{metric}, profile=p{p}" in svg, (metric, p)
