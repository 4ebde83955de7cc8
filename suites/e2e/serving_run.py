"""A measured serving run: the engine's decisions drive real forward passes of a model.

The serving engine (`paged.serving.engine.Engine`, token mode) decides every step: which
sequences decode, which prompts prefill how far, who is preempted. Through its step
hook, `ModelStep` runs that step for real: a random-weight Llama-architecture model
(transformers, built in code; `ServingModelSpec`) computes the step's new tokens, whose
K and V are written into the engine's own cache storage at the slots its block tables
(paged) or reservations (contiguous) name, and attention reads the cache there through
kvbench's kernels (`kernels.ops.write_kv`, `paged_decode_attention`,
`paged_prefill_attention`: the torch path on a CPU, Triton on a GPU). The step's wall
time becomes the engine's clock, so arrivals, queueing and latency are measured.

What is timed: the forward pass of the step (embedding, projections, MLP, the kernels
writing and reading the cache, final norm and lm_head). On a GPU: wall time
(`time.perf_counter`, CUDA synchronized). On a CPU: the serving thread's CPU time
(`time.thread_time`, torch running one intra-op thread, see `cpu_threads`), which equals
wall time on an idle machine and leaves out the time other jobs of a shared machine hold
the cores (wall time there swung 2x between identical steps). The step may run `repeats`
times (the same K/V written to the same slots, the same attention read: repeating
changes nothing) and the fastest counts. The engine's own bookkeeping and the synthetic
KV it appends before each step (overwritten by the model's) are not timed.

A contiguous cache is read through the same kernels: its arena seen as blocks of
`block_size` slots, each request's reservation a run of consecutive blocks (the `max`
policy's reservations start at multiples of max_seq_len, a multiple of the block size),
so both systems pay the same attention cost and differ only in what their memory lets
the engine batch. Token ids are a fixed function of (sequence, position): the trace
decides every output length, as in a replay of recorded requests.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from kvbench.reference.contract import KVCache
from kvbench.suites.e2e.llama_forward import LlamaForward, PackedBatch, pack
from kvbench.suites.e2e.tiny_llama import random_llama
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry


@dataclass(frozen=True)
class ServingModelSpec:
    """The measured run's model: small enough that a step takes milliseconds to tens of
    milliseconds on 2 CPU cores, large enough that batching pays."""

    num_layers: int = 4
    hidden_size: int = 256
    num_q_heads: int = 8
    num_kv_heads: int = 4
    intermediate_size: int = 704
    vocab_size: int = 2048
    max_positions: int = 2048
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_q_heads

    def geometry(self) -> KVGeometry:
        return KVGeometry(
            self.num_layers, self.num_kv_heads, self.head_dim, "float32", self.num_q_heads
        )


def build_model(spec: ServingModelSpec, device: torch.device | str = "cpu"):  # type: ignore[no-untyped-def]
    """A random-weight LlamaForCausalLM of `spec` (float32, eval mode; nothing downloaded)."""
    return random_llama(spec, seed=spec.seed, device=device)


@contextmanager
def cpu_threads(n: int) -> Iterator[None]:
    """Run the block with torch using `n` intra-op threads (restored afterwards). The
    measured CPU runs use one: on a shared 2-core machine two threads spin against other
    jobs and a step's time swings by up to 10x."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def param_count(model) -> int:  # type: ignore[no-untyped-def]
    return sum(p.numel() for p in model.parameters())


class _Pools:
    """Block views of an engine cache's storage: (K, V) pools [blocks, bs, H, D] per
    layer and each request's block table."""

    def __init__(self, cache: KVCache, block_size: int) -> None:
        self.cache = cache
        self.paged = hasattr(cache, "block_table") and hasattr(cache, "key_cache")
        if self.paged:
            self.block_size = int(cache.block_size)  # type: ignore[attr-defined]
        else:
            if not hasattr(cache, "arena") or not hasattr(cache, "reservation"):
                raise ConfigError(f"{type(cache).__name__} exposes no storage to run a model on")
            cap = int(cache.capacity_tokens)  # type: ignore[attr-defined]
            if cap % block_size:
                raise ConfigError(f"capacity {cap} is not a multiple of block size {block_size}")
            self.block_size = block_size

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.paged:
            return self.cache.key_cache(layer), self.cache.value_cache(layer)  # type: ignore[attr-defined]
        k, v = self.cache.arena(layer)  # type: ignore[attr-defined]
        bs = self.block_size
        return k.view(-1, bs, *k.shape[1:]), v.view(-1, bs, *v.shape[1:])

    def table(self, rid: object) -> list[int]:
        if self.paged:
            return list(self.cache.block_table(rid))  # type: ignore[attr-defined]
        start, reserved = self.cache.reservation(rid)  # type: ignore[attr-defined]
        bs = self.block_size
        if start % bs or reserved % bs:
            raise ConfigError(
                f"reservation ({start}, {reserved}) of {rid!r} is not block-aligned ({bs})"
            )
        return list(range(start // bs, (start + reserved) // bs))


@dataclass
class _Plan:
    tables: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens: torch.Tensor
    slots: torch.Tensor
    decode_only: bool


class _PoolAttention:
    """Attention engine of `LlamaForward` over the engine cache's own storage."""

    def __init__(
        self, pools: _Pools | _ScratchPools, scale: float, backend: str | None, device
    ) -> None:  # type: ignore[no-untyped-def]
        self.pools = pools
        self.scale = scale
        self.backend = backend
        self.device = device
        self.plan: _Plan | None = None

    def make_plan(self, batch: PackedBatch) -> None:
        bs = self.pools.block_size
        tables, slots = [], []
        totals = [c + n for c, n in zip(batch.cached, batch.lengths, strict=True)]
        for rid, first, total in zip(batch.request_ids, batch.cached, totals, strict=True):
            table = self.pools.table(rid)
            if -(-total // bs) > len(table):
                raise AssertionError(f"{rid!r}: {total} tokens but {len(table)} blocks")
            tables.append(table)
            slots += [table[p // bs] * bs + p % bs for p in range(first, total)]
        width = max(len(t) for t in tables)
        tt = torch.zeros((len(tables), width), dtype=torch.int32)
        for b, t in enumerate(tables):
            tt[b, : len(t)] = torch.tensor(t, dtype=torch.int32)
        dev = self.device
        self.plan = _Plan(
            tt.to(dev),
            torch.tensor(totals, dtype=torch.int32, device=dev),
            torch.tensor([0, *batch.starts[1:], sum(batch.lengths)], dtype=torch.int32, device=dev),
            torch.tensor(slots, dtype=torch.int64, device=dev),
            all(n == 1 for n in batch.lengths),
        )

    def __call__(
        self, batch: PackedBatch, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        from kvbench.kernels import ops

        plan = self.plan
        assert plan is not None
        kc, vc = self.pools.layer(layer)
        ops.write_kv(kc, vc, k, v, plan.slots, backend=self.backend)
        if plan.decode_only:
            return ops.paged_decode_attention(
                q, kc, vc, plan.tables, plan.seq_lens, self.scale, backend=self.backend
            )
        return ops.paged_prefill_attention(
            q, kc, vc, plan.tables, plan.cu_seqlens, plan.seq_lens, self.scale,
            backend=self.backend,
        )  # fmt: skip


class _ScratchPools:
    """A one-block pool per layer shaped like `like`'s, for the empty call
    (`ModelStep.probe_every`): one request (any id) whose table is block 0."""

    def __init__(self, like: _Pools, num_layers: int) -> None:
        self.block_size = like.block_size
        k, _ = like.layer(0)
        shape = (1, *k.shape[1:])
        self._kv = [
            tuple(torch.zeros(shape, dtype=k.dtype, device=k.device) for _ in range(2))
            for _ in range(num_layers)
        ]

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self._kv[layer]
        return k, v

    def table(self, rid: object) -> list[int]:
        return [0]


@dataclass
class StepSample:
    """One executed step: its work (decoders, their KV tokens read, prefill chunks as
    (tokens cached before, length)), measured and modeled seconds, and `empty_s`: the
    mean of the two empty calls that bracket the step where the hook measures them
    (`ModelStep.probe_every`), else 0."""

    step: int
    decoders: int
    kv_read: int
    chunks: list[tuple[int, int]]
    measured_s: float
    modeled_s: float
    empty_s: float = 0.0


@dataclass
class ModelStep:
    """The engine's step hook that runs each step through the model (module docstring).

    Records a `StepSample` per executed step in `samples`."""

    model: object
    cache: KVCache
    backend: str | None = "torch"
    block_size: int = DEFAULT_BLOCK_SIZE
    repeats: int = 1
    samples: list[StepSample] = field(default_factory=list)
    #: keep each step's last-row logits per sequence id (tests hold them to an oracle)
    keep_logits: bool = False
    logits: list[dict[str, tuple[int, torch.Tensor]]] = field(default_factory=list)
    #: time an empty call (one token, no context, in a scratch one-block pool: the step's
    #: fixed cost plus one read of the weights) before the first step and after every
    #: `probe_every`-th step: the host's per-step cost at that moment, measured beside the
    #: steps (a shared host's speed drifts over seconds). Each sample's `empty_s` is the
    #: mean of the empty calls that bracket it, the latest before it and the first after
    #: it (the latest before it alone until that one runs), so a drift during the steps
    #: between two calls cancels to first order. 1: every step bracketed by its own pair
    #: (the pair's second call is the next step's first). 0: no empty calls.
    probe_every: int = 0

    def __post_init__(self) -> None:
        if self.probe_every < 0:
            raise ConfigError(f"probe_every must be >= 0, got {self.probe_every}")
        self.forward = LlamaForward(self.model)
        self.device = next(self.model.parameters()).device  # type: ignore[attr-defined]
        self.vocab = int(self.model.config.vocab_size)  # type: ignore[attr-defined]
        pools = _Pools(self.cache, self.block_size)
        self.attention = _PoolAttention(pools, self.forward.scale, self.backend, self.device)
        self._empty: list[float] = []
        self._since_probe = 0
        if self.probe_every:
            self._scratch = _PoolAttention(
                _ScratchPools(pools, int(self.model.config.num_hidden_layers)),  # type: ignore[attr-defined]
                self.forward.scale,
                self.backend,
                self.device,
            )

    def _probe(self) -> float:
        """Seconds of one empty call (see `probe_every`); the first call warms up."""
        batch = pack(["empty"], [[0]], [0], [None])
        self._scratch.make_plan(batch)
        attention, self.attention = self.attention, self._scratch
        try:
            if not self._empty:
                self._timed(batch)  # warm-up: first-call allocations are not a step's cost
            seconds = self._timed(batch)
        finally:
            self.attention = attention
        self._empty.append(seconds)
        return seconds

    def _timed(self, batch: PackedBatch) -> float:
        """Seconds of one forward pass of `batch` (and its next-token choice)."""
        cuda = self.device.type == "cuda"
        clock = time.perf_counter if cuda else time.thread_time
        if cuda:
            torch.cuda.synchronize()
        t0 = clock()
        out = self.forward(batch, self.attention)
        out.logits[batch.last_rows()].argmax(dim=-1)
        self._last = out.logits
        if cuda:
            torch.cuda.synchronize()
        return clock() - t0

    def token_ids(self, sid: str, length: int) -> list[int]:
        """The ids the run fed sequence `sid` at positions 0 .. length - 1."""
        return [self._token(sid, p) for p in range(length)]

    def _token(self, sid: str, pos: int) -> int:
        return (zlib.crc32(sid.encode()) + 7919 * pos) % self.vocab

    def __call__(
        self,
        step: int,
        decoded: list[tuple[str, int]],
        chunks: list[tuple[str, int, int]],
        model_ps: int,
    ) -> int | None:
        ids, tokens, cached = [], [], []
        for sid, c in decoded:
            ids.append(sid)
            tokens.append([self._token(sid, c)])
            cached.append(c)
        for sid, start, n in chunks:
            ids.append(sid)
            tokens.append([self._token(sid, p) for p in range(start, start + n)])
            cached.append(start)
        if not ids:
            return None  # a step that ran no token (swaps only): the model's price
        batch = pack(ids, tokens, cached, [None] * len(ids))
        empty = 0.0
        if self.probe_every:
            if not self._empty:
                self._probe()
            empty = self._empty[-1]
        self.attention.make_plan(batch)
        seconds = min(self._timed(batch) for _ in range(max(1, self.repeats)))
        if self.keep_logits:
            rows = batch.last_rows()
            ends = [c + n for c, n in zip(batch.cached, batch.lengths, strict=True)]
            self.logits.append(
                {
                    str(rid): (end, self._last[r].clone())
                    for rid, r, end in zip(batch.request_ids, rows, ends, strict=True)
                }
            )
        self.samples.append(
            StepSample(
                step,
                len(decoded),
                sum(c + 1 for _, c in decoded),
                [(start, n) for _, start, n in chunks],
                seconds,
                model_ps / 1e12,
                empty,
            )
        )
        if self.probe_every:
            self._since_probe += 1
            if self._since_probe >= self.probe_every:
                self._bracket()
        return round(seconds * 1e12)

    def _bracket(self) -> None:
        """Time the empty call that closes the open bracket: every sample since the
        previous empty call gets the mean of that call and this one."""
        before = self._empty[-1]
        after = self._probe()
        for sample in self.samples[len(self.samples) - self._since_probe :]:
            sample.empty_s = 0.5 * (before + after)
        self._since_probe = 0
