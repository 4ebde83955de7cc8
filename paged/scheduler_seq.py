"""Engine-side state of one sequence, and what the engine needs from each kind of cache.

`Seq` is one sequence (a request, one of its n samples, or one beam) as the serving
engine tracks it: queue state, prefill progress, and - while it decodes - its logical
position as a line in the step number (KV length c = base_c + (t - base_step)), so that
event mode can defer its appends. `kv_for_tokens` makes the deterministic KV that the
engine writes with tensors. `CacheAdapter` hides the paged / contiguous differences.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import TYPE_CHECKING

import torch

from kvbench.paged.cache import PagedKVCache
from kvbench.paged.scheduler_model import SeqRecord
from kvbench.reference.contiguous import ContiguousKVCache, next_pow2
from kvbench.reference.contract import KVCache
from kvbench.workloads.trace import SYNTH_BASE, TraceRequest

if TYPE_CHECKING:
    from kvbench.paged.beams import BeamGroup

if TYPE_CHECKING:
    pass

WAITING, RUNNING, SWAPPED, FINISHED = 0, 1, 2, 3
NEVER = 1 << 62
#: Orders of the sequences of one request: index * _CHILDREN + child (child < CHILDREN).
CHILDREN = 1 << 24
#: Synthetic output ids of child k of request i start at SYNTH_BASE*(i+1) + _OUT*(k+1).
_OUT = SYNTH_BASE // 64


by_order = attrgetter("order")


class Seq:
    """Engine-side state of one sequence."""

    __slots__ = (
        "base_c",
        "base_g",
        "base_step",
        "computed",
        "cow",
        "decoding",
        "event_step",
        "family",
        "forked",
        "generated",
        "group",
        "hashed",
        "index",
        "order",
        "out_base",
        "out_tokens",
        "parked",
        "prompt",
        "rec",
        "req",
        "salt",
        "sid",
        "state",
        "synced",
        "target",
        "version",
    )

    def __init__(self, req: TraceRequest, index: int, child: int, prompt: Sequence[int]):
        self.req = req
        self.index = index
        self.order = index * CHILDREN + child  # trace order, then child number
        self.sid = str(req.id) if child == 0 else f"{req.id}#{child}"
        self.prompt = prompt
        self.salt = req.salt
        self.out_tokens = req.output_tokens if child == 0 else None
        self.out_base = SYNTH_BASE * (index + 1) + _OUT * (child + 1)
        self.state = WAITING
        self.target = len(prompt)  # tokens to prefill before decoding
        self.computed = 0  # KV tokens in the cache (prefill phase)
        self.generated = 0
        self.decoding = False
        self.base_step = self.base_c = self.base_g = self.synced = 0
        self.event_step = NEVER
        self.version = 0
        self.cow = False
        self.forked = child != 0
        self.hashed = False  # whether its output token ids are given to the cache (engine)
        self.group: BeamGroup | None = None  # its beam-search group, if any
        #: the n sequences of its n-sample request (parent first), preempted together
        self.family: list[Seq] | None = None
        self.parked = False  # a recomputed beam waiting for its group's other beams
        self.rec = SeqRecord(self.sid, req.id, req.arrival, len(prompt), req.output_len)

    def token(self, p: int) -> int:
        plen = len(self.prompt)
        if p < plen:
            return self.prompt[p]
        j = p - plen
        return self.out_tokens[j] if self.out_tokens is not None else self.out_base + j

    def tokens(self, a: int, b: int) -> list[int]:
        return [self.token(p) for p in range(a, b)]


def kv_for_tokens(
    token_ids: Sequence[int], positions: Sequence[int], cache: KVCache
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic K and V for tokens at positions ([layers, n, kv_heads, head_dim]).

    KV depends only on (token id, position): a recomputed or swapped-in sequence must hold
    exactly the KV it had, and a prefix-cache hit must serve exactly what was computed.
    """
    g = cache.geometry
    tok = torch.tensor([t % 100_003 for t in token_ids], dtype=torch.float64)
    pos = torch.tensor(list(positions), dtype=torch.float64)
    base = (tok * 0.0137 + pos * 0.291).view(1, -1, 1, 1)
    lay = torch.arange(g.num_layers, dtype=torch.float64).view(-1, 1, 1, 1) * 0.53
    head = torch.arange(g.num_kv_heads, dtype=torch.float64).view(1, 1, -1, 1) * 0.71
    dim = torch.arange(g.head_dim, dtype=torch.float64).view(1, 1, 1, -1) * 0.117
    k = torch.sin(base + lay + head + dim)
    v = torch.cos(1.3 * base - lay + head * 0.5 + dim * 1.7)
    return k.to(cache.torch_dtype), v.to(cache.torch_dtype)


class CacheAdapter:
    """What the engine needs from a cache beyond the contract, per cache type."""

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache
        self.paged = isinstance(cache, PagedKVCache)
        self.contiguous = isinstance(cache, ContiguousKVCache)
        self.store_kv = bool(getattr(cache, "store_kv", True))
        self.block_size = cache.block_size if self.paged else 0
        self.can_swap = self.paged and cache.swap.num_blocks > 0
        self.prefix = self.paged and cache.prefix is not None
        self.exact_growth = self.paged or self.contiguous
        g = cache.geometry
        self._dummy = torch.zeros((), dtype=cache.torch_dtype)
        self._shape = (g.num_layers, g.num_kv_heads, g.head_dim)

    def growth_point(self, seq: Seq, c: int) -> int:
        """Smallest KV length >= c at which appending one more token needs memory."""
        if seq.cow or not self.exact_growth:
            return c
        if self.paged:
            bs = self.block_size
            return -(-c // bs) * bs
        cache = self.cache
        if cache.policy == "pow2":
            return min(next_pow2(max(c, 1)), cache.max_seq_len)
        return NEVER

    def append(self, seq: Seq, start: int, n: int, ids: list[int] | None) -> None:
        cache = self.cache
        if self.paged and not self.store_kv:
            cache.append_tokens(seq.sid, n, ids)
            return
        if self.store_kv:
            k, v = kv_for_tokens(seq.tokens(start, start + n), range(start, start + n), cache)
        else:
            L, H, D = self._shape
            k = v = self._dummy.expand(L, n, H, D)
        cache.append(seq.sid, k, v, ids)

    def distinct_blocks(self, sids: Sequence[str]) -> int:
        """Blocks a group of sequences holds, each shared block counted once (what a
        group swap copies)."""
        if not self.paged:
            return 0
        return len({b for sid in sids for b in self.cache.block_table(sid)})

    def memory(self) -> tuple[int, int, int, int, int]:
        """(free blocks, used blocks, evictable cached blocks, synced live slots,
        reserved slots)."""
        if self.paged:
            pool = self.cache.pool
            return (
                pool.num_free,
                pool.num_used,
                pool.num_evictable,
                pool.live_slots,
                pool.num_used * self.block_size,
            )
        st = self.cache.stats()
        return (0, 0, 0, st.live_slots, st.reserved_slots)
