"""serving.kv_specs' page: a summary table and figure set each model's windowed layout
beside its full-attention twin per trace (KV saved computed from the rows, not copied),
the shared KV budget is stated once with its unit, and the layouts are named in words."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.reports.kv_specs import derived_tables, pairs, summary_figure
from kvbench.reports.site import build_site
from kvbench.reports.store.frame import to_frame
from kvbench.reports.store.reader import load_run
from kvbench.reports.store.writer import ResultWriter

WINDOWED = "sliding window 4096 on all 32 layers"
FULL = "full attention on all 32 layers"


def _run(tmp_path: Path) -> Path:
    with ResultWriter("k", tmp_path, environment={"device": "cpu"}) as w:
        for attention, pages, peak, rate, layers in (
            (WINDOWED, 250.0, 96, 0.8, 32),
            (FULL, 1000.0, 37, 0.4, 0),
        ):
            case = {"trace": "mooncake", "requests": 200, "model": "mistral-7b",
                    "attention": attention, "kv_budget": 40 * 2**30, "block_size": 16,
                    "profile": "a100-80gb", "duration_s": 250.0}  # fmt: skip
            for metric, value, unit in (
                ("pages_per_running_request", pages, "pages"),
                ("page_bytes", 2 * 2**20, "B"),
                ("peak_concurrency", peak, "requests"),
                ("sustained_rate", rate, "requests/s"),
                ("rate_limit", 0.8, "requests/s"),
                ("burst_tokens_per_second", 200.0, "tokens/s"),
                ("windowed_layers", layers, "layers"),
                ("pool_pages", 20000, "pages"),
            ):
                w.record("serving.kv_specs", case, metric, value, unit)
    return tmp_path / "k.jsonl"


def test_summary_pairs_windowed_with_full_and_computes_the_saving(tmp_path: Path) -> None:
    frame = to_frame([load_run(_run(tmp_path))])
    (pair,) = pairs(frame)
    assert pair.windowed.layout == WINDOWED and pair.full.layout == FULL
    assert pair.saved == pytest.approx(0.75)
    (table,) = derived_tables("serving.kv_specs", frame)
    (row,) = table.rows
    cells = dict(zip(table.header, row, strict=True))
    assert cells["KV per running request, windowed [MiB]"] == "500.0"
    assert cells["full [MiB]"] == "2,000.0"
    assert cells["KV saved by the window [%]"] == "75.0"
    assert cells["peak concurrency, windowed [requests]"] == "96"
    # windowed reached the trace's limit (a lower bound), full did not
    assert cells["sustained rate, windowed [requests/s]"] == "≥ 0.8"
    assert cells["full [requests/s]"] == "0.4"
    assert "Modeled" in table.note and WINDOWED in table.note
    assert derived_tables("serving.rate", frame) == []
    ((title, svg),) = summary_figure(frame)
    assert "modeled" in title and svg.startswith("<svg")


def test_page_states_the_budget_once_with_its_unit(tmp_path: Path) -> None:
    build_site([load_run(_run(tmp_path))], tmp_path / "site")
    page = (tmp_path / "site" / "sweep-serving.kv_specs.html").read_text()
    main, _, details = page.partition("<details>")
    assert "kv_budget = 40 GiB" in main
    assert "42,949,672,960" not in page and "<th>kv_budget" not in page
    assert "Summary: windowed vs full attention" in main
    assert f"<td>{WINDOWED}</td>" in main
    assert "<th>pool_pages</th>" not in main and "<th>pool_pages</th>" in details
