"""Prefix-cache hits under KV cache specs: which cached blocks a hit needs.

A hit of `c` prompt tokens (a multiple of the block size) lets a request skip computing
positions 0 .. c - 1; its first computed token (position c) then reads, in each layer
group, what its query sees there, so a hit needs exactly those blocks cached:

* full attention: blocks 0 .. c / block_size - 1 (the whole prefix);
* sliding window w: the blocks covering positions max(0, c - w + 1) .. c - 1, i.e.
  ceil((w - 1) / block_size) blocks once c >= w - 1 (vLLM's SlidingWindowManager counts
  the same `cdiv(window - 1, block_size)` contiguous blocks); the blocks before them may
  be missing (their table entries are the null block, -1 here, released at once);
  and always the hit's last block, so a cold cache never hits (this matters only for
  w = 1, whose next token reads no earlier position; vLLM's scan likewise ends a hit
  at a cached block);
* cross-attention: never prefix-cached (its encoder output is given at admission).

A model's hit is the longest c (at most the prompt minus its last token, in whole blocks)
every self-attention group accepts. Hits under a window are not monotone (a hit at c
says nothing of c - block_size), so the search tries every candidate from the longest
down, as vLLM's right-to-left scan does.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvbench.workloads.kv_rules import rule_for
from kvbench.workloads.kv_spec import KVCacheSpec


def blocks_a_hit_needs(spec: KVCacheSpec, hit_blocks: int, block_size: int) -> range:
    """Logical blocks of `spec`'s group that a hit of `hit_blocks` whole blocks needs
    cached (see the module docstring; `KindRule.hit_blocks`); empty for cross-attention."""
    return rule_for(spec).hit_blocks(hit_blocks, block_size)


def longest_hit_blocks(
    specs: Sequence[KVCacheSpec],
    cached: Sequence[Sequence[bool]],
    max_blocks: int,
    block_size: int,
) -> int:
    """The longest hit, in blocks (<= max_blocks), that every group accepts.

    cached[g][i]: whether group g has block i of the prompt cached (each list at least
    max_blocks long; cross-attention groups are ignored)."""
    rules = [rule_for(spec) for spec in specs]
    for m in range(max_blocks, 0, -1):
        if all(
            all(cached[g][i] for i in rule.hit_blocks(m, block_size))
            for g, rule in enumerate(rules)
        ):
            return m
    return 0
