"""Two documented behaviours pinned so that a change to either fails a test:

* swap-in re-indexes every full block of the request in the prefix cache, the first one
  (whose key has no parent) included, so prefix hits survive a swap-out, an eviction of
  the old cached copies, and a swap-in (DESIGN.md, "Prefix cache"; paged/cache.py
  swap_in_group);
* the victim of a preemption is the latest-arrived running request (DESIGN.md,
  "Preemption"; paged/serving/engine/ choose_victim), not the earliest, nor the one whose id
  sorts last.

Each was checked to fail under its mutation (skipping the parentless block on swap-in;
choosing the earliest-arrived running request).
"""

from __future__ import annotations

import torch

from kvbench.paged.cache import PagedKVCache
from kvbench.paged.serving.engine import Engine
from kvbench.paged.serving.time_model import SchedulerConfig, TimeModel
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.profiles import get_profile
from kvbench.workloads.trace import Trace, TraceRequest

G = KVGeometry(num_layers=1, num_kv_heads=1, head_dim=4, dtype="float32", num_q_heads=1)
BS = 4


def _kv(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(n)
    shape = (G.num_layers, n, G.num_kv_heads, G.head_dim)
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


def test_prefix_hits_survive_swap_out_eviction_and_swap_in() -> None:
    cache = PagedKVCache(G, 6, BS, num_cpu_blocks=6)
    prompt = list(range(100, 109))  # two full blocks and one token
    cache.admit("a", prompt)
    cache.append("a", *_kv(len(prompt)), token_ids=prompt)
    cache.swap_out("a")  # its device blocks stay cached, evictable
    for i in range(6):  # fill the whole pool: every cached copy of a's blocks is evicted
        cache.admit(f"f{i}", [1000 + 10 * i + j for j in range(BS)])
    assert cache.num_free_blocks == 0
    probe = PagedKVCache(G, 6, BS)  # what a's prompt would hit with nothing indexed
    assert probe.admit("p", prompt) == 0
    for i in range(6):
        cache.free(f"f{i}")
    cache.swap_in("a")  # must index a's two full blocks again, the parentless first too
    assert cache.admit("b", prompt) == 2 * BS
    k_a, _ = cache.gather("a")
    cache.append("b", *_kv(1), token_ids=[prompt[-1]])
    k_b, _ = cache.gather("b")
    assert torch.equal(k_b[:, : 2 * BS], k_a[:, : 2 * BS])  # the hit serves a's KV


def test_preemption_takes_the_latest_arrived_running_request() -> None:
    """Three requests arrive in the order z, m, a (so neither the earliest nor the id that
    sorts last is the latest); the pool cannot hold all three grown, so one is preempted
    (by recompute): it is 'a', and 'z', the earliest, never is."""
    tm = TimeModel(get_profile("a100-80gb"), G, weight_bytes=10**9, params=5e8, block_size=BS)
    trace = Trace(
        (
            TraceRequest("z", 0.0, 4, 12),
            TraceRequest("m", 0.0, 4, 12),
            TraceRequest("a", 0.0, 4, 12),
        )
    )
    cache = PagedKVCache(G, 10, BS, store_kv=False)
    cfg = SchedulerConfig(max_num_seqs=8, max_batched_tokens=64, preemption="recompute")
    records = {r.id: r for r in Engine(cache, cfg, tm).run(trace).records}
    assert records["a"].preemptions >= 1
    assert records["z"].preemptions == 0
    assert all(r.generated == 12 for r in records.values())
