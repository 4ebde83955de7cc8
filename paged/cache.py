"""PagedKVCache: the paged implementation of the KV cache contract (reference/contract.py).

The cache owns named parts, each a class with its own declared state, invariants and
`check()`, each given at construction the other parts it works on (none reads the cache):

    pool        `BlockPool` (block_pool.py): physical blocks, refcounts, fill, free stack,
                LRU of evictable cached blocks; validates num_blocks and block_size
    prefix      `PrefixCache` (prefix_cache.py): sha256 chained block keys, verified hits;
                None when prefix caching is off
    admission   `PrefixAdmission` (prefix_admission.py): a prompt's cached prefix and
                admission cost; the indexing of newly full blocks
    requests    `RequestTable` (requests.py): request states by id, lookups, admission order
    kv          `DeviceKV` (device_kv.py): the device K/V pools and the `kernels.ops` calls
                that touch them (write_kv, copy_blocks; none in memory-only mode)
    swap        `SwapSpace` (swap.py): the CPU block pool (`swap.cpu`) and the swap of
                request groups between it and the device
    accounting  `CacheAccounting` (accounting.py): stats, prefix stats and the serving
                accounting the engine reads (read-only)

The cache itself plans and performs admission, growth (copy-on-write), fork and free, and
answers the contract's calls by delegating to its parts. The kernels' backend follows
`kernels.ops.choose_backend` unless `kernel_backend` forces one.

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

from collections.abc import Callable, Sequence

import torch

from kvbench.kernels import ops
from kvbench.paged.accounting import CacheAccounting, CacheLimits
from kvbench.paged.block_chain import BlockChain
from kvbench.paged.block_pool import BlockPool
from kvbench.paged.block_table import RequestState, block_table_tensor
from kvbench.paged.device_kv import DeviceKV
from kvbench.paged.eviction import make_queue
from kvbench.paged.plain_append import PlainAppend
from kvbench.paged.prefix_admission import PrefixAdmission
from kvbench.paged.prefix_cache import (
    BlockKey,
    ExtraKeys,
    KeyFn,
    PrefixCache,
    PrefixCacheStats,
    block_key,
)
from kvbench.paged.requests import RequestTable
from kvbench.paged.swap import CpuBlockPool, SwapSpace
from kvbench.reference.contract import (
    CacheStats,
    Footprint,
    Occupancy,
    RequestId,
    ServingTraits,
)
from kvbench.reference.validation import (
    MAX_INDEX,
    PLAIN_TOKEN_TYPES,
    token_id_count,
    validate_device,
    validate_geometry,
    validate_kv_append,
    validate_prompt,
    validate_token_ids,
)
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE, check_block_size
from kvbench.workloads.capacity import watermark_blocks
from kvbench.workloads.errors import CapacityError, ConfigError, ShapeError
from kvbench.workloads.geometry import KVGeometry, require_positive
from kvbench.workloads.kv_quant import ScaleSpec, append_dtype, make_kv_quant
from kvbench.workloads.kv_rules import rule_for
from kvbench.workloads.kv_spec import KVCacheSpec
from kvbench.workloads.torch_dtypes import torch_dtype

#: Every layer of this cache is full attention: growth asks that kind's rule
#: (`_append_plain` inlines it for speed).
_FULL = rule_for(KVCacheSpec.full())


class PagedKVCache:
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
            (`paged.eviction.POLICIES`: "lru", the default, "lfu", ...).
        k_scale, v_scale, scale_granularity: fp8 geometries only (`workloads.kv_quant`):
            static scales, or None for dynamic ones set by the first append; "tensor" or
            "head". The pools then hold fp8 bytes written by the kernels' quantizing
            `write_kv`, `gather` returns them, `attend` dequantizes in the kernel.
    """

    # ---- the parts (module docstring); each checks its own invariants
    pool: BlockPool
    prefix: PrefixCache | None
    admission: PrefixAdmission
    requests: RequestTable
    kv: DeviceKV
    swap: SwapSpace
    accounting: CacheAccounting
    # ---- fixed at construction
    block_size: int
    num_blocks: int
    max_seq_len: int
    watermark: float
    watermark_blocks: int
    store_kv: bool
    kernel_backend: str | None
    _geometry: KVGeometry
    _dtype: torch.dtype
    _device: torch.device
    _track_tokens: bool
    plain: PlainAppend
    _append_plain: Callable[[RequestId, int, Sequence[int | None] | None], bool]
    # ---- counters
    cow_copies: int

    def __init__(
        self,
        geometry: KVGeometry,
        num_blocks: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
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
        k_scale: ScaleSpec | None = None,
        v_scale: ScaleSpec | None = None,
        scale_granularity: str = "tensor",
        index_duplicates: bool = False,
    ) -> None:
        validate_geometry(geometry)
        if not isinstance(index_duplicates, bool):
            raise ConfigError(f"index_duplicates must be a bool, got {index_duplicates!r}")
        self.kv_quant = make_kv_quant(geometry, k_scale, v_scale, scale_granularity)
        make_queue(eviction_policy)  # ConfigError on an unknown name, before anything
        # block ids and slots go to kernels as int32; checked before anything is allocated
        num_blocks = require_positive("num_blocks", num_blocks, MAX_INDEX)
        block_size = check_block_size(block_size)
        if num_cpu_blocks:
            require_positive("num_cpu_blocks", num_cpu_blocks, MAX_INDEX)
        if max_seq_len is not None:
            require_positive("max_seq_len", max_seq_len)
        keep_free = watermark_blocks(watermark, num_blocks)
        self._geometry = geometry
        self._dtype = torch_dtype(geometry.dtype)
        self._device = validate_device(device)
        ops.choose_backend(self._device, kernel_backend)  # ConfigError on an unknown name
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_seq_len = max_seq_len if max_seq_len is not None else num_blocks * block_size
        self.watermark = float(watermark)
        #: Blocks admission keeps free: the least integer >= watermark * num_blocks.
        self.watermark_blocks = keep_free
        self.store_kv = store_kv
        self.kernel_backend = kernel_backend
        self.kv = DeviceKV(
            geometry, num_blocks, block_size, self._dtype, self._device,
            store_kv=store_kv, backend=kernel_backend,
        )  # fmt: skip
        # the pool's bookkeeping after the tensors: a pool too big to hold fails first there
        self.prefix = (
            PrefixCache(key_fn, index_duplicates=index_duplicates)
            if enable_prefix_caching
            else None
        )
        self.pool = BlockPool(num_blocks, block_size, self.prefix, eviction_policy)
        self.admission = PrefixAdmission(self.pool, self.prefix, block_size)
        cpu = CpuBlockPool(
            num_cpu_blocks,
            self.kv.block_shape if store_kv else None,
            geometry.num_layers,
            self._dtype,
            pin_memory=self._device.type == "cuda",
        )
        self.swap = SwapSpace(cpu, self.pool, self.kv, self.prefix, self.watermark_blocks)
        self.requests = RequestTable()
        #: the fast memory-only appends (`paged.plain_append`); `_append_plain` is its
        #: append as a bound method (no extra call layer)
        self.plain = PlainAppend(
            self.requests, self.pool, self.admission, block_size, self.max_seq_len
        )
        self._append_plain = self.plain.append
        limits = CacheLimits(
            self.max_seq_len, self.watermark_blocks, store_kv, geometry.bytes_per_token
        )
        self.accounting = CacheAccounting(self.pool, self.prefix, self.swap, self.requests, limits)
        #: Whether requests keep their token ids (needed for KV checks and prefix keys).
        self._track_tokens = store_kv or enable_prefix_caching
        #: Copy-on-write copies made so far.
        self.cow_copies = 0

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

    @property
    def swap_outs(self) -> int:
        """Requests swapped out so far."""
        return self.swap.swap_outs

    @property
    def swap_ins(self) -> int:
        """Requests swapped in so far."""
        return self.swap.swap_ins

    def key_cache(self, layer: int) -> torch.Tensor:
        """Layer `layer`'s K pool [num_blocks, block_size, num_kv_heads, head_dim] (a view)."""
        return self.kv.storage()[0][layer]

    def value_cache(self, layer: int) -> torch.Tensor:
        """Layer `layer`'s V pool [num_blocks, block_size, num_kv_heads, head_dim] (a view)."""
        return self.kv.storage()[1][layer]

    # ------------------------------------------------------------------ lookups
    def seq_len(self, request_id: RequestId) -> int:
        return self.requests.get(request_id).seq_len

    def request_ids(self) -> list[RequestId]:
        """All held requests (running and swapped), in admission order."""
        return self.requests.ids()

    def running_ids(self) -> list[RequestId]:
        """Requests whose blocks are on the device, in admission order."""
        return self.requests.ids(swapped=False)

    def swapped_ids(self) -> list[RequestId]:
        return self.requests.ids(swapped=True)

    def is_swapped(self, request_id: RequestId) -> bool:
        return self.requests.get(request_id).swapped

    def block_table(self, request_id: RequestId) -> list[int]:
        """A copy of the request's block table (CPU block ids when swapped)."""
        return list(self.requests.get(request_id).blocks)

    def token_ids(self, request_id: RequestId) -> list[int | None]:
        """Ids of the request's cached tokens (None where never given)."""
        tokens = self.requests.get(request_id).token_list()
        if tokens is None:
            raise ConfigError("token ids are not tracked (memory-only, no prefix caching)")
        return tokens

    def block_tables(self, request_ids: Sequence[RequestId]) -> tuple[torch.Tensor, torch.Tensor]:
        """int32 block tables [batch, max_blocks] and seq_lens [batch] of running requests,
        on the cache's device (the form `paged_decode_attention` takes)."""
        reqs = [self.requests.resident(r, "build a block table for") for r in request_ids]
        tables, lens = block_table_tensor(
            [r.blocks for r in reqs], [r.seq_len for r in reqs], self.block_size
        )
        return tables.to(self._device), lens.to(self._device)

    # ------------------------------------------------------------------ planning (no changes)
    def _match(
        self, prompt: Sequence[int], extra: ExtraKeys, chain: BlockChain | None = None
    ) -> tuple[list[BlockKey], list[int]]:
        """(keys, cached blocks) of the prompt's longest hit (`PrefixAdmission.match`)."""
        return self.admission.match(prompt, extra, chain)

    def blocks_needed_to_admit(
        self, prompt: Sequence[int], *, salt: str | None = None, adapter_id: str | None = None
    ) -> int:
        """Blocks admitting `prompt` now would take from the free count (after prefix hits)."""
        _, hits = self._match(prompt, (salt, adapter_id))
        return self.admission.cost(len(prompt), hits)

    def prefix_hit(
        self, prompt: Sequence[int], *, salt: str | None = None, adapter_id: str | None = None
    ) -> tuple[int, int]:
        """(prompt tokens an admission of `prompt` would serve from the prefix cache
        now: full blocks, the last token never, 0 without prefix caching; the blocks it
        would take from the free count, as `blocks_needed_to_admit`), from one match;
        changes nothing. vLLM v1's scheduler sizes a first chunk from the hit and admits
        only when the whole sequence fits."""
        hits = self._match(prompt, (salt, adapter_id))[1]
        return len(hits) * self.block_size, self.admission.cost(len(prompt), hits)

    def can_admit(
        self, prompt: Sequence[int], *, salt: str | None = None, adapter_id: str | None = None
    ) -> bool:
        """Whether admitting `prompt` now would keep the watermark (ignores other checks)."""
        need = self.blocks_needed_to_admit(prompt, salt=salt, adapter_id=adapter_id)
        return self.pool.num_free - need >= self.watermark_blocks

    def _growth(self, req: RequestState, n: int) -> tuple[int, bool]:
        """(fresh blocks, copy-on-write needed) to append n tokens to a running request."""
        s, bs = req.seq_len, self.block_size
        fresh = _FULL.blocks_to_grow(len(req.blocks), s, n, bs)
        idx = s // bs
        cow = idx < len(req.blocks) and self.pool.ref[req.blocks[idx]] > 1
        return fresh, cow

    def blocks_needed_to_grow(self, request_id: RequestId, n: int) -> int:
        """Blocks appending n tokens to a running request takes (fresh + copy-on-write)."""
        fresh, cow = self._growth(self.requests.resident(request_id, "grow"), n)
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
        chain: BlockChain | None = None,
    ) -> int:
        """Admit a request (see the module docstring); returns the prompt tokens served
        from the prefix cache (a multiple of block_size, < len(prompt)). `chain`: the
        prompt's key chain computed beforehand (`paged.block_chain`, for replays that
        admit one prompt into many caches); it changes no decision, only skips hashing."""
        self.requests.require_new(request_id)
        given = prompt
        prompt = validate_prompt(prompt, self.max_seq_len, check_ids=self._track_tokens)
        if output_len is not None and (
            isinstance(output_len, bool) or not isinstance(output_len, int) or output_len < 0
        ):
            raise ConfigError(f"output_len must be an integer >= 0, got {output_len!r}")
        extra = PrefixAdmission.extra_keys(salt, adapter_id)
        if chain is not None:
            chain = self.admission.check_chain(chain, given, extra)
        keys, hits = self._match(prompt, extra, chain)
        cost = self.admission.cost(len(prompt), hits)
        free = self.pool.num_free
        if free - cost < self.watermark_blocks:
            raise CapacityError(
                f"cannot admit request {request_id!r} ({len(prompt)} prompt tokens): needs "
                f"{cost} blocks, {free} free, watermark keeps {self.watermark_blocks}"
            )
        # ---- mutation starts: nothing below can fail
        self.pool.incref_many(hits)
        fresh = self.pool.allocate_many(-(-len(prompt) // self.block_size) - len(hits))
        cached = len(hits) * self.block_size
        if self.prefix is not None:
            self.prefix.record_lookup(len(prompt), len(hits), cached)
        # the hit's ids are the prompt's: kept as the request's head, not copied
        tokens: list[int | None] | None = [] if self._track_tokens else None
        state = RequestState(
            request_id,
            self.requests.next_order(),
            prompt,
            salt,
            extra,
            output_len,
            tokens,
            cached,
            hits + fresh,
            keys,
        )
        state.chain = chain
        if tokens is not None:
            state.head = cached
            if chain is None and self.prefix is not None:
                state.miss = self.prefix.miss
        self.requests.add(state)
        return cached

    # ------------------------------------------------------------------ append
    def _check_growth(
        self, request_id: RequestId, n: int, token_ids: Sequence[int | None] | None
    ) -> tuple[RequestState, int, bool]:
        """Validate appending n tokens (ids, max_seq_len, free blocks); returns the request
        and its plan (fresh blocks, copy-on-write). Changes nothing."""
        req = self.requests.resident(request_id, "append to")
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
        dtype = append_dtype(self.kv_quant, self._dtype, keys)
        n = validate_kv_append(self._geometry, dtype, keys, values)
        pending = None if self.kv_quant is None else self.kv_quant.prepare(keys, values)
        req, fresh, cow = self._check_growth(request_id, n, token_ids)
        start = self._grow(req, n, fresh, cow, token_ids)
        self.kv.write(req.blocks, start, keys, values, pending)
        if self.kv_quant is not None and pending is not None:
            self.kv_quant.commit(pending)
        self.admission.register_full_blocks(req)

    def append_tokens(
        self, request_id: RequestId, n: int, token_ids: Sequence[int | None] | None = None
    ) -> None:
        """Memory-only append of n tokens (bookkeeping only; no KV is written)."""
        if self.store_kv:
            raise ConfigError("append_tokens is for memory-only caches; use append with KV")
        if type(n) is int and n > 0 and self._append_plain(request_id, n, token_ids):
            return
        n = require_positive("n", n)
        req, fresh, cow = self._check_growth(request_id, n, token_ids)
        self._grow(req, n, fresh, cow, token_ids)
        self.admission.register_full_blocks(req)

    def _grow(
        self,
        req: RequestState,
        n: int,
        fresh: int,
        cow: bool,
        token_ids: Sequence[int | None] | None,
        *,
        ints: bool = False,
    ) -> int:
        """Take the planned blocks (copy-on-write first) and advance the request by n
        tokens; returns the first new position. Nothing here can fail. `ints`: the
        caller checked that token_ids (if any) are exact ints."""
        bs, pool, s = self.block_size, self.pool, req.seq_len
        blocks = req.blocks
        if cow:
            idx = s // bs
            old = blocks[idx]
            new = pool.allocate()
            self.kv.copy_block(old, new)
            pool.set_fill(new, pool.fill[old])
            pool.decref(old)
            blocks[idx] = new
            self.cow_copies += 1
        for _ in range(fresh):
            blocks.append(pool.allocate())
        end = s + n
        pool.fill_span(blocks, s, end)
        if (
            req.tokens is not None
            and token_ids is not None
            and not (ints or set(map(type, token_ids)) <= PLAIN_TOKEN_TYPES)  # exact ints / None
        ):
            token_ids = [int(t) if t is not None else None for t in token_ids]
        req.advance(end, token_ids)
        return s

    # ------------------------------------------------------------------ fork / free
    def fork(self, parent_id: RequestId, child_id: RequestId) -> None:
        """Make `child_id` share every written block of `parent_id` (copy-on-write later)."""
        parent = self.requests.resident(parent_id, "fork")
        self.requests.require_new(child_id)
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
        self.requests.add(parent.copy_as(child_id, self.requests.next_order(), blocks))

    def free(self, request_id: RequestId) -> None:
        """Release the request: its blocks tail first (or its CPU blocks if swapped)."""
        req = self.requests.get(request_id)
        if req.swapped:
            self.swap.release(req.blocks)
        else:
            self.pool.release(req.blocks)
        self.requests.remove(request_id)

    def gather(self, request_id: RequestId) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's K and V [num_layers, seq_len, num_kv_heads, head_dim] (copies)."""
        req = self.requests.resident(request_id, "gather")
        return self.kv.gather(req.blocks, req.seq_len)

    def attend(
        self,
        request_ids: Sequence[RequestId],
        query: torch.Tensor,
        layer: int = 0,
        scale: float | None = None,
    ) -> torch.Tensor:
        """Decode attention of one query per request through `paged_decode_attention`
        (`DeviceKV.attend`; fp8 pools dequantize with the layer's scales)."""
        reqs = [self.requests.resident(r, "attend over") for r in request_ids]
        return self.kv.attend(
            list(request_ids), [r.blocks for r in reqs], [r.seq_len for r in reqs], query,
            layer, scale, self.kv_quant,
        )  # fmt: skip

    # ------------------------------------------------------------------ swap (part: swap)
    def swap_out(self, request_id: RequestId) -> None:
        """Copy all the request's blocks to CPU swap space and release them on the device."""
        self.swap_out_group([request_id])

    def swap_in(self, request_id: RequestId) -> None:
        """Bring a swapped-out request back into fresh device blocks, bit for bit.

        Admission-like: needs free - blocks >= watermark blocks (CapacityError otherwise).
        """
        self.swap_in_group([request_id])

    def swap_out_group(self, request_ids: Sequence[RequestId]) -> None:
        """Swap out several resident requests together, keeping what they share shared
        (`SwapSpace.swap_out`). All or nothing: CapacityError (swap space too small for
        the distinct blocks) or a bad id changes nothing."""
        self.swap.swap_out(self.requests.group(request_ids, swapped=False))

    def swap_in_group(self, request_ids: Sequence[RequestId]) -> None:
        """Bring several swapped requests back together, bit for bit, restoring the sharing
        among them (`SwapSpace.swap_in`). Admission-like: needs free - distinct blocks >=
        watermark blocks. All or nothing: CapacityError or a bad id changes nothing."""
        self.swap.swap_in(self.requests.group(request_ids, swapped=True))

    # ------------------------------------------------------------------ reports (part: accounting)
    def stats(self) -> CacheStats:
        """Memory snapshot (O(requests + blocks)); see `CacheAccounting.stats`."""
        return self.accounting.stats(self.cow_copies)

    def prefix_stats(self) -> PrefixCacheStats:
        """Prefix-cache counters (all zero when prefix caching is off)."""
        return self.accounting.prefix_stats()

    def serving_traits(self) -> ServingTraits:
        """Fixed facts a serving engine reads once (contract: ServingCache)."""
        return self.accounting.serving_traits()

    def footprint(self, tokens: int) -> Footprint:
        """Blocks a request of `tokens` tokens holds alone, against the admissible pool."""
        return self.accounting.footprint(tokens)

    def next_growth(self, request_id: RequestId, length: int) -> int:
        """The next block boundary at or after `length`."""
        return self.accounting.next_growth(length)

    def occupancy(self) -> Occupancy:
        """(free, used, cached-evictable blocks, live slots, reserved slots)."""
        return self.accounting.occupancy()

    def blocks_held(self, request_ids: Sequence[RequestId]) -> int:
        """Distinct blocks (device or CPU) the requests hold, shared ones counted once."""
        return self.accounting.blocks_held(request_ids)

    # ------------------------------------------------------------------ checking
    def snapshot(self) -> dict[str, object]:
        """The whole state as comparable values and tensor copies (for atomicity tests;
        compare two with `paged.snapshots.snapshots_equal`). Expensive: copies the KV pools."""
        k, v = self.kv.snapshot()
        cpu = self.swap.cpu
        return {
            "pool": self.pool.snapshot(),
            "prefix": self.prefix.snapshot() if self.prefix is not None else None,
            "swap": self.swap.snapshot(),
            "requests": self.requests.snapshot(),
            "cow_copies": self.cow_copies,
            "k": k,
            "v": v,
            "cpu_k": None if cpu.k is None else cpu.k.clone(),
            "cpu_v": None if cpu.v is None else cpu.v.clone(),
        }

    def check(self) -> None:
        """Assert every part's invariants (pool and prefix index, device KV, request tables
        against the pool, swap space against the swapped tables, the slot accounting)."""
        self.pool.check()
        self.kv.check()
        self.requests.check(self.pool, self.prefix, self.max_seq_len)
        self.swap.check(r.blocks for r in self.requests.states() if r.swapped)
        self.accounting.check()


__all__ = ["PagedKVCache"]
