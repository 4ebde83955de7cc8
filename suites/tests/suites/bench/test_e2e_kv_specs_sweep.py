"""e2e.kv_specs: one case per model kind and scenario, and rows that say what ran."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from kvbench.suites.bench import (
    catalog,  # noqa: F401  (registers the sweeps)
    registry,
)
from kvbench.suites.bench.context import BenchContext


def test_cases_cover_every_model_and_scenario() -> None:
    sw = registry.get_sweep("e2e.kv_specs")
    cases = sw.cases(False)
    assert {(c["model"], c["scenario"]) for c in cases} == {
        (m, s)
        for m in ("sliding_window-mistral", "hybrid-gemma2", "cross_attention-whisper")
        for s in ("ragged", "chunked_prefill", "prefix", "fork", "preempt_swap",
                  "preempt_recompute")
    }  # fmt: skip


@pytest.mark.parametrize(
    ("model", "scenario"),
    [("sliding_window-mistral", "prefix"), ("cross_attention-whisper", "preempt_swap")],
)
def test_a_case_matches_hf_and_counts_what_it_exercised(model: str, scenario: str) -> None:
    sw = registry.get_sweep("e2e.kv_specs")
    case = {"model": model, "scenario": scenario, "block_size": 4}
    got = {m.metric: m for m in sw.measure(case, BenchContext(torch.device("cpu")))}
    assert 0 < got["logit_error_max"].value <= 1e-5 and got["logit_error_max"].unit == "ratio"
    assert got["tokens_equal"].value == 1.0
    assert got["positions"].value > 0
    if scenario == "prefix":  # the window released blocks; a hit skipped blocks before it
        assert got["released_blocks_max"].value > 0
        assert got["prefix_hits_past_window"].value > 0
        assert got["prefix_hit_tokens"].value > 0
    else:  # full self-attention releases nothing; the small pool preempts
        assert got["released_blocks_max"].value == 0
        assert got["preemptions"].value > 0
