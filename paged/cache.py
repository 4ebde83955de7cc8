"""PagedKVCache: the paged implementation of the KV cache contract (reference/contract.py).

Pieces (each its own module): `BlockPool` (physical blocks, refcounts, free stack, LRU of
cached blocks), `PrefixCache` (sha256 chained block keys, verified hits), `RequestState` and
block-table tensors, `SwapSpace` (CPU blocks), and `kernels.ops` (write_kv, copy_blocks,
swap_blocks, paged_decode_attention: the only code that touches KV tensors; the backend
follows `kernels.ops.choose_backend` unless `kernel_backend` forces one).

Semantics:
    * admit reserves ceil(prompt_len / block_size) blocks: the longest verified chain of
      cached full blocks of the prompt (capped so the last prompt token is computed
      again), plus fresh blocks for the rest. A new request is admitted only if
      free - needed >= watermark * num_blocks, where free counts evictable cached blocks
      and needed counts fresh blocks plus cached hits revived from the evictable queue.
    * append writes after the last token. Running requests may grow into the watermark.
      The first write into a shared block (a partial last block shared after a fork) copies
      it first (copy-on-write); full blocks are never written again. Every block that fills
      and whose token ids are all known is indexed in the prefix cache.
    * fork shares every written block (refcounts go up); a parent still in the middle of
      its prompt gives the child fresh blocks for its own prompt reservation.
    * free releases the request's blocks tail first.
    * swap_out copies all of a request's blocks to the CPU swap space and releases them;
      swap_in (admission-like, so it respects the watermark) copies them back into fresh
      blocks, bit for bit. A swapped request keeps its id and length but cannot be
      appended to, forked, gathered or attended until swapped in. swap_out_group and
      swap_in_group do the same for several requests at once (a beam group, a request
      and its samples) and keep the blocks they share shared, on the CPU and back.
    * memory-only mode (store_kv=False): identical bookkeeping without tensors; grow
      requests with `append_tokens`.

Every operation validates everything, then mutates; a failure raises a KVBenchError
subclass and leaves the cache exactly as it was (`snapshot` lets tests prove it).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Sequence

import torch

from kvbench.kernels import ops
from kvbench.paged.block_pool import BlockPool
from kvbench.paged.block_table import RequestState, block_table_tensor, slot_mapping
from kvbench.paged.cache_inspect import PagedInspection, snapshots_equal
from kvbench.paged.cache_serving import PagedServingAccounting
from kvbench.paged.cache_swap import PagedSwap
from kvbench.paged.eviction import make_queue
from kvbench.paged.prefix_cache import ExtraKeys, KeyFn, PrefixCache, block_key
from kvbench.paged.swap import SwapSpace
from kvbench.reference.contract import RequestId
from kvbench.reference.validation import (
    allocate_zeros,
    token_id_count,
    validate_count,
    validate_device,
    validate_geometry,
    validate_kv_append,
    validate_prompt,
    validate_token_ids,
)
from kvbench.workloads.errors import (
    CapacityError,
    ConfigError,
    DuplicateRequestError,
    RequestStateError,
    ShapeError,
    UnknownRequestError,
)
from kvbench.workloads.geometry import KVGeometry, require_positive
from kvbench.workloads.torch_dtypes import torch_dtype


class PagedKVCache(PagedSwap, PagedInspection, PagedServingAccounting):
    """A paged KV cache with prefix caching, copy-on-write, swap and watermark admission.

    Args:
        geometry: KV geometry (layers, KV heads, head dim, dtype, query heads).
        num_blocks: physical GPU blocks.
        block_size: tokens per block.
        max_seq_len: the longest a request may grow (default num_blocks * block_size).
        watermark: fraction of num_blocks kept free at admission, in [0, 1).
        num_cpu_blocks: blocks of CPU swap space (0: no swapping).
        enable_prefix_caching: index full blocks and reuse them across requests.
        device: where the KV tensors live.
        store_kv: False for memory-only mode (no tensors; same bookkeeping).
        key_fn: block key function (tests inject weak ones to force collisions).
        kernel_backend: "torch" or "triton" to force the kernels' backend; None lets
            `kernels.ops` choose (Triton on CUDA, torch on CPU unless TRITON_INTERPRET=1).
        eviction_policy: which evictable cached block is reallocated first
            (`paged.eviction.POLICIES`: "lru", the default, or "lfu").
    """

    def __init__(
        self,
        geometry: KVGeometry,
        num_blocks: int,
        block_size: int = 16,
        *,
        max_seq_len: int | None = None,
        watermark: float = 0.0,
        num_cpu_blocks: int = 0,
        enable_prefix_caching: bool = True,
        device: str | torch.device = "cpu",
        store_kv: bool = True,
        key_fn: KeyFn = block_key,
        kernel_backend: str | None = None,
        eviction_policy: str = "lru",
    ) -> None:
        validate_geometry(geometry)
        make_queue(eviction_policy)  # ConfigError on an unknown name, before anything
        require_positive("num_blocks", num_blocks)
        require_positive("block_size", block_size)
        validate_count("num_blocks", num_blocks)
        validate_count("block_size", block_size)
        if num_cpu_blocks:
            validate_count("num_cpu_blocks", num_cpu_blocks)
        if max_seq_len is not None:
            require_positive("max_seq_len", max_seq_len)
        if isinstance(watermark, bool) or not isinstance(watermark, numbers.Real):
            raise ConfigError(f"watermark must be a number in [0, 1), got {watermark!r}")
        if not 0.0 <= float(watermark) < 1.0:
            raise ConfigError(f"watermark must be in [0, 1), got {watermark!r}")
        self._geometry = geometry
        self._dtype = torch_dtype(geometry.dtype)
        self._device = validate_device(device)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_seq_len = max_seq_len if max_seq_len is not None else num_blocks * block_size
        self.watermark = float(watermark)
        #: Blocks admission keeps free: the least integer >= watermark * num_blocks.
        self.watermark_blocks = math.ceil(round(self.watermark * num_blocks, 9))
        ops.choose_backend(self._device, kernel_backend)  # ConfigError on an unknown name
        self.store_kv = store_kv
        self.kernel_backend = kernel_backend
        block_shape = (block_size, geometry.num_kv_heads, geometry.head_dim)
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        if store_kv:
            shape = (geometry.num_layers, num_blocks, *block_shape)
            self._k = allocate_zeros(shape, self._dtype, self._device, "the key pool")
            self._v = allocate_zeros(shape, self._dtype, self._device, "the value pool")
        # the pool's bookkeeping after the tensors: a pool too big to hold fails first there
        self.prefix = PrefixCache(key_fn) if enable_prefix_caching else None
        self.pool = BlockPool(num_blocks, block_size, self.prefix, eviction_policy)
        self.swap = SwapSpace(
            num_cpu_blocks,
            block_shape if store_kv else None,
            geometry.num_layers,
            self._dtype,
            pin_memory=self._device.type == "cuda",
        )
        self._requests: dict[Hashable, RequestState] = {}
        self._order = 0
        self._track_tokens = store_kv or enable_prefix_caching
        self.cow_copies = 0
        self.swap_outs = 0
        self.swap_ins = 0

    # ------------------------------------------------------------------ properties
    @property
    def geometry(self) -> KVGeometry:
        return self._geometry

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def torch_dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now (free plus evictable cached)."""
        return self.pool.num_free

    def key_cache(self, layer: int) -> torch.Tensor:
        """Layer `layer`'s K pool [num_blocks, block_size, num_kv_heads, head_dim] (a view)."""
        return self._storage()[0][layer]

    def value_cache(self, layer: int) -> torch.Tensor:
        """Layer `layer`'s V pool [num_blocks, block_size, num_kv_heads, head_dim] (a view)."""
        return self._storage()[1][layer]

    # ------------------------------------------------------------------ lookups
    def _get(self, request_id: RequestId) -> RequestState:
        try:
            return self._requests[request_id]
        except (KeyError, TypeError):
            raise UnknownRequestError(f"unknown request id {request_id!r}") from None

    def _resident(self, request_id: RequestId, what: str) -> RequestState:
        req = self._get(request_id)
        if req.swapped:
            raise RequestStateError(f"cannot {what} request {request_id!r}: it is swapped out")
        return req

    def _storage(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._k is None or self._v is None:
            raise ConfigError("this cache is memory-only (store_kv=False): it holds no KV")
        return self._k, self._v

    def seq_len(self, request_id: RequestId) -> int:
        return self._get(request_id).seq_len

    def request_ids(self) -> list[RequestId]:
        """All held requests (running and swapped), in admission order."""
        return list(self._requests)

    def running_ids(self) -> list[RequestId]:
        """Requests whose blocks are on the device, in admission order."""
        return [r for r, s in self._requests.items() if not s.swapped]

    def swapped_ids(self) -> list[RequestId]:
        return [r for r, s in self._requests.items() if s.swapped]

    def is_swapped(self, request_id: RequestId) -> bool:
        return self._get(request_id).swapped

    def block_table(self, request_id: RequestId) -> list[int]:
        """A copy of the request's block table (CPU block ids when swapped)."""
        return list(self._get(request_id).blocks)

    def token_ids(self, request_id: RequestId) -> list[int | None]:
        """Ids of the request's cached tokens (None where never given)."""
        req = self._get(request_id)
        tokens = req.token_list()
        if tokens is None:
            raise ConfigError("token ids are not tracked (memory-only, no prefix caching)")
        return tokens

    def block_tables(self, request_ids: Sequence[RequestId]) -> tuple[torch.Tensor, torch.Tensor]:
        """int32 block tables [batch, max_blocks] and seq_lens [batch] of running requests,
        on the cache's device (the form `paged_decode_attention` takes)."""
        reqs = [self._resident(r, "build a block table for") for r in request_ids]
        tables, lens = block_table_tensor(
            [r.blocks for r in reqs], [r.seq_len for r in reqs], self.block_size
        )
        return tables.to(self._device), lens.to(self._device)

    # ------------------------------------------------------------------ planning (no changes)
    def _extra(self, salt: str | None, adapter_id: str | None) -> ExtraKeys:
        return (salt, adapter_id)

    def _match(self, prompt: Sequence[int], extra: ExtraKeys) -> tuple[list[bytes], list[int]]:
        if self.prefix is None:
            return [], []
        max_blocks = (len(prompt) - 1) // self.block_size  # the last token is recomputed
        return self.prefix.match(prompt, extra, self.block_size, max_blocks)

    def _admission_cost(self, prompt_len: int, hits: Sequence[int]) -> int:
        """Blocks an admission takes from the free count: fresh ones plus revived hits."""
        fresh = -(-prompt_len // self.block_size) - len(hits)
        revived = sum(1 for b in hits if self.pool.ref[b] == 0)
        return fresh + revived

    def blocks_needed_to_admit(
        self, prompt: Sequence[int], *, salt: str | None = None, adapter_id: str | None = None
    ) -> int:
        """Blocks admitting `prompt` now would take from the free count (after prefix hits)."""
        _, hits = self._match(prompt, self._extra(salt, adapter_id))
        return self._admission_cost(len(prompt), hits)

    def can_admit(
        self, prompt: Sequence[int], *, salt: str | None = None, adapter_id: str | None = None
    ) -> bool:
        """Whether admitting `prompt` now would keep the watermark (ignores other checks)."""
        need = self.blocks_needed_to_admit(prompt, salt=salt, adapter_id=adapter_id)
        return self.pool.num_free - need >= self.watermark_blocks

    def _growth(self, req: RequestState, n: int) -> tuple[int, bool]:
        """(fresh blocks, copy-on-write needed) to append n tokens to a running request."""
        s, bs = req.seq_len, self.block_size
        fresh = max(0, -(-(s + n) // bs) - len(req.blocks))
        idx = s // bs
        cow = idx < len(req.blocks) and self.pool.ref[req.blocks[idx]] > 1
        return fresh, cow

    def blocks_needed_to_grow(self, request_id: RequestId, n: int) -> int:
        """Blocks appending n tokens to a running request takes (fresh + copy-on-write)."""
        fresh, cow = self._growth(self._resident(request_id, "grow"), n)
        return fresh + int(cow)

    def can_grow(self, request_id: RequestId, n: int) -> bool:
        """Whether n tokens can be appended now (running requests may use the watermark)."""
        return self.blocks_needed_to_grow(request_id, n) <= self.pool.num_free

    # ------------------------------------------------------------------ admit
    def admit(
        self,
        request_id: RequestId,
        prompt: Sequence[int],
        *,
        salt: str | None = None,
        output_len: int | None = None,
        adapter_id: str | None = None,
    ) -> int:
        """Admit a request (see the module docstring); returns the prompt tokens served
        from the prefix cache (a multiple of block_size, < len(prompt))."""
        try:
            known = request_id in self._requests
        except TypeError:
            raise ConfigError(f"request id {request_id!r} is not hashable") from None
        if known:
            raise DuplicateRequestError(f"request id {request_id!r} is already admitted")
        prompt = validate_prompt(prompt, self.max_seq_len, check_ids=self._track_tokens)
        if output_len is not None and (
            isinstance(output_len, bool) or not isinstance(output_len, int) or output_len < 0
        ):
            raise ConfigError(f"output_len must be an integer >= 0, got {output_len!r}")
        for name, value in (("salt", salt), ("adapter_id", adapter_id)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{name} must be a string or None, got {value!r}")
        extra = self._extra(salt, adapter_id)
        keys, hits = self._match(prompt, extra)
        cost = self._admission_cost(len(prompt), hits)
        free = self.pool.num_free
        if free - cost < self.watermark_blocks:
            raise CapacityError(
                f"cannot admit request {request_id!r} ({len(prompt)} prompt tokens): needs "
                f"{cost} blocks, {free} free, watermark keeps {self.watermark_blocks}"
            )
        # ---- mutation starts: nothing below can fail
        for b in hits:
            self.pool.incref(b)
        fresh = self.pool.allocate_many(-(-len(prompt) // self.block_size) - len(hits))
        cached = len(hits) * self.block_size
        if self.prefix is not None:
            self.prefix.record_lookup(len(prompt), len(hits), cached)
        tokens = list(prompt[:cached]) if self._track_tokens else None
        self._requests[request_id] = RequestState(
            request_id,
            self._next_order(),
            prompt,
            salt,
            extra,
            output_len,
            tokens,
            cached,
            hits + fresh,
            keys,
        )
        return cached

    def _next_order(self) -> int:
        self._order += 1
        return self._order

    # ------------------------------------------------------------------ append
    def _check_growth(
        self, request_id: RequestId, n: int, token_ids: Sequence[int | None] | None
    ) -> tuple[RequestState, int, bool]:
        req = self._resident(request_id, "append to")
        if token_ids is not None:
            if token_id_count(token_ids) != n:
                raise ShapeError(f"token_ids has {len(token_ids)} ids for {n} tokens")
            validate_token_ids(token_ids)
        new_len = req.seq_len + n
        if new_len > self.max_seq_len:
            raise CapacityError(
                f"request {request_id!r} would grow to {new_len} tokens, past "
                f"max_seq_len={self.max_seq_len}"
            )
        fresh, cow = self._growth(req, n)
        if (fresh or cow) and fresh + cow > self.pool.num_free:
            raise CapacityError(
                f"cannot append {n} tokens to request {request_id!r}: needs {fresh + cow} "
                f"blocks ({fresh} new, {int(cow)} copy-on-write), {self.pool.num_free} free"
            )
        return req, fresh, cow

    def append(
        self,
        request_id: RequestId,
        keys: torch.Tensor,
        values: torch.Tensor,
        token_ids: Sequence[int | None] | None = None,
    ) -> None:
        """Write n tokens' K and V ([num_layers, n, num_kv_heads, head_dim]) after the
        request's last token (see the module docstring)."""
        n = validate_kv_append(self._geometry, self._dtype, keys, values)
        req, fresh, cow = self._check_growth(request_id, n, token_ids)
        start = self._grow(req, n, fresh, cow, token_ids)
        if self._k is not None and self._v is not None:
            slots = slot_mapping(req.blocks, self.block_size, start, n).to(self._device)
            keys = keys.to(self._device).contiguous()
            values = values.to(self._device).contiguous()
            kb = {"backend": self.kernel_backend}
            for layer in range(self._geometry.num_layers):
                ops.write_kv(
                    self._k[layer], self._v[layer], keys[layer], values[layer], slots, **kb
                )
        self._register_full_blocks(req)

    def append_tokens(
        self, request_id: RequestId, n: int, token_ids: Sequence[int | None] | None = None
    ) -> None:
        """Memory-only append of n tokens (bookkeeping only; no KV is written)."""
        if self.store_kv:
            raise ConfigError("append_tokens is for memory-only caches; use append with KV")
        if token_ids is None and type(n) is int and n > 0 and self._append_plain(request_id, n):
            return
        require_positive("n", n)
        req, fresh, cow = self._check_growth(request_id, n, token_ids)
        self._grow(req, n, fresh, cow, token_ids)
        self._register_full_blocks(req)

    def _append_plain(self, request_id: RequestId, n: int) -> bool:
        """The common memory-only append (a resident request, no ids, no copy-on-write,
        within max_seq_len) with the same checks and effects as the general path; False
        (nothing changed) for anything else. Trace replays call it millions of times."""
        try:
            req = self._requests.get(request_id)
        except TypeError:
            return False
        if req is None or req.swapped:
            return False
        s, bs, pool = req.seq_len, self.block_size, self.pool
        end = s + n
        blocks = req.blocks
        idx = s // bs
        if end > self.max_seq_len or (idx < len(blocks) and pool.ref[blocks[idx]] != 1):
            return False
        fresh = -(-end // bs) - len(blocks)
        if fresh > 0:
            if fresh > pool.num_free:
                raise CapacityError(
                    f"cannot append {n} tokens to request {request_id!r}: needs {fresh} "
                    f"blocks ({fresh} new, 0 copy-on-write), {pool.num_free} free"
                )
            for _ in range(fresh):
                blocks.append(pool.allocate())
        pool.fill_span(blocks, s, end)
        tokens = req.tokens
        if tokens is not None:
            if s < req.prompt_len:  # prompt ids are known (and no unknown tail precedes them)
                part = req.prompt[s:end]
                tokens.extend(part)
                req.unknown_tail += n - len(part)
            else:
                req.unknown_tail += n
        req.seq_len = end
        if req.hashable and tokens is not None and self.prefix is not None:
            self._register_full_blocks(req)
        return True

    def _grow(
        self,
        req: RequestState,
        n: int,
        fresh: int,
        cow: bool,
        token_ids: Sequence[int | None] | None,
    ) -> int:
        """Take the planned blocks (copy-on-write first) and advance the request by n
        tokens; returns the first new position. Nothing here can fail."""
        bs, pool, s = self.block_size, self.pool, req.seq_len
        idx = s // bs
        if cow:
            old = req.blocks[idx]
            new = pool.allocate()
            if self._k is not None and self._v is not None:
                pair = torch.tensor([[old, new]], dtype=torch.int64, device=self._device)
                for layer in range(self._geometry.num_layers):
                    ops.copy_blocks(
                        self._k[layer], self._v[layer], pair, backend=self.kernel_backend
                    )
            pool.set_fill(new, pool.fill[old])
            pool.decref(old)
            req.blocks[idx] = new
            self.cow_copies += 1
        for _ in range(fresh):
            req.blocks.append(pool.allocate())
        end = s + n
        pool.fill_span(req.blocks, s, end)
        if req.tokens is not None:
            if token_ids is not None:
                req.materialize_tail()
                req.tokens.extend(int(t) if t is not None else None for t in token_ids)
            else:
                prompt_part = req.prompt[s:end] if s < req.prompt_len else ()
                req.tokens.extend(prompt_part)
                req.unknown_tail += n - len(prompt_part)
        req.seq_len = end
        return s

    def _register_full_blocks(self, req: RequestState) -> None:
        """Index every newly full block of the request whose token ids are all known."""
        if self.prefix is None or not req.hashable or req.tokens is None:
            return
        prefix, tokens, keys, extra = self.prefix, req.tokens, req.keys, req.extra
        key_fn, insert, bs = prefix.key_fn, prefix.insert, self.block_size
        i = len(keys)
        parent = keys[-1] if keys else None
        while (i + 1) * bs <= req.seq_len:
            chunk = tuple(tokens[i * bs : (i + 1) * bs])
            if len(chunk) < bs or None in chunk:  # short: it reaches into the unknown tail
                req.hashable = False
                return
            key = key_fn(parent, chunk, extra)  # type: ignore[arg-type]
            insert(req.blocks[i], key, parent, chunk, extra)  # type: ignore[arg-type]
            keys.append(key)
            parent = key
            i += 1

    # ------------------------------------------------------------------ fork / free
    def fork(self, parent_id: RequestId, child_id: RequestId) -> None:
        """Make `child_id` share every written block of `parent_id` (copy-on-write later)."""
        parent = self._resident(parent_id, "fork")
        try:
            known = child_id in self._requests
        except TypeError:
            raise ConfigError(f"request id {child_id!r} is not hashable") from None
        if known:
            raise DuplicateRequestError(f"request id {child_id!r} is already admitted")
        shared = -(-parent.seq_len // self.block_size)
        own = len(parent.blocks) - shared  # the parent's pending prompt reservation
        if own > self.pool.num_free:
            raise CapacityError(
                f"cannot fork {parent_id!r} into {child_id!r}: its prompt reservation needs "
                f"{own} blocks, {self.pool.num_free} free"
            )
        blocks = parent.blocks[:shared]
        for b in blocks:
            self.pool.incref(b)
        blocks.extend(self.pool.allocate_many(own))
        self._requests[child_id] = parent.copy_as(child_id, self._next_order(), blocks)

    def free(self, request_id: RequestId) -> None:
        """Release the request: its blocks tail first (or its CPU blocks if swapped)."""
        req = self._get(request_id)
        if req.swapped:
            self.swap.release(req.blocks)
        else:
            self.pool.release(req.blocks)
        del self._requests[request_id]

    def gather(self, request_id: RequestId) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's K and V [num_layers, seq_len, num_kv_heads, head_dim] (copies)."""
        req = self._resident(request_id, "gather")
        k, v = self._storage()
        slots = slot_mapping(req.blocks, self.block_size, 0, req.seq_len).to(self._device)
        flat = (k.shape[0], self.num_blocks * self.block_size, *k.shape[3:])
        return k.view(flat)[:, slots].contiguous(), v.view(flat)[:, slots].contiguous()

    def attend(
        self,
        request_ids: Sequence[RequestId],
        query: torch.Tensor,
        layer: int = 0,
        scale: float | None = None,
    ) -> torch.Tensor:
        """Decode attention of one query per request through `paged_decode_attention`."""
        g = self._geometry
        reqs = [self._resident(r, "attend over") for r in request_ids]
        k, v = self._storage()
        expected = (len(reqs), g.num_q_heads, g.head_dim)
        if not isinstance(query, torch.Tensor) or query.dim() != 3:
            raise ShapeError(f"query must be a tensor {list(expected)}, got {query!r:.80}")
        if tuple(query.shape) != expected:
            raise ShapeError(f"query must be {list(expected)}, got {tuple(query.shape)}")
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < g.num_layers:
            raise ConfigError(f"layer {layer!r} outside [0, {g.num_layers})")
        for rid, req in zip(request_ids, reqs, strict=True):
            if req.seq_len == 0:
                raise ShapeError(f"request {rid!r} has no cached tokens to attend over")
        if not reqs:
            return query.clone()
        tables, lens = block_table_tensor(
            [r.blocks for r in reqs], [r.seq_len for r in reqs], self.block_size
        )
        scale = 1.0 / math.sqrt(g.head_dim) if scale is None else float(scale)
        return ops.paged_decode_attention(
            query.to(self._device),
            k[layer],
            v[layer],
            tables.to(self._device),
            lens.to(self._device),
            scale,
            backend=self.kernel_backend,
            max_seq_len=max(r.seq_len for r in reqs),
        )


__all__ = ["PagedKVCache", "snapshots_equal"]
