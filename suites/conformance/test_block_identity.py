"""The vllm-v1 replay's identity keys (`paged.block_identity`) change nothing but speed.

The property that makes them exact: over described prompts of one `bt`, two blocks get
equal keys from `DescribedIdentities` iff they get equal `block_key` chain keys from the
prompts' listed ids (checked for every pair of positions, tails of outputs included).
Then the replays: the memory-only vllm-v1 engine keyed by identities against the same
engine keyed by sha256 chains (identities refused), step by step in token mode: the
same decisions every step, the same results, the same LRU order and statistics, and an
index of the same blocks whose keys map one-to-one (with their parents). Traces: shared
described prefixes (hits), salts, cut last blocks, prompts shorter than a block,
chunked prefill, recompute preemption, vLLM's duplicate indexing on and off, and a slice
of the Mooncake conversation trace. No vLLM needed.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.paged.block_identity import IDENTITY_CONTENT, DescribedIdentities
from kvbench.paged.cache import PagedKVCache
from kvbench.paged.prefix_cache import packed_chain
from kvbench.paged.serving.engine.v1 import V1Decision
from kvbench.suites.conformance.peer_vllm_scheduler import Case, engine_for, uses
from kvbench.suites.conformance.prefix_index_compare import same_index_up_to_keys
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.shipped import shipped_trace
from kvbench.workloads.trace import SYNTH_BASE, BlockTokenIds, Trace, TraceRequest

_PROMPT = st.tuples(
    st.lists(st.integers(0, 3), min_size=1, max_size=4),  # block ids: shared often
    st.integers(0, 15),  # ids cut from the last described block
    st.sampled_from([None, None, "s"]),  # salt
    st.integers(0, 40),  # output tokens
)


@settings(max_examples=60, deadline=None)
@given(
    block_size=st.sampled_from([2, 4]),
    per=st.sampled_from([1, 2, 4]),
    prompts=st.lists(_PROMPT, min_size=2, max_size=6),
)
def test_identities_are_equal_exactly_where_sha256_chain_keys_are(
    block_size: int, per: int, prompts: list[tuple[list[int], int, str | None, int]]
) -> None:
    bt = block_size * per
    ids = DescribedIdentities(block_size, bt)
    by_identity, by_sha = [], []
    for k, (blocks, cut, salt, outs) in enumerate(prompts):
        length = max(1, len(blocks) * bt - min(cut, bt - 1))
        prompt = BlockTokenIds(blocks, bt, length)
        tail = range(SYNTH_BASE * (k % 2 + 1), SYNTH_BASE * (k % 2 + 1) + outs)
        keys, contents = ids.packed(prompt, (salt, None), tail)
        sha, packed = packed_chain((*prompt, *tail), block_size, (salt, None))
        assert len(keys) == len(sha) == len(contents)
        full = length // block_size
        assert contents[:full] == [IDENTITY_CONTENT] * full
        assert contents[full:] == packed[full:]  # the blocks past the prompt: their ids
        by_identity += keys
        by_sha += sha
    for i, (a, x) in enumerate(zip(by_identity, by_sha, strict=True)):
        for b, y in zip(by_identity[i:], by_sha[i:], strict=True):
            assert (a == b) == (x == y)


def test_only_traces_of_described_prompts_of_one_size_qualify() -> None:
    def req(i: int, **kw: Any) -> TraceRequest:
        kw.setdefault("prompt_blocks", (i, i + 1))
        kw.setdefault("prompt_block_tokens", 8)
        return TraceRequest(i, 0.0, 12, 2, **kw)

    assert DescribedIdentities.qualifies([req(0), req(1)], 4) == 8
    assert DescribedIdentities.qualifies([req(0), req(1)], 8) == 8
    assert DescribedIdentities.qualifies([req(0), req(1)], 16) is None  # 16 does not divide 8
    other = req(1, prompt_blocks=(1, 2, 3), prompt_block_tokens=4)
    assert DescribedIdentities.qualifies([req(0), other], 4) is None
    given = TraceRequest(1, 0.0, 3, 2, prompt=(1, 2, 3))
    assert DescribedIdentities.qualifies([req(0), given], 4) is None
    answered = req(1, output_tokens=(5, 6))
    assert DescribedIdentities.qualifies([req(0), answered], 4) is None
    assert DescribedIdentities.qualifies([], 4) is None


@pytest.mark.parametrize("bad", [0, 2, 6, 10, 8.0, True, None])
def test_a_block_size_that_does_not_divide_the_described_blocks_is_refused(bad: Any) -> None:
    with pytest.raises(ConfigError, match=repr(bad)):
        DescribedIdentities(4, bad)


def test_a_prompt_of_other_described_blocks_is_refused_by_size() -> None:
    ids = DescribedIdentities(4, 8)
    with pytest.raises(ConfigError, match="16 ids, not 8"):
        ids.packed(BlockTokenIds((1,), 16, 16), (None, None))
    assert len(ids) == 0


def _described(
    prompts: list[tuple[list[int], int, str | None, int]], bt: int, spread_s: float
) -> Trace:
    reqs = []
    for i, (blocks, cut, salt, outs) in enumerate(prompts):
        length = max(1, len(blocks) * bt - min(cut, bt - 1))
        reqs.append(
            TraceRequest(
                i, spread_s * i / len(prompts), length, max(1, outs), salt=salt,
                prompt_blocks=tuple(blocks), prompt_block_tokens=bt,
            )
        )  # fmt: skip
    return Trace(tuple(reqs))


def _prompts(n: int, seed: int) -> list[tuple[list[int], int, str | None, int]]:
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        head = [rng.choice([0, 1, 2])] if rng.random() < 0.7 else []
        blocks = head + [rng.randrange(3, 40) for _ in range(rng.randint(0, 4))]
        out.append(
            (blocks or [99], rng.randint(0, 70), rng.choice([None, None, "s"]), rng.randint(1, 90))
        )
    return out


@functools.lru_cache(maxsize=1)
def _mooncake() -> Trace:
    reqs = [
        r
        for r in shipped_trace("mooncake-conversation").requests[:400]
        if r.prompt_len + r.output_len < 9_000
    ][:120]
    return Trace(tuple(reqs))


CASES = [
    # name, trace, block size, blocks (null included), max_num_seqs, budget, threshold
    Case("shared-preempt", _described(_prompts(60, 1), 64, 0.0), 16, 70, 16, 512),
    Case("chunked-lpt", _described(_prompts(50, 2), 64, 2.0), 16, 90, 12, 96, 40),
    Case("roomy-32", _described(_prompts(40, 3), 64, 1.0), 32, 400, 32, 8192),
    Case("short-prompts", _described(_prompts(30, 4), 8, 0.5), 8, 40, 8, 128),
    Case("mooncake", None, 16, 2_500, 32, 2048),  # type: ignore[arg-type]
]


def _case(case: Case) -> Case:
    if case.trace is None:
        return Case(
            case.name, _mooncake(), case.block_size, case.num_blocks, case.max_num_seqs,
            case.max_batched_tokens, case.long_prefill_token_threshold,
        )  # fmt: skip
    return case


def _sha256_plan(requests: Sequence[TraceRequest], reach: bool) -> None:
    """`KeyChains.plan` keeping sha256 chains for every block."""


def _replay(
    case: Case, identities: bool, duplicates: bool, mode: str = "token"
) -> tuple[list[V1Decision], tuple[Any, ...], tuple[Any, ...], PagedKVCache]:
    eng = engine_for(case, mode=mode, index_duplicates=duplicates)
    assert eng.v1 is not None and eng.v1.keys is not None
    if not identities:  # sha256 chains throughout: no trace is taken as qualifying
        eng.v1.keys.plan = _sha256_plan  # type: ignore[assignment]
    got: list[V1Decision] = []
    if mode == "token":
        eng.v1.on_step = got.append
    res = eng.run(case.trace)
    assert (eng.v1.keys.identities is not None) is identities
    cache = eng.cache
    assert isinstance(cache, PagedKVCache) and cache.prefix is not None
    state = (cache.pool.lru_order(), cache.prefix_stats(), cache.pool.free_stack())
    return got, (res.decisions(), res.timeline, eng.v1.stats, res.preemptions), state, cache


@pytest.mark.parametrize("duplicates", [True, False], ids=["vllm-duplicates", "unindexed"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_identity_keys_change_nothing_but_speed(case: Case, duplicates: bool) -> None:
    case = _case(case)
    steps_i, result_i, state_i, cache_i = _replay(case, True, duplicates)
    steps_s, result_s, state_s, cache_s = _replay(case, False, duplicates)
    assert len(steps_i) == len(steps_s) > 0
    for a, b in zip(steps_i, steps_s, strict=True):
        assert a == b, f"step {a.step}: identities {a}, sha256 {b}"
    assert result_i == result_s
    assert state_i == state_s  # LRU order, prefix statistics, free stack
    assert same_index_up_to_keys(cache_i, cache_s) > 0
    # event mode takes the identities too: the same decisions as token stepping
    _, ev, ev_state, ev_cache = _replay(case, True, duplicates, mode="event")
    assert ev[0] == result_i[0] and ev[2] == result_i[2] and ev[3] == result_i[3]
    assert ev_state == state_i
    same_index_up_to_keys(ev_cache, cache_s)


def test_the_traces_reach_hits_preemption_and_chunks() -> None:
    seen: Counter[str] = Counter()
    for case in CASES:
        steps, _, _, _ = _replay(_case(case), True, True)
        seen.update(uses(steps))
    assert len(seen) == 3 and all(seen.values()), seen


def test_a_cache_keyed_by_identities_refuses_a_second_trace() -> None:
    """A second trace over the same engine while identities key its index is refused by
    name (it could miss what sha256 keys would hit: an earlier replay's synthetic
    outputs among it); the same trace on a fresh engine replays, keyed by sha256 where
    it does not qualify (prompts given above the synthetic ids)."""
    case = _case(CASES[0])
    eng = engine_for(case)
    eng.run(case.trace)
    assert eng.v1 is not None and eng.v1.keys is not None and eng.v1.keys.identities
    listed = Trace(
        (TraceRequest("x", 0.0, 40, 3, prompt=tuple(range(SYNTH_BASE, SYNTH_BASE + 40))),)
    )
    with pytest.raises(ConfigError, match="earlier replay"):
        eng.run(listed)
    with pytest.raises(ConfigError, match="earlier replay"):
        eng.run(case.trace)
    fresh = engine_for(case)
    fresh.run(listed)
    assert fresh.v1 is not None and fresh.v1.keys is not None
    assert fresh.v1.keys.identities is None and not fresh.v1.keys.fresh_tails
    fresh.run(listed)  # sha256 keys on a non-empty index: a second trace is taken
    assert fresh.v1.keys.identities is None and not fresh.v1.keys.fresh_tails


@settings(max_examples=25, deadline=None)
@given(
    block_size=st.sampled_from([2, 4]),
    per=st.sampled_from([1, 2, 3]),
    pool=st.integers(8, 40),
    budget=st.sampled_from([8, 32, 512]),
    threshold=st.sampled_from([0, 6]),
    spread=st.sampled_from([0.0, 0.5]),
    prompts=st.lists(_PROMPT, min_size=1, max_size=14),
)
def test_drawn_replays_decide_alike_under_identities_and_sha256(
    block_size: int,
    per: int,
    pool: int,
    budget: int,
    threshold: int,
    spread: float,
    prompts: list[tuple[list[int], int, str | None, int]],
) -> None:
    """Drawn traces (shared, salted, cut described prompts, in any arrival order, any
    residue of the last block, outputs from one token) on pools small enough to preempt:
    identities and sha256 chains decide every step alike and leave indexes that map one
    to one."""
    bt = block_size * per
    longest = max(len(b) * bt + max(1, o) for b, _, _, o in prompts)
    case = Case(
        "drawn", _described(prompts, bt, spread), block_size,
        max(pool, -(-longest // block_size) + 2), 4, budget, threshold,
    )  # fmt: skip
    steps_i, result_i, state_i, cache_i = _replay(case, True, True)
    steps_s, result_s, state_s, cache_s = _replay(case, False, True)
    assert steps_i == steps_s and result_i == result_s and state_i == state_s
    same_index_up_to_keys(cache_i, cache_s)
