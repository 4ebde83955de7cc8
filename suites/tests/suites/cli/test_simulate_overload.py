"""`kvbench simulate`'s overload warning (`paged.serving.overload`): arrivals of uncached
prompt tokens faster than the set-up can prefill are named in one stderr line, after the
tables and in the summary rows; slower arrivals and an offline batch (everything at
t = 0) are not. The arriving rate is checked against a sum done here by hand (the
trace's synthetic prompts share nothing, so every prompt token is computed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.paged.cache_spec import CacheSpec
from kvbench.paged.serving.overload import prefill_capacity_tps, prefill_load
from kvbench.paged.serving.simulation import time_model_for
from kvbench.suites.conformance.hostile import run_cli
from kvbench.workloads.trace import Trace, TraceRequest

PROMPT, REQUESTS = 1000, 12


def _capacity() -> float:
    return prefill_capacity_tps(time_model_for(CacheSpec(), "a100-80gb"), 4096)


def _trace(ratio: float) -> Trace:
    """REQUESTS prompts of PROMPT tokens arriving at `ratio` x the default set-up's
    prefill capacity (ratio 0: all at t = 0)."""
    gap = PROMPT / (ratio * _capacity()) if ratio else 0.0
    return Trace(tuple(TraceRequest(f"r{i}", i * gap, PROMPT, 2) for i in range(REQUESTS)))


@pytest.mark.parametrize(("ratio", "warned"), [(2.0, True), (0.5, False), (0.0, False)])
def test_simulate_warns_when_arrivals_outrun_prefill(
    tmp_path: Path, ratio: float, warned: bool
) -> None:
    path = _trace(ratio).write(tmp_path / "t.jsonl")
    code, out, err = run_cli(
        ["simulate", "--quiet", "--trace", str(path), "--out", str(tmp_path / "o")]
    )
    assert code == 0, err
    row = json.loads((tmp_path / "o" / "summary.jsonl").read_text().splitlines()[0])
    assert row["prefill_overloaded"] is warned
    if warned:
        assert err.count("\n") == 1 and err.startswith("kvbench simulate: warning: paged: ")
        assert "arrivals outrun prefill 2.0x" in err and "arrivals outrun prefill" in out
        assert row["arriving_prompt_tps"] == pytest.approx(2 * _capacity(), rel=1e-9)
    else:
        assert "outrun" not in err + out
    if ratio == 0.0:  # an offline batch has no arrival rate
        assert row["arriving_prompt_tps"] is None


def test_the_arriving_rate_is_computed_tokens_over_the_span() -> None:
    """(prompt tokens computed by every request but the first) / (last - first arrival)."""
    from kvbench.paged.serving.records import SeqRecord

    trace = Trace(
        (
            TraceRequest("a", 1.0, 100, 1),
            TraceRequest("b", 3.0, 50, 1),
            TraceRequest("c", 5.0, 70, 1),
        )
    )
    recs = [SeqRecord("a", "a", 1.0, 100, 1), SeqRecord("b", "b", 3.0, 50, 1, cached_tokens=16)]
    recs += [SeqRecord("c", "c", 5.0, 70, 1), SeqRecord("c#1", "c", 5.0, 70, 1)]  # a sample
    tm = time_model_for(CacheSpec(), "a100-80gb")
    load = prefill_load(trace, recs, tm, 4096)
    assert load is not None and load.arriving_tps == (50 - 16 + 70) / 4.0
    assert load.capacity_tps == 4096 / (tm.prefill_ps([(0, 4096)]) / 1e12)
    assert prefill_load(trace, recs, None, 4096) is None
