"""A forward pass of the tiny HF Llama in which kvbench, not transformers, owns the KV.

Why a small forward of our own rather than transformers' attention interface: kvbench's
caches are per-request (admit / append / fork / free, ragged lengths, no padding) and its
kernels take a flat ragged batch with block tables, while HF's attention hook receives
padded `[batch, heads, seq, dim]` tensors alongside HF's own `past_key_values` and a mask
built from HF's view of the batch. Prefix hits, forks and preemption change a request's
cached length behind HF's back, so the hook would have to undo HF's cache and mask logic.
Here every module of the model runs as transformers built it (embedding, RMSNorm, the
rotary embedding and `apply_rotary_pos_emb`, q/k/v/o projections, MLP, final norm,
lm_head, with HF's weights); only "where K/V live and how attention reads them" is
kvbench's, through an `Attention` engine. Tokens of all requests are packed into one
`[total_tokens, hidden]` batch, so no padding mask exists to get wrong.

Engines:
    OracleAttention   float64 `reference.oracle.extend_attention` over the request's cached
                      prefix (from `cache.gather`) plus the new tokens.
    KernelAttention   the same inputs laid out in a scratch paged pool (shuffled block
                      table) and read by `kernels.ops.write_kv` + `paged_prefill_attention`
                      (or `paged_decode_attention` when every request has one new token).
    PagedNativeAttention  the paged kernels reading a PagedKVCache's own pool through its
                      block tables (the new tokens written to a copy of the pool first).
    CacheAttention    `cache.attend`: decode attention of each request's newest token over
                      the KV the cache holds (the new token's KV must already be appended).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from kvbench.reference.contract import KVCache, RequestId
from kvbench.reference.oracle import extend_attention
from kvbench.workloads.errors import ConfigError, ShapeError


@dataclass
class PackedBatch:
    """New tokens of several requests packed back to back.

    request_ids[b] owns rows `starts[b] : starts[b] + lengths[b]` of the packed tensors;
    its new tokens sit at positions `cached[b] .. cached[b] + lengths[b] - 1`, the first
    `cached[b]` positions' KV being in `prefix_k[b]` / `prefix_v[b]`
    ([num_layers, cached, num_kv_heads, head_dim]; None when the engine reads the cache).
    """

    request_ids: list[RequestId]
    token_ids: list[list[int]]
    cached: list[int]
    prefix_k: list[torch.Tensor | None]
    prefix_v: list[torch.Tensor | None]

    @property
    def lengths(self) -> list[int]:
        return [len(t) for t in self.token_ids]

    @property
    def starts(self) -> list[int]:
        out, acc = [], 0
        for n in self.lengths:
            out.append(acc)
            acc += n
        return out

    def flat_ids(self) -> torch.Tensor:
        return torch.tensor([t for ids in self.token_ids for t in ids], dtype=torch.long)

    def flat_positions(self) -> torch.Tensor:
        pos = [c + i for c, n in zip(self.cached, self.lengths, strict=True) for i in range(n)]
        return torch.tensor(pos, dtype=torch.long)

    def last_rows(self) -> list[int]:
        return [s + n - 1 for s, n in zip(self.starts, self.lengths, strict=True)]


class Attention(Protocol):
    """Attention of the packed new tokens in one layer.

    q: [T, num_q_heads, head_dim]; k, v: [T, num_kv_heads, head_dim] of the new tokens
    (already rotated). Returns [T, num_q_heads, head_dim] float32.
    """

    def __call__(
        self, batch: PackedBatch, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor: ...


class OracleAttention:
    """Float64 causal attention over cached prefix + new tokens, per request."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __call__(
        self, batch: PackedBatch, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        out = torch.empty_like(q)
        for b, (s, n) in enumerate(zip(batch.starts, batch.lengths, strict=True)):
            pk, pv = batch.prefix_k[b], batch.prefix_v[b]
            if pk is None or pv is None:
                raise ShapeError(f"request {batch.request_ids[b]!r} has no gathered prefix")
            kk = torch.cat([pk[layer].to(k.device), k[s : s + n]])
            vv = torch.cat([pv[layer].to(v.device), v[s : s + n]])
            out[s : s + n] = extend_attention(q[s : s + n], kk, vv, self.scale).to(q.dtype)
        return out


class KernelAttention:
    """kvbench's paged kernels over a scratch paged pool holding prefix + new tokens.

    Each call lays the batch out in `block_size`-token blocks in a shuffled order (so a
    kernel that ignores the block table reads the wrong tokens), writes every token with
    `write_kv` at its slot, then runs the prefill/extend kernel (the decode kernel when
    each request has exactly one new token). `backend` is passed to `kernels.ops`
    ("torch", "triton", or None for its own choice); so is `check_indices` (False: the
    ops read nothing back from the device; the longest lengths are known here anyway).
    """

    def __init__(
        self,
        block_size: int,
        scale: float,
        backend: str | None = None,
        seed: int = 0,
        check_indices: bool = True,
    ) -> None:
        self.block_size = block_size
        self.scale = scale
        self.backend = backend
        self.check_indices = check_indices
        self._gen = torch.Generator().manual_seed(seed)

    def __call__(
        self, batch: PackedBatch, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        from kvbench.kernels import ops

        bs = self.block_size
        totals = [c + n for c, n in zip(batch.cached, batch.lengths, strict=True)]
        blocks_per = [-(-t // bs) for t in totals]
        num_blocks = sum(blocks_per) + 1
        perm = torch.randperm(num_blocks, generator=self._gen).tolist()
        hkv, d = k.shape[1], k.shape[2]
        # Slots no token occupies hold large finite garbage: a kernel that reads past a
        # sequence's length, or a wrong block, gets visibly wrong output.
        shape = (num_blocks, bs, hkv, d)
        dev = q.device
        k_cache = (torch.randn(shape, generator=self._gen) * 100).to(dev, k.dtype)
        v_cache = (torch.randn(shape, generator=self._gen) * 100).to(dev, k.dtype)
        tables = torch.zeros((len(totals), max(blocks_per)), dtype=torch.int32)
        keys, values, slots, cursor = [], [], [], 0
        for b, (s, n) in enumerate(zip(batch.starts, batch.lengths, strict=True)):
            table = perm[cursor : cursor + blocks_per[b]]
            cursor += blocks_per[b]
            tables[b, : len(table)] = torch.tensor(table, dtype=torch.int32)
            pk, pv = batch.prefix_k[b], batch.prefix_v[b]
            if pk is None or pv is None:
                raise ShapeError(f"request {batch.request_ids[b]!r} has no gathered prefix")
            keys += [pk[layer].to(dev, k.dtype), k[s : s + n]]
            values += [pv[layer].to(dev, v.dtype), v[s : s + n]]
            slots += [table[p // bs] * bs + p % bs for p in range(totals[b])]
        slot_mapping = torch.tensor(slots, dtype=torch.int64).to(dev)
        tables = tables.to(dev)
        checks = self.check_indices
        ops.write_kv(
            k_cache, v_cache, torch.cat(keys), torch.cat(values), slot_mapping,
            backend=self.backend, check_indices=checks,
        )  # fmt: skip
        seq_lens = torch.tensor(totals, dtype=torch.int32).to(dev)
        longest = max(totals)
        if all(n == 1 for n in batch.lengths):
            return ops.paged_decode_attention(
                q, k_cache, v_cache, tables, seq_lens, self.scale, backend=self.backend,
                check_indices=checks, max_seq_len=longest,
            )  # fmt: skip
        cu = torch.tensor([0, *batch.starts[1:], q.shape[0]], dtype=torch.int32).to(dev)
        return ops.paged_prefill_attention(
            q, k_cache, v_cache, tables, cu, seq_lens, self.scale, backend=self.backend,
            check_indices=checks, max_seq_len=longest, max_q_len=max(batch.lengths),
        )  # fmt: skip


@dataclass
class _NativePlan:
    """Block tables and slots of one step over a paged cache's real pool (+ scratch)."""

    tables: torch.Tensor  # int32 [batch, max_blocks]
    seq_lens: torch.Tensor  # int32 [batch]
    cu_seqlens: torch.Tensor  # int32 [batch + 1]
    slots: torch.Tensor  # int64 [T], where the new tokens go
    max_seq_len: int  # the longest of seq_lens (known on the host)
    max_q_len: int  # the most new tokens of one request
    num_scratch: int  # blocks appended after the pool
    private_copies: list[tuple[int, int]]  # (pool block, scratch block) to copy first

    def to(self, device: torch.device) -> _NativePlan:
        """The plan with its tensors on `device` (built on the host, moved once)."""
        return _NativePlan(
            self.tables.to(device),
            self.seq_lens.to(device),
            self.cu_seqlens.to(device),
            self.slots.to(device),
            self.max_seq_len,
            self.max_q_len,
            self.num_scratch,
            self.private_copies,
        )


def native_plan(
    batch: PackedBatch, tables: list[list[int]], block_size: int, pool_blocks: int
) -> _NativePlan:
    """The block tables and slots of one step of `batch` over a pool of `pool_blocks`
    blocks whose requests hold `tables` (one list per request, logical -> physical; a
    released entry, -1, may precede a sliding window and is passed on as is): tokens past
    a request's blocks go to scratch blocks numbered from `pool_blocks` on, and a partial
    block shared by several writers of the batch gets a private scratch copy per writer.
    `tables` is modified."""
    bs, pool = block_size, pool_blocks
    totals = [c + n for c, n in zip(batch.cached, batch.lengths, strict=True)]
    scratch = 0
    copies: list[tuple[int, int]] = []
    writers: dict[int, int] = {}
    for b, table in enumerate(tables):
        first = batch.cached[b]
        for i in range(first // bs, -(-totals[b] // bs)):
            if i < len(table):
                writers[table[i]] = writers.get(table[i], 0) + 1
    for b, table in enumerate(tables):
        first = batch.cached[b]
        need = -(-totals[b] // bs)
        idx = first // bs
        if first % bs and idx < len(table) and writers[table[idx]] > 1:
            copies.append((table[idx], pool + scratch))  # copy-on-write, engine side
            table[idx] = pool + scratch
            scratch += 1
        while len(table) < need:
            table.append(pool + scratch)
            scratch += 1
        del table[need:]
    slots = [
        tables[b][p // bs] * bs + p % bs
        for b in range(len(tables))
        for p in range(batch.cached[b], totals[b])
    ]
    width = max(len(t) for t in tables)
    tt = torch.zeros((len(tables), width), dtype=torch.int32)
    for b, t in enumerate(tables):
        tt[b, : len(t)] = torch.tensor(t, dtype=torch.int32)
    return _NativePlan(
        tt,
        torch.tensor(totals, dtype=torch.int32),
        torch.tensor([0, *batch.starts[1:], sum(batch.lengths)], dtype=torch.int32),
        torch.tensor(slots, dtype=torch.int64),
        max(totals),
        max(batch.lengths),
        scratch,
        copies,
    )


class PagedNativeAttention:
    """kvbench's paged kernels reading a paged cache's own pool and block tables.

    The vLLM flow: the new tokens' K/V are written with `write_kv` at their slots, then
    `paged_prefill_attention` (or `paged_decode_attention` when every request has one new
    token) reads the prefix straight from the blocks the cache's block table names, the
    blocks a prefix hit, a fork or a swap-in gave the request. Because the contract
    appends all layers at once after the forward, the writes go to a per-layer copy of the
    pool (the pool plus scratch blocks for tokens past the blocks the request holds); the
    real pool is written by `append` afterwards. A partial block shared by several
    requests of the batch (siblings after a fork) gets a private scratch copy per writer,
    as an engine's copy-on-write before the forward would.

    Needs the cache to expose `block_size`, `num_blocks`, `block_table(id)`,
    `key_cache(layer)` and `value_cache(layer)` (PagedKVCache does).
    """

    needs_prefix = False  # reads the prefix from the cache's pool, not from `gather`

    def __init__(
        self, cache, scale: float, backend: str | None = None, check_indices: bool = True
    ) -> None:
        for name in ("block_size", "num_blocks", "block_table", "key_cache", "value_cache"):
            if not hasattr(cache, name):
                raise ConfigError(
                    f"native paged attention needs cache.{name}; {type(cache).__name__} has none"
                )
        self.cache = cache
        self.scale = scale
        self.backend = backend
        self.check_indices = check_indices
        # The plan of the batch being run (held by reference: ids of freed objects recur).
        self._plan: tuple[PackedBatch, _NativePlan] | None = None

    def _make_plan(self, batch: PackedBatch) -> _NativePlan:
        tables = [list(self.cache.block_table(rid)) for rid in batch.request_ids]
        return native_plan(batch, tables, int(self.cache.block_size), int(self.cache.num_blocks))

    def __call__(
        self, batch: PackedBatch, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        from kvbench.kernels import ops

        if self._plan is None or self._plan[0] is not batch:
            self._plan = (batch, self._make_plan(batch).to(q.device))
        plan = self._plan[1]
        pools = []
        for real in (self.cache.key_cache(layer), self.cache.value_cache(layer)):
            extra = real.new_zeros((plan.num_scratch, *real.shape[1:]))
            pool = torch.cat([real, extra]).to(q.dtype)
            for src, dst in plan.private_copies:
                pool[dst] = pool[src]
            pools.append(pool)
        k_cache, v_cache = pools
        checks = self.check_indices
        ops.write_kv(k_cache, v_cache, k, v, plan.slots, backend=self.backend, check_indices=checks)
        if all(n == 1 for n in batch.lengths):
            return ops.paged_decode_attention(
                q, k_cache, v_cache, plan.tables, plan.seq_lens, self.scale, backend=self.backend,
                check_indices=checks, max_seq_len=plan.max_seq_len,
            )  # fmt: skip
        return ops.paged_prefill_attention(
            q, k_cache, v_cache, plan.tables, plan.cu_seqlens, plan.seq_lens, self.scale,
            backend=self.backend, check_indices=checks, max_seq_len=plan.max_seq_len,
            max_q_len=plan.max_q_len,
        )  # fmt: skip


class CacheAttention:
    """Decode attention through the cache under test (`KVCache.attend`).

    Every request contributes exactly its newest token, whose KV (all layers) the cache
    already holds: this is the read path an engine runs against the cache.
    """

    def __init__(self, cache: KVCache, scale: float) -> None:
        self.cache = cache
        self.scale = scale

    def __call__(
        self, batch: PackedBatch, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        if any(n != 1 for n in batch.lengths):
            raise ShapeError(f"cache attention takes one token per request, got {batch.lengths}")
        return self.cache.attend(batch.request_ids, q, layer=layer, scale=self.scale)


@dataclass
class ForwardOutput:
    """K/V of the packed new tokens ([num_layers, T, num_kv_heads, head_dim], on the
    model's device) and the logits of every packed row ([T, vocab], float32, on the CPU,
    where the runner picks tokens and the checks compare them with HF's)."""

    keys: torch.Tensor
    values: torch.Tensor
    logits: torch.Tensor


#: Submodules this forward runs, per level of a Llama-architecture model. A model with
#: any other (Qwen3's per-head `q_norm` / `k_norm`, Gemma's extra norms, ...) would be
#: decoded wrongly without them, so `check_supported` refuses it by name.
SUPPORTED_MODULES = {
    "model": frozenset({"embed_tokens", "layers", "norm", "rotary_emb"}),
    "decoder layer": frozenset({"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}),
    "attention": frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "rotary_emb"}),
}

#: Model types whose forward is exactly embedding, (RMSNorm, rotary attention, RMSNorm,
#: MLP) x layers, norm, lm_head: what `LlamaForward.__call__` implements.
SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2"})

#: Config fields that change the computation in ways this forward does not model, and
#: the value that means "off".
_UNMODELED_CONFIG = (
    ("attn_logit_softcapping", None),
    ("final_logit_softcapping", None),
    ("embedding_multiplier", None),
    ("residual_multiplier", None),
    ("logits_scaling", None),
    ("attention_multiplier", None),
)


def check_supported(model, *, allow_sliding_window: bool = False) -> None:
    """Refuse (ConfigError, naming it) a model this forward would decode wrongly: an
    unsupported model type, a submodule it does not run, a sliding attention window
    (unless `allow_sliding_window`: the layer-group runner's attention applies each
    group's window, `suites/e2e/spec_runner.py`), or a config field that changes
    attention or the logits."""
    cfg = model.config
    model_type = getattr(cfg, "model_type", None)
    inner = model.model
    levels = [("model", "model", inner)]
    for i, layer in enumerate(inner.layers):
        levels.append((f"decoder layer {i}", "decoder layer", layer))
        levels.append((f"attention of layer {i}", "attention", layer.self_attn))
    for where, kind, module in levels:
        allowed = SUPPORTED_MODULES[kind]
        extra = [name for name, _ in module.named_children() if name not in allowed]
        if extra:
            raise ConfigError(
                f"{model_type} model: {where} has module(s) {', '.join(extra)} that the e2e "
                "runner's forward does not implement (e.g. Qwen3's per-head q/k norms)"
            )
    window = getattr(cfg, "sliding_window", None)
    uses_window = getattr(cfg, "use_sliding_window", True)
    layer_types = getattr(cfg, "layer_types", None) or []
    if not allow_sliding_window and (
        (window is not None and uses_window is not False)
        or any(t != "full_attention" for t in layer_types)
    ):
        raise ConfigError(
            f"{model_type} model: sliding-window attention (sliding_window={window!r}, "
            f"layer_types={sorted(set(layer_types))}) is not implemented by the e2e runner, "
            "which attends over the whole context"
        )
    for name, off in _UNMODELED_CONFIG:
        value = getattr(cfg, name, off)
        if value is not off and value != off:
            raise ConfigError(
                f"{model_type} model: config {name}={value!r} is not implemented by the e2e "
                "runner's forward"
            )
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"model type {model_type!r} is not supported by the e2e runner (it implements "
            f"{', '.join(sorted(SUPPORTED_MODEL_TYPES))} only)"
        )


def embed_batch(inner, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    """(positions [T], hidden states [T, hidden]) of a packed batch: its flat ids through
    the decoder's token embedding (`inner`: the HF model's decoder stack), on the model's
    device. The start of every e2e forward."""
    dev = inner.embed_tokens.weight.device
    positions = batch.flat_positions().to(dev)
    return positions, inner.embed_tokens(batch.flat_ids().to(dev))


def project_qkv(  # type: ignore[no-untyped-def]
    attn, x: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's q [T, Hq, D], k and v [T, Hkv, D] from its projections of x [T, hidden]
    (v contiguous: it is stored as the layer's V as it is)."""
    t = x.shape[0]
    q = attn.q_proj(x).view(t, num_q_heads, head_dim)
    k = attn.k_proj(x).view(t, num_kv_heads, head_dim)
    return q, k, attn.v_proj(x).view(t, num_kv_heads, head_dim).contiguous()


class LlamaForward:
    """The HF Llama's layers run on a packed ragged batch with kvbench attention.

    Refuses (ConfigError) a model it would decode wrongly: see `check_supported`
    (`allow_sliding_window`: the attention engine applies the windows).
    """

    def __init__(self, model, *, allow_sliding_window: bool = False) -> None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        check_supported(model, allow_sliding_window=allow_sliding_window)
        self.model = model
        self._rotary = apply_rotary_pos_emb
        cfg = model.config
        self.num_q_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_q_heads
        self.scale = float(model.model.layers[0].self_attn.scaling)

    @torch.no_grad()
    def __call__(self, batch: PackedBatch, attention: Attention) -> ForwardOutput:
        inner = self.model.model
        positions, h = embed_batch(inner, batch)  # h [T, hidden]
        t = h.shape[0]
        cos, sin = inner.rotary_emb(h, positions.unsqueeze(0))  # [1, T, head_dim]
        cos, sin = cos[0], sin[0]
        keys, values = [], []
        for layer, block in enumerate(inner.layers):
            attn = block.self_attn
            x = block.input_layernorm(h)
            q, k, v = project_qkv(attn, x, self.num_q_heads, self.num_kv_heads, self.head_dim)
            # HF rotates [.., heads, seq, dim] with cos [.., seq, dim]; here heads are dim 1.
            q, k = self._rotary(q, k, cos, sin, unsqueeze_dim=1)
            q, k = q.contiguous(), k.contiguous()
            keys.append(k)
            values.append(v)
            o = attention(batch, layer, q, k, v)
            h = h + attn.o_proj(o.reshape(t, self.num_q_heads * self.head_dim))
            h = h + block.mlp(block.post_attention_layernorm(h))
        logits = self.model.lm_head(inner.norm(h)).float().cpu()
        return ForwardOutput(torch.stack(keys), torch.stack(values), logits)


def pack(
    request_ids: Sequence[RequestId],
    token_ids: Sequence[Sequence[int]],
    cached: Sequence[int],
    prefixes: Sequence[tuple[torch.Tensor, torch.Tensor] | None],
) -> PackedBatch:
    """A PackedBatch from per-request new tokens, cached lengths and gathered prefixes."""
    return PackedBatch(
        list(request_ids),
        [list(t) for t in token_ids],
        list(cached),
        [p[0] if p is not None else None for p in prefixes],
        [p[1] if p is not None else None for p in prefixes],
    )
