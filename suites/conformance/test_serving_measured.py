"""The measured serving run (`suites.e2e.serving_run`): the engine's decisions drive a
real model whose attention reads the engine's own cache through kvbench's kernels.

Oracle: Hugging Face's own forward of each sequence's whole token list (its attention,
its positions, no cache at all). Every logit the run produced for a sequence's newest
token - from a prefill chunk or a decode step, on a paged or a contiguous cache - must
equal HF's logit at that position. A kernel that read a wrong block, a wrong slot or a
stale K/V would change them. The measured clock must be the sum of the steps' times.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from kvbench.paged.cache import PagedKVCache
from kvbench.paged.serving.engine import Engine
from kvbench.paged.serving.time_model import SchedulerConfig, TimeModel
from kvbench.reference.contiguous import ContiguousKVCache
from kvbench.suites.e2e.serving_run import (
    ModelStep,
    ServingModelSpec,
    build_model,
    cpu_threads,
    param_count,
)
from kvbench.workloads.profiles import get_profile
from kvbench.workloads.trace import Trace, TraceRequest

SPEC = ServingModelSpec(num_layers=2, hidden_size=64, num_q_heads=4, num_kv_heads=2,
                        intermediate_size=128, vocab_size=97, max_positions=256)  # fmt: skip


def _trace() -> Trace:
    lens = [(9, 7), (20, 4), (3, 12), (17, 9), (5, 5), (30, 3)]
    return Trace(tuple(TraceRequest(f"r{i}", 0.002 * i, p, o) for i, (p, o) in enumerate(lens)))


def _cache(kind: str, slots: int):  # type: ignore[no-untyped-def]
    g = SPEC.geometry()
    if kind == "paged":
        return PagedKVCache(g, slots // 8, 8, enable_prefix_caching=False, kernel_backend="torch")
    return ContiguousKVCache(g, slots, 64, "max")


@pytest.mark.parametrize(
    ("kind", "slots", "probe_every"), [("paged", 48, 0), ("contiguous", 192, 0), ("paged", 48, 3)]
)
def test_measured_run_matches_hf_forward(kind: str, slots: int, probe_every: int) -> None:
    """probe_every > 0: the empty calls timed beside the steps run in a scratch pool, so
    every logit still matches and the engine's clock still counts only the steps."""
    model = build_model(SPEC)
    params = param_count(model)
    tm = TimeModel(get_profile("cpu"), SPEC.geometry(), 4 * params, float(params), 8)
    cache = _cache(kind, slots)
    hook = ModelStep(model, cache, "torch", 8, keep_logits=True, probe_every=probe_every)
    cfg = SchedulerConfig(
        mode="token", max_num_seqs=4, max_batched_tokens=16, preemption="recompute"
    )
    with cpu_threads(1):
        result = Engine(cache, cfg, tm, step_hook=hook).run(_trace())
    assert result.generated_tokens == sum(r.output_len for r in _trace().requests)
    assert result.modeled_seconds == pytest.approx(
        sum(s.measured_s for s in hook.samples), rel=1e-9
    )
    checked = 0
    for step in hook.logits:
        for sid, (end, logits) in step.items():
            ids = torch.tensor([hook.token_ids(sid, end)])
            with torch.no_grad():
                want = model(ids).logits[0, -1].float()
            torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)
            checked += 1
    assert checked >= len(hook.samples)
    assert all((s.empty_s > 0) == (probe_every > 0) for s in hook.samples)
    if slots == 48:
        assert result.preemptions > 0  # recomputed sequences were checked too
