"""A memory-only serving cache of a layer-group model: what the serving engine schedules
windowed and hybrid models over.

`LayerGroupServingCache` implements the serving accounting of the KV contract
(`reference.contract.ServingCache`) for a `workloads.kv_spec.ModelKVSpec`: one pool of
equal pages (one block of one layer group), one block table per self-attention group per
request, and every operation covering all of a request's groups at once, as
`paged.layer_groups.LayerGroupsPagedCache` does with tensors. It holds no KV (like
`PagedKVCache(store_kv=False)`); its bookkeeping is block ids and reference counts in a
`BlockPool`, so forks share blocks and copy a shared partial last block on write.

Per group (the rules of `workloads.spec_capacity`):

* full attention keeps a block per `block_size` tokens until the request is freed;
* a sliding window of W releases every block wholly before the first position the
  newest query reads. A prefill chunk at positions a .. a + n - 1 keeps what its first
  query reads (from a - W + 1); a decode append of n tokens stands for n one-token steps
  (the engine defers the appends between events), so it keeps what its last query reads
  (from a + n - W). Either way the request holds, after the append, exactly the blocks
  `blocks_in_step` plans for the step that computed its newest token(s);
* cross-attention takes ceil(encoder_len / block_size) blocks at admission (the encoder
  output written once), shares them with forks and frees them with the request.

Admission reserves the pages the prompt's prefill can come to hold: every prompt block
of a full group, and for a windowed group min(prompt blocks, the blocks a span of
W - 1 + C tokens can touch) when prefill chunks are at most C = `prefill_chunk` tokens
(None: the prompt in one chunk, so every prompt block). The reservation is a floor on
the request's self-attention pages until its prompt is complete: pages it does not hold
yet are kept out of `num_free_blocks` for everyone else (`outstanding`), so a chunk never
fails, and what a window releases during prefill is not handed to others before the
prefill ends. A new request is admitted only if free - needed >= the watermark, where
free already excludes every outstanding reservation; running requests grow into the
watermark. No prefix caching.

Swap (with `num_cpu_blocks` > 0): a group of requests whose prompts are complete moves
together, every group's table and the cross-attention pages at once: each distinct
held page (shared ones once) is copied into one CPU page that carries one reference per
table entry holding it, so sharing among the group survives; released entries stay
NULL_BLOCK. Swapping in is admission-like (free - distinct pages >= the watermark) and
restores the same pattern of sharing and each page's fill. A swapped request can only be
swapped in or freed. Without swap space, swapping raises CapacityError (the engine then
recomputes).

Slots: a page has `block_size` slots, so a token written to k self-attention groups
fills k slots (`ServingTraits.slots_per_token`); live slots are the written slots of
held pages; reserved slots are (used + outstanding) pages x block_size.

With a single full-attention group this cache decides exactly as
`PagedKVCache(enable_prefix_caching=False, num_cpu_blocks=0, store_kv=False)`; the
conformance suite checks that the engine's whole timeline is identical.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvbench.paged.block_pool import BlockPool
from kvbench.paged.spec_requests import NULL_BLOCK, SpecRequest, entries, move_pages
from kvbench.reference.contract import (
    CacheStats,
    Footprint,
    Occupancy,
    RequestId,
    ServingTraits,
)
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE, check_block_size
from kvbench.workloads.capacity import blocks_for_tokens, watermark_blocks
from kvbench.workloads.errors import (
    CapacityError,
    ConfigError,
    DuplicateRequestError,
    RequestStateError,
    UnknownRequestError,
)
from kvbench.workloads.geometry import KVGeometry, require_positive
from kvbench.workloads.kv_rules import rule_for
from kvbench.workloads.kv_spec import ModelKVSpec
from kvbench.workloads.spec_capacity import request_peak_blocks
from kvbench.workloads.torch_dtypes import torch_dtype


class LayerGroupServingCache:
    """Memory-only paged accounting of a layer-group model (module docstring).

    Args:
        model: the layer groups (`workloads.kv_spec.ModelKVSpec`).
        num_blocks: pages in the pool.
        block_size: tokens per block.
        max_seq_len: longest a request may grow (default num_blocks * block_size).
        watermark: fraction of pages admission keeps free, in [0, 1).
        prefill_chunk: the largest prefill chunk the scheduler appends (its token
            budget), which bounds a windowed group's prefill reservation; None: whole
            prompts.
        num_cpu_blocks: pages of CPU swap space (0: none; preemption recomputes).
    """

    def __init__(
        self,
        model: ModelKVSpec,
        num_blocks: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        *,
        max_seq_len: int | None = None,
        watermark: float = 0.0,
        prefill_chunk: int | None = None,
        num_cpu_blocks: int = 0,
    ) -> None:
        if not isinstance(model, ModelKVSpec):
            raise ConfigError(f"model must be a ModelKVSpec, got {type(model).__name__}")
        num_blocks = require_positive("num_blocks", num_blocks)
        block_size = check_block_size(block_size)
        for g in model.groups:
            g.spec.check_block_size(block_size)  # what a kind asks of its pages
        if max_seq_len is not None:
            require_positive("max_seq_len", max_seq_len)
        if prefill_chunk is not None:
            require_positive("prefill_chunk", prefill_chunk)
        keep_free = watermark_blocks(watermark, num_blocks)
        if (
            isinstance(num_cpu_blocks, bool)
            or not isinstance(num_cpu_blocks, int)
            or (num_cpu_blocks < 0)
        ):
            raise ConfigError(f"num_cpu_blocks must be an integer >= 0, got {num_cpu_blocks!r}")
        if not model.self_groups:
            raise ConfigError(f"model {model.name!r} has no self-attention group to decode")
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_seq_len = max_seq_len if max_seq_len is not None else num_blocks * block_size
        self.watermark_blocks = keep_free
        self.prefill_chunk = prefill_chunk
        self.pool = BlockPool(num_blocks, block_size)
        #: CPU swap space (None: none)
        self.cpu = BlockPool(num_cpu_blocks, block_size) if num_cpu_blocks else None
        #: per self-attention group: the rule of its kind (`workloads.kv_rules`)
        self.rules = [rule_for(model.groups[g].spec) for g in model.self_groups]
        cross = [rule_for(model.groups[g].spec) for g in model.cross_groups]
        self.encoder_lens: list[int] = [int(r.spec.encoder_len or 0) for r in cross]
        self.cross_blocks = sum(r.admission_blocks(block_size) for r in cross)
        self.cross_slots = sum(self.encoder_lens)
        self.outstanding = 0  # sum of the requests' outstanding reservations
        self._requests: dict[RequestId, SpecRequest] = {}
        g = model.groups[0]
        self._geometry = KVGeometry(model.num_layers, g.num_kv_heads, g.head_dim, g.dtype)

    # ------------------------------------------------------------------ KV contract
    @property
    def geometry(self) -> KVGeometry:
        """Every KV-holding layer of the model (all groups) with the groups' KV shape."""
        return self._geometry

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self._geometry.dtype)

    def request_ids(self) -> list[RequestId]:
        return list(self._requests)

    def _get(self, request_id: RequestId) -> SpecRequest:
        try:
            return self._requests[request_id]
        except (KeyError, TypeError):
            raise UnknownRequestError(f"unknown request {request_id!r}") from None

    def _resident(self, request_id: RequestId, action: str) -> SpecRequest:
        """The request, which must not be swapped out (RequestStateError naming the
        action otherwise)."""
        req = self._get(request_id)
        if req.swapped:
            raise RequestStateError(f"cannot {action} request {request_id!r}: it is swapped out")
        return req

    def seq_len(self, request_id: RequestId) -> int:
        return self._get(request_id).seq_len

    def block_tables(self, request_id: RequestId) -> list[list[int]]:
        """Copies of the request's self-attention group tables (NULL_BLOCK: released)."""
        return [list(t) for t in self._get(request_id).tables]

    def pages_held(self, request_id: RequestId) -> int:
        """Pages the request holds now over all its groups (cross-attention included)."""
        req = self._get(request_id)
        return req.held + len(req.cross)

    def append(
        self,
        request_id: RequestId,
        keys: torch.Tensor,
        values: torch.Tensor,
        token_ids: Sequence[int] | None = None,
    ) -> None:
        raise ConfigError("LayerGroupServingCache is memory-only: grow with append_tokens")

    def gather(self, request_id: RequestId) -> tuple[torch.Tensor, torch.Tensor]:
        raise ConfigError("LayerGroupServingCache is memory-only: it holds no KV to gather")

    def attend(
        self,
        request_ids: Sequence[RequestId],
        query: torch.Tensor,
        layer: int = 0,
        scale: float | None = None,
    ) -> torch.Tensor:
        raise ConfigError("LayerGroupServingCache is memory-only: it holds no KV to attend")

    # ------------------------------------------------------------------ planning
    def prefill_pages(self, prompt_len: int) -> int:
        """Self-attention pages a prompt of `prompt_len` tokens may hold during its
        prefill in chunks of at most `prefill_chunk` tokens (module docstring)."""
        chunk = self.prefill_chunk or prompt_len
        return sum(r.prefill_pages(prompt_len, chunk, self.block_size) for r in self.rules)

    def blocks_needed_to_admit(self, prompt: Sequence[int], *, salt: str | None = None) -> int:
        """Pages admitting `prompt` takes from the free count: its prefill reservation
        plus the cross-attention pages (no prefix caching)."""
        return self.prefill_pages(len(prompt)) + self.cross_blocks

    def _plan(self, req: SpecRequest, n: int) -> tuple[list[list[int]], int, int, int, int]:
        """An append of n tokens: (per group the logical blocks it releases, blocks it
        takes (new + copy-on-write), blocks freed by releases of blocks it does not
        write, blocks freed by releases of blocks it writes, self pages held after).

        A decode append releases relative to its last query, so a block it writes can
        leave the window in the same call (n one-token steps would have written it,
        then dropped it); such blocks are freed after the writes."""
        bs, ref = self.block_size, self.pool.ref
        s = req.seq_len
        query = s + n - 1 if s >= req.prompt_len else s  # the query deciding releases
        end_blocks = blocks_for_tokens(s + n, bs)
        written = s // bs  # the first block this append writes
        releases: list[list[int]] = []
        take = early = late = 0
        held = req.held
        for gi, (rule, table) in enumerate(zip(self.rules, req.tables, strict=True)):
            new = rule.blocks_to_grow(len(table), s, n, bs)
            cow = s % bs != 0 and ref[table[-1]] > 1
            gone: list[int] = []
            out = rule.first_kept(query) // bs  # blocks before it lie wholly out
            if out:
                gone = list(range(req.first[gi], min(out, end_blocks)))
                for j in gone:
                    if j < written:
                        early += ref[table[j]] == 1
                    else:
                        late += 1  # written now: held by this request alone after the write
            releases.append(gone)
            take += new + int(cow)
            held += new - len(gone)
        return releases, take, early, late, held

    def blocks_needed_to_grow(self, request_id: RequestId, n: int) -> int:
        """Blocks appending n tokens takes (new + copy-on-write), before what its
        releases free (an upper bound of its net need)."""
        return self._plan(self._resident(request_id, "grow"), n)[1]

    # ------------------------------------------------------------------ mutation
    def admit(
        self,
        request_id: RequestId,
        prompt: Sequence[int],
        *,
        salt: str | None = None,
        output_len: int | None = None,
    ) -> int:
        """Admit a request: reserve its prefill pages and take its cross-attention pages
        (module docstring). Returns 0 (no prefix caching). CapacityError, nothing
        changed, when the watermark would be crossed."""
        if request_id in self._requests:
            raise DuplicateRequestError(f"request {request_id!r} is already admitted")
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence):
            raise ConfigError(f"prompt must be a sequence of token ids, got {prompt!r}")
        plen = len(prompt)
        if plen == 0:
            raise ConfigError(f"request {request_id!r} has an empty prompt")
        if plen > self.max_seq_len:
            raise CapacityError(
                f"request {request_id!r} has {plen} prompt tokens, past "
                f"max_seq_len={self.max_seq_len}"
            )
        floor = self.prefill_pages(plen)
        need = floor + self.cross_blocks
        free = self.num_free_blocks
        if free - need < self.watermark_blocks:
            raise CapacityError(
                f"cannot admit request {request_id!r} ({plen} prompt tokens): needs {need} "
                f"pages, {free} free, watermark keeps {self.watermark_blocks}"
            )
        # ---- mutation: nothing below can fail
        cross = self.pool.allocate_many(self.cross_blocks)
        start = 0
        for length in self.encoder_lens:
            k = blocks_for_tokens(length, self.block_size)
            self.pool.fill_span(cross[start : start + k], 0, length)
            start += k
        groups = len(self.rules)
        req = SpecRequest(plen, [[] for _ in range(groups)], cross, floor=floor)
        req.first = [0] * groups
        self._requests[request_id] = req
        self.outstanding += req.outstanding
        return 0

    def append_tokens(
        self, request_id: RequestId, n: int, token_ids: Sequence[int | None] | None = None
    ) -> None:
        """Append n tokens to every self-attention group (the releases of every group
        first, then new blocks and copy-on-write group by group, so the check below
        holds whatever the order of the groups); CapacityError, nothing changed, when
        the pool cannot supply them without touching another request's reservation."""
        req = self._resident(request_id, "append to")
        n = require_positive("n", n)
        if req.seq_len + n > self.max_seq_len:
            raise CapacityError(
                f"request {request_id!r} would grow to {req.seq_len + n} tokens, past "
                f"max_seq_len={self.max_seq_len}"
            )
        releases, take, early, late, held = self._plan(req, n)
        floor = req.floor if req.seq_len + n < req.prompt_len else 0
        out_after = floor - held if floor > held else 0
        others = self.outstanding - req.outstanding
        free = self.pool.num_free
        if take > free + early or free + early + late - take < others + out_after:
            raise CapacityError(
                f"cannot append {n} tokens to request {request_id!r}: needs {take} pages "
                f"({early + late} freed by its windows), {self.num_free_blocks} free"
            )
        # ---- mutation: nothing below can fail
        pool, bs, s = self.pool, self.block_size, req.seq_len
        self.outstanding -= req.outstanding
        end_blocks = blocks_for_tokens(s + n, bs)
        written = s // bs
        for gi, table in enumerate(req.tables):  # every group releases before any takes
            for j in releases[gi]:
                if j < written:  # blocks this append does not write go first
                    pool.decref(table[j])
                    table[j] = NULL_BLOCK
        for gi, table in enumerate(req.tables):
            gone = releases[gi]
            if s % bs and pool.ref[table[-1]] > 1:  # copy-on-write of the shared last block
                old = table[-1]
                new = pool.allocate()
                pool.set_fill(new, pool.fill[old])
                pool.decref(old)
                table[-1] = new
            table.extend(pool.allocate_many(end_blocks - len(table)))
            pool.fill_span(table, s, s + n)
            for j in gone:
                if j >= written:
                    pool.decref(table[j])
                    table[j] = NULL_BLOCK
            if gone:
                req.first[gi] = gone[-1] + 1
        req.seq_len = s + n
        req.held = held
        req.floor = floor
        self.outstanding += req.outstanding

    def fork(self, parent_id: RequestId, child_id: RequestId) -> None:
        """The child shares every held block of every group of the parent (its prompt
        must be complete: the engine forks after prefill)."""
        parent = self._resident(parent_id, "fork")
        if child_id in self._requests:
            raise DuplicateRequestError(f"request {child_id!r} is already admitted")
        if parent.floor:
            raise RequestStateError(
                f"cannot fork {parent_id!r} into {child_id!r} before its prompt is complete"
            )
        pool = self.pool
        for table in parent.tables:
            for b in table:
                if b != NULL_BLOCK:
                    pool.incref(b)
        for b in parent.cross:
            pool.incref(b)
        self._requests[child_id] = SpecRequest(
            parent.prompt_len,
            [list(t) for t in parent.tables],
            list(parent.cross),
            parent.seq_len,
            parent.held,
            0,
            list(parent.first),
        )

    def free(self, request_id: RequestId) -> None:
        """Release every block of every group of the request and its reservation."""
        req = self._get(request_id)
        self.outstanding -= req.outstanding
        pool = self.cpu if req.swapped else self.pool
        assert pool is not None
        for table in req.tables:
            pool.release([b for b in table if b != NULL_BLOCK])
        pool.release(req.cross)
        del self._requests[request_id]

    def _group(self, request_ids: Sequence[RequestId], swapped: bool) -> list[SpecRequest]:
        """The requests of a swap, each once, all in the state the swap moves them from
        (RequestStateError, UnknownRequestError or ConfigError otherwise)."""
        if isinstance(request_ids, (str, bytes)) or not request_ids:
            raise ConfigError(f"a swap needs a non-empty list of request ids, got {request_ids!r}")
        if len(set(request_ids)) != len(request_ids):
            raise ConfigError(f"request ids repeat in {list(request_ids)!r}")
        reqs = [self._get(rid) for rid in request_ids]
        for rid, req in zip(request_ids, reqs, strict=True):
            if req.swapped != swapped:
                state = "swapped out" if req.swapped else "resident"
                raise RequestStateError(f"request {rid!r} is {state}")
            if req.floor:
                raise RequestStateError(
                    f"cannot swap request {rid!r} before its prompt is complete"
                )
        return reqs

    def swap_out_group(self, request_ids: Sequence[RequestId]) -> None:
        """Move resident requests to swap space together (module docstring); all or
        nothing: CapacityError (no swap space, or too little for the distinct pages) or a
        bad id or state changes nothing."""
        reqs = self._group(request_ids, swapped=False)
        if self.cpu is None:
            raise CapacityError(
                "LayerGroupServingCache has no swap space (num_cpu_blocks=0): preemption recomputes"
            )
        need = len({b for req in reqs for b in entries(req)})
        if need > self.cpu.num_free:
            raise CapacityError(
                f"cannot swap out request(s) {list(request_ids)!r}: needs {need} pages of "
                f"swap space, {self.cpu.num_free} free"
            )
        move_pages(reqs, self.pool, self.cpu)
        for req in reqs:
            req.swapped = True

    def swap_in_group(self, request_ids: Sequence[RequestId]) -> None:
        """Bring swapped requests back together, their sharing and fills restored;
        admission-like: CapacityError, nothing changed, unless free - distinct pages >=
        the watermark."""
        reqs = self._group(request_ids, swapped=True)
        assert self.cpu is not None  # only a cache with swap space swaps out
        need = len({b for req in reqs for b in entries(req)})
        free = self.num_free_blocks
        if free - need < self.watermark_blocks:
            raise CapacityError(
                f"cannot swap in request(s) {list(request_ids)!r}: needs {need} pages, {free} "
                f"free, watermark keeps {self.watermark_blocks}"
            )
        move_pages(reqs, self.cpu, self.pool)
        for req in reqs:
            req.swapped = False

    # ------------------------------------------------------------------ serving accounting
    def serving_traits(self) -> ServingTraits:
        return ServingTraits(
            block_size=self.block_size,
            store_kv=False,
            prefix_caching=False,
            can_swap=self.cpu is not None,
            max_seq_len=self.max_seq_len,
            watermark_blocks=self.watermark_blocks,
            releases_blocks=any(r.bounded for r in self.rules),
            slots_per_token=len(self.rules),
        )

    def footprint(self, tokens: int) -> Footprint:
        """Most pages one request of `tokens` tokens can hold alone: its prefill
        reservation (were the whole length its prompt) or its decode peak
        (`request_peak_blocks`), against all pages but the watermark's."""
        tokens = require_positive("tokens", tokens)
        peak = request_peak_blocks(self.model, tokens, self.block_size)
        need = max(peak, self.prefill_pages(tokens) + self.cross_blocks)
        return Footprint(need, self.num_blocks - self.watermark_blocks, "blocks")

    def next_growth(self, request_id: RequestId, length: int) -> int:
        """The smallest length >= `length` at which a one-token append allocates (a
        block boundary) or releases a block from some window: with the first held block
        f of a window W, the append at position L drops block f once L - W + 1 >=
        (f + 1) x block_size (after a prefill that is often at once)."""
        bs = self.block_size
        best = -(-length // bs) * bs
        req = self._requests.get(request_id)
        for gi, rule in enumerate(self.rules):
            point = rule.release_point(req.first[gi] if req is not None else 0, bs)
            if point is not None:
                best = min(best, max(length, point))
        return best

    @property
    def num_free_blocks(self) -> int:
        """Pages free for growth: the pool's free pages less every outstanding
        reservation."""
        return self.pool.num_free - self.outstanding

    def occupancy(self) -> Occupancy:
        """(free, used (held + reserved), 0 cached, live slots, reserved slots)."""
        pool = self.pool
        used = pool.num_used + self.outstanding
        return Occupancy(pool.num_free - self.outstanding, used, 0, pool.live_slots,
                         used * self.block_size)  # fmt: skip

    def blocks_held(self, request_ids: Sequence[RequestId]) -> int:
        """Distinct pages the requests hold, on the device or in swap space (a shared
        page counted once)."""
        held: set[tuple[bool, int]] = set()
        for rid in request_ids:
            req = self._get(rid)
            held.update((req.swapped, b) for b in entries(req))
        return len(held)

    def stats(self) -> CacheStats:
        """A memory snapshot in page slots (a page holds block_size slots)."""
        pool, bs = self.pool, self.block_size
        reservation = self.outstanding * bs
        used_slots = pool.num_used * bs
        return CacheStats(
            capacity_slots=pool.num_blocks * bs,
            live_slots=pool.live_slots,
            reservation_slots=reservation,
            internal_fragmentation_slots=used_slots - pool.live_slots,
            free_slots=(pool.num_free - self.outstanding) * bs,
            external_fragmentation_slots=0,
            logical_tokens=sum(r.seq_len for r in self._requests.values()),
            num_requests=len(self._requests),
            bytes_per_slot=self.model.page_bytes(1),
            block_size=bs,
            total_blocks=pool.num_blocks,
            free_blocks=pool.num_free - self.outstanding,
            used_blocks=pool.num_used + self.outstanding,
            shared_blocks=sum(1 for c in pool.ref if c > 1),
        )

    # ------------------------------------------------------------------ checks
    def snapshot(self) -> tuple[object, ...]:
        """All bookkeeping as plain comparable values (atomicity tests)."""
        reqs = {
            rid: ([list(t) for t in r.tables], list(r.cross), r.seq_len, r.held, r.floor,
                  list(r.first), r.swapped)
            for rid, r in self._requests.items()
        }  # fmt: skip
        cpu = None if self.cpu is None else self.cpu.snapshot()
        return self.pool.snapshot(), cpu, reqs, self.outstanding

    def check(self) -> None:
        """Assert: the pool's invariants; refcounts equal the tables holding each block;
        each group's table covers its length and holds exactly the blocks its window
        keeps; held and outstanding counts add up; free pages cover the reservations."""
        self.pool.check()
        if self.cpu is not None:
            self.cpu.check()
        bs = self.block_size
        holders: dict[int, int] = {}
        cpu_holders: dict[int, int] = {}
        outstanding = 0
        for rid, req in self._requests.items():
            held = 0
            count = cpu_holders if req.swapped else holders
            assert not (req.swapped and req.floor), (rid, "swapped during its prefill")
            for gi, table in enumerate(req.tables):
                assert len(table) == blocks_for_tokens(req.seq_len, bs), (rid, gi)
                for j, b in enumerate(table):
                    assert (b == NULL_BLOCK) == (j < req.first[gi]), (rid, gi, j, b)
                    if b != NULL_BLOCK:
                        count[b] = count.get(b, 0) + 1
                        held += 1
            for b in req.cross:
                count[b] = count.get(b, 0) + 1
            assert held == req.held, (rid, held, req.held)
            assert not req.floor or req.seq_len < req.prompt_len, (rid, "floor after prefill")
            assert req.held <= req.floor or not req.floor, (rid, "prefill above its reservation")
            outstanding += req.outstanding
        for b, n in enumerate(self.pool.ref):
            assert n == holders.get(b, 0), (b, n, holders.get(b, 0))
        for b, n in enumerate(self.cpu.ref if self.cpu is not None else ()):
            assert n == cpu_holders.get(b, 0), ("cpu", b, n, cpu_holders.get(b, 0))
        assert outstanding == self.outstanding, (outstanding, self.outstanding)
        assert self.pool.num_free >= self.outstanding, "reservations exceed the free pages"


def spec_serving_cache(
    model: ModelKVSpec,
    kv_budget: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    *,
    max_seq_len: int | None = None,
    watermark: float = 0.01,
    prefill_chunk: int | None = None,
    swap_bytes: int = 0,
) -> LayerGroupServingCache:
    """A memory-only layer-group cache of `kv_budget` bytes: as many pages as fit
    (`ModelKVSpec.page_bytes`), and `swap_bytes` of CPU swap space (as many pages as fit;
    0: none); ConfigError when not one device page fits."""
    require_positive("kv_budget", kv_budget)
    page = model.page_bytes(check_block_size(block_size))
    if kv_budget < page:
        raise ConfigError(f"kv_budget={kv_budget} B holds no {page}-byte page of {model.name!r}")
    if isinstance(swap_bytes, bool) or not isinstance(swap_bytes, int) or swap_bytes < 0:
        raise ConfigError(f"swap_bytes must be an integer >= 0, got {swap_bytes!r}")
    return LayerGroupServingCache(
        model, kv_budget // page, block_size, max_seq_len=max_seq_len, watermark=watermark,
        prefill_chunk=prefill_chunk, num_cpu_blocks=swap_bytes // page,
    )  # fmt: skip
