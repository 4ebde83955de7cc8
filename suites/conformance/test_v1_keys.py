"""The vllm-v1 replay's whole-sequence key chains (`paged.serving.engine.v1_keys`)
change nothing but speed: against the ids path (every append handing the cache its ids,
every admission probed with `prefix_hit`), the same decisions every step, the same
prefix index (blocks and duplicates, under keys in one-to-one correspondence: the
blocks past a prompt take fresh identities where no other sequence could hit them,
`KeyChains.plan`; the very keys where every block is hashed), the same eviction order
and statistics.

Traces that reach every use of a chain: shared system prompts (hits), chunked prefills
(a chain bound to the first chunk keys the later ones), recompute preemption (a chain
bound to prompt + generated tokens, and its own earlier blocks hit), multi-turn chats
with given answers (output blocks hit by the next turn, duplicates indexed), synthetic
outputs. No vLLM needed.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from kvbench.paged.cache import PagedKVCache
from kvbench.paged.prefix_cache import block_key
from kvbench.paged.serving.engine.v1 import V1Decision
from kvbench.paged.serving.engine.v1_keys import KeyChains
from kvbench.suites.conformance.peer_vllm_scheduler import (
    GEOM,
    Case,
    engine_for,
    multi_turn,
    sharegpt_like,
    uses,
)
from kvbench.suites.conformance.prefix_index_compare import same_index_up_to_keys

CASES = [
    # name, trace, block size, blocks (null included), max_num_seqs, budget
    Case("system-preempt", sharegpt_like(50, 3, systems=2, system_len=40), 16, 130, 16, 512),
    Case("chunked-lpt", sharegpt_like(40, 2, spread_s=1.0), 16, 110, 12, 64, 24),
    Case("multiturn-preempt", multi_turn(8, 4, 6), 16, 80, 8, 2048),
    Case("roomy", sharegpt_like(30, 5, systems=1, system_len=70), 32, 400, 32, 8192),
]


def _replay(
    case: Case, keyed: bool, mode: str
) -> tuple[list[V1Decision], tuple[Any, ...], tuple[Any, ...]]:
    eng = engine_for(case, mode=mode)
    assert eng.v1 is not None
    assert (eng.v1.keys is not None) is True  # the memory-only PagedKVCache takes chains
    if not keyed:
        eng.v1.keys = eng.v1.fast = None  # the ids path
    got: list[V1Decision] = []
    if mode == "token":
        eng.v1.on_step = got.append
    res = eng.run(case.trace)
    cache = eng.cache
    assert isinstance(cache, PagedKVCache) and cache.prefix is not None
    state = (cache.pool.lru_order(), cache.prefix_stats(), cache)
    return got, (res.decisions(), res.timeline, eng.v1.stats, res.preemptions), state


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_chains_change_nothing_but_speed(case: Case) -> None:
    steps_k, result_k, state_k = _replay(case, True, "token")
    steps_i, result_i, state_i = _replay(case, False, "token")
    assert len(steps_k) == len(steps_i) > 0
    for a, b in zip(steps_k, steps_i, strict=True):
        assert a == b, f"step {a.step}: chains {a}, ids {b}"
    assert result_k == result_i
    assert state_k[:2] == state_i[:2]  # LRU order, counters
    # blocks and duplicates, under keys one to one (the blocks past a prompt may take
    # fresh identities: `KeyChains.plan`), equal where every block is hashed
    fresh = same_index_up_to_keys(state_k[2], state_i[2])
    synthetic = all(r.output_tokens is None for r in case.trace.requests)
    assert (fresh > 0) == synthetic, (fresh, synthetic)  # fresh tails exactly where they may
    if not synthetic:
        assert state_k[2].prefix.snapshot() == state_i[2].prefix.snapshot()
    # event mode takes the chain path too: same decisions as token stepping
    _, ev, ev_state = _replay(case, True, "event")
    assert ev[0] == result_k[0] and ev[2] == result_k[2] and ev[3] == result_k[3]
    assert ev_state[:2] == state_k[:2]
    same_index_up_to_keys(ev_state[2], state_i[2])


def test_the_traces_reach_every_use() -> None:
    """Hits, chunked admissions and preemptions do happen in these traces."""
    seen: Counter[str] = Counter()
    for case in CASES:
        steps, _, _ = _replay(case, True, "token")
        seen.update(uses(steps))
    assert len(seen) == 3 and all(seen.values()), seen


def test_chains_apply_only_where_the_cache_takes_them() -> None:
    """Memory-only PagedKVCache with prefix caching and block_key only; a cache that
    holds KV, caches no prefixes or keys otherwise gets the ids path."""

    def make(**kw: object) -> PagedKVCache:
        return PagedKVCache(GEOM, 8, 4, **kw)  # type: ignore[arg-type]

    assert KeyChains.applies(make(store_kv=False))
    assert not KeyChains.applies(make(store_kv=True))
    assert not KeyChains.applies(make(store_kv=False, enable_prefix_caching=False))

    def weak(parent: bytes | None, tokens: object, extra: object) -> bytes:
        return block_key(parent, tokens, extra)[:4]  # type: ignore[arg-type]

    assert not KeyChains.applies(make(store_kv=False, key_fn=weak))
