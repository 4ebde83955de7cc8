"""A paged cache of a model's layer groups over one pool (hybrid models, cross-attention).

One `BlockPool` of equal pages serves every group of a `workloads.kv_spec.ModelKVSpec`,
each request has one block table per group, and every operation covers all of a
request's groups at once (all or nothing), as vLLM's hybrid KV cache manager does:

* full attention: a block per `block_size` tokens, kept until the request is freed;
* sliding window: the release rule of `workloads.spec_capacity` (before an append writes
  positions n .., every block wholly before position n - window + 1 is released and its
  entry becomes `NULL_BLOCK`);
* cross-attention: ceil(encoder_len / block_size) blocks allocated and written once at
  admission from the encoder's K/V, read-only, shared by forks, freed with the request,
  never prefix-cached; the self-attention blocks of such a model are prefix-cached under
  keys that include a digest of the encoder K/V (`_prefix_salt`).

Storage: the groups share one K and one V tensor `[layers_per_group, num_blocks,
block_size, num_kv_heads, head_dim]` (a page is one block of one group: every group has
the same layer count and KV shape, which `ModelKVSpec` checks as equal page bytes; this
module also requires equal shapes). Layer i of a group reads and writes storage[i] at that
group's blocks. Fork shares every block of every group; the first write into a shared
partial last block copies it first. Every failed operation changes nothing.

Swap (preemption that keeps the KV, `swap_out` / `swap_in`): a group of requests moves to
a CPU block pool of `num_cpu_blocks` pages and back, every layer group at once; each
distinct device block they hold (in any group, shared among them or not) is copied and
held once on the CPU, released entries stay `NULL_BLOCK`, and swap-in gives them fresh
device blocks with the same sharing (`paged.group_swap`). Preemption by recomputation is
`free` then `admit`.

fp8 storage (`dtype` float8_e4m3fn / float8_e5m2): each group quantizes on write with
its own scales per layer (`paged.group_quant`: PagedKVCache's rules, static or dynamic,
per tensor or per KV head); `gather` returns the fp8 bytes (`scales(group)` dequantizes
them), `attend` dequantizes in the kernel; copy-on-write, swap and prefix hits move bytes.
This class implements `reference.contract.LayerGroupsKVCache`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence

import torch

from kvbench.kernels import ops
from kvbench.kernels.validation import IndexRangeError
from kvbench.paged.block_pool import BlockPool
from kvbench.paged.group_prefix import GroupPrefixIndex
from kvbench.paged.group_quant import Pending, group_quant
from kvbench.paged.group_swap import GroupSwap
from kvbench.paged.group_table import NULL_BLOCK as NULL_BLOCK  # re-exported
from kvbench.paged.group_table import GroupTable
from kvbench.paged.prefix_cache import PrefixCache
from kvbench.paged.swap import CpuBlockPool
from kvbench.reference.contract import KVPair as KV
from kvbench.workloads.block_size import check_block_size
from kvbench.workloads.capacity import blocks_for_tokens
from kvbench.workloads.errors import (
    CapacityError,
    ConfigError,
    DuplicateRequestError,
    RequestStateError,
    ShapeError,
    UnknownRequestError,
)
from kvbench.workloads.kv_quant import PendingScales, ScaleSpec
from kvbench.workloads.kv_rules import rule_for
from kvbench.workloads.kv_spec import ModelKVSpec


class LayerGroupsPagedCache(GroupSwap):
    """Paged KV of every layer group of `model`, over one pool of `num_blocks` pages."""

    def __init__(
        self,
        model: ModelKVSpec,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        *,
        num_cpu_blocks: int = 0,
        enable_prefix_caching: bool = False,
        k_scale: ScaleSpec | None = None,
        v_scale: ScaleSpec | None = None,
        scale_granularity: str = "tensor",
        kernel_backend: str | None = None,
    ) -> None:
        shapes = {(g.num_layers, g.num_kv_heads, g.head_dim) for g in model.groups}
        if len(shapes) != 1:
            raise ConfigError(
                f"model {model.name!r}: groups of different shapes {sorted(shapes)} cannot "
                "share one storage here (equal layers, KV heads and head dim needed)"
            )
        layers, heads, dim = shapes.pop()
        #: fp8 storage only: every group's scales (`paged.group_quant`); else None
        self.quant = group_quant(
            dtype, len(model.groups), layers, heads, k_scale, v_scale, scale_granularity
        )
        ops.choose_backend(torch.device(device), kernel_backend)  # ConfigError: unknown name
        #: "torch" or "triton" forces the kernels' backend (as PagedKVCache's); None: ops picks
        self.kernel_backend = kernel_backend
        self.model = model
        #: per group, the rule of its kind (`workloads.kv_rules`)
        self.rules = [rule_for(g.spec) for g in model.groups]
        self.block_size = check_block_size(block_size)
        for g in model.groups:
            g.spec.check_block_size(block_size)  # what a kind asks of its pages
        prefix = PrefixCache() if enable_prefix_caching else None
        self.pool = BlockPool(num_blocks, block_size, prefix=prefix)
        self.index = GroupPrefixIndex(prefix, model, block_size) if prefix is not None else None
        shape = (layers, num_blocks, block_size, heads, dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.kv_shape = (layers, heads, dim)
        self._requests: dict[Hashable, list[GroupTable]] = {}
        self.cpu = CpuBlockPool(num_cpu_blocks, (block_size, heads, dim), layers, dtype)
        #: Swapped-out requests (their tables hold CPU blocks) -> fill of each CPU block.
        self._swapped: set[Hashable] = set()
        self._cpu_fill: dict[int, int] = {}

    # ------------------------------------------------------------------ queries
    def _get(self, request_id: Hashable, *, resident: bool = True) -> list[GroupTable]:
        try:
            tables = self._requests[request_id]
        except KeyError:
            raise UnknownRequestError(f"unknown request {request_id!r}") from None
        if resident and request_id in self._swapped:
            raise RequestStateError(f"request {request_id!r} is swapped out")
        return tables

    def is_swapped(self, request_id: Hashable) -> bool:
        self._get(request_id, resident=False)
        return request_id in self._swapped

    def request_ids(self) -> list[Hashable]:
        return list(self._requests)

    def seq_len(self, request_id: Hashable) -> int:
        """Decoder tokens written (the same in every self-attention group)."""
        tables = self._get(request_id, resident=False)
        return tables[self.model.self_groups[0]].seq_len if self.model.self_groups else 0

    def block_table(self, request_id: Hashable, group: int) -> list[int]:
        return list(self._get(request_id, resident=False)[group].blocks)

    def held_blocks(self, request_id: Hashable, group: int) -> list[int]:
        """Logical indices of the blocks the request holds in `group`."""
        tables = self._get(request_id, resident=False)
        return [j for j, b in enumerate(tables[group].blocks) if b != NULL_BLOCK]

    def kept_from(self, request_id: Hashable, group: int) -> int:
        return self._get(request_id, resident=False)[group].kept_from

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def scales(self, group: int) -> tuple[torch.Tensor, torch.Tensor]:
        """fp8 storage: `group`'s K and V scales, float32 [layers, num_kv_heads] (what
        dequantizes `gather`'s bytes: `workloads.fp8.dequantize`). ConfigError for 16/32-bit
        storage, or while the group's dynamic scales wait for its first write."""
        if self.quant is None:
            raise ConfigError(f"the cache stores {self.k.dtype}, not fp8: it has no scales")
        return self.quant.scales(group)

    # ------------------------------------------------------------------ checks of input
    def _check_kv(self, kv: KV, what: str, n: int | None = None) -> int:
        k, v = kv
        layers, heads, dim = self.kv_shape
        if (
            k.dim() != 4
            or v.shape != k.shape
            or (k.shape[0], k.shape[2], k.shape[3]) != (layers, heads, dim)
            or (n is not None and k.shape[1] != n)
        ):
            raise ShapeError(
                f"{what}: K {tuple(k.shape)} / V {tuple(v.shape)}; expected [{layers}, "
                f"{'n' if n is None else n}, {heads}, {dim}]"
            )
        if self.quant is not None:
            self.quant.check_dtype(k, v, what)
        elif k.dtype != self.k.dtype or v.dtype != self.k.dtype:
            raise ShapeError(f"{what}: dtype {k.dtype} differs from the cache's {self.k.dtype}")
        return k.shape[1]

    # ------------------------------------------------------------------ mutation
    def admit(
        self,
        request_id: Hashable,
        encoder_kv: Sequence[KV] = (),
        *,
        prompt: Sequence[int] | None = None,
        salt: str | None = None,
    ) -> int:
        """Register a request: its cross-attention groups get blocks for the encoder K/V
        (`encoder_kv[i]` for the i-th cross group, [layers, encoder_len, heads, dim]),
        written now; its other groups start empty. Returns the prompt tokens already
        cached (0 without prefix caching). CapacityError changes nothing."""
        if request_id in self._requests:
            raise DuplicateRequestError(f"request {request_id!r} is already admitted")
        cross = self.model.cross_groups
        if len(encoder_kv) != len(cross):
            raise ShapeError(
                f"admit needs one encoder K/V per cross-attention group ({len(cross)}), "
                f"got {len(encoder_kv)}"
            )
        need = 0
        for gi, kv in zip(cross, encoder_kv, strict=True):
            length = self.model.groups[gi].spec.encoder_len
            self._check_kv(kv, f"encoder K/V of group {gi}", length)
            need += self.rules[gi].admission_blocks(self.block_size)
        pending = self.quant.prepare(cross, encoder_kv) if self.quant is not None else {}
        hit = None
        salt = self._prefix_salt(salt, encoder_kv)
        if self.index is not None and prompt is not None:
            hit = self.index.lookup(prompt, salt)
            revived = {b for t in hit.tables.values() for b in t if b != NULL_BLOCK}
            need += sum(1 for b in revived if self.pool.ref[b] == 0)
        if need > self.pool.num_free:
            raise CapacityError(
                f"request {request_id!r} needs {need} blocks for its encoder output and "
                f"cached prefix; {self.pool.num_free} free"
            )
        tables = [GroupTable() for _ in self.model.groups]
        if hit is not None:
            assert self.index is not None and prompt is not None
            for gi, blocks in hit.tables.items():
                held = [j for j, b in enumerate(blocks) if b != NULL_BLOCK]
                for j in held:
                    self.pool.incref(blocks[j])
                # first position held (a hit may hold no block: its rule needs none)
                kept = held[0] * self.block_size if held else hit.tokens
                tables[gi] = GroupTable(blocks, hit.tokens, kept)
            self.index.start(request_id, prompt, salt, hit)
        elif self.index is not None:
            self.index.start(request_id, (), salt, None)
        for gi, kv in zip(cross, encoder_kv, strict=True):
            n = kv[0].shape[1]
            tables[gi].blocks = self.pool.allocate_many(blocks_for_tokens(n, self.block_size))
            self._write(tables[gi], kv, n, pending.get(gi))
        if self.quant is not None:
            self.quant.commit(pending)
        self._requests[request_id] = tables
        return hit.tokens if hit is not None else 0

    def _prefix_salt(self, salt: str | None, encoder_kv: Sequence[KV]) -> str | None:
        """The salt prefix-cache keys use: `salt`, plus for a model with cross-attention a
        sha-256 digest of the request's encoder K/V. From the second decoder layer on, a
        token's self-attention K/V depend on the encoder output, so two requests with one
        decoder prompt but different encoder outputs must never share blocks."""
        if not encoder_kv or self.index is None:
            return salt
        digest = hashlib.sha256()
        for k, v in encoder_kv:
            for t in (k, v):
                digest.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
        return f"{salt or ''}|encoder-kv {digest.hexdigest()}"

    def _plan(self, group: int, table: GroupTable, n: int) -> tuple[list[int], bool, int]:
        """(logical blocks to release, copy-on-write of the last block?, new blocks)."""
        keep = self.rules[group].first_kept(table.seq_len)
        bs = self.block_size
        release = [
            j for j, b in enumerate(table.blocks) if b != NULL_BLOCK and (j + 1) * bs <= keep
        ]
        partial = table.seq_len % bs != 0
        cow = partial and n > 0 and self.pool.ref[table.blocks[-1]] > 1
        new = self.rules[group].blocks_to_grow(len(table.blocks), table.seq_len, n, bs)
        return release, cow, new

    def _net_need(
        self, tables: list[GroupTable], n: int
    ) -> tuple[int, int, list[tuple[int, list[int], bool, int]]]:
        """(blocks an append of n tokens allocates, blocks its releases free, and per
        self group (group, logical blocks to release, copy-on-write?, new blocks)).
        `append` releases in every group before it allocates in any, so the two
        totals decide it whatever the order of the groups."""
        take = freed = 0
        plans = []
        ref = self.pool.ref
        for gi in self.model.self_groups:
            release, cow, new = self._plan(gi, tables[gi], n)
            take += new + int(cow)
            freed += sum(1 for j in release if ref[tables[gi].blocks[j]] == 1)
            plans.append((gi, release, cow, new))
        return take, freed, plans

    def blocks_needed_to_append(self, request_id: Hashable, n: int) -> int:
        """Net blocks an append of n tokens takes from the pool over all groups: it fits
        exactly when this is at most `num_free_blocks`."""
        take, freed, _ = self._net_need(self._get(request_id), n)
        return take - freed

    def append(
        self, request_id: Hashable, kv: Sequence[KV], token_ids: Sequence[int] | None = None
    ) -> None:
        """Append n tokens to every self-attention group at once (`kv[i]` for the i-th of
        `self_groups`, [layers, n, heads, dim]): every group first releases what left its
        window, then the blocks of every group are taken in one allocation, then written.
        CapacityError, changing nothing, when the pool cannot supply the blocks; any
        other failure once the releases began is rolled back (`_apply`)."""
        tables = self._get(request_id)
        groups = self.model.self_groups
        if len(kv) != len(groups):
            raise ShapeError(f"append needs K/V for {len(groups)} groups, got {len(kv)}")
        n = self._check_kv(kv[0], "append") if kv else 0
        for i, one in enumerate(kv):
            self._check_kv(one, f"append, group {groups[i]}", n)
        ids = None
        if self.index is not None:
            ids = self.index.ids_for(request_id, self.seq_len(request_id), n, token_ids)
            if ids is not None and len(ids) != n:
                raise ShapeError(f"append of {n} tokens got {len(ids)} token ids")
        pending = self.quant.prepare(groups, kv) if self.quant is not None else {}
        take, freed, plans = self._net_need(tables, n)
        if take > self.pool.num_free + freed:
            raise CapacityError(
                f"request {request_id!r} needs {take} blocks to append {n} tokens; "
                f"{self.pool.num_free} free and {freed} leaving windows"
            )
        self._apply(tables, plans, kv, n, take, pending)
        if self.quant is not None:
            self.quant.commit(pending)
        if self.index is not None:
            self.index.extend(request_id, ids)
            for gi in groups:
                self.index.index_full_blocks(request_id, gi, tables[gi].blocks)

    def _apply(
        self,
        tables: list[GroupTable],
        plans: list[tuple[int, list[int], bool, int]],
        kv: Sequence[KV],
        n: int,
        take: int,
        pending: Pending,
    ) -> None:
        """An append's changes: release in every group, take the `take` blocks in one
        allocation (copy-on-write first, then the new ones, group by group), copy and
        write. A failure up to the allocation (the only one validated input can meet)
        is undone exactly: nothing changed. A failure in a copy or write (a device
        error) returns the blocks taken and restores every group's length and table
        tail, but the releases stand, as after an append of 0 tokens (their blocks may
        already be overwritten; gather/attend refuse the newest window until the next
        append), and cached prefixes the allocation evicted stay evicted."""
        pool = self.pool
        released: list[tuple[GroupTable, int, int, int]] = []  # (table, entry, block, fill)
        kept = [tables[gi].kept_from for gi, *_ in plans]
        try:
            for gi, release, _, _ in plans:
                table = tables[gi]
                for j in release:
                    b = table.blocks[j]
                    fill = pool.fill[b]
                    pool.decref(b)
                    released.append((table, j, b, fill))
                    table.blocks[j] = NULL_BLOCK
                table.kept_from = self.rules[gi].first_kept(table.seq_len)
            fresh = pool.allocate_many(take) if n else []
        except BaseException:
            for table, j, b, fill in reversed(released):
                pool.undo_release(b, fill)
                table.blocks[j] = b
            for (gi, *_), kept_from in zip(plans, kept, strict=True):
                tables[gi].kept_from = kept_from
            raise
        if n:
            self._copy_and_write(tables, plans, kv, n, fresh, pending)

    def _copy_and_write(
        self,
        tables: list[GroupTable],
        plans: list[tuple[int, list[int], bool, int]],
        kv: Sequence[KV],
        n: int,
        fresh: list[int],
        pending: Pending,
    ) -> None:
        """The copies and writes of an append into its `fresh` blocks; on a failure
        every group's length and table tail come back and `fresh` returns to the pool."""
        pool = self.pool
        saved = []
        for gi, *_ in plans:
            t = tables[gi]
            last = t.blocks[-1] if t.blocks else NULL_BLOCK
            fill = pool.fill[last] if last != NULL_BLOCK else 0
            saved.append((t, len(t.blocks), last, fill, t.seq_len))
        copied: list[int] = []  # the shared last blocks copy-on-write left
        try:
            blocks = iter(fresh)
            for (gi, _, cow, new), one in zip(plans, kv, strict=True):
                table = tables[gi]
                if cow:
                    old = table.blocks[-1]
                    self._copy_last_block(table, next(blocks))
                    copied.append(old)
                table.blocks += [next(blocks) for _ in range(new)]
                self._write(table, one, n, pending.get(gi))
        except BaseException:
            pool.release(fresh)
            for b in copied:
                pool.incref(b)
            for t, length, last, fill, seq_len in saved:
                del t.blocks[length:]
                if length and t.blocks[-1] != NULL_BLOCK:
                    t.blocks[-1] = last  # back from a copy-on-write
                    pool.set_fill(last, fill)  # a write may have filled the partial last
                t.seq_len = seq_len
            raise

    def _write(
        self, table: GroupTable, kv: KV, n: int, scales: PendingScales | None = None
    ) -> None:
        """Write n tokens after the table's last; fp8: quantized with `scales` (the
        table's group's)."""
        slots = self._slots(table.blocks, table.seq_len, n)
        ks = vs = None
        for layer in range(self.kv_shape[0]):
            if scales is not None:
                ks, vs = scales.layer(layer, self.k.device)
            ops.write_kv(
                self.k[layer], self.v[layer], kv[0][layer], kv[1][layer], slots,
                backend=self.kernel_backend, k_scale=ks, v_scale=vs,
            )  # fmt: skip
        self.pool.fill_span(table.blocks, table.seq_len, table.seq_len + n)
        table.seq_len += n

    def _slots(self, blocks: Sequence[int], start: int, n: int) -> torch.Tensor:
        pos = torch.arange(start, start + n, dtype=torch.int64)
        table = torch.tensor(blocks, dtype=torch.int64)
        bs = self.block_size
        return (table[pos // bs] * bs + pos % bs).to(self.k.device)

    def _copy_last_block(self, table: GroupTable, new: int) -> None:
        """Copy-on-write of the table's shared partial last block into block `new`."""
        old = table.blocks[-1]
        pairs = torch.tensor([[old, new]], dtype=torch.int64, device=self.k.device)
        for layer in range(self.kv_shape[0]):
            ops.copy_blocks(self.k[layer], self.v[layer], pairs, backend=self.kernel_backend)
        self.pool.set_fill(new, table.seq_len % self.block_size)
        self.pool.decref(old)
        table.blocks[-1] = new

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """The child shares every block of every group of the parent."""
        parent = self._get(parent_id)
        if child_id in self._requests:
            raise DuplicateRequestError(f"request {child_id!r} is already admitted")
        for table in parent:
            for b in table.blocks:
                if b != NULL_BLOCK:
                    self.pool.incref(b)
        self._requests[child_id] = [
            GroupTable(list(t.blocks), t.seq_len, t.kept_from) for t in parent
        ]
        if self.index is not None:
            self.index.fork(parent_id, child_id)

    def free(self, request_id: Hashable) -> None:
        """Release every block of every group of the request (device or swap space)."""
        tables = self._get(request_id, resident=False)
        held = [[b for b in t.blocks if b != NULL_BLOCK] for t in tables]
        if request_id in self._swapped:
            self._swapped.discard(request_id)
            for blocks in held:
                self.cpu.release(blocks)
            self._forget_free_cpu_fills()
        else:
            for blocks in held:
                self.pool.release(blocks)
        del self._requests[request_id]
        if self.index is not None:
            self.index.forget(request_id)

    # ------------------------------------------------------------------ reads
    def window_start(self, group: int, seq_len: int) -> int:
        """First position the newest token (at seq_len - 1) reads in `group`."""
        return self.rules[group].first_kept(seq_len - 1)

    def _readable_from(self, request_id: Hashable, group: int, table: GroupTable) -> int:
        """The first position the newest token reads in `group`; IndexRangeError when a
        block of its window was released. That happens only right after a prefix hit
        under a window with window % block_size == 1: the hit keeps what the *next*
        token reads (`spec_prefix`), one block short of the newest token's window; the
        next append makes the whole window readable again."""
        start = self.window_start(group, table.seq_len)
        bs = self.block_size
        for j in range(start // bs, len(table.blocks)):
            if table.blocks[j] == NULL_BLOCK:
                raise IndexRangeError(
                    f"request {request_id!r}, group {group}: the newest token (position "
                    f"{table.seq_len - 1}) reads positions {start}..{table.seq_len - 1}, "
                    f"but block {j} (positions {j * bs}..{(j + 1) * bs - 1}) was released: "
                    f"a prefix hit keeps only what the next token reads (from position "
                    f"{table.kept_from}); append a token first"
                )
        return start

    def gather(self, request_id: Hashable, group: int) -> KV:
        """K and V ([layers, n, heads, dim]) of what the newest token attends to in
        `group`: its window, every token (full attention) or the encoder output.
        IndexRangeError, as `attend`, when part of the window was released
        (`_readable_from`)."""
        table = self._get(request_id)[group]
        start = self._readable_from(request_id, group, table)
        slots = self._slots(table.blocks, start, table.seq_len - start)
        layers, heads, dim = self.kv_shape
        flat = (layers, -1, heads, dim)
        return self.k.view(flat)[:, slots], self.v.view(flat)[:, slots]

    def attend(
        self,
        request_ids: Sequence[Hashable],
        query: torch.Tensor,
        group: int,
        layer: int,
        **kw: object,
    ) -> torch.Tensor:
        """Decode attention of query[b] over request b's KV in one group and layer,
        through `kernels.ops` (windowed for a sliding-window group; keyword arguments go
        to it, e.g. backend). IndexRangeError, as `gather`, when part of a request's
        window was released (`_readable_from`), whatever the backend."""
        tables = [self._get(r)[group] for r in request_ids]
        if any(t.seq_len == 0 for t in tables):
            raise ShapeError("attend needs every request to hold at least one token there")
        for r, t in zip(request_ids, tables, strict=True):
            self._readable_from(r, group, t)
        width = max(len(t.blocks) for t in tables)
        rows = torch.full((len(tables), width), NULL_BLOCK, dtype=torch.int32)
        for i, t in enumerate(tables):
            rows[i, : len(t.blocks)] = torch.tensor(t.blocks, dtype=torch.int32)
        lens = torch.tensor([t.seq_len for t in tables], dtype=torch.int32)
        dev = self.k.device
        if self.kernel_backend is not None:
            kw.setdefault("backend", self.kernel_backend)
        if self.quant is not None:  # fp8: the kernel dequantizes with the layer's scales
            kw.update(self.quant.layer_kw(group, layer, dev))
        return ops.paged_decode_attention(
            query, self.k[layer], self.v[layer], rows.to(dev), lens.to(dev),
            window=self.rules[group].kernel_window, **kw,  # type: ignore[arg-type]
        )  # fmt: skip

    # ------------------------------------------------------------------ checks
    def snapshot(self) -> tuple[object, ...]:
        """All bookkeeping as plain values (atomicity tests)."""
        reqs = {
            r: [(list(t.blocks), t.seq_len, t.kept_from) for t in ts]
            for r, ts in self._requests.items()
        }
        cpu = (
            self.cpu.snapshot(),
            sorted(self._cpu_fill.items()),
            sorted(map(repr, self._swapped)),
        )
        prefix = self.index.snapshot() if self.index is not None else None
        quant = self.quant.snapshot() if self.quant is not None else None
        return self.pool.snapshot(), reqs, cpu, prefix, quant

    def check(self) -> None:
        """Assert the invariants: the pool's own; reference counts equal the tables that
        hold each block; every self-attention group of a request has the same length
        (full attention keeps everything from position 0); every group's table covers
        its length; no table holds a block
        wholly outside its window, and none lacks one inside; cross-attention tables hold
        exactly the encoder's blocks; swapped requests hold CPU blocks only, counted
        by the CPU pool's own check."""
        self.pool.check()
        if self.index is not None:
            self.index.prefix.check()
        self.cpu.check(
            [b for t in self._requests[r] for b in t.blocks if b != NULL_BLOCK]
            for r in self._swapped
        )
        assert set(self._cpu_fill) == {c for c, n in enumerate(self.cpu.ref) if n}
        holders: dict[int, int] = {}
        bs = self.block_size
        for rid, tables in self._requests.items():
            lengths = {gi: tables[gi].seq_len for gi in self.model.self_groups}
            assert len(set(lengths.values())) <= 1, f"request {rid!r}: group lengths {lengths}"
            for gi, table in enumerate(tables):
                rule = self.rules[gi]
                if not rule.bounded:
                    assert table.kept_from == 0, (rid, gi, table.kept_from)
                assert len(table.blocks) == blocks_for_tokens(table.seq_len, bs), (rid, gi)
                if not rule.self_attention:
                    assert table.seq_len == rule.spec.encoder_len, (rid, gi)
                for j, b in enumerate(table.blocks):
                    inside = (j + 1) * bs > table.kept_from
                    assert (b != NULL_BLOCK) == inside, (rid, gi, j, b, table.kept_from)
                    if b != NULL_BLOCK and rid not in self._swapped:
                        holders[b] = holders.get(b, 0) + 1
        for b, count in enumerate(self.pool.ref):
            assert count == holders.get(b, 0), (b, count, holders.get(b, 0))
