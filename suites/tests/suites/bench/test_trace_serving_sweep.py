"""trace.serving on a small Mooncake-format trace built here: every view measures what it
says (units, ranges, consistency between views), and the reader maps the format."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.sweeps import mooncake_reader
from kvbench.suites.bench.sweeps import trace_serving as ts
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.prompt_ids import HashBlockPrompt
from kvbench.workloads.trace import TraceError


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


def test_reader_maps_the_format(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", _rows(10))
    trace = mooncake_reader.read_mooncake(path)
    assert len(trace) == 10
    assert [r.arrival for r in trace.requests[:5]] == [0.0, 0.0, 0.0, 0.0, 3.0]
    first = trace.requests[0]
    assert isinstance(first.prompt, HashBlockPrompt)
    assert first.prompt_len == 612 and first.prompt[0] == 0 and first.prompt[600] == 1
    assert len(mooncake_reader.read_mooncake(path, window_s=3.0)) == 4
    bad = _rows(3)
    bad[1]["hash_ids"] = [0]  # 512 tokens cannot cover input_length 613
    with pytest.raises(TraceError, match="line 2") as info:
        mooncake_reader.read_mooncake(_write(tmp_path / "bad.jsonl", bad))
    assert info.value.field == "hash_ids"
    del bad[2]["output_length"]
    bad[1]["hash_ids"] = _rows(3)[1]["hash_ids"]
    with pytest.raises(TraceError, match="line 3"):
        mooncake_reader.read_mooncake(_write(tmp_path / "bad2.jsonl", bad))
    with pytest.raises(ConfigError, match="does not exist"):
        mooncake_reader.read_mooncake(tmp_path / "missing.jsonl")


def test_every_view_measures_consistently(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "t.jsonl", _rows(40))
    monkeypatch.setattr(ts, "TRACE_FILES", (path,))
    monkeypatch.setattr(ts, "_TRACES", {})
    monkeypatch.setattr(ts, "_RUNS", {})
    ctx = BenchContext(device=__import__("torch").device("cpu"))
    cases = ts._cases(False)
    views = {c["view"] for c in cases}
    assert views == {"grid", "search", "timeline", "replay"}
    assert all(c["window_s"] == ts.DEFAULT_WINDOW_S for c in cases)
    assert {c["time_scale"] for c in cases if c["view"] == "grid"} == set(ts.TIME_SCALES)
    by_view: dict[str, list[dict]] = {v: [] for v in views}
    for case in cases:
        got = {m.metric: (m.value, m.unit) for m in ts.trace_serving(case, ctx)}
        by_view[case["view"]].append({"case": case, **got})
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
    assert replay["replay_prompt_tokens"][0] == sum(r["input_length"] for r in _rows(40))
    assert not any(
        math.isnan(v[0]) for row in by_view["timeline"] for k, v in row.items() if k != "case"
    )
