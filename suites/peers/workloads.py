"""The identical work every peer gets in the peer benches (suites/bench/sweeps/peers.py).

* `pool_ops_sequence`: a seeded random admit / append / free sequence for block-pool
  operations per second; `run_ops` applies it to an allocator adapter.
* `iter_trace` + `replay`: an N-request serving trace (shared system prompts plus unique
  suffixes) replayed through an allocator adapter with a window of live requests and a
  pool small enough that cached prefixes get evicted. The trace is generated lazily (a
  100k-request trace would hold ~13 M token ids) and `replay` times only the adapter's
  calls, so building token lists costs no peer anything.
* `prefix_hit_replay`: a trace's prompts served one at a time through an allocator
  adapter (admit, free; the blocks stay cached until evicted): the prefix-hit tokens,
  for the trace.prefix_capacity peer rows (`paged.hitrate`'s replay model).
* `decode_inputs`, `paged_decode_fn`, `sdpa_decode_fn`: one CPU decode step over the same
  random K/V, paged through an attention adapter (blocks scattered by a seeded
  permutation) or contiguous for torch's SDPA.

Units: token counts, seconds (time.perf_counter).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvbench.suites.peers.base import AllocatorAdapter, AttentionAdapter
from kvbench.workloads.errors import CapacityError

#: Trace shape: shared system prompts, their length, the suffix and output length ranges.
TRACE_SYSTEM_PROMPTS = 8
TRACE_SYSTEM_LEN = 64
TRACE_SUFFIX = (16, 128)
TRACE_OUTPUT = (16, 128)


def pool_ops_sequence(n_ops: int, seed: int = 0) -> list[tuple]:
    """A random ("admit" | "append" | "free", request id, tokens) sequence over at most 64
    live requests: prompts are one of 4 shared 48-token stems plus 1..39 random tokens (so
    some admissions hit the prefix cache), appends add 8 tokens, frees pick a random live
    request. A pool of 4096 blocks of 16 never runs dry on it (64 x ~900 tokens max)."""
    rng = np.random.default_rng(seed)
    stems = [[int(t) for t in rng.integers(0, 1000, size=48)] for _ in range(4)]
    ops: list[tuple] = []
    live: list[int] = []
    next_id = 0
    while len(ops) < n_ops:
        r = rng.random()
        if (r < 0.35 and len(live) < 64) or not live:
            stem = stems[int(rng.integers(0, 4))]
            suffix = [int(t) for t in rng.integers(0, 1000, size=int(rng.integers(1, 40)))]
            ops.append(("admit", next_id, stem + suffix))
            live.append(next_id)
            next_id += 1
        elif r < 0.8:
            rid = live[int(rng.integers(0, len(live)))]
            ops.append(("append", rid, [int(t) for t in rng.integers(0, 1000, size=8)]))
        else:
            rid = live.pop(int(rng.integers(0, len(live))))
            ops.append(("free", rid, None))
    return ops


def run_ops(alloc: AllocatorAdapter, ops: Sequence[tuple]) -> int:
    """Apply `ops` to `alloc`; returns the prompt tokens served from its prefix cache."""
    hits = 0
    for kind, rid, tokens in ops:
        if kind == "admit":
            hits += alloc.admit(rid, tokens)
        elif kind == "append":
            alloc.append(rid, tokens)
        else:
            alloc.free(rid)
    return hits


def iter_trace(n: int, seed: int = 0) -> Iterator[tuple[list[int], int]]:
    """(prompt, output_len) of n requests, generated lazily and reproducibly: one of 8
    shared 64-token system prompts plus a unique 16..128-token suffix; 16..128 output
    tokens. Every call with the same (n, seed) yields the same trace."""
    rng = np.random.default_rng(seed)
    systems = [
        [int(t) for t in rng.integers(0, 32000, size=TRACE_SYSTEM_LEN)]
        for _ in range(TRACE_SYSTEM_PROMPTS)
    ]
    lo, hi = TRACE_SUFFIX
    olo, ohi = TRACE_OUTPUT
    chunk = 4096
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        which = rng.integers(0, TRACE_SYSTEM_PROMPTS, size=m)
        suffix_lens = rng.integers(lo, hi + 1, size=m)
        out_lens = rng.integers(olo, ohi + 1, size=m)
        for j in range(m):
            i = start + j
            suffix = [32000 + (i * 131 + t) % 1_000_000 for t in range(int(suffix_lens[j]))]
            yield systems[int(which[j])] + suffix, int(out_lens[j])


@dataclass(frozen=True)
class ReplayResult:
    """What one replay measured: `seconds` spent inside the adapter's calls, prompt tokens
    served from the prefix cache, and admissions / appends retried after freeing the
    oldest live request for room."""

    seconds: float
    requests: int
    hit_tokens: int
    capacity_retries: int


def replay(
    alloc: AllocatorAdapter,
    requests: Iterable[tuple[list[int], int]],
    window: int = 64,
) -> ReplayResult:
    """Replay `requests` through `alloc`: each is admitted (freeing the oldest live request
    while the pool is full), grows to its output length in block-filling appends, and the
    oldest request is freed once `window` are live. Only the adapter's calls are timed."""
    bs = alloc.block_size
    clock = time.perf_counter
    live: list[Hashable] = []
    hits = retries = count = 0
    spent = 0.0
    for i, (prompt, out_len) in enumerate(requests):
        count += 1
        while True:
            t0 = clock()
            try:
                hits += alloc.admit(i, prompt)
                spent += clock() - t0
                break
            except CapacityError:
                spent += clock() - t0
                if not live:
                    raise
                t0 = clock()
                alloc.free(live.pop(0))
                spent += clock() - t0
                retries += 1
        live.append(i)
        done = 0
        base = 10_000_000 + i * 256
        while done < out_len:
            step = min(bs - (len(prompt) + done) % bs, out_len - done)
            toks = list(range(base + done, base + done + step))
            while True:
                t0 = clock()
                try:
                    alloc.append(i, toks)
                    spent += clock() - t0
                    break
                except CapacityError:
                    spent += clock() - t0
                    if live[0] == i:
                        raise
                    t0 = clock()
                    alloc.free(live.pop(0))
                    spent += clock() - t0
                    retries += 1
            done += step
        if len(live) >= window:
            t0 = clock()
            alloc.free(live.pop(0))
            spent += clock() - t0
    t0 = clock()
    for rid in live:
        alloc.free(rid)
    spent += clock() - t0
    return ReplayResult(spent, count, hits, retries)


def prefix_hit_replay(
    alloc: AllocatorAdapter, prompts: Iterable[tuple[Sequence[int], str | None]], max_tokens: int
) -> int:
    """Prefix-hit tokens of `prompts` ((token ids, salt) pairs, in arrival order) served one
    at a time through `alloc`: each is admitted (the adapter computes the rest of the
    prompt and caches its full blocks) and freed at once, so the blocks stay cached until
    a later admission evicts them: `paged.hitrate`'s replay model, on a peer. A prompt
    longer than `max_tokens` (the cache's capacity) goes in cut to its first
    `max_tokens` ids, as there."""
    hits = 0
    for i, (ids, salt) in enumerate(prompts):
        cut = ids if len(ids) <= max_tokens else ids[:max_tokens]
        hits += alloc.admit(i, cut, salt)
        alloc.free(i)
    return hits


def decode_inputs(
    batch: int, context: int, num_q_heads: int, num_kv_heads: int, head_dim: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random float32 (q [B, Hq, D], k [B, L, Hkv, D], v [B, L, Hkv, D]), never zeros."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(batch, context, num_kv_heads, head_dim, generator=g)
    v = torch.randn(batch, context, num_kv_heads, head_dim, generator=g)
    q = torch.randn(batch, num_q_heads, head_dim, generator=g)
    return q, k, v


def paged_decode_fn(
    adapter: AttentionAdapter,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_size: int,
    seed: int,
) -> Callable[[], torch.Tensor]:
    """Write k / v (every sequence of full length L) into `adapter`'s paged cache through
    its own write op, blocks scattered by a seeded permutation; returns its decode step."""
    batch, context, hkv, d = k.shape
    per = -(-context // block_size)
    num_blocks = batch * per
    cache = adapter.make_cache(num_blocks, block_size, hkv, d, k.dtype)
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    tables = perm.view(batch, per).to(torch.int32)
    pos = torch.arange(context)
    for b in range(batch):
        slots = tables[b].long()[pos // block_size] * block_size + pos % block_size
        adapter.write(cache, k[b], v[b], slots)
    lens = torch.full((batch,), context, dtype=torch.int32)
    return adapter.decode_fn(cache, q, tables, lens, 1.0 / math.sqrt(d))


def sdpa_decode_fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Callable[[], torch.Tensor]:
    """torch SDPA over the same K/V laid out contiguously ([B, Hkv, L, D]): the faster of
    the grouped-rows call and `enable_gqa=True` for this shape (its name is the returned
    callable's `form` attribute). Output reshapes to q's shape."""
    from kvbench.suites.bench.sdpa_baseline import decode_forms, fastest

    kc = k.transpose(1, 2).contiguous()
    vc = v.transpose(1, 2).contiguous()
    form, fn = fastest(decode_forms(q, kc, vc, 1.0 / math.sqrt(q.shape[-1])))

    def run() -> torch.Tensor:
        return fn()

    run.form = form  # type: ignore[attr-defined]
    return run


def relative_difference(got: torch.Tensor, expect: torch.Tensor) -> float:
    """||got - expect|| / ||expect|| in float64."""
    g, e = got.to(torch.float64).reshape(-1), expect.to(torch.float64).reshape(-1)
    return float(torch.linalg.vector_norm(g - e) / torch.linalg.vector_norm(e))
