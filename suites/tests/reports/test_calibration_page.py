"""Before/after GPU calibration tables and the calibration page, from hand-written rows:
datasheet rows never leak into the fitted tables and claims, the before/after table
pairs them, and the calibration page's errors are the rows' own."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.reports import calibration as cal_page
from kvbench.reports import serving
from kvbench.reports.store.frame import to_frame
from kvbench.reports.store.reader import load_run
from kvbench.reports.store.writer import ResultWriter

SETUP = "opt-13b-1xa100-40gb"


def _frame(tmp_path: Path):  # type: ignore[no-untyped-def]
    with ResultWriter("x", tmp_path) as w:
        for calib, knees in (
            ("fitted", {"paged": 3.0, "contiguous-max": 1.0}),
            ("datasheet", {"paged": 4.0, "contiguous-max": 2.0}),
        ):
            for system, rate in knees.items():
                case = {"setup": SETUP, "workload": "sharegpt", "system": system,
                        "calibration": calib, "bound_factor": 10.0}  # fmt: skip
                w.record("serving.rate", case, "sustained_rate", rate, "requests/s")
        for calib, tps in (("fitted", 900.0), ("datasheet", 1200.0)):
            case = {"setup": "llama-2-70b-a100-80gb", "system": "paged", "batch": 8,
                    "calibration": calib}  # fmt: skip
            w.record("serving.batch_table", case, "tokens_per_second", tps, "tokens/s")
        for model, held in (("m/a", 1.0), ("m/b", 1.0)):
            for tokens, (meas, ds, fit) in ((1, (10.0, 8.0, 11.0)), (4096, (100.0, 50.0, 90.0))):
                case = {"gpu": "h100", "model": model, "tp": 1, "num_tokens": tokens}
                for g in ("qkv", "o", "up", "down"):
                    w.record("calibration.gpu", case, f"{g}_measured_us", meas, "us")
                    w.record("calibration.gpu", case, f"{g}_datasheet_us", ds, "us")
                    w.record("calibration.gpu", case, f"{g}_fitted_us", fit, "us")
                w.record("calibration.gpu", case, "held_out", held, "bool")
    return to_frame([load_run(tmp_path / "x.jsonl")])


def test_fitted_tables_never_read_datasheet_rows(tmp_path: Path) -> None:
    frame = _frame(tmp_path)
    assert serving.sustained_ratios(frame).loc[(SETUP, "sharegpt"), "contiguous-max"] == 3.0
    assert serving.sustained_ratios(frame, "datasheet").loc[
        (SETUP, "sharegpt"), "contiguous-max"
    ] == pytest.approx(2.0)
    assert serving.batch_peaks(frame) == {"paged": 900.0}


def test_before_after_tables_pair_the_two_calibrations(tmp_path: Path) -> None:
    frame = _frame(tmp_path)
    table = serving.calibration_rate_table(frame)
    assert table is not None
    paged = next(r for r in table.rows if r[2] == "paged")
    assert paged[3:6] == ["4", "3", "0.75x"]
    mx = next(r for r in table.rows if r[2] == "contiguous-max")
    assert mx[6:] == ["2.00x", "3.00x"]
    batch = serving.calibration_batch_table(frame)
    assert batch is not None and batch.rows == [["paged", "1,200", "900", "0.75x"]]
    titles = [t.title for t in serving.derived_tables("serving.rate", frame)]
    assert len(titles) == 2 and "before / after" in titles[1]


def test_calibration_page_errors_come_from_the_rows(tmp_path: Path) -> None:
    frame = _frame(tmp_path)
    summary, by_tokens, by_tp = cal_page.error_tables(frame)
    # datasheet: |8/10-1| = 0.2 and |50/100-1| = 0.5 -> 35%; fitted: 0.1 and 0.1 -> 10%
    assert summary.rows == [["h100", "16", "35.0%", "10.0%"]]
    assert by_tokens.rows[0][1] == "20.0% -> 10.0%" and by_tokens.rows[0][-1] == "50.0% -> 10.0%"
    assert by_tp.rows == [["h100", "35.0% -> 10.0%"]]
    assert "attention" in summary.note and "assumption" in summary.note
    svgs = cal_page.scatter_svgs(frame)
    assert [t for t, _ in svgs] == [
        "Predicted vs measured linear-layer time, h100 (held-out models)"
    ]
    assert svgs[0][1].startswith("<svg")


def test_cow_load_claim_names_the_profile_that_priced_it(tmp_path: Path) -> None:
    """The copy-on-write-under-load claim's note says which calibration priced the run:
    the rows' `calibration` parameter, or the datasheet for rows from before it."""
    from kvbench.reports import claims

    def verdict(case_extra: dict, run: str):  # type: ignore[no-untyped-def]
        with ResultWriter(run, tmp_path) as w:
            case = {"setup": SETUP, "workload": "alpaca", "sharing": "parallel", "width": 2,
                    "rate": 16.0, "duration": 8.0, **case_extra}  # fmt: skip
            w.record("serving.cow_load", case, "saved_fraction", 0.08, "fraction")
        frame = to_frame([load_run(tmp_path / f"{run}.jsonl")])
        return {c.key: v for c, v in claims.evaluate(frame)}["cow-parallel-load"]

    assert (
        "at the fitted profile (`kvbench calibrate gpu`)"
        in verdict({"calibration": "fitted"}, "a").note
    )
    assert "at the datasheet peaks" in verdict({}, "b").note
