"""e2e.kv_specs: tiny HF models with KV cache specs decoding through layer groups, per case.

The models and scenarios of the end-to-end KV-spec check (`suites/e2e/spec_checks.py`,
`suites/conformance/test_e2e_kv_specs.py`): a Mistral with window 7 (every layer), a
Gemma-2 with local (window 6) and global layers alternating, and a Whisper
encoder-decoder (cross-attention K/V written once at admission), each generating 8
tokens (12 under preemption) through `LayerGroupsPagedCache` (blocks of 4 tokens, the
paged kernels' torch / C++ CPU paths) in the Llama check's scenarios, against Hugging
Face's own forward over each whole sequence:

* `logit_error_max`: the largest ||logits - hf|| / ||hf|| over every generated position
  (the check's tolerance is 1e-5);
* `tokens_equal`: 1 when every sequence's greedy tokens are HF's, else 0;
* `positions`: generated positions compared;
* `released_blocks_max`: the most table entries one request had released (-1) at once
  (blocks that left a window; 0 for full attention);
* `prefix_hit_tokens`, `prefix_hits_past_window`, `preemptions`: what the scenario
  exercised (a hit past a window is admitted with released entries before the window).

Computed here on the CPU (numbers of a run, no clock).
"""

from __future__ import annotations

from kvbench.reports.provenance import COMPUTED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.registry import Case, Measurement, sweep

SCENARIOS = ("ragged", "chunked_prefill", "prefix", "fork", "preempt_swap", "preempt_recompute")
BLOCK_SIZE = 4


def _cases(full: bool) -> list[Case]:
    from kvbench.suites.e2e.spec_checks import SPEC_MODELS

    return [
        {"model": label, "scenario": s, "block_size": BLOCK_SIZE}
        for label in SPEC_MODELS
        for s in SCENARIOS
    ]


@sweep(
    "e2e.kv_specs",
    "KV cache specs end to end: tiny random-weight HF Mistral (sliding window 7), Gemma-2 "
    "(local window 6 + global layers) and Whisper (cross-attention) generating through "
    "kvbench's layer-group paged cache in the Llama check's scenarios, against HF's own "
    "forward: largest relative logit error, greedy tokens equal, blocks released by "
    "windows (computed here, not timed)",
    _cases,
    requires=("transformers", "kvbench.suites.e2e.spec_checks"),
    tags=("e2e", "kv_specs", "accuracy"),
    produced=(COMPUTED,),
)
def e2e_kv_specs(case: Case, ctx: BenchContext) -> list[Measurement]:
    import torch

    from kvbench.suites.e2e import spec_checks as sc
    from kvbench.suites.e2e.spec_models import build_spec_model

    model = build_spec_model(sc.spec_of(case["model"]))
    bs = case["block_size"]
    scenario = case["scenario"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if scenario.startswith("preempt_"):
            lengths, new, blocks = sc.preemption_plan(model, bs)
            cache = sc.make_cache(model, bs, blocks)
            run = sc.preemption(model, cache, lengths, new, preemption=scenario[8:])
        else:
            cache = sc.make_cache(model, bs, 512)
            if scenario == "ragged":
                run = sc.ragged(model, cache)
            elif scenario == "chunked_prefill":
                run = sc.ragged(model, cache, prefill_chunk=5)
            elif scenario == "prefix":
                run = sc.prefix(model, cache, bs)
            else:
                run = sc.fork(model, cache, bs)
        result = sc.compare(model, run.results, run.expect)
    finally:
        torch.set_num_threads(threads)
    stats = run.runner.stats
    tokens_equal = not any("tokens" in p for p in result.problems)
    return [
        Measurement("logit_error_max", result.max_error, "ratio"),
        Measurement("tokens_equal", float(tokens_equal), "fraction"),
        Measurement("positions", result.positions, "count"),
        Measurement("released_blocks_max", run.runner.adapter.max_released, "blocks"),
        Measurement("prefix_hit_tokens", stats.prefix_hit_tokens, "tokens"),
        Measurement("prefix_hits_past_window", run.runner.adapter.hits_past_window, "count"),
        Measurement("preemptions", stats.preemptions, "count"),
    ]
