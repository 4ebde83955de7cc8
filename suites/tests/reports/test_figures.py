"""Figures: what a reader compares across the figures of one page."""

from __future__ import annotations

import re

import pandas as pd

from kvbench.reports import figures


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

    def spec(metric: str) -> figures.FigureSpec:
        return figures.FigureSpec("peers.cpu_decode", metric, "context", (metric,), logx=True)

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
