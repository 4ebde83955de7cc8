"""End to end: a tiny random Llama 4 text model (chunked local attention on its RoPE layers,
full attention on its NoPE layer, q/k norm, temperature tuning, one mixture-of-experts
layer; built in code, nothing downloaded) decoded by kvbench's layer-group paged cache and
kernels, against Hugging Face's own forward over the whole sequence (its chunked causal
mask).

Chunks of 8 tokens with blocks of 4 (and 8): sequences reach 48 tokens, so the chunked
groups release finished chunks mid-decode; prefix hits follow vLLM's chunked-local rule
(blocks before the next token's chunk are not needed); forks copy on write; a small pool
preempts. A token kvbench got wrong shows as HF's argmax differing (`spec_checks.compare`).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kvbench.paged.layer_groups import LayerGroupsPagedCache
from kvbench.suites.e2e import spec_checks as sc
from kvbench.suites.e2e.spec_forward import check_spec_supported, spec_forward
from kvbench.suites.e2e.spec_models import (
    TinySpecModel,
    build_spec_model,
    hf_logits,
    make_config,
    model_kv_spec,
    random_model,
)
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.kv_spec import KVCacheSpec

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="the end-to-end suite needs `transformers` (the `test` extra installs it)",
)

TINY = TinySpecModel("llama4", num_layers=4, chunk=8, seed=4)


@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model():
    return build_spec_model(TINY)


def _assert_matches_hf(model, run: sc.Run) -> None:
    result = sc.compare(model, run.results, run.expect)
    assert not result.problems, "kvbench decode differs from transformers:\n" + "\n".join(
        result.problems
    )
    assert result.positions > 0


def test_the_groups_are_read_from_the_llama4_config(model) -> None:
    """RoPE layers 0-2 chunked local of 8 tokens, the NoPE layer 3 full attention."""
    got = [(g.spec, g.layer_ids) for g in model_kv_spec(model).groups]
    chunked = KVCacheSpec.chunked_local(TINY.chunk)
    assert got == [(chunked, (0,)), (chunked, (1,)), (chunked, (2,)), (KVCacheSpec.full(), (3,))]


def test_hf_masks_by_chunk(model) -> None:
    """The oracle really is chunked: past the first chunk, HF's logits differ from the
    same weights with full attention everywhere (and agree inside the first chunk)."""
    full = random_model(make_config(TINY, attention_chunk_size=None), TINY.seed)
    tokens = sc.prompts(3, [20], model.config.vocab_size)[0]
    a, b = hf_logits(model, tokens), hf_logits(full, tokens)
    torch.testing.assert_close(a[: TINY.chunk], b[: TINY.chunk])
    assert not torch.allclose(a[TINY.chunk :], b[TINY.chunk :], atol=1e-3)


@pytest.mark.parametrize("block_size", [4, 8])
def test_ragged_decode_matches_hf(model, block_size: int) -> None:
    cache = sc.make_cache(model, block_size, 200)
    run = sc.ragged(model, cache)
    _assert_matches_hf(model, run)
    cache.check()
    assert cache.request_ids() == []


def test_prefix_hits_and_forks_match_hf(model) -> None:
    """Shared prefixes hit by vLLM's chunked-local rule (at least the system prompt's
    whole blocks, the full NoPE group holding every block; another salt never hits),
    forks copy on write; all decode what HF does."""
    bs = 4
    cache = sc.make_cache(model, bs, 200)
    run = sc.prefix(model, cache, bs)
    _assert_matches_hf(model, run)
    first = {rid: hits[0] for rid, hits in run.runner.stats.hits.items()}
    for rid, least in run.min_hit.items():
        assert first[rid] >= least, f"{rid}: hit {first[rid]} < {least} tokens"
    assert first["salted"] == 0
    assert run.runner.adapter.hits_past_window > 0  # released entries before the chunk
    cache.check()
    _assert_matches_hf(model, sc.fork(model, sc.make_cache(model, bs, 200), bs))


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_mid_decode_matches_hf(model, mode: str) -> None:
    lengths, new, pages = sc.preemption_plan(model, 4)
    run = sc.preemption(model, sc.make_cache(model, 4, pages), lengths, new, preemption=mode)
    _assert_matches_hf(model, run)
    assert run.runner.stats.preemptions > 0


def test_oracle_attention_path_matches_hf(model) -> None:
    """The same decode with float64 attention over the cache's `gather` (the chunk a
    group's newest token reads) instead of the kernels."""
    cache = sc.make_cache(model, 4, 200, prefix_caching=False)
    _assert_matches_hf(model, sc.ragged(model, cache, write_attention="oracle"))


def test_what_the_runner_does_not_follow_is_refused_by_name(model) -> None:
    """The multimodal model type, a layer type kvbench's Llama 4 forward does not
    attend, a chunked layer without RoPE, a module it does not run; and a chunk that is
    not whole blocks for the paged cache (vLLM's rule)."""
    import transformers

    class _Fake:
        config = transformers.Llama4Config()

    with pytest.raises(ConfigError, match="vision tower"):
        check_spec_supported(_Fake())
    odd = random_model(make_config(TINY, layer_types=["sliding_attention"] * 4), 0)
    with pytest.raises(ConfigError, match="sliding_attention"):
        spec_forward(odd)
    nope = random_model(make_config(TINY, no_rope_layers=[1, 1, 0, 0],
                                    layer_types=["chunked_attention"] * 4), 0)  # fmt: skip
    with pytest.raises(ConfigError, match="layer 2 is chunked but has no RoPE"):
        spec_forward(nope)
    extra = random_model(make_config(TINY), 0)
    extra.model.layers[0].self_attn.add_module("rel_bias", torch.nn.Identity())
    with pytest.raises(ConfigError, match="rel_bias"):
        spec_forward(extra)
    with pytest.raises(ConfigError, match="chunk=8 is not a multiple of block_size=16"):
        LayerGroupsPagedCache(model_kv_spec(model), num_blocks=8, block_size=16)
