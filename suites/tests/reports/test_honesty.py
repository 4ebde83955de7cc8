"""The report says exactly what was measured: every number with its unit, the spread of
timed values, differences within noise marked and the largest changes first, where each
sweep ran, which runs are incomplete, claims whose range agrees with their cases and
whose sources are publications; `kvbench bench` ends with the claim count."""

from __future__ import annotations

import html
import math
import re
from pathlib import Path

import pytest

from kvbench.reports import claims
from kvbench.reports.site import backends, build_site
from kvbench.reports.store.reader import load_run, load_runs
from kvbench.reports.store.writer import ResultWriter
from kvbench.suites.cli import main as kvbench
from kvbench.suites.conformance.hostile import run_cli
from kvbench.workloads.units import format_quantity

ENV = {"device": "cpu", "cpu_model": "Test CPU", "cpu_count": 2, "torch": "9.9", "triton": "8.8"}

#: Every unit the sweeps record, and how a value of it must end when printed.
UNIT_ENDINGS: dict[str, tuple[str, ...]] = {
    "s": (" s", " ms", " µs", " ns"),
    "fraction": ("%",),
    "ratio": ("×",),
    "x": ("×",),
    "B": (" B", " KiB", " MiB", " GiB", " TiB"),
    "B/s": (" B/s", " KiB/s", " MiB/s", " GiB/s", " TiB/s"),
    "GiB": (" GiB",),
    "tokens": (" tokens",),
    "blocks": (" blocks",),
    "requests": (" requests",),
    "tokens/s": (" tokens/s",),
    "requests/s": (" requests/s",),
    "ops/s": (" ops/s",),
    "events/s": (" events/s",),
    "FLOP": ("FLOP",),
    "FLOP/s": ("FLOP/s",),
    "bool": ("yes", "no"),
}
VALUES = (0.0, 1e-7, 3.2e-4, 0.8157, 1.0, 2.176, 10.0, 37.64, 1.147e4, 2**31, 1e18)


@pytest.mark.parametrize("unit", sorted(UNIT_ENDINGS))
def test_every_number_with_a_unit_renders_with_its_unit(unit: str) -> None:
    for v in VALUES + tuple(-x for x in VALUES[1:]):
        text = format_quantity(v, unit)
        assert text.endswith(UNIT_ENDINGS[unit]), f"{v} {unit} -> {text!r}"
        assert "e+" not in text or abs(v) >= 1e15, text


def test_fractions_of_ten_or_more_and_seconds_of_one_or_more_keep_their_unit() -> None:
    assert format_quantity(37.64, "fraction") == "3,764%"
    assert format_quantity(1.8547, "fraction") == "185.5%"
    assert format_quantity(-0.312, "fraction") == "-31.2%"
    assert format_quantity(2.176, "s") == "2.176 s"
    assert format_quantity(1.147e4, "s") == "11,470 s"
    assert format_quantity(0.8157, "s") == "815.7 ms"
    assert format_quantity(3, "count") == "3"
    assert format_quantity(math.nan, "s") == ""


# ----------------------------------------------------------------- a site of two runs


def _timed(w: ResultWriter, suite: str, case: dict, metric: str, median: float, spread: float):
    stats = {"median": median, "q1": median * (1 - spread), "q3": median * (1 + spread), "n": 9}
    w.record(suite, case, metric, median, "s", stats)


def _write_runs(folder: Path) -> None:
    header = {"planned_cases": 3, "bench": {"sweeps": "all", "shard": None, "seed": 0}}
    for rid, slow in (("a", 1.0), ("b", 3.0)):
        with ResultWriter(rid, folder, environment=ENV, header_fields=header) as w:
            for i, ctx in enumerate((128, 1024)):
                case = {"block_size": 16, "ctx_len": ctx, "batch": 2}
                _timed(w, "kernel.decode", case, "time_paged", 0.002 * (i + 1), 0.05)
                # within noise: B differs by 2% with 10% spreads
                _timed(
                    w,
                    "kernel.decode",
                    case,
                    "time_contiguous",
                    0.001 * (1.02 if rid == "b" else 1),
                    0.1,
                )
                # a large change only at ctx 1024, a smaller one at 128
                factor = slow if ctx == 1024 else 1 + (slow - 1) / 4
                _timed(w, "kernel.decode", case, "time_prefill", 1.5 * factor, 0.01)
                w.record("kernel.decode", case, "overhead_vs_sdpa", 0.1 * (i + 1), "fraction")
                w.record("kernel.decode", case, "backend_is_triton", 0.0, "bool")
                w.record("kernel.decode", case, "case_wall_time", 0.5, "s")
            w.record("capacity.footprint", {"model": "m"}, "bytes_per_token", 327680, "B")
            w.record("capacity.footprint", {"model": "m"}, "case_wall_time", 0.5, "s")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("honest")
    _write_runs(folder / "results")
    out = folder / "site"
    runs = load_runs(["a", "b"], folder / "results")
    build_site(runs, out)
    return out


def _cells(page: str) -> list[list[str]]:
    """The text of every table row's cells (tags stripped, spread spans kept apart)."""
    rows = []
    for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", page, flags=re.S):
        cells = re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", tr, flags=re.S)
        rows.append([html.unescape(re.sub(r"<[^>]+>", "|", c)) for c in cells])
    return rows


def test_sweep_table_cells_carry_units_and_spread(site: Path) -> None:
    page = (site / "sweep-kernel.decode.html").read_text()
    rows = _cells(page)
    header = rows[0] if rows[0][0] != "environment" else rows[1]
    table = [r for r in rows if len(r) == len(header)]
    col = {h: i for i, h in enumerate(table[0])}
    for r in table[1:]:
        time = r[col["time_paged"]]
        assert re.match(r"[\d.,]+ ms\|q1–q3 [\d.,]+ ms – [\d.,]+ ms, n=9\|", time), time
        assert r[col["overhead_vs_sdpa"]].endswith("%")
        assert r[col["time_prefill"]].split("|")[0].endswith(" s")
    assert "spans q1–q3 of the repeats (n = 9 per point)" in page


def test_sweep_page_names_run_device_and_backend(site: Path) -> None:
    page = html.unescape((site / "sweep-kernel.decode.html").read_text())
    for run in ("a", "b"):
        assert f"run {run}; started" in page
    assert "device cpu (Test CPU, 2 cores)" in page and "torch 9.9, triton 8.8" in page
    assert "kernel backend torch" in page


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([("backend_is_triton", 0.0)], ["torch"]),
        ([("backend_is_triton", 0.0), ("kernel_path_is_cpp", 1.0)], ["cpu-cpp"]),
        ([("backend_is_triton", 0.0), ("kernel_path_is_cpp", 0.0)], ["torch-sdpa"]),
        (
            [("backend_is_triton", 0.0), ("kernel_path_is_cpp", 1.0), ("kernel_path_is_cpp", 0.0)],
            ["cpu-cpp", "torch-sdpa"],
        ),
        ([("backend_is_triton", 1.0), ("kernel_path_is_cpp", 0.0)], ["triton"]),
        ([("backend_is_triton", 1.0), ("backend_is_triton", 0.0)], ["torch", "triton"]),
    ],
)
def test_backend_names_the_cpu_path_that_ran(rows: list, expected: list[str]) -> None:
    """A page where the C++ kernel ran said "kernel backend torch", which read as the
    gather + SDPA version; the label names the path the rows record (`cpu-cpp` or
    `torch-sdpa`), and rows that record none (older runs) keep "torch"."""
    import pandas as pd

    frame = pd.DataFrame([{"metric": m, "value": v} for m, v in rows])
    assert backends(frame) == expected


def test_a_backend_case_column_keeps_its_label() -> None:
    import pandas as pd

    frame = pd.DataFrame(
        [{"metric": "passed", "value": 1.0, "backend": b} for b in ("cpu-cpp", "torch", "triton")]
    )
    assert backends(frame) == ["cpu-cpp", "torch", "triton"]


def test_compare_page_leads_with_the_largest_significant_change(site: Path) -> None:
    page = html.unescape((site / "compare.html").read_text())
    rows = [r for r in _cells(page) if len(r) == 7 and r[0] != "sweep"]
    verdicts = [r[6] for r in rows]
    assert verdicts[0] == "changed" and rows[0][2] == "time_prefill"
    assert "ctx_len=1024" in rows[0][1] and rows[0][5] == "3×"
    assert rows[1][2] == "time_prefill" and "ctx_len=128" in rows[1][1]
    noise = [r for r in rows if r[2] == "time_contiguous"]
    assert noise and all(r[6] == "within noise" for r in noise)
    order = {"changed": 0, "differs": 1, "within noise": 2, "same": 3}
    assert [order[v] for v in verdicts] == sorted(order[v] for v in verdicts)
    assert "within noise (the ranges overlap" in page


def test_wide_tables_scroll_with_the_key_column_in_view(site: Path) -> None:
    page = (site / "sweep-kernel.decode.html").read_text()
    assert '<div class="scroll">' in page
    assert re.search(r"\.scroll td:first-child \{[^}]*position: sticky; left: 0", page)
    assert re.search(r"\.scroll \{[^}]*overflow: auto", page)


def test_a_killed_run_is_reported_incomplete(tmp_path: Path) -> None:
    header = {"planned_cases": 5, "bench": {"sweeps": "all", "shard": None, "seed": 0}}
    with ResultWriter("killed", tmp_path, environment=ENV, header_fields=header) as w:
        w.record("capacity.footprint", {"model": "m"}, "bytes_per_token", 1.0, "B")
        w.record("capacity.footprint", {"model": "m"}, "case_wall_time", 0.1, "s")
    with open(tmp_path / "killed.jsonl", "ab") as fh:
        fh.write(b'{"kind":"row","schema":1,"suite":"capacity.foot')  # killed mid-line
    out = tmp_path / "site"
    build_site(load_runs(["killed"], tmp_path), out)
    index = html.unescape((out / "index.html").read_text())
    assert "Incomplete:" in index and "incomplete: 1 of 5 cases ended" in index
    assert "torn" in index
    sweep = html.unescape((out / "sweep-capacity.footprint.html").read_text())
    assert "Incomplete run" in sweep and "killed" in sweep


def test_a_whole_run_is_not_flagged(site: Path) -> None:
    assert "Incomplete" not in (site / "index.html").read_text()


# ----------------------------------------------------------------- claims


def test_overhead_claim_range_agrees_with_its_per_case_list() -> None:
    import pandas as pd

    rows = []
    for ctx, values in ((128, (0.05, 0.30)), (4096, (0.10, 0.12))):
        for b, v in enumerate(values):
            rows.append(
                {
                    "suite": "kernel.decode",
                    "metric": "paging_overhead",
                    "value": v,
                    "unit": "fraction",
                    "run_id": "r",
                    "case_key": f"{ctx}-{b}",
                    "block_size": 16,
                    "ctx_len": ctx,
                    "batch": b,
                }
            )
    rows.append(dict(rows[0], metric="backend_is_triton", value=1.0, unit="bool"))
    frame = pd.DataFrame(rows)
    verdict = dict((c.key, v) for c, v in claims.evaluate(frame))["overhead-seed"]
    overall, per_case = verdict.measured.split(" (by context length: ")  # a GPU row
    assert overall == "5.0%-30.0%"
    assert "128: 5.0%-30.0% (2 cases)" in per_case and "4096: 10.0%-12.0% (2 cases)" in per_case
    assert verdict.verdict == claims.FAILS  # 30% is above the published 15.0%


def test_measured_ranges_with_negative_ends_read_as_ranges() -> None:
    """A paged kernel faster than its baseline gave "-91.7%--20.4%" on the claims page."""
    import pandas as pd

    from kvbench.reports.claims_model import _range

    assert _range(pd.Series([-0.917, -0.204])) == "-91.7% to -20.4%"
    assert _range(pd.Series([-0.1, 0.2])) == "-10.0% to 20.0%"
    assert _range(pd.Series([0.05, 0.3])) == "5.0%-30.0%"
    assert _range(pd.Series([-0.05, -0.05])) == "-5.0%"


def test_claim_sources_cite_publications_not_issues() -> None:
    for c in claims.CLAIMS:
        assert not re.search(r"\bissue\b", c.source, flags=re.I), c.source
    sources = " ".join(c.source for c in claims.CLAIMS)
    assert "Efficient Memory Management for Large Language Model Serving" in sources
    assert "SOSP 2023" in sources


# ----------------------------------------------------------------- bench


def test_bench_names_what_copy_peak_is_and_ends_with_the_claim_count(tmp_path: Path) -> None:
    code, out, err = run_cli(
        [
            "bench",
            "--only",
            "capacity.footprint",
            "--no-progress",
            "--out-dir",
            str(tmp_path),
            "--run-id",
            "cp",
        ]
    )
    assert code == 0, err
    last = out.strip().splitlines()[-1]
    n = len(claims.CLAIMS)
    assert re.fullmatch(
        rf"claims: \d+ holds?, \d+ do(?:es)? not hold, \d+ not applicable here, \d+ not measured "
        rf"\(of {n};.*\)",
        last,
    ), last
    counted = [int(x) for x in re.findall(r"(\d+) (?:hold|does|do |not)", last.split(" (of ")[0])]
    assert sum(counted) == n, last  # every verdict is counted once
    desc = load_run(tmp_path / "cp.jsonl").header["bench"]["descriptions"]["copy_peak"]
    assert desc.endswith(".") and "bandwidth_fraction" in desc
    assert kvbench(["report", "cp", "--dir", str(tmp_path), "--out", str(tmp_path / "s")]) == 0
