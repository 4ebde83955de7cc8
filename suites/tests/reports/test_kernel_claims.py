"""Kernel-overhead claims are judged on `paging_overhead` (the same kernel over a
contiguous and a scattered layout), only on rows they are about: GPU rows when a GPU ran,
else the CPU kernel that reads blocks in place (labelled a CPU measurement), and never the
CPU gather + SDPA stand-in ("not applicable here"). Values below the published range do
not hold (no tolerance), and [PA-deep-dive]'s "growing with length" is checked against the
spread. The overhead vs SDPA is shown as a second baseline and never judged."""

from __future__ import annotations

import pandas as pd
import pytest

from kvbench.reports import claims


def _frame(
    overheads: list[float],
    path_metric: str | None,
    path_value: float,
    spread: float = 0.001,
    sdpa: float | None = None,
) -> pd.DataFrame:
    rows = []
    for i, ov in enumerate(overheads):
        case = {"run_id": "r", "case_key": f"c{i}", "suite": "kernel.decode",
                "block_size": 16, "ctx_len": 128 * 2**i, "batch": 8}  # fmt: skip
        rows.append({**case, "metric": "paging_overhead", "value": ov,
                     "stats.q1": ov - spread, "stats.q3": ov + spread})  # fmt: skip
        if sdpa is not None:
            rows.append({**case, "metric": "overhead_vs_sdpa", "value": sdpa})
        if path_metric:
            rows.append({**case, "metric": path_metric, "value": path_value})
    return pd.DataFrame(rows)


def _verdict(frame: pd.DataFrame, key: str = "overhead-seed") -> claims.Verdict:
    return {c.key: v for c, v in claims.evaluate(frame)}[key]


@pytest.mark.parametrize(
    ("metric", "value", "overheads", "expect", "label"),
    [
        ("backend_is_triton", 1.0, [0.05, 0.12], claims.HOLDS, "measured on a GPU"),
        ("backend_is_triton", 1.0, [0.05, 0.40], claims.FAILS, "measured on a GPU"),
        ("kernel_path_is_cpp", 1.0, [0.05, 0.14], claims.HOLDS, "CPU measurement"),
        ("kernel_path_is_cpp", 1.0, [0.1, 0.9], claims.FAILS, "CPU measurement"),
        # below the published range: no tolerance turns it into "holds"
        ("kernel_path_is_cpp", 1.0, [0.01, 0.03], claims.FAILS, "CPU measurement"),
        ("kernel_path_is_cpp", 1.0, [-0.2, 0.1], claims.FAILS, "CPU measurement"),
        ("kernel_path_is_cpp", 0.0, [0.6, 6.3], claims.NOT_APPLICABLE, "stand-in"),
        (None, 0.0, [0.6, 6.3], claims.NOT_APPLICABLE, "stand-in"),
    ],
)
def test_overhead_claim_judges_only_what_it_is_about(
    metric: str | None, value: float, overheads: list[float], expect: str, label: str
) -> None:
    v = _verdict(_frame(overheads, metric, value))
    assert v.verdict == expect
    assert label in v.note or label in v.measured
    if expect != claims.NOT_APPLICABLE and metric == "kernel_path_is_cpp":
        assert "not a GPU figure" in v.note


def test_growth_must_exceed_the_spread() -> None:
    """Inside 4.8-15.0% but flat within the q1-q3 spread: [PA-deep-dive]'s 'growing with length'
    is not shown, so its claim does not hold; the paper's (no growth part) does."""
    flat = _frame([0.10, 0.11], "kernel_path_is_cpp", 1.0, spread=0.02)
    assert _verdict(flat).verdict == claims.FAILS
    assert "grows with length" in _verdict(flat).note
    rising = _frame([0.05, 0.14], "kernel_path_is_cpp", 1.0, spread=0.02)
    assert _verdict(rising).verdict == claims.HOLDS
    paper = _frame([0.21, 0.21], "backend_is_triton", 1.0)
    assert _verdict(paper, "overhead-paper").verdict == claims.HOLDS


def test_sdpa_is_a_second_baseline_shown_and_never_judged() -> None:
    frame = _frame([0.05, 0.14], "kernel_path_is_cpp", 1.0, sdpa=-0.8)
    v = _verdict(frame)
    assert v.verdict == claims.HOLDS  # SDPA's -80% does not enter the verdict
    assert "second baseline, SDPA" in v.note and "-80.0%" in v.note


def test_sdpa_rows_alone_are_not_measured() -> None:
    frame = _frame([], None, 0.0)
    sdpa = pd.DataFrame([{"run_id": "r", "case_key": "c", "suite": "kernel.decode",
                          "block_size": 16, "ctx_len": 128, "metric": "overhead_vs_sdpa",
                          "value": -0.5}])  # fmt: skip
    v = _verdict(pd.concat([frame, sdpa]))
    assert v.verdict == claims.NOT_MEASURED and "paging_overhead" in v.note


def test_no_kernel_rows_is_not_measured() -> None:
    frame = pd.DataFrame(
        [
            {
                "run_id": "r",
                "case_key": "x",
                "suite": "capacity.footprint",
                "metric": "m",
                "value": 1.0,
            }
        ]
    )
    assert _verdict(frame).verdict == claims.NOT_MEASURED


def test_kernel_tables_carry_the_spread_and_pages_name_the_path() -> None:
    from kvbench.reports import site, tables

    frame = pd.DataFrame(
        [
            {"run_id": "r", "case_key": "a", "suite": "kernel.decode", "ctx_len": 128,
             "metric": "time_paged", "value": 2.0, "unit": "s", "stats.q1": 1.5, "stats.q3": 2.5},
            {"run_id": "r", "case_key": "a", "suite": "kernel.decode", "ctx_len": 128,
             "metric": "kernel_path_is_cpp", "value": 1.0, "unit": "bool"},
        ]
    )  # fmt: skip
    _keys, metrics, rows = tables.wide(frame, spread=True)
    assert metrics[-1] == "time_paged q1-q3"
    assert rows[0][-1] == (1.5, 2.5)
    assert "C++ kernel reading blocks in place" in site._provenance(frame)
    assert "faster of the two contiguous SDPA calls" in site._provenance(frame)
    prefill = frame.assign(suite="kernel.prefill")
    assert "first backend torch accepts" in site._provenance(prefill)
    assert "faster of the two" not in site._provenance(prefill)
    frame.loc[1, "metric"] = "backend_is_triton"
    assert "on a GPU" in site._provenance(frame)
    pred = frame.assign(suite="kernel.predicted")
    assert site._provenance(pred).startswith("Predicted (not measured)")
