"""End to end with an fp8 KV cache: the tiny random-weight Llama generating through
kvbench's fp8 caches, against Hugging Face's own float32 `generate` (the oracle of
test_e2e_llama.py). See suites/e2e/fp8_accuracy.py for how a case is run.

fp8 changes the logits, so these are loose bounds on the accuracy cost, not exactness
(measured on the ragged prompts below, 16 new tokens: e4m3 per-tensor median teacher-forced
logit error 0.059, max 0.19, argmax agreement 69-100% per request; e5m2 0.086 / 0.19):

* `FP8_MEDIAN_BOUND` on the median and `FP8_MAX_BOUND` on the largest relative logit
  error over all generated positions, and at least `FP8_AGREEMENT` of teacher-forced
  positions whose argmax is HF's token;
* the float32 cache through the same path: 1e-5 and every token (so the path is sound
  and the error is the quantization's);
* paged (C++ / torch fp8 decode kernel) and contiguous (float64 oracle over the
  dequantized K/V) caches give the same logits within 1e-4: the kernel is not the error;
* a read that uses twice the scales breaks the bounds (the checks can fail).
"""

from __future__ import annotations

import importlib.util
import statistics

import pytest
import torch

from kvbench.suites.e2e import fp8_accuracy
from kvbench.suites.e2e.tiny_llama import TinyLlamaSpec, build_tiny_llama
from kvbench.workloads.kv_quant import KVQuant

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="the end-to-end suite needs `transformers` (the `test` extra installs it)",
)

SPEC = TinyLlamaSpec(num_layers=2, hidden_size=64, num_q_heads=4, num_kv_heads=2, vocab_size=256)
LENGTHS = (3, 16, 17, 40, 1, 33)
NEW_TOKENS = 16
FP8_MEDIAN_BOUND = {"fp8_e4m3": 0.12, "fp8_e5m2": 0.2}
FP8_MAX_BOUND = 0.5
FP8_AGREEMENT = 0.6


@pytest.fixture(scope="module")
def model():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield build_tiny_llama(SPEC)
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def hf_memo() -> dict:
    return {}


def _prompts() -> list[tuple[int, ...]]:
    return fp8_accuracy.prompts_for(11, LENGTHS, SPEC.vocab_size)


def _summary(results) -> tuple[float, float, float]:
    errors = [e for r in results for e in r.logit_errors]
    agreement = sum(r.agreement * r.new_tokens for r in results) / sum(
        r.new_tokens for r in results
    )
    return statistics.median(errors), max(errors), agreement


def test_fp32_kv_control_matches_hf_exactly(model, hf_memo) -> None:
    results = fp8_accuracy.measure(model, _prompts(), NEW_TOKENS, "float32", hf=hf_memo)
    _, worst, agreement = _summary(results)
    assert worst <= 1e-5 and agreement == 1.0
    assert all(r.tokens_matched == NEW_TOKENS for r in results)


@pytest.mark.parametrize("granularity", ["tensor", "head"])
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_kv_logits_and_greedy_tokens_stay_near_hf(
    model, hf_memo, kv_dtype: str, granularity: str
) -> None:
    results = fp8_accuracy.measure(
        model, _prompts(), NEW_TOKENS, kv_dtype, granularity=granularity, hf=hf_memo
    )
    median, worst, agreement = _summary(results)
    assert median <= FP8_MEDIAN_BOUND[kv_dtype], f"median logit error {median:.3g}"
    assert worst <= FP8_MAX_BOUND, f"largest logit error {worst:.3g}"
    assert agreement >= FP8_AGREEMENT, f"argmax agreement {agreement:.2f}"
    assert median > 1e-4  # fp8 is really in the path (the float32 control is ~5e-7)


def test_fp8_paged_kernel_and_contiguous_oracle_agree(model, hf_memo) -> None:
    paged = fp8_accuracy.measure(model, _prompts()[:3], 8, "fp8_e4m3", "paged", hf=hf_memo)
    contiguous = fp8_accuracy.measure(
        model, _prompts()[:3], 8, "fp8_e4m3", "contiguous", hf=hf_memo
    )
    for a, b in zip(paged, contiguous, strict=True):
        assert a.logit_errors == pytest.approx(b.logit_errors, abs=1e-4)
        assert a.tokens_matched == b.tokens_matched


def test_fp8_wrong_scales_break_the_bounds(model, hf_memo, monkeypatch) -> None:
    """Mutation: every read dequantizes with twice the true scales."""
    true_scales = KVQuant.scales

    def doubled(self):
        k, v = true_scales(self)
        return k * 2, v * 2

    monkeypatch.setattr(KVQuant, "scales", doubled)
    results = fp8_accuracy.measure(model, _prompts(), NEW_TOKENS, "fp8_e4m3", hf=hf_memo)
    median, worst, _ = _summary(results)
    assert median > FP8_MEDIAN_BOUND["fp8_e4m3"] or worst > FP8_MAX_BOUND
