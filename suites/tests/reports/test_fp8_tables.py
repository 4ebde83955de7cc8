"""The fp8 summary tables from hand-written rows: paired ratios keep their spread, bytes
and fractions their units, and the serving table pairs float16 with fp8 per system."""

from __future__ import annotations

from pathlib import Path

from kvbench.reports import fp8_tables
from kvbench.reports.store.frame import to_frame
from kvbench.reports.store.reader import load_run
from kvbench.reports.store.writer import ResultWriter


def _frame(tmp_path: Path):
    with ResultWriter("f", tmp_path) as w:
        case = {"kv_dtype": "fp8_e4m3", "scales": "tensor", "head_spread": 1, "batch": 8}
        case |= {"ctx_len": 1024, "block_size": 16, "gqa": 4}
        stats = {"median": 3.1, "q1": 2.8, "q3": 3.4, "n": 21}
        w.record(fp8_tables.DECODE, case, "ratio_fp8_vs_float16", 3.1, "ratio", stats)
        w.record(fp8_tables.DECODE, case, "bytes_per_call_fp8", 16_900_000, "B")
        w.record(fp8_tables.DECODE, case, "bytes_per_call_float16", 33_700_000, "B")
        w.record(fp8_tables.DECODE, case, "bandwidth_fraction", 0.08, "fraction")
        w.record(fp8_tables.DECODE, case, "rel_err_fp8_vs_exact_fp64", 0.0386, "fraction")
        for dtype, slots, rate in (("float16", 15728, 3.67), ("fp8_e4m3", 31457, 6.73)):
            c = {"setup": "opt-13b-1xa100-40gb", "system": "paged", "kv_dtype": dtype}
            w.record(fp8_tables.SERVING, c, "kv_slots", slots, "tokens")
            w.record(fp8_tables.SERVING, c, "sustained_rate", rate, "requests/s")
    return to_frame([load_run(tmp_path / "f.jsonl")])


def test_decode_table_shows_paired_ratio_spread_bytes_and_fraction(tmp_path: Path) -> None:
    frame = _frame(tmp_path)
    (table,) = fp8_tables.derived_tables(fp8_tables.DECODE, frame)
    row = dict(zip(table.header, table.rows[0], strict=True))
    assert row["fp8 / fp16 time"] == "3.10x [2.80-3.40, n=21]"
    assert row["format"] == "fp8_e4m3" and row["context"] == "1,024"
    assert "MB" in row["bytes/call fp8"] or "MiB" in row["bytes/call fp8"]
    assert "%" in row["copy-peak fraction"]
    assert row["fp8 / bf16 time"] == ""  # not measured: an empty cell, not a number


def test_serving_table_pairs_dtypes_per_system(tmp_path: Path) -> None:
    frame = _frame(tmp_path)
    (table,) = fp8_tables.derived_tables(fp8_tables.SERVING, frame)
    assert table.rows[0][:2] == ["opt-13b-1xa100-40gb", "paged"]
    assert table.rows[0][-1] == "1.83x"
    assert fp8_tables.derived_tables("serving.rate", frame) == []
