"""End-to-end conformance of KV cache specs: tiny HF models decoding through layer groups.

Three tiny random-weight Hugging Face models (built in code, float32, nothing downloaded;
`suites/e2e/spec_models.py`) decode through kvbench's `LayerGroupsPagedCache` with the
layer groups kvbench reads from their own HF configs (`workloads.hf_spec`):

* `sliding_window-mistral`: Mistral, every layer windowed (window 7, shorter than every
  long sequence here: blocks are released mid-sequence, table entries -1);
* `hybrid-gemma2`: Gemma 2, 4 layers alternating local (window 6) and global attention,
  two groups of two layers over one pool; its query scaling (`query_pre_attn_scalar`
  24, not head_dim 16), scaled embedding, extra norms and final logit soft-cap run as
  HF's; attention-score soft-capping is refused by name (the kernels cannot apply it);
* `cross_attention-whisper`: Whisper, decoder self-attention paged (full), the
  cross-attention K/V of HF's encoder output written once at admission into the cross
  group's blocks (13 encoder tokens: a partial block at every block size here).

Oracle: HF's own forward over each whole sequence (its attention, masks and
cross-attention). Every case demands HF's greedy tokens and, per generated position,
logits within the Llama check's tolerance (relative 1e-5; about 7e-7 measured), in the
Llama check's scenarios: a ragged batch with late arrivals (the reference cache with the
float64 oracle, and the paged cache with the paged kernels at block sizes 1, 4 and 16),
chunked prefill, shared prefixes served from the prefix cache (under a window only the
blocks the rule of `workloads.spec_prefix` names are needed), parallel sampling through
fork, preemption by swap and by recompute. One deliberately broken setup per model kind
(a wrong window, local and global layers swapped, a wrong cross-attention block, and
prefix hits across different encoder inputs) fails these same checks.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kvbench.kernels.validation import IndexRangeError
from kvbench.paged.layer_groups import NULL_BLOCK, LayerGroupsPagedCache
from kvbench.reference.oracle import relative_error
from kvbench.suites.e2e import spec_checks as sc
from kvbench.suites.e2e.llama_forward import pack
from kvbench.suites.e2e.spec_attention import GroupNativeAttention, GroupOracleAttention
from kvbench.suites.e2e.spec_forward import LayerMap, spec_forward
from kvbench.suites.e2e.spec_models import build_spec_model, model_kv_spec
from kvbench.workloads.kv_spec import KVCacheSpec, LayerGroup, ModelKVSpec

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="the end-to-end suite needs `transformers` (the `test` extra installs it)",
)

LABELS = list(sc.SPEC_MODELS)
WINDOWED = ("sliding_window-mistral", "hybrid-gemma2")


@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    """One intra-op thread: these tensors are tiny, and threads only contend on 2 cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=LABELS)
def label(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def model(label):
    return build_spec_model(sc.spec_of(label))


def assert_matches_hf(model, run: sc.Run) -> sc.Comparison:
    result = sc.compare(model, run.results, run.expect)
    assert not result.problems, "kvbench decode differs from transformers:\n" + "\n".join(
        result.problems
    )
    assert result.positions > 0
    return result


def check_paged(cache) -> None:
    if isinstance(cache, LayerGroupsPagedCache):
        assert cache.request_ids() == []
        cache.check()


# --------------------------------------------------------------------------- the model
def test_kv_spec_read_from_the_hf_config(label: str, model) -> None:
    """The groups kvbench serves are the model's: Mistral one windowed group, Gemma 2 its
    local layers (0, 2) windowed and global ones (1, 3) full, Whisper a full self group and
    a cross group of the encoder length."""
    spec = model_kv_spec(model)
    got = [(g.spec, g.layer_ids) for g in spec.groups]
    tiny = sc.spec_of(label)
    if label == "sliding_window-mistral":
        assert got == [(KVCacheSpec.sliding_window(tiny.window), (0, 1))]
    elif label == "hybrid-gemma2":
        assert got == [
            (KVCacheSpec.sliding_window(tiny.window), (0, 2)),
            (KVCacheSpec.full(), (1, 3)),
        ]
    else:
        assert got == [
            (KVCacheSpec.full(), (0, 1)),
            (KVCacheSpec.cross_attention(tiny.encoder_len), (0, 1)),
        ]


@pytest.mark.parametrize("windowed", WINDOWED)
def test_the_oracle_agrees_with_hf_generate(windowed: str) -> None:
    """The oracle (HF's forward over the whole sequence, its masks) decodes what HF's own
    `generate` does with its own KV cache (its sliding-window layers keep only the window):
    the same greedy tokens past the window, logits within the tolerance. (Whisper's
    generate adds task and timestamp logic of its own, so it is not used as an oracle.)"""
    from kvbench.suites.e2e.tiny_llama import hf_greedy

    model = build_spec_model(sc.spec_of(windowed))
    prompt = sc.prompts(7, [9], model.config.vocab_size)[0]
    gen = hf_greedy(model, prompt, 12)
    full = sc.hf(model, (*prompt, *gen.tokens[:-1]), None)[len(prompt) - 1 :]
    assert tuple(int(t) for t in full.argmax(-1)) == gen.tokens
    assert relative_error(full, gen.logits) <= sc.LOGIT_TOL


@pytest.mark.parametrize("engine", ["oracle", "native"])
def test_forward_matches_hf_forward_on_every_position(label: str, model, engine: str) -> None:
    """The packed forward (HF modules, layer-group attention) equals HF's forward at every
    position of a ragged pair of prompts longer than the window, before any decoding."""
    ps = sc.prompts(3, [13, 29], model.config.vocab_size)
    encs = sc._encoders(model, 2, 3)
    fwd = spec_forward(model)
    cache = sc.make_cache(model, 4, 64, reference=engine == "oracle")
    layers = LayerMap.of(cache.model, fwd)
    for rid, enc in zip("ab", encs, strict=True):
        kv = []
        for g in cache.model.cross_groups:
            per_layer = fwd.encoder_kv(enc)  # type: ignore[arg-type]
            ids = layers.group_layers(g, cross=True)
            kv.append(
                (
                    torch.stack([per_layer[i][0] for i in ids]),
                    torch.stack([per_layer[i][1] for i in ids]),
                )
            )
        cache.admit(rid, kv)
    attention = (
        GroupOracleAttention(cache, layers, fwd.scale)
        if engine == "oracle"
        else GroupNativeAttention(cache, layers, fwd.scale, "torch")
    )
    batch = pack(["a", "b"], ps, [0, 0], [None, None])
    ours = fwd(batch, attention).logits
    for p, enc, start in zip(ps, encs, batch.starts, strict=True):
        theirs = sc.hf(model, p, enc)
        err = relative_error(ours[start : start + len(p)], theirs)
        assert err <= sc.LOGIT_TOL, f"{engine}: relative error {err:.3g}"


# --------------------------------------------------------------------------- scenarios
RAGGED = [("reference", 4), ("paged", 1), ("paged", 4), ("paged", 16)]


@pytest.mark.parametrize(("kind", "block_size"), RAGGED)
def test_ragged_batch_matches_hf(label: str, model, kind: str, block_size: int) -> None:
    reference = kind == "reference"
    cache = sc.make_cache(model, block_size, 512, reference=reference)
    run = sc.ragged(model, cache, write_attention="oracle" if reference else "native")
    assert_matches_hf(model, run)
    check_paged(cache)
    if not reference and label in WINDOWED:
        assert run.runner.adapter.max_released > 0, "no block left a window: test too short"
    if label == "cross_attention-whisper":
        assert run.runner.adapter.cross_admissions == len(run.expect)


@pytest.mark.parametrize(("block_size", "chunk"), [(4, 5), (16, 7)])
def test_chunked_prefill_matches_hf(label: str, model, block_size: int, chunk: int) -> None:
    """Prompts computed `chunk` tokens per step, each chunk reading (through the windowed
    prefill kernel where the group is windowed) what the cache holds of the earlier ones."""
    cache = sc.make_cache(model, block_size, 512)
    run = sc.ragged(model, cache, prefill_chunk=chunk)
    assert_matches_hf(model, run)
    partial = sum(-(-len(p) // chunk) - 1 for p, _, _ in run.expect.values())
    assert run.runner.stats.partial_prefills == partial
    check_paged(cache)


@pytest.mark.parametrize("block_size", [4, 16])
def test_shared_prefix_hits_match_hf(label: str, model, block_size: int) -> None:
    cache = sc.make_cache(model, block_size, 512)
    run = sc.prefix(model, cache, block_size)
    assert_matches_hf(model, run)
    first = {rid: hits[0] for rid, hits in run.runner.stats.hits.items()}
    for rid, least in run.min_hit.items():
        assert first[rid] >= least, f"{rid}: hit {first[rid]} < {least} tokens"
    assert first["salted"] == 0, "a request with another salt hit the prefix cache"
    assert first["aligned"] < len(run.expect["aligned"][0]), "the last token was not recomputed"
    if "other-encoder" in first:
        assert first["other-encoder"] == 0, "a request with another encoder input hit"
    if label in WINDOWED:  # a hit past the window: its table starts with released entries
        assert run.runner.adapter.hits_past_window > 0
    check_paged(cache)


@pytest.mark.parametrize("block_size", [4, 16])
def test_parallel_sampling_fork_matches_hf(label: str, model, block_size: int) -> None:
    cache = sc.make_cache(model, block_size, 512)
    run = sc.fork(model, cache, block_size)
    assert_matches_hf(model, run)
    assert run.runner.stats.forks == len(run.expect)
    check_paged(cache)


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_mid_decode_matches_hf(label: str, model, mode: str) -> None:
    lengths, new, blocks = sc.preemption_plan(model, 4)
    cache = sc.make_cache(model, 4, blocks)
    run = sc.preemption(model, cache, lengths, new, preemption=mode)
    assert_matches_hf(model, run)
    stats = run.runner.stats
    assert stats.preemptions > 0, "the pool was meant to be too small for the batch"
    if mode == "swap":
        assert stats.swaps_out == stats.swaps_in == stats.preemptions
    else:
        assert stats.recomputes == stats.preemptions
    check_paged(cache)


def test_hybrid_qwen2_max_window_layers_matches_hf() -> None:
    """Qwen2 with `max_window_layers`: layers 0-1 full, 2-3 windowed (window 6), served as
    two groups; a ragged batch and chunked prefill at block size 4."""
    from kvbench.suites.e2e.spec_models import TinySpecModel

    model = build_spec_model(TinySpecModel("qwen2", num_layers=4, window=6, seed=3))
    spec = model_kv_spec(model)
    assert [(g.spec.window, g.layer_ids) for g in spec.groups] == [(None, (0, 1)), (6, (2, 3))]
    for chunk in (None, 5):
        cache = sc.make_cache(model, 4, 512)
        run = sc.ragged(model, cache, prefill_chunk=chunk)
        assert_matches_hf(model, run)
        assert run.runner.adapter.max_released > 0
        check_paged(cache)


# --------------------------------------------------------------------------- broken setups
def _regroup(spec: ModelKVSpec, groups: list[LayerGroup]) -> ModelKVSpec:
    return ModelKVSpec(spec.name + " (broken)", tuple(groups), spec.source)


def _wrong_window(model) -> sc.Run:
    """The windowed group served with a window two tokens short of the model's."""
    spec = model_kv_spec(model)
    g = spec.groups[0]
    wrong = LayerGroup(
        KVCacheSpec.sliding_window(g.spec.window - 2),  # type: ignore[operator]
        g.num_layers, g.num_kv_heads, g.head_dim, g.dtype, g.layer_ids,
    )  # fmt: skip
    cache = sc.make_cache(model, 4, 512, spec=_regroup(spec, [wrong]))
    return sc.ragged(model, cache)


def _swapped_local_global(model) -> sc.Run:
    """Gemma 2's local layers served as global and the global ones windowed."""
    spec = model_kv_spec(model)
    local, full = spec.groups
    swapped = [
        LayerGroup(local.spec, 2, local.num_kv_heads, local.head_dim, local.dtype, full.layer_ids),
        LayerGroup(full.spec, 2, full.num_kv_heads, full.head_dim, full.dtype, local.layer_ids),
    ]
    cache = sc.make_cache(model, 4, 512, spec=_regroup(spec, swapped))
    return sc.ragged(model, cache)


class WrongCrossBlockCache(LayerGroupsPagedCache):
    """Admission writes the encoder K/V, then fills the cross group's second block from
    its first (a wrong cross-attention block; merely permuting whole blocks would go
    unseen: cross-attention is unmasked, so key order does not matter)."""

    def admit(self, request_id, encoder_kv=(), *, prompt=None, salt=None) -> int:
        hit = super().admit(request_id, encoder_kv, prompt=prompt, salt=salt)
        for g in self.model.cross_groups:
            blocks = self.block_table(request_id, g)
            self.k[:, blocks[1]] = self.k[:, blocks[0]]
            self.v[:, blocks[1]] = self.v[:, blocks[0]]
        return hit


def _wrong_cross_block(model) -> sc.Run:
    cache = sc.make_cache(model, 4, 512, paged_cls=WrongCrossBlockCache)
    return sc.ragged(model, cache)


class TokensOnlyKeysCache(LayerGroupsPagedCache):
    """Broken on purpose: prefix-cache keys from decoder tokens and salt only, without
    the digest of the encoder K/V the real cache adds."""

    def _prefix_salt(self, salt, encoder_kv):
        return salt


def _encoder_not_keyed(model) -> sc.Run:
    """Prefix caching keyed by decoder tokens only (neither the cache nor the runner adds
    the encoder's digest): `other-encoder` hits the first request's self-attention
    blocks, computed under another encoder output."""
    cache = sc.make_cache(model, 4, 512, paged_cls=TokensOnlyKeysCache)
    run = sc.prefix(model, cache, 4, key_encoder=False)
    assert run.runner.stats.hits["other-encoder"][0] > 0
    return run


BROKEN = {
    "sliding_window-mistral": {"window-two-short": _wrong_window},
    "hybrid-gemma2": {"local-global-swapped": _swapped_local_global},
    "cross_attention-whisper": {
        "wrong-cross-block": _wrong_cross_block,
        "prefix-hit-across-encoder-inputs": _encoder_not_keyed,
    },
}


BROKEN_CASES = [(label, name) for label, cases in BROKEN.items() for name in cases]


@pytest.mark.parametrize(("broken_label", "name"), BROKEN_CASES)
def test_broken_setup_is_caught(broken_label: str, name: str) -> None:
    """The same scenarios and checks that pass above fail on a deliberately broken setup."""
    model = build_spec_model(sc.spec_of(broken_label))
    run = BROKEN[broken_label][name](model)
    result = sc.compare(model, run.results, run.expect)
    assert result.problems, f"the broken setup {name!r} went unnoticed"


class EarlyReleaseCache(LayerGroupsPagedCache):
    """A windowed group that releases blocks one position too early (the release rule's
    off-by-one): the block holding the newest query's first window position is dropped."""

    def _plan(self, group, table, n):  # type: ignore[no-untyped-def]
        release, cow, new = super()._plan(group, table, n)
        rule = self.rules[group]
        if not rule.bounded:
            return release, cow, new
        keep = rule.first_kept(table.seq_len) + 1
        bs = self.block_size
        early = [j for j, b in enumerate(table.blocks) if b != NULL_BLOCK and (j + 1) * bs <= keep]
        return early, cow, new


def test_sliding_window_release_one_position_early_is_caught() -> None:
    """The cache's read check (or the kernels' index check behind it) names the released
    block a window still reads."""
    model = build_spec_model(sc.spec_of("sliding_window-mistral"))
    cache = sc.make_cache(model, 4, 512, paged_cls=EarlyReleaseCache)
    with pytest.raises(IndexRangeError, match=r"was released|block -1"):
        sc.ragged(model, cache)


def test_every_model_kind_has_a_broken_setup() -> None:
    assert set(BROKEN) == set(sc.SPEC_MODELS)
    assert all(BROKEN.values())


# --------------------------------------------------------------------------- refused by name
def _tiny(config_name: str, model_name: str, **fields):  # type: ignore[no-untyped-def]
    import transformers

    config = getattr(transformers, config_name)(**fields)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return getattr(transformers, model_name)(config).float().eval()


_SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8)  # fmt: skip


@pytest.mark.parametrize(
    ("config_name", "model_name", "fields", "names"),
    [
        # Gemma 2's attention-score soft-cap: a tanh before the softmax the kernels lack
        ("Gemma2Config", "Gemma2ForCausalLM", {**_SMALL, "attn_logit_softcapping": 50.0},
         r"attn_logit_softcapping=50\.0"),
        # T5's relative position bias is added to the attention scores
        ("T5Config", "T5ForConditionalGeneration",
         {"vocab_size": 64, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 1,
          "num_heads": 4}, "relative position bias"),
        ("Gemma3TextConfig", "Gemma3ForCausalLM", _SMALL, "Gemma 3"),
        ("BartConfig", "BartForConditionalGeneration",
         {"vocab_size": 64, "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
          "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
          "decoder_ffn_dim": 64}, "'bart' is not supported"),
        ("Qwen3Config", "Qwen3ForCausalLM", _SMALL, "'qwen3' is not supported"),
    ],
    ids=["gemma2-attn-softcap", "t5", "gemma3", "bart", "qwen3"],
)  # fmt: skip
def test_unmodeled_features_are_refused_by_name(
    config_name: str, model_name: str, fields: dict, names: str
) -> None:
    from kvbench.workloads.errors import ConfigError

    model = _tiny(config_name, model_name, **fields)
    with pytest.raises(ConfigError, match=names):
        spec_forward(model)


def test_whisper_scaled_embedding_is_refused() -> None:
    from kvbench.suites.e2e.spec_models import make_config, random_model
    from kvbench.workloads.errors import ConfigError

    model = random_model(
        make_config(sc.spec_of("cross_attention-whisper"), scale_embedding=True), 0
    )
    with pytest.raises(ConfigError, match="scale_embedding"):
        spec_forward(model)


def test_runner_rejects_bad_configuration(label: str, model) -> None:
    """Groups that do not place every layer, KV shapes not the model's, a missing or
    needless encoder input, an unknown engine: ConfigError naming it, nothing admitted."""
    from kvbench.suites.e2e.llama_runner import GenerationRequest
    from kvbench.suites.e2e.spec_runner import SpecCacheRunner
    from kvbench.workloads.errors import ConfigError

    spec = model_kv_spec(model)
    g = spec.groups[0]
    short = LayerGroup(g.spec, 1, g.num_kv_heads, g.head_dim, g.dtype, g.layer_ids[:1])
    with pytest.raises(ConfigError, match="layers"):
        SpecCacheRunner(model, sc.make_cache(model, 4, 64, spec=_regroup(spec, [short])))
    wide = [
        LayerGroup(x.spec, x.num_layers, x.num_kv_heads * 2, x.head_dim, x.dtype, x.layer_ids)
        for x in spec.groups
    ]
    with pytest.raises(ConfigError, match="KV heads"):
        SpecCacheRunner(model, sc.make_cache(model, 4, 64, spec=_regroup(spec, wide)))
    cache = sc.make_cache(model, 4, 64)
    with pytest.raises(ConfigError, match="kernels"):
        SpecCacheRunner(model, cache, write_attention="kernels")
    runner = SpecCacheRunner(model, cache)
    enc = torch.zeros(3)
    wrong = GenerationRequest(
        "x", (5, 6), 2, encoder_input=None if model.config.is_encoder_decoder else enc
    )
    with pytest.raises(ConfigError, match="encoder"):
        runner.submit(wrong)
    assert not runner.has_work() and cache.request_ids() == []


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_kernels_hybrid_gemma2_match_hf(monkeypatch) -> None:
    """The smallest hybrid case with Triton kernels under the interpreter everywhere: the
    cache's writes and copy-on-write, the windowed and full prefill of the write pass, the
    windowed and full decode of the read pass (a fork; prompts past the window)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from kvbench.suites.e2e.llama_runner import GenerationRequest
    from kvbench.suites.e2e.spec_runner import SpecCacheRunner

    model = build_spec_model(sc.spec_of("hybrid-gemma2"))
    cache = sc.make_cache(model, 4, 64)
    ps = sc.prompts(41, [5, 11], model.config.vocab_size)
    top = torch.topk(sc.hf(model, ps[0], None)[-1], 2).indices.tolist()
    reqs = [
        GenerationRequest("a", ps[0], 3, branch_tokens=tuple(top)),
        GenerationRequest("b", ps[1], 3),
    ]
    runner = SpecCacheRunner(model, cache, kernel_backend="triton")
    results = runner.run(reqs)
    expect: sc.Expect = {("a", j): (ps[0], t, None) for j, t in enumerate(top)}
    expect["b"] = (ps[1], None, None)
    assert_matches_hf(model, sc.Run(results, expect, runner))
    assert runner.adapter.max_released > 0
    check_paged(cache)
