"""Prefix caching under a sliding window (`workloads.spec_prefix`, `paged.group_prefix`).

The rule: a hit of c tokens needs, per group, the blocks its first computed token
(position c) reads: all of them under full attention, only those covering positions
max(0, c - w + 1) .. c - 1 under a window w. Checked against a position-by-position
oracle, and end to end: a windowed hit whose early blocks were evicted serves the same
window KV as computing the whole prompt.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from kvbench.paged.layer_groups import NULL_BLOCK, LayerGroupsPagedCache
from kvbench.reference.layer_groups import LayerGroupsReferenceCache
from kvbench.workloads.kv_spec import KVCacheSpec, LayerGroup, ModelKVSpec
from kvbench.workloads.spec_prefix import longest_hit_blocks

LAYERS, HEADS, DIM = 1, 1, 4
SPEC = st.one_of(
    st.just(KVCacheSpec.full()), st.builds(KVCacheSpec.sliding_window, st.integers(1, 12))
)


def _oracle_hit(
    specs: list[KVCacheSpec], cached: list[list[bool]], max_blocks: int, bs: int
) -> int:
    """Longest c (whole blocks) such that every position the token at c reads, in every
    group, lies in a cached block, and so does position c - 1 (a cold cache never hits;
    independent of spec_prefix: positions, not blocks)."""
    best = 0
    for m in range(1, max_blocks + 1):
        c = m * bs
        ok = True
        for spec, row in zip(specs, cached, strict=True):
            lo = 0 if spec.window is None else min(max(0, c - spec.window + 1), c - 1)
            ok &= all(row[p // bs] for p in range(lo, c))
        if ok:
            best = m
    return best


@given(
    specs=st.lists(SPEC, min_size=1, max_size=3),
    bs=st.integers(1, 5),
    data=st.data(),
)
def test_sliding_window_hit_rule_matches_position_oracle(
    specs: list[KVCacheSpec], bs: int, data: st.DataObject
) -> None:
    max_blocks = data.draw(st.integers(0, 10))
    cached = [
        data.draw(st.lists(st.booleans(), min_size=max_blocks, max_size=max_blocks)) for _ in specs
    ]
    assert longest_hit_blocks(specs, cached, max_blocks, bs) == _oracle_hit(
        specs, cached, max_blocks, bs
    )


def _kv_of(tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """K/V as a function of (token, position): equal prefixes give equal KV."""
    t = torch.tensor(tokens, dtype=torch.float32)
    pos = torch.arange(len(tokens), dtype=torch.float32)
    k = (t[:, None] * 0.01 + pos[:, None] * torch.arange(1, DIM + 1)).reshape(1, -1, 1, DIM)
    return k, -k


def test_sliding_window_hit_survives_eviction_of_blocks_outside_the_window() -> None:
    """Window 4, blocks of 2, a pool of 6: request a computes a 10-token prompt (blocks
    0-4, released as it goes) and is freed; b, a 4-token stranger, evicts the oldest
    cached blocks. c = a's prompt + 1 token still hits 10 tokens (blocks 3, 4 cover
    positions 7..9, what position 10 reads), and its window equals the reference's."""
    model = ModelKVSpec(
        "w", (LayerGroup(KVCacheSpec.sliding_window(4), LAYERS, HEADS, DIM, "float32"),)
    )
    cache = LayerGroupsPagedCache(model, 6, 2, enable_prefix_caching=True)
    prompt = list(range(100, 110))
    assert cache.admit("a", prompt=prompt) == 0
    for i in range(10):  # one token at a time: blocks leave the window as a decodes
        k, v = _kv_of(prompt[: i + 1])
        cache.append("a", [(k[:, i : i + 1], v[:, i : i + 1])])
        cache.check()
    cache.free("a")
    cache.admit("b", prompt=[1, 2, 3, 4])
    k, v = _kv_of([1, 2, 3, 4])
    cache.append("b", [(k, v)])  # takes 2 blocks: the free one and the LRU evictable
    cache.check()
    longer = [*prompt, 7]
    assert cache.admit("c", prompt=longer) == 10
    table = cache.block_table("c", 0)
    assert table[:3] == [NULL_BLOCK] * 3 and NULL_BLOCK not in table[3:]
    k, v = _kv_of(longer)
    cache.append("c", [(k[:, 10:], v[:, 10:])])
    cache.check()
    ref = LayerGroupsReferenceCache(model)
    ref.admit("c")
    ref.append("c", [(k, v)])
    for got, want in zip(cache.gather("c", 0), ref.gather("c", 0), strict=True):
        assert torch.equal(got, want)


def test_hybrid_hit_is_the_longest_every_group_accepts() -> None:
    """Full + window groups: an identical prompt hits 8 tokens in both groups at once
    (the window group only blocks 3 (position 7), the full group blocks 0-3); another
    salt hits nothing."""
    groups = tuple(
        LayerGroup(s, LAYERS, HEADS, DIM, "float32")
        for s in (KVCacheSpec.full(), KVCacheSpec.sliding_window(2))
    )
    cache = LayerGroupsPagedCache(ModelKVSpec("h", groups), 32, 2, enable_prefix_caching=True)
    prompt = list(range(9))
    cache.admit("a", prompt=prompt)
    k, v = _kv_of(prompt)
    cache.append("a", [(k, v), (k, v)])
    assert cache.admit("b", prompt=prompt) == 8
    assert cache.held_blocks("b", 1) == [3] and cache.held_blocks("b", 0) == [0, 1, 2, 3]
    cache.check()
    salted = cache.admit("s", prompt=prompt, salt="x")
    assert salted == 0
