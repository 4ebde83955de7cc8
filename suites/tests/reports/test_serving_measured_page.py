"""serving.measured's page: the calibration case's coefficients sit in their own table
(value, unit, source), and the main table keeps the cases' results, not the calibration
columns or diagnostics."""

from __future__ import annotations

from pathlib import Path

from kvbench.reports.serving import derived_tables
from kvbench.reports.site import build_site
from kvbench.reports.store.frame import to_frame
from kvbench.reports.store.reader import load_run
from kvbench.reports.store.writer import ResultWriter


def _run(tmp_path: Path) -> Path:
    with ResultWriter("m", tmp_path, environment={"device": "cpu"}) as w:
        cal = {"calibration": "cpu"}
        for metric, value, unit in (
            ("fitted_step_overhead", 9.5e-3, "s"),
            ("fitted_bandwidth", 12.0e9, "B/s"),
            ("copy_peak_measured", 12.8e9, "B/s"),
            ("fitted_flops", 20e9, "FLOP/s"),
            ("fma_peak_measured", 77e9, "FLOP/s"),
            ("fit_step_error_mean", 0.15, "fraction"),
            ("unbounded_fitted_bandwidth", 46e9, "B/s"),
            ("fit_steps", 1284.0, "steps"),
        ):
            w.record("serving.measured", cal, metric, value, unit)
        case = {"system": "paged", "batch": 8, "requests": 32}
        w.record("serving.measured", case, "tokens_per_second", 300.0, "tokens/s")
        w.record("serving.measured", case, "step_error_mean", 0.14, "fraction")
        w.record("serving.measured", case, "step_error_mean_unbounded", 0.13, "fraction")
    return tmp_path / "m.jsonl"


def test_calibration_table_has_units_and_sources(tmp_path: Path) -> None:
    frame = to_frame([load_run(_run(tmp_path))])
    (table,) = derived_tables("serving.measured", frame)
    assert table.header == ["quantity", "value", "unit", "source"]
    rows = {r[0]: r for r in table.rows}
    assert rows["bandwidth"][1:3] == ["12", "GB/s"]
    assert rows["copy peak (64 MiB, beyond the LLC)"][1:3] == ["12.8", "GB/s"]
    assert rows["fixed per-step cost"][1:3] == ["9.5", "ms"]
    assert rows["FMA peak (512^3 float32 matmul)"][1:3] == ["77", "GFLOP/s"]
    assert "bounded by the copy peak" in rows["bandwidth"][3]
    assert rows["fit steps"][1:3] == ["1,284", "steps"]  # a count, not 1.28e+03


def test_main_table_keeps_results_and_moves_calibration_columns(tmp_path: Path) -> None:
    build_site([load_run(_run(tmp_path))], tmp_path / "site")
    page = (tmp_path / "site" / "sweep-serving.measured.html").read_text()
    main, _, details = page.partition("<details>")
    assert "<th>tokens_per_second</th>" in main and "<th>step_error_mean</th>" in main
    for moved in ("fitted_bandwidth", "copy_peak_measured", "step_error_mean_unbounded"):
        assert f"<th>{moved}</th>" not in main and f"<th>{moved}</th>" in details
    assert "CPU calibration: the step-time model" in main


def test_calibration_sources_read_as_text_not_numbers(tmp_path: Path) -> None:
    """Only the value column is right-aligned and unwrapped: the unit and the (long)
    source wrap as text instead of running off the page."""
    build_site([load_run(_run(tmp_path))], tmp_path / "site")
    page = (tmp_path / "site" / "sweep-serving.measured.html").read_text()
    section = page.partition("CPU calibration: the step-time model")[2].partition("</table>")[0]
    row = section.partition("<td>bandwidth</td>")[2].partition("</tr>")[0]
    assert row.startswith('<td class="num">12</td>'), row
    assert "<td>GB/s</td>" in row and '<td class="num">fitted' not in row
