"""End-to-end conformance: a real (tiny, random-weight) Llama decoding through kvbench.

Oracle: Hugging Face transformers' own `generate(do_sample=False)` with its own KV cache
and attention, code nobody here wrote. The model under test is the same HF model whose
layers run in a packed ragged batch with kvbench's cache holding K/V and kvbench's
attention reading it (see suites/e2e/llama_forward.py for why a forward of our own rather
than HF's attention-interface hook, and suites/e2e/llama_runner.py for the loop).

Every case demands the same greedy tokens as HF and, per generated position, logits
within `LOGIT_TOL` relative error (float32; measured errors are about 5e-7). Cases:
    * a ragged batch of plain prompts, with a late arrival (mixed prefill + decode steps);
    * prompts sharing a system prefix, served from the prefix cache (a block-aligned
      prompt whose last token is recomputed, an identical prompt, a salted one that must
      not hit, and hits on freed-but-cached blocks);
    * chunked prefill (each chunk extends the KV of the earlier ones);
    * parallel sampling through fork, each branch forced down a different token and then
      compared with HF run on that branch's tokens (copy-on-write of the partial block);
    * preemption mid-decode by swap and by recompute in a pool too small for the batch;
    * block sizes 1, 16 and 32; the torch kernels, and Triton under the interpreter at
      the smallest size;
    * deliberately broken caches (an off-by-one slot, a prefix hit serving the wrong
      block, a fork without copy-on-write) fail these same checks.

KVBENCH_HYPOTHESIS_PROFILE=thorough runs more prompts, longer ones and more tokens.
"""

from __future__ import annotations

import copy
import importlib.util
import os
from collections.abc import Callable, Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.paged import PagedKVCache
from kvbench.reference.contiguous import ContiguousKVCache
from kvbench.reference.contract import KVCache
from kvbench.reference.oracle import relative_error
from kvbench.suites.e2e.llama_forward import KernelAttention, LlamaForward, OracleAttention, pack
from kvbench.suites.e2e.llama_runner import (
    GenerationRequest,
    LlamaCacheRunner,
    SequenceResult,
)
from kvbench.suites.e2e.tiny_llama import (
    GreedyResult,
    TinyLlamaSpec,
    build_tiny_llama,
    hf_greedy,
    kv_geometry,
)
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry

# transformers is imported lazily (by the model fixture): importing it costs seconds, and
# collecting the suite should not pay that when these tests are deselected.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="the end-to-end suite needs `transformers` (the `test` extra installs it)",
)

THOROUGH = os.environ.get("KVBENCH_HYPOTHESIS_PROFILE") == "thorough"

#: 2 layers, hidden 64, 4 query heads over 2 KV heads (GQA group 2), head_dim 16.
SPEC = TinyLlamaSpec(num_layers=2, hidden_size=64, num_q_heads=4, num_kv_heads=2, vocab_size=256)
#: A second shape for the thorough profile: 3 layers, 8 query heads over 1 KV head (MQA).
SPEC_MQA = TinyLlamaSpec(
    num_layers=3, hidden_size=128, num_q_heads=8, num_kv_heads=1, vocab_size=384, seed=7
)
SPECS = [SPEC, SPEC_MQA] if THOROUGH else [SPEC]

#: Per generated position: ||logits - hf|| / ||hf|| (float32 end to end; ~5e-7 measured).
LOGIT_TOL = 1e-5
BLOCK_SIZES = (1, 16, 32)
NEW_TOKENS = 24 if THOROUGH else 8


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    """One intra-op thread: these tensors are tiny, and threads only contend on 2 cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=SPECS, ids=lambda s: f"L{s.num_layers}-kv{s.num_kv_heads}")
def model(request):
    return build_tiny_llama(request.param)


_HF_CACHE: dict[tuple[int, tuple[int, ...], int], GreedyResult] = {}


def hf(model, prompt: Sequence[int], n: int) -> GreedyResult:
    """HF's greedy continuation of `prompt` (memoized per model, prompt and length)."""
    key = (id(model), tuple(prompt), n)
    if key not in _HF_CACHE:
        _HF_CACHE[key] = hf_greedy(model, prompt, n)
    return _HF_CACHE[key]


def prompts(seed: int, lengths: Sequence[int], vocab: int) -> list[tuple[int, ...]]:
    """Random prompts of the given lengths (fixed seed)."""
    gen = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(0, vocab, (n,), generator=gen).tolist()) for n in lengths]


# --------------------------------------------------------------------------- caches
def make_cache(
    kind: str,
    model,
    block_size: int,
    capacity_tokens: int,
    *,
    max_seq_len: int = 160,
    policy: str = "max",
    backend: str | None = "torch",
    paged_cls: type[PagedKVCache] = PagedKVCache,
    device: torch.device | str = "cpu",
) -> KVCache:
    """A cache of `kind` ("contiguous" or "paged") for `model`, holding about
    `capacity_tokens` token slots on the device (the paged one rounds up to blocks)."""
    geometry = kv_geometry(model)
    if kind == "contiguous":
        return ContiguousKVCache(geometry, capacity_tokens, max_seq_len, policy=policy)
    num_blocks = -(-capacity_tokens // block_size)
    return paged_cls(
        geometry,
        num_blocks,
        block_size,
        max_seq_len=max_seq_len,
        num_cpu_blocks=4 * num_blocks,
        kernel_backend=backend,
        device=device,
    )


# --------------------------------------------------------------------------- comparison
def mismatches(
    model, results: dict, expect: dict[object, tuple[tuple[int, ...], int | None]]
) -> list[str]:
    """Differences between each result and HF.

    expect maps a sequence id to (prompt, forced first token or None). A sequence with a
    forced first token is a fork branch: its first logits are HF's for the prompt, its
    first token is the forced one, and the rest must be HF's greedy continuation of
    prompt + [forced].
    """
    problems = []
    for sid, (prompt, forced) in expect.items():
        res: SequenceResult | None = results.get(sid)
        if res is None:
            problems.append(f"{sid!r}: no result")
            continue
        n = len(res.tokens)
        first = hf(model, prompt, 1 if forced is not None else n)
        if forced is None:
            want_tokens, want_logits = first.tokens, first.logits
        else:
            rest = hf(model, (*prompt, forced), n - 1) if n > 1 else None
            want_tokens = (forced, *(rest.tokens if rest else ()))
            want_logits = torch.cat([first.logits[:1], *([rest.logits] if rest else [])])
        if res.prompt != tuple(prompt):
            problems.append(f"{sid!r}: prompt {res.prompt} != {tuple(prompt)}")
        if res.tokens != want_tokens:
            diff = [
                j for j, (a, b) in enumerate(zip(res.tokens, want_tokens, strict=False)) if a != b
            ]
            i = min([*diff, len(want_tokens) - 1])
            top2 = torch.topk(want_logits[i], 2).values
            problems.append(
                f"{sid!r}: tokens {res.tokens} != HF {want_tokens} (first at step {i}; "
                f"HF's top-2 logit margin there {float(top2[0] - top2[1]):.3g})"
            )
        for i in range(min(len(res.logits), len(want_logits))):
            err = relative_error(res.logits[i], want_logits[i])
            if not err <= LOGIT_TOL:  # NaN fails too
                problems.append(f"{sid!r}: step {i} logits relative error {err:.3g}")
                break
    return problems


def assert_matches_hf(model, results: dict, expect: dict) -> None:
    problems = mismatches(model, results, expect)
    assert not problems, "kvbench decode differs from transformers:\n" + "\n".join(problems)


# --------------------------------------------------------------------------- scenarios
def ragged_scenario(model, cache: KVCache, **runner_kw) -> tuple[dict, dict, LlamaCacheRunner]:
    """Ragged prompts decoded together; two arrive after two steps (mixed batches)."""
    vocab = model.config.vocab_size
    lengths = [3, 16, 17, 40, 1, 33] if not THOROUGH else [1, 2, 5, 15, 16, 17, 31, 33, 64, 97]
    ps = prompts(11, lengths, vocab)
    reqs = [GenerationRequest(f"r{i}", p, NEW_TOKENS) for i, p in enumerate(ps)]
    runner = LlamaCacheRunner(model, cache, **runner_kw)
    early, late = reqs[:-2], reqs[-2:]
    for r in early:
        runner.submit(r)
    runner.step()
    runner.step()
    results = runner.run(late)
    return results, {r.request_id: (r.prompt, None) for r in reqs}, runner


def prefix_scenario(
    model, cache: KVCache, block_size: int, **runner_kw
) -> tuple[dict, dict, LlamaCacheRunner, dict[str, int]]:
    """Requests sharing a system prefix: returns also each request's minimum prefix hit
    (in tokens) that a prefix-caching cache must serve on its first admission."""
    vocab = model.config.vocab_size
    bs = block_size
    system, u1, u2, u3 = prompts(5, [2 * bs + 3, 7, 4, 9], vocab)
    reqs = {
        "first": system + u1,  # computes the prefix
        "same-suffix": system + u2,  # hits the full blocks of the prefix
        "identical": system + u1,  # hits all full blocks; recomputes the tail
        "aligned": system[: 2 * bs],  # all full blocks: the last token is recomputed
        "one-past": system[: 2 * bs + 1],  # hits 2 blocks, recomputes one token
        "salted": system + u2,  # another salt: must not hit
    }
    min_hit = {
        "first": 0,
        "same-suffix": 2 * bs,
        "identical": 2 * bs,
        "aligned": bs,
        "one-past": 2 * bs,
        "salted": 0,
    }
    runner = LlamaCacheRunner(model, cache, **runner_kw)
    runner.submit(GenerationRequest("first", reqs["first"], NEW_TOKENS))
    runner.step()  # the prefix is now in the cache (and the first request still running)
    for name in ("same-suffix", "identical", "aligned", "one-past"):
        runner.submit(GenerationRequest(name, reqs[name], NEW_TOKENS))
    runner.submit(GenerationRequest("salted", reqs["salted"], NEW_TOKENS, salt="tenant-b"))
    results = runner.run()
    # Everything is freed now; the prefix blocks stay cached and must still serve hits.
    reqs["after-free"] = system + u3
    min_hit["after-free"] = 2 * bs
    results.update(runner.run([GenerationRequest("after-free", reqs["after-free"], NEW_TOKENS)]))
    return results, {k: (p, None) for k, p in reqs.items()}, runner, min_hit


def fork_scenario(
    model, cache: KVCache, block_size: int, **runner_kw
) -> tuple[dict, dict, LlamaCacheRunner]:
    """Parallel sampling: each prompt forks into 3 branches forced down its top-3 tokens."""
    vocab = model.config.vocab_size
    bs = block_size
    lengths = [bs + 5, 2 * bs] + ([3 * bs + 1, 7] if THOROUGH else [])
    ps = prompts(23, lengths, vocab)
    reqs, expect = [], {}
    for i, p in enumerate(ps):
        top = torch.topk(hf(model, p, 1).logits[0], 3).indices.tolist()
        reqs.append(GenerationRequest(f"p{i}", p, NEW_TOKENS, branch_tokens=tuple(top)))
        for j, token in enumerate(top):
            expect[(f"p{i}", j)] = (p, token)
    runner = LlamaCacheRunner(model, cache, **runner_kw)
    return runner.run(reqs), expect, runner


def preemption_plan(block_size: int) -> tuple[list[int], int, int]:
    """(prompt lengths, new tokens, pool blocks): the pool holds the largest request
    whole but not the batch, so decoding must preempt."""
    lengths = [5, 9, 3] + ([12, 2] if THOROUGH else [])
    new = block_size + 8 if block_size > 1 else 9
    need = [-(-(n + new) // block_size) for n in lengths]
    return lengths, new, max(need) + 1


def preemption_scenario(
    model, cache: KVCache, lengths: Sequence[int], new: int, **runner_kw
) -> tuple[dict, dict, LlamaCacheRunner]:
    ps = prompts(31, lengths, model.config.vocab_size)
    reqs = [GenerationRequest(f"q{i}", p, new) for i, p in enumerate(ps)]
    runner = LlamaCacheRunner(model, cache, **runner_kw)
    return runner.run(reqs), {r.request_id: (r.prompt, None) for r in reqs}, runner


# --------------------------------------------------------------------------- tests
def test_forward_matches_hf_forward_on_every_position(model) -> None:
    """The packed forward (HF modules, kvbench attention) equals HF's own forward at every
    position of a ragged pair of prompts, before any cache is involved."""
    ps = prompts(3, [13, 29], model.config.vocab_size)
    fwd = LlamaForward(model)
    for engine in (OracleAttention(fwd.scale), KernelAttention(16, fwd.scale, "torch")):
        empty = torch.empty(model.config.num_hidden_layers, 0, fwd.num_kv_heads, fwd.head_dim)
        batch = pack(["a", "b"], ps, [0, 0], [(empty, empty), (empty, empty)])
        ours = fwd(batch, engine).logits
        for p, start in zip(ps, batch.starts, strict=True):
            with torch.no_grad():
                theirs = model(torch.tensor([p]), use_cache=False).logits[0].float()
            err = relative_error(ours[start : start + len(p)], theirs)
            assert err <= LOGIT_TOL, f"{type(engine).__name__}: relative error {err:.3g}"


def test_runner_rejects_bad_configuration(model) -> None:
    cache = make_cache("contiguous", model, 16, 256)
    with pytest.raises(ConfigError, match="bogus"):
        LlamaCacheRunner(model, cache, preemption="bogus")
    with pytest.raises(ConfigError, match="bogus"):
        LlamaCacheRunner(model, cache, write_attention="bogus")
    with pytest.raises(ConfigError, match="-1"):
        LlamaCacheRunner(model, cache, prefill_chunk=-1)
    with pytest.raises(ConfigError, match="ContiguousKVCache has none"):
        LlamaCacheRunner(model, cache, write_attention="native")
    wrong = KVGeometry(num_layers=5, num_kv_heads=2, head_dim=16, dtype="float32", num_q_heads=4)
    other = ContiguousKVCache(wrong, 64, 64)
    with pytest.raises(ConfigError, match="does not match"):
        LlamaCacheRunner(model, other)
    runner = LlamaCacheRunner(model, cache)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        runner.submit(GenerationRequest("x", (1, 2), 0))
    assert not runner.has_work()


RAGGED_CONFIGS = [
    ("contiguous", "oracle", 16),
    ("contiguous", "kernels", 16),
    ("paged", "oracle", 16),
    ("paged", "kernels", 16),
    *[("paged", "native", bs) for bs in BLOCK_SIZES],
]


def engine_for(kind: str) -> str:
    """The write-pass attention of the scenario tests: the paged kernels over the paged
    cache's own pool, or over a scratch pool of the contiguous cache's gathered KV."""
    return "native" if kind == "paged" else "kernels"


@pytest.mark.parametrize(("kind", "engine", "block_size"), RAGGED_CONFIGS)
def test_ragged_batch_matches_hf(model, kind: str, engine: str, block_size: int) -> None:
    cache = make_cache(kind, model, block_size, 2048)
    results, expect, _ = ragged_scenario(
        model, cache, write_attention=engine, block_size=block_size
    )
    assert_matches_hf(model, results, expect)
    assert cache.request_ids() == []
    if isinstance(cache, PagedKVCache):
        cache.check()


@pytest.mark.parametrize(
    ("kind", "block_size", "chunk"),
    [("contiguous", 16, 7), ("paged", 1, 5), ("paged", 16, 7), ("paged", 32, 16)],
)
def test_chunked_prefill_matches_hf(model, kind: str, block_size: int, chunk: int) -> None:
    """Prompts computed `chunk` tokens per step, each chunk extending the KV the cache
    holds from the earlier ones, next to decoding requests."""
    cache = make_cache(kind, model, block_size, 2048)
    results, expect, runner = ragged_scenario(
        model, cache, write_attention=engine_for(kind), prefill_chunk=chunk
    )
    assert_matches_hf(model, results, expect)
    partial = sum(-(-len(p) // chunk) - 1 for p, _ in expect.values())
    assert runner.stats.partial_prefills == partial


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_shared_prefix_hits_match_hf(model, kind: str, block_size: int) -> None:
    cache = make_cache(kind, model, block_size, 2048)
    results, expect, runner, min_hit = prefix_scenario(
        model, cache, block_size, write_attention=engine_for(kind)
    )
    assert_matches_hf(model, results, expect)
    first_hits = {rid: hits[0] for rid, hits in runner.stats.hits.items()}
    if kind == "paged":
        for rid, least in min_hit.items():
            assert first_hits[rid] >= least, f"{rid}: hit {first_hits[rid]} < {least} tokens"
        assert first_hits["salted"] == 0, "a request with another salt hit the prefix cache"
        assert first_hits["aligned"] < len(expect["aligned"][0]), (
            "the last token was not recomputed"
        )
        assert isinstance(cache, PagedKVCache)  # check() / cow_copies: paged only
        cache.check()
    else:
        assert set(first_hits.values()) == {0}


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_parallel_sampling_fork_matches_hf(model, kind: str, block_size: int) -> None:
    # The contiguous cache reserves max_seq_len per branch: room for 4 prompts x 3 branches.
    cache = make_cache(kind, model, block_size, 4096)
    results, expect, runner = fork_scenario(
        model, cache, block_size, write_attention=engine_for(kind)
    )
    assert_matches_hf(model, results, expect)
    assert runner.stats.forks == len(expect)
    branch_firsts: dict[str, set[int | None]] = {}
    for (parent, _), (_, forced) in expect.items():
        branch_firsts.setdefault(parent, set()).add(forced)
    assert all(len(f) == 3 for f in branch_firsts.values()), "branches must differ"
    if isinstance(cache, PagedKVCache):
        if block_size > 1:  # the bs+5 prompt leaves a shared partial block
            assert cache.cow_copies > 0
        cache.check()


@pytest.mark.parametrize("engine", ["kernels", "native"])
def test_preemption_by_swap_on_device_matches_hf(model, device: torch.device, engine: str) -> None:
    """Swap preemption with model and paged cache on `device` (on CUDA: the dispatch's
    compiled kernels, swap through the pinned pool; on a CPU the torch ops), with both
    write-pass engines."""
    backend = "torch" if device.type == "cpu" else None
    lengths, new, blocks = preemption_plan(16)
    cache = make_cache("paged", model, 16, blocks * 16, backend=backend, device=device)
    results, expect, runner = preemption_scenario(
        on_device(model, device), cache, lengths, new, write_attention=engine,
        preemption="swap", kernel_backend=backend, block_size=16,
    )  # fmt: skip
    assert_matches_hf(model, results, expect)
    assert runner.stats.swaps_out == runner.stats.swaps_in > 0
    assert isinstance(cache, PagedKVCache)  # check() / cow_copies: paged only
    cache.check()


PREEMPTION_CONFIGS = [("contiguous", 16)] + [("paged", bs) for bs in BLOCK_SIZES]


@pytest.mark.parametrize(("kind", "block_size"), PREEMPTION_CONFIGS)
@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_mid_decode_matches_hf(model, kind: str, mode: str, block_size: int) -> None:
    lengths, new, blocks = preemption_plan(block_size)
    if kind == "paged":
        cache = make_cache(kind, model, block_size, blocks * block_size)
    else:  # pow2 reservations outgrow a small arena and fail to relocate mid-decode
        cache = make_cache(kind, model, block_size, 64, max_seq_len=64, policy="pow2")
    results, expect, runner = preemption_scenario(
        model, cache, lengths, new, write_attention=engine_for(kind), preemption=mode,
        block_size=block_size,
    )  # fmt: skip
    assert_matches_hf(model, results, expect)
    stats = runner.stats
    assert stats.preemptions > 0, "the pool was meant to be too small for the batch"
    if mode == "swap":
        assert stats.swaps_out == stats.swaps_in == stats.preemptions
    else:
        assert stats.recomputes == stats.preemptions
    if isinstance(cache, PagedKVCache):
        cache.check()


def on_device(model, device: torch.device):
    """The model itself on the CPU; a copy of it on another device."""
    return model if device.type == "cpu" else copy.deepcopy(model).to(device)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_kernels_match_hf(model, device: torch.device, monkeypatch) -> None:
    """The smallest case end to end with Triton kernels (the interpreter on a CPU, the
    compiled kernels with model and cache on CUDA) both in the cache (write, copy-on-write,
    decode attention) and in the write pass (prefill)."""
    if device.type == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    runs_on = on_device(model, device)
    cache = make_cache("paged", model, 16, 256, backend="triton", device=device)
    ps = prompts(41, [5, 18], model.config.vocab_size)
    top = torch.topk(hf(model, ps[0], 1).logits[0], 2).indices.tolist()
    reqs = [
        GenerationRequest("a", ps[0], 3, branch_tokens=tuple(top)),
        GenerationRequest("b", ps[1], 3),
    ]
    runner = LlamaCacheRunner(runs_on, cache, "native", kernel_backend="triton")
    results = runner.run(reqs)
    expect = {("a", j): (ps[0], t) for j, t in enumerate(top)} | {"b": (ps[1], None)}
    assert_matches_hf(model, results, expect)
    assert isinstance(cache, PagedKVCache)  # check() / cow_copies: paged only
    assert cache.cow_copies > 0
    cache.check()


@st.composite
def workloads(draw, vocab: int):
    """A random workload: block size, requests (some sharing a system prefix, some
    forking into branches, some arriving late), a preemption mode and a pool that is
    at times too small for the batch."""
    bs = draw(st.sampled_from(BLOCK_SIZES))
    system = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=2 * bs + 4))
    reqs = []
    for i in range(draw(st.integers(1, 4))):
        shared = draw(st.integers(0, len(system)))
        suffix = draw(st.lists(st.integers(0, vocab - 1), min_size=0 if shared else 1, max_size=20))
        new = draw(st.integers(1, 6))
        branches = draw(
            st.none() | st.lists(st.integers(0, vocab - 1), min_size=1, max_size=3).map(tuple)
        )
        arrival = draw(st.integers(0, 3))
        reqs.append((arrival, GenerationRequest(f"w{i}", (*system[:shared], *suffix), new,
                                                branch_tokens=branches)))  # fmt: skip
    mode = draw(st.sampled_from(["swap", "recompute"]))
    chunk = draw(st.none() | st.integers(1, 24))
    need = max(-(-(len(r.prompt) + r.max_new_tokens) // bs) for _, r in reqs) + 1
    blocks = need + draw(st.integers(0, 3 * need))
    return bs, reqs, mode, chunk, blocks


@settings(max_examples=60 if THOROUGH else 4)
@given(data=st.data())
def test_random_workloads_match_hf(model, data) -> None:
    """Hypothesis draws workloads mixing every case at once on the paged cache."""
    bs, reqs, mode, chunk, blocks = data.draw(workloads(model.config.vocab_size))
    cache = make_cache("paged", model, bs, blocks * bs)
    runner = LlamaCacheRunner(model, cache, "native", preemption=mode, prefill_chunk=chunk)
    expect: dict = {}
    for step in range(4):
        for arrival, r in reqs:
            if arrival == step:
                runner.submit(r)
                forced = r.branch_tokens or (None,)
                keys = (
                    [(r.request_id, j) for j in range(len(forced))]
                    if r.branch_tokens
                    else [r.request_id]
                )
                expect.update({k: (r.prompt, f) for k, f in zip(keys, forced, strict=True)})
        if runner.has_work():
            runner.step()
    results = runner.run()
    assert_matches_hf(model, results, expect)
    assert cache.request_ids() == []
    assert isinstance(cache, PagedKVCache)  # check() / cow_copies: paged only
    cache.check()


# --------------------------------------------------------------------------- broken caches
class OffByOneSlotCache:
    """A cache whose appends land one slot late: token i of an append gets the K/V of
    token i-1 (the first is written twice) - the classic slot-mapping off-by-one."""

    def __init__(self, inner: KVCache) -> None:
        self._inner = inner

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def append(self, request_id, keys, values, token_ids=None) -> None:
        keys = torch.cat([keys[:, :1], keys[:, :-1]], dim=1)
        values = torch.cat([values[:, :1], values[:, :-1]], dim=1)
        self._inner.append(request_id, keys, values, token_ids)


class WrongBlockPrefixCache(PagedKVCache):
    """A paged cache whose prefix hits serve the first hit block twice: the second block
    of a shared prefix is read from the first one's KV."""

    def _match(self, prompt, extra, chain=None):
        keys, hits = super()._match(prompt, extra, chain)
        if len(hits) >= 2:
            hits = [hits[0], hits[0], *hits[2:]]
        return keys, hits


class NoCopyOnWriteCache(PagedKVCache):
    """A paged cache that writes into a shared partial block in place (no copy-on-write),
    so one fork branch overwrites its siblings' newest tokens."""

    def _growth(self, req, n):
        fresh, _ = super()._growth(req, n)
        return fresh, False


class SwapInWrongBlockCache(PagedKVCache):
    """A paged cache whose swap_in fills the request's second block from its first CPU
    block (a wrong swap mapping). (Merely permuting a request's blocks would go unseen:
    keys are rotated before caching, so attention does not depend on block order.)"""

    def swap_in(self, request_id) -> None:
        super().swap_in(request_id)
        blocks = self.block_table(request_id)
        if len(blocks) >= 2:
            for layer in range(self.geometry.num_layers):
                for pool in (self.key_cache(layer), self.value_cache(layer)):
                    pool[blocks[1]] = pool[blocks[0]]


def _broken_ragged(model, block_size: int):
    cache = OffByOneSlotCache(make_cache("paged", model, block_size, 2048))
    results, expect, _ = ragged_scenario(model, cache, write_attention="native")
    return results, expect


def _broken_contiguous(model, block_size: int):
    cache = OffByOneSlotCache(make_cache("contiguous", model, block_size, 2048))
    results, expect, _ = ragged_scenario(model, cache, write_attention="oracle")
    return results, expect


def _broken_prefix(model, block_size: int):
    cache = make_cache("paged", model, block_size, 2048, paged_cls=WrongBlockPrefixCache)
    results, expect, _, _ = prefix_scenario(model, cache, block_size, write_attention="native")
    return results, expect


def _broken_fork(model, block_size: int):
    cache = make_cache("paged", model, block_size, 2048, paged_cls=NoCopyOnWriteCache)
    results, expect, _ = fork_scenario(model, cache, block_size, write_attention="native")
    return results, expect


def _broken_swap(model, block_size: int):
    lengths, new, blocks = preemption_plan(1)  # block size 1: many blocks per request
    cache = make_cache("paged", model, 1, blocks, paged_cls=SwapInWrongBlockCache)
    results, expect, runner = preemption_scenario(
        model, cache, lengths, new, write_attention="native", preemption="swap"
    )
    assert runner.stats.swaps_in > 0
    return results, expect


BROKEN: dict[str, Callable] = {
    "off-by-one-slot-paged": _broken_ragged,
    "off-by-one-slot-contiguous": _broken_contiguous,
    "prefix-hit-wrong-block": _broken_prefix,
    "fork-without-copy-on-write": _broken_fork,
    "swap-in-wrong-block": _broken_swap,
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_cache_is_caught(model, name: str) -> None:
    """The same scenarios and checks that pass above fail on a deliberately broken cache."""
    results, expect = BROKEN[name](model, 16)
    problems = mismatches(model, results, expect)
    assert problems, f"the broken cache {name!r} went unnoticed"
