"""One sequence as the serving engine tracks it, and the KV the engine writes for it.

`Seq` is a request, one of its n samples, or one beam: its queue state (`SeqState`),
prefill progress, and - while it decodes - its logical position as a line in the step
number (KV length c = base_c + (t - base_step), generated g = base_g + (t - base_step)),
so that event mode can defer its appends and write them in one call later (`synced` is
how far the cache has been told). `kv_for_tokens` makes the deterministic KV that the
engine writes into caches that hold tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from operator import attrgetter
from typing import TYPE_CHECKING

import torch

from kvbench.paged.serving.records import SeqRecord
from kvbench.reference.contract import KVCache
from kvbench.workloads.trace import SYNTH_BASE, TraceRequest

if TYPE_CHECKING:
    from kvbench.paged.serving.beams import BeamGroup


class SeqState(Enum):
    """Where a sequence is. WAITING: queued for (re-)admission, holds no memory;
    RUNNING: admitted, prefilling or decoding, holds device memory; SWAPPED: its memory
    is in CPU swap space; FINISHED: retired (or a pruned beam), holds nothing."""

    WAITING = 0
    RUNNING = 1
    SWAPPED = 2
    FINISHED = 3


WAITING, RUNNING, SWAPPED, FINISHED = SeqState

#: A step number no event reaches.
NEVER = 1 << 62
#: Orders of the sequences of one request: index * CHILDREN + child (child < CHILDREN).
CHILDREN = 1 << 24
#: Synthetic output ids of child k of request i start at SYNTH_BASE*(i+1) + _OUT*(k+1).
_OUT = SYNTH_BASE // 64

by_order = attrgetter("order")


class Seq:
    """Engine-side state of one sequence (attributes documented in __init__)."""

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
        "nabove",
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
        #: the output ids: the trace's (a tuple) or, for a beam, its history (a list)
        self.out_tokens: tuple[int, ...] | list[int] | None = (
            req.output_tokens if child == 0 else None
        )
        self.out_base = SYNTH_BASE * (index + 1) + _OUT * (child + 1)
        self.state = WAITING
        self.target = len(prompt)  # tokens to prefill before decoding
        self.computed = 0  # KV tokens in the cache (prefill phase)
        self.generated = 0
        self.decoding = False
        #: the decoder's line: (KV length, generated) = (base_c, base_g) at base_step
        self.base_step = self.base_c = self.base_g = 0
        self.synced = 0  # KV tokens the cache holds while decoding (<= the line's c)
        #: windows of the time model's layout its context has passed (c >= W), a prefix
        #: of the ascending windows (kept while decoding: `DecoderLines.classify`)
        self.nabove = 0
        self.event_step = NEVER
        self.version = 0  # bumped when a queued event becomes stale
        self.cow = False  # its last block may be shared (the next append copies it)
        self.forked = child != 0
        self.hashed = False  # whether its output token ids are given to the cache
        self.group: BeamGroup | None = None  # its beam-search group, if any
        #: the n sequences of its n-sample request (parent first), preempted together
        self.family: list[Seq] | None = None
        self.parked = False  # a recomputed beam waiting for its group's other beams
        self.rec = SeqRecord(self.sid, req.id, req.arrival, len(prompt), req.output_len)

    def token(self, p: int) -> int:
        """The token id at position p (prompt, then given or synthetic outputs)."""
        plen = len(self.prompt)
        if p < plen:
            return self.prompt[p]
        j = p - plen
        return self.out_tokens[j] if self.out_tokens is not None else self.out_base + j

    def history(self) -> list[int]:
        """A beam's output ids so far (the engine gives every beam a list of them)."""
        out = self.out_tokens
        assert isinstance(out, list), f"{self.sid} is not a beam"
        return out

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
