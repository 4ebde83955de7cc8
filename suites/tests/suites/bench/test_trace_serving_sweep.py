"""trace.serving on a small Mooncake-format trace built here: every view measures what it
says (units, ranges, consistency between views), and the sweep reads the shipped trace."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.sweeps import trace_serving as ts
from kvbench.workloads.shipped import shipped_trace
from kvbench.workloads.trace_import import read_mooncake


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _rows(n: int) -> list[dict]:
    """n requests in bursts of 4 every 3 s; conversations extend earlier prompts."""
    rows = []
    for i in range(n):
        ids = [0, 1 + i % 5] + [100 + i * 10 + k for k in range(i % 3)]
        length = 512 * (len(ids) - 1) + 100 + i
        rows.append(
            {
                "timestamp": 3000 * (i // 4),
                "input_length": length,
                "output_length": 5 + i % 7,
                "hash_ids": ids,
            }
        )
    return rows


def test_the_sweep_replays_the_shipped_trace() -> None:
    """The sweep reads the trace shipped in the package (offline on a fresh clone): the
    first 300 s of the Mooncake conversation trace, prompts described by hash blocks."""
    ts._TRACES.clear()
    trace = ts._trace(ts.DEFAULT_WINDOW_S)
    assert trace.requests and all(r.arrival < ts.DEFAULT_WINDOW_S for r in trace.requests)
    whole = shipped_trace(ts.TRACE)
    assert trace.requests == whole.requests[: len(trace)]
    assert whole.requests[len(trace)].arrival >= ts.DEFAULT_WINDOW_S
    assert all(r.prompt_block_tokens == 512 for r in trace.requests)


def test_every_view_measures_consistently(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "t.jsonl", _rows(40))
    monkeypatch.setattr(ts, "_TRACES", {ts.DEFAULT_WINDOW_S: read_mooncake(path)})
    monkeypatch.setattr(ts, "_RUNS", {})
    ctx = BenchContext(device=__import__("torch").device("cpu"))
    cases = ts._cases(False)
    views = {c["view"] for c in cases}
    assert views == {"grid", "search", "timeline", "replay"}
    assert all(c["window_s"] == ts.DEFAULT_WINDOW_S for c in cases)
    assert {c["time_scale"] for c in cases if c["view"] == "grid"} == set(ts.TIME_SCALES)
    by_view: dict[str, list[dict]] = {v: [] for v in views}
    stats: dict[str, dict] = {}
    for case in cases:
        measured = ts.trace_serving(case, ctx)
        got = {m.metric: (m.value, m.unit) for m in measured}
        by_view[case["view"]].append({"case": case, **got})
        if case["view"] == "replay":
            stats = {m.metric: m.stats for m in measured if m.stats}
    for row in by_view["grid"]:
        assert row["goodput"][1] == "requests/s" and row["ttft_p99"][1] == "s"
        assert 0.0 <= row["slo_attainment"][0] <= 1.0
        assert row["goodput"][0] == pytest.approx(
            row["slo_attainment"][0] * row["requests_per_second"][0]
        )
        assert row["ttft_p50"][0] <= row["ttft_p90"][0] <= row["ttft_p99"][0]
        assert 0.0 < row["prefix_hit_rate"][0] < 1.0  # the shared first blocks hit
    (search,) = by_view["search"]
    assert search["slo_time_scale"][0] > 0 and search["slo_time_scale"][1] == "x"
    admitted = sum(r["window_admitted"][0] for r in by_view["timeline"])
    assert admitted == 40
    (replay,) = by_view["replay"]
    assert replay["replay_wall_time"][0] > 0
    for metric in ("replay_wall_time", "replay_cpu_time", "replay_prompt_tokens_per_second"):
        spread = stats[metric]  # measured here: repeated, with q1-q3 and n
        assert spread["n"] == ts.REPLAY_REPEATS
        assert spread["q1"] <= replay[metric][0] <= spread["q3"]
    assert replay["replay_prompt_tokens"][0] == sum(r["input_length"] for r in _rows(40))
    assert not any(
        math.isnan(v[0]) for row in by_view["timeline"] for k, v in row.items() if k != "case"
    )
