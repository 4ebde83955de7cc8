"""e2e.llama_fp8: the accuracy cost of an fp8 KV cache end to end, per case.

The tiny random-weight HF Llama of the end-to-end suite (2 layers, hidden 64, 4 query /
2 KV heads, head dim 16, float32) generates 16 tokens after six ragged prompts (1-40
tokens) through a paged cache storing K/V as `fp8_e4m3` or `fp8_e5m2` (dynamic scales,
per tensor or per KV head; the float32 cache is the control), compared with Hugging
Face's own float32 `generate` (suites/e2e/fp8_accuracy.py):

* `logit_error_median` / `_p90` / `_max`: ||logits - hf|| / ||hf|| over every generated
  position of every request, teacher-forced on HF's tokens (same context as HF's);
* `greedy_agreement`: the fraction of those positions whose argmax is HF's token;
* `tokens_matched_mean`: free-running greedy tokens equal to HF's before the first
  difference, mean over requests (of 16).

Computed here on the CPU (numbers of a run, no clock; a random-weight model's logits
have small top-2 margins, so its agreement is a pessimistic figure for trained models).
"""

from __future__ import annotations

import statistics

from kvbench.reports.provenance import COMPUTED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.registry import Case, Measurement, sweep

PROMPT_LENGTHS = (3, 16, 17, 40, 1, 33)
NEW_TOKENS = 16
CASES = (
    ("float32", "tensor"),
    ("fp8_e4m3", "tensor"),
    ("fp8_e4m3", "head"),
    ("fp8_e5m2", "tensor"),
    ("fp8_e5m2", "head"),
)

_MODEL: list[object] = []
_HF: dict = {}


def _cases(full: bool) -> list[Case]:
    return [
        {"kv_dtype": d, "granularity": g, "cache": "paged", "new_tokens": NEW_TOKENS}
        for d, g in CASES
    ]


def _model() -> object:
    from kvbench.suites.e2e.tiny_llama import TinyLlamaSpec, build_tiny_llama

    if not _MODEL:
        spec = TinyLlamaSpec(
            num_layers=2, hidden_size=64, num_q_heads=4, num_kv_heads=2, vocab_size=256
        )
        _MODEL.append(build_tiny_llama(spec))
    return _MODEL[0]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@sweep(
    "e2e.llama_fp8",
    "accuracy cost of fp8 KV end to end: a tiny random-weight HF Llama generating through "
    "kvbench's paged cache with e4m3 / e5m2 K/V (per-tensor or per-head dynamic scales; "
    "float32 control) against HF's own generate: teacher-forced relative logit error and "
    "argmax agreement, free-running tokens matched (computed here, not timed)",
    _cases,
    requires=("transformers", "kvbench.suites.e2e.fp8_accuracy"),
    tags=("e2e", "fp8", "accuracy"),
    produced=(COMPUTED,),
)
def e2e_llama_fp8(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.suites.e2e import fp8_accuracy

    model = _model()
    prompts = fp8_accuracy.prompts_for(11 + ctx.seed, PROMPT_LENGTHS, 256)
    results = fp8_accuracy.measure(
        model,
        prompts,
        case["new_tokens"],
        case["kv_dtype"],
        case["cache"],
        granularity=case["granularity"],
        hf=_HF,
    )
    errors = [e for r in results for e in r.logit_errors]
    positions = sum(r.new_tokens for r in results)
    agreement = sum(r.agreement * r.new_tokens for r in results) / positions
    return [
        Measurement("logit_error_median", statistics.median(errors), "ratio"),
        Measurement("logit_error_p90", _quantile(errors, 0.9), "ratio"),
        Measurement("logit_error_max", max(errors), "ratio"),
        Measurement("greedy_agreement", agreement, "fraction"),
        Measurement(
            "tokens_matched_mean", statistics.mean(r.tokens_matched for r in results), "tokens"
        ),
        Measurement("positions", positions, "count"),
    ]
