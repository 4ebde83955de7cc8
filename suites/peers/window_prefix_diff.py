"""The prefix-cache differential of one attention kind: kvbench's layer-group cache of one
group of that `KVCacheSpec` against vLLM's manager of vLLM's matching spec (through
`vllm_adapter.VLLMAllocator(spec=...)`, e.g. SlidingWindowManager for a sliding window) on
the same random request streams.

A stream draws prompts from a few shared stems (so hits happen) with random tails,
admits each request (both report their hit), decodes a few tokens one at a time with
their ids (both cache the blocks they fill and release what leaves the window), and
frees requests in random order. After every operation it compares the hit and the
number of non-null blocks the request holds. With a pool larger than every block the
stream ever takes, neither evicts, so the comparison isolates the hit and release rules;
a small pool adds each side's eviction order (kvbench: never-cached blocks first, then
least recently freed; vLLM: one free queue), where disagreement is expected and counted.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from kvbench.paged.layer_groups import NULL_BLOCK, LayerGroupsPagedCache
from kvbench.suites.peers.vllm_adapter import VLLMAllocator
from kvbench.workloads.errors import CapacityError
from kvbench.workloads.kv_spec import KVCacheSpec, LayerGroup, ModelKVSpec


@dataclass
class DiffCounts:
    """Agreements and disagreements of one stream (admissions, held-block readings)."""

    hits_equal: int = 0
    hits_differ: int = 0
    hit_tokens_kvbench: int = 0
    hit_tokens_vllm: int = 0
    held_equal: int = 0
    held_differ: int = 0
    refused_both: int = 0
    refused_one: int = 0
    examples: list[str] = field(default_factory=list)


def _kvbench_cache(spec: KVCacheSpec, block_size: int, num_blocks: int) -> LayerGroupsPagedCache:
    group = LayerGroup(spec, 1, 1, 1, "float32")
    model = ModelKVSpec(spec.describe(), (group,))
    return LayerGroupsPagedCache(model, num_blocks, block_size, enable_prefix_caching=True)


def run_stream(
    seed: int,
    spec: KVCacheSpec | int,
    block_size: int,
    num_blocks: int,
    num_requests: int = 40,
) -> DiffCounts:
    """One random stream through both caches (see the module docstring) for one group of
    `spec` (an int: a sliding window of that many tokens)."""
    if not isinstance(spec, KVCacheSpec):
        spec = KVCacheSpec.sliding_window(spec)
    rng = random.Random(seed)
    ours = _kvbench_cache(spec, block_size, num_blocks)
    theirs = VLLMAllocator(num_blocks, block_size, spec=spec)
    stems = [[rng.randrange(1000) for _ in range(rng.randint(1, 40))] for _ in range(3)]
    counts = DiffCounts()
    live: list[int] = []

    def zeros(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        z = torch.zeros((1, n, 1, 1))
        return [(z, z)]

    def compare_held(rid: int) -> None:
        mine = sum(b != NULL_BLOCK for b in ours.block_table(rid, 0))
        peer = sum(b != 0 for b in theirs.block_table(rid))  # vLLM's null block is 0
        if mine == peer:
            counts.held_equal += 1
        else:
            counts.held_differ += 1
            if len(counts.examples) < 5:
                counts.examples.append(f"request {rid}: held {mine} vs vLLM {peer}")

    for rid in range(num_requests):
        if live and rng.random() < 0.4:
            gone = live.pop(rng.randrange(len(live)))
            ours.free(gone)
            theirs.free(gone)
        prompt = rng.choice(stems)[: rng.randint(1, 40)] + [
            rng.randrange(1000) for _ in range(rng.randint(1, 8))
        ]
        refused = []
        try:
            hit = ours.admit(rid, prompt=prompt)
            ours.append(rid, zeros(len(prompt) - hit))
        except CapacityError:
            if rid in ours.request_ids():
                ours.free(rid)
            refused.append("kvbench")
            hit = -1
        try:
            peer_hit = theirs.admit(rid, prompt)
        except CapacityError:
            refused.append("vllm")
            peer_hit = -1
        if len(refused) == 2:
            counts.refused_both += 1
            continue
        if refused:
            counts.refused_one += 1
            if "kvbench" not in refused:
                ours.free(rid)
            if "vllm" not in refused:
                theirs.free(rid)
            continue
        counts.hit_tokens_kvbench += hit
        counts.hit_tokens_vllm += peer_hit
        if hit == peer_hit:
            counts.hits_equal += 1
        else:
            counts.hits_differ += 1
            if len(counts.examples) < 5:
                counts.examples.append(
                    f"request {rid} ({len(prompt)} tokens): hit {hit} vs vLLM {peer_hit}"
                )
        live.append(rid)
        compare_held(rid)
        for _ in range(rng.randint(0, 6)):
            token = rng.randrange(1000)
            try:
                ours.append(rid, zeros(1), [token])
                theirs.append(rid, [token])
            except CapacityError:
                break  # a side that ran out stops decoding this request
            compare_held(rid)
    ours.check()
    return counts
