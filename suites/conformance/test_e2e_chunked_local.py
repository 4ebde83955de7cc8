"""End to end: a tiny random Llama 4 text model (chunked local attention on its RoPE layers,
full attention on its NoPE layer, q/k norm, temperature tuning, one mixture-of-experts
layer; built in code, nothing downloaded) decoded by kvbench's layer-group paged cache and
kernels, against Hugging Face's own forward over the whole sequence (its chunked causal
mask).

Chunks of 8 tokens with blocks of 4 (and 8): sequences reach 48 tokens, so the chunked
groups release finished chunks mid-decode; prefix hits follow vLLM's chunked-local rule
(blocks before the next token's chunk are not needed); forks copy on write; a small pool
preempts. A token kvbench got wrong shows as HF's argmax differing (`spec_checks.compare`).

Llama 4's text decoder is not among the e2e harness's built-in forwards: this module
holds its tiny config and its forward (`Llama4TextForward`: complex RoPE, the L2 q/k norm
of RoPE layers, the attention temperature tuning of NoPE layers (a per-position query
scale), dense or mixture-of-experts feed-forward, run as transformers built them) and
registers it with `spec_forward.register_forward`, refusing by name Llama 4's multimodal
model (its text model is decoded), a layer type other than chunked or full attention, a
chunked layer without RoPE and any module it does not run. The kind itself (the groups,
the caches, the kernels) is read from the config by `workloads.hf_spec` as for every model.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kvbench.paged.layer_groups import LayerGroupsPagedCache
from kvbench.reference.contract import KVPair
from kvbench.suites.e2e import spec_checks as sc
from kvbench.suites.e2e.llama_forward import (
    ForwardOutput,
    PackedBatch,
    embed_batch,
    project_qkv,
)
from kvbench.suites.e2e.spec_forward import (
    _PROJ,
    GroupAttention,
    _check_modules,
    check_spec_supported,
    register_forward,
    spec_forward,
)
from kvbench.suites.e2e.spec_models import (
    TinySpecModel,
    common_fields,
    hf_logits,
    model_kv_spec,
    random_model,
)
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.kv_spec import KVCacheSpec

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="the end-to-end suite needs `transformers` (the `test` extra installs it)",
)

TINY = TinySpecModel("llama4", num_layers=4, seed=4)
CHUNK = 8  # tokens of one attention chunk (Llama 4's attention_chunk_size)


def make_config(spec: TinySpecModel, **overrides):  # -> transformers.Llama4TextConfig
    """Layers 0-2 chunked (RoPE), 3 full (NoPE); layer 1 mixture-of-experts."""
    import transformers

    return transformers.Llama4TextConfig(
        **{
            **common_fields(spec),
            "head_dim": spec.head_dim,
            "intermediate_size_mlp": spec.intermediate_size,
            "attention_chunk_size": CHUNK,
            "moe_layers": [1] if spec.num_layers > 1 else [],
            "num_local_experts": 2,
            "floor_scale": 4,  # temperature tuning changes within the test lengths
            "attn_scale": 0.5,
            **overrides,
        }
    )


def _llama4_model(config, seed: int):
    import transformers

    return random_model(config, seed, transformers.Llama4ForCausalLM)


_LLAMA4_MODEL = frozenset({"embed_tokens", "layers", "norm", "rotary_emb"})
_LLAMA4_LAYER = frozenset(
    {"self_attn", "feed_forward", "input_layernorm", "post_attention_layernorm"}
)
_LLAMA4_ATTN = _PROJ | {"qk_norm"}
_LLAMA4_LAYER_TYPES = frozenset({"full_attention", "chunked_attention"})


def _check_llama4(model) -> None:
    """Llama 4's text model: the modules `Llama4TextForward` runs, and layer types it
    attends as kvbench's groups do (chunked local on RoPE layers, full otherwise)."""
    cfg = model.config
    types = set(cfg.layer_types or ())
    if not types <= _LLAMA4_LAYER_TYPES:
        raise ConfigError(
            f"llama4_text model: layer_types {sorted(types - _LLAMA4_LAYER_TYPES)} are not "
            f"implemented by the e2e runner (it attends {sorted(_LLAMA4_LAYER_TYPES)})"
        )
    for i, t in enumerate(cfg.layer_types or ()):
        if t == "chunked_attention" and not cfg.no_rope_layers[i]:
            raise ConfigError(
                f"llama4_text model: layer {i} is chunked but has no RoPE; transformers "
                "builds chunked attention on RoPE layers only"
            )
    inner = model.model
    levels: list[tuple[str, object, frozenset]] = [("model", inner, _LLAMA4_MODEL)]
    for i, layer in enumerate(inner.layers):
        levels.append((f"decoder layer {i}", layer, _LLAMA4_LAYER))
        levels.append((f"attention of layer {i}", layer.self_attn, _LLAMA4_ATTN))
    _check_modules("llama4_text", levels)


class Llama4TextForward:
    """Llama 4's text decoder on a packed ragged batch (see the module docstring)."""

    is_encoder_decoder = False

    def __init__(self, model) -> None:
        from transformers.models.llama4.modeling_llama4 import apply_rotary_emb

        check_spec_supported(model)
        self.model = model
        self._rotary = apply_rotary_emb
        cfg = model.config
        self.num_layers = cfg.num_hidden_layers
        self.num_q_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = int(model.model.layers[0].self_attn.head_dim)
        self.scale = float(model.model.layers[0].self_attn.scaling)

    def encoder_kv(self, encoder_input: torch.Tensor) -> list[KVPair]:
        raise ConfigError("llama4_text has no encoder")

    @torch.no_grad()
    def __call__(self, batch: PackedBatch, attention: GroupAttention) -> ForwardOutput:
        inner = self.model.model
        positions, h = embed_batch(inner, batch)
        t = h.shape[0]
        freqs = inner.rotary_emb(h, positions.unsqueeze(0))  # complex [1, T, D / 2]
        keys, values = [], []
        for layer, block in enumerate(inner.layers):
            attn = block.self_attn
            x = block.input_layernorm(h)
            q, k, v = project_qkv(attn, x, self.num_q_heads, self.num_kv_heads, self.head_dim)
            if attn.use_rope:
                q, k = self._rotary(q[None], k[None], freqs)
                q, k = q[0], k[0]
            if hasattr(attn, "qk_norm"):
                q, k = attn.qk_norm(q), attn.qk_norm(k)
            if attn.attn_temperature_tuning and not attn.use_rope:  # NoPE: scale by position
                steps = torch.floor((positions.float() + 1.0) / attn.floor_scale)
                q = (q * (torch.log1p(steps) * attn.attn_scale + 1.0).view(t, 1, 1)).to(q.dtype)
            q, k = q.contiguous(), k.contiguous()
            keys.append(k)
            values.append(v)
            o = attention(batch, layer, q, k, v)
            h = h + attn.o_proj(o.reshape(t, self.num_q_heads * self.head_dim))
            m = block.feed_forward(block.post_attention_layernorm(h))
            h = h + (m[0] if block.is_moe_layer else m)
        logits = self.model.lm_head(inner.norm(h))
        return ForwardOutput(torch.stack(keys), torch.stack(values), logits.float().cpu())


register_forward(
    "llama4_text",
    Llama4TextForward,
    _check_llama4,
    refused={
        "llama4": "Llama 4's vision tower and projector are not implemented by the e2e "
        "runner (decode its text model, model type llama4_text)"
    },
)


@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model():
    return _llama4_model(make_config(TINY), TINY.seed)


def _assert_matches_hf(model, run: sc.Run) -> None:
    result = sc.compare(model, run.results, run.expect)
    assert not result.problems, "kvbench decode differs from transformers:\n" + "\n".join(
        result.problems
    )
    assert result.positions > 0


def test_the_groups_are_read_from_the_llama4_config(model) -> None:
    """RoPE layers 0-2 chunked local of 8 tokens, the NoPE layer 3 full attention."""
    got = [(g.spec, g.layer_ids) for g in model_kv_spec(model).groups]
    chunked = KVCacheSpec.chunked_local(CHUNK)
    assert got == [(chunked, (0,)), (chunked, (1,)), (chunked, (2,)), (KVCacheSpec.full(), (3,))]


def test_hf_masks_by_chunk(model) -> None:
    """The oracle really is chunked: past the first chunk, HF's logits differ from the
    same weights with full attention everywhere (and agree inside the first chunk)."""
    full = _llama4_model(make_config(TINY, attention_chunk_size=None), TINY.seed)
    tokens = sc.prompts(3, [20], model.config.vocab_size)[0]
    a, b = hf_logits(model, tokens), hf_logits(full, tokens)
    torch.testing.assert_close(a[:CHUNK], b[:CHUNK])
    assert not torch.allclose(a[CHUNK:], b[CHUNK:], atol=1e-3)


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
    odd = _llama4_model(make_config(TINY, layer_types=["sliding_attention"] * 4), 0)
    with pytest.raises(ConfigError, match="sliding_attention"):
        spec_forward(odd)
    nope = _llama4_model(make_config(TINY, no_rope_layers=[1, 1, 0, 0],
                                    layer_types=["chunked_attention"] * 4), 0)  # fmt: skip
    with pytest.raises(ConfigError, match="layer 2 is chunked but has no RoPE"):
        spec_forward(nope)
    extra = _llama4_model(make_config(TINY), 0)
    extra.model.layers[0].self_attn.add_module("rel_bias", torch.nn.Identity())
    with pytest.raises(ConfigError, match="rel_bias"):
        spec_forward(extra)
    with pytest.raises(ConfigError, match="chunk=8 is not a multiple of block_size=16"):
        LayerGroupsPagedCache(model_kv_spec(model), num_blocks=8, block_size=16)


def test_register_forward_refuses_a_built_in_type_and_lists_what_it_added() -> None:
    """A built-in architecture (or a refused one) cannot be replaced by registration; the
    runner's refusal of an unknown model type lists the added ones with the built-ins."""
    for taken in ("llama", "gemma2", "t5"):
        with pytest.raises(ConfigError, match=f"model type {taken!r} has a built-in"):
            register_forward(taken, Llama4TextForward, _check_llama4)

    class _Unknown:
        class config:  # stands in for a transformers config
            model_type = "mamba"

    with pytest.raises(ConfigError, match="llama4_text"):
        check_spec_supported(_Unknown())
