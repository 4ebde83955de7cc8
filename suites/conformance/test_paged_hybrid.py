"""Hybrid and cross-attention layer groups over one pool (`paged.layer_groups`) against
the reference that keeps everything (`reference.layer_groups`), driven by one hypothesis
state machine over random models: 1-3 groups of full attention, sliding windows,
chunked local attention (chunks of 1-3 blocks) and cross-attention (Gemma-2-like local + global, Whisper-like self + cross, two windows).

Admissions with prompts (prefix caching on or off, two salts; a hit under a window holds
only the blocks `spec_prefix` says it needs) and swap-out / swap-in of request groups (every layer group at once) joins the operations.
After every step: what each group's newest query reads is identical in both caches; each
self-attention group holds exactly the blocks `spec_capacity.blocks_in_step` plans for
the request's last append (no block referenced outside its window); cross-attention
groups hold ceil(encoder_len / block_size) blocks from admission on; reference counts and
pool accounting (device and CPU) hold. A refused admission, append or swap changes nothing.
"""

from __future__ import annotations

from typing import Any, cast

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from kvbench.kernels.validation import IndexRangeError
from kvbench.paged.layer_groups import LayerGroupsPagedCache
from kvbench.reference import oracle
from kvbench.reference.contract import KVPair, LayerGroupsKVCache
from kvbench.reference.layer_groups import LayerGroupsReferenceCache
from kvbench.workloads.capacity import blocks_for_tokens
from kvbench.workloads.errors import CapacityError, ConfigError, RequestStateError
from kvbench.workloads.kv_spec import KVCacheSpec, LayerGroup, ModelKVSpec
from kvbench.workloads.spec_capacity import blocks_in_step
from kvbench.workloads.spec_prefix import blocks_a_hit_needs

LAYERS, HEADS, DIM = 2, 1, 8

SPECS = st.one_of(
    st.builds(KVCacheSpec.sliding_window, st.integers(1, 12)),
    st.just(KVCacheSpec.full()),
    st.builds(KVCacheSpec.cross_attention, st.integers(1, 12)),
    st.builds(KVCacheSpec.chunked_local, st.integers(1, 3)),  # in blocks: `in_blocks`
)


def in_blocks(specs: list[KVCacheSpec], block_size: int) -> list[KVCacheSpec]:
    """A drawn chunked-local spec's chunk counts blocks (caches page whole-block chunks,
    `KVCacheSpec.check_block_size`); the other specs as drawn."""
    return [
        KVCacheSpec.chunked_local(s.chunk * block_size) if s.chunk is not None else s for s in specs
    ]


def _model(specs: list[KVCacheSpec]) -> ModelKVSpec:
    return ModelKVSpec("m", tuple(LayerGroup(s, LAYERS, HEADS, DIM, "float32") for s in specs))


class LayerGroupsMachine(RuleBasedStateMachine):
    """The differential; `MODELS` draws the groups' specs (subclasses narrow it)."""

    requests = Bundle("requests")
    MODELS: st.SearchStrategy[list[KVCacheSpec]] = st.lists(SPECS, min_size=1, max_size=3).filter(
        lambda s: any(x.encoder_len is None for x in s)
    )

    #: pool pages and prefix caching (subclasses draw tighter pools, more hits)
    NUM_BLOCKS: st.SearchStrategy[int] = st.integers(4, 40)
    PREFIX: st.SearchStrategy[bool] = st.booleans()
    #: tokens of the prompt appended at admission, of `rest` after the hit
    FIRST_CHUNK = staticmethod(lambda rest: st.one_of(st.just(rest), st.integers(0, rest)))

    BLOCK_SIZES: st.SearchStrategy[int] = st.sampled_from([1, 2, 3, 4, 8])

    @initialize(data=st.data(), num_cpu_blocks=st.integers(0, 24))
    def setup(self, data: st.DataObject, num_cpu_blocks: int) -> None:
        block_size = data.draw(self.BLOCK_SIZES, label="block_size")
        specs = self.draw_specs(data, block_size)
        num_blocks = self.draw_num_blocks(data, specs, block_size)
        prefix = data.draw(self.PREFIX, label="prefix caching")
        self.model = _model(specs)
        self.bs = block_size
        self.paged = LayerGroupsPagedCache(
            self.model,
            num_blocks,
            block_size,
            num_cpu_blocks=num_cpu_blocks,
            enable_prefix_caching=prefix,
            **self.draw_storage(data),
        )
        self.ref = self.make_reference()
        self.last_step: dict[int, tuple[int, int]] = {}
        #: per request just admitted with a prefix hit (until its next append): per self
        #: group the first position the hit keeps (`spec_prefix.blocks_a_hit_needs`)
        self.hit_kept: dict[int, dict[int, int]] = {}
        #: requests whose prompt is still being appended: (prompt, tokens appended)
        self.prompts: dict[int, tuple[list[int], int]] = {}
        #: every prompt admitted, with its salt (later admissions share their prefixes)
        self.shared: list[tuple[list[int], str | None]] = []
        self.next_id = 0
        self.gen = torch.Generator().manual_seed(0)
        self.prepare(data)

    def prepare(self, data: st.DataObject) -> None:
        """The first operations of every example (subclasses; none here)."""

    def draw_storage(self, data: st.DataObject) -> dict[str, Any]:
        """The paged cache's storage arguments (dtype, scales): float32 here (the fp8
        machines of `test_paged_hybrid_fp8` draw fp8)."""
        return {}

    def make_reference(self) -> LayerGroupsReferenceCache:
        """The reference the paged cache is compared with (fp8: the dequantized K/V)."""
        return LayerGroupsReferenceCache(self.model)

    def same_view(self, rid: int, group: int, paged: KVPair, ref: KVPair) -> bool:
        """Whether the paged cache's view of (rid, group) is the reference's."""
        return torch.equal(paged[0], ref[0]) and torch.equal(paged[1], ref[1])

    def draw_specs(self, data: st.DataObject, block_size: int) -> list[KVCacheSpec]:
        """The model's groups (subclasses draw orders and windows by the block size)."""
        return in_blocks(data.draw(self.MODELS, label="specs"), block_size)

    def draw_num_blocks(self, data: st.DataObject, specs: list[KVCacheSpec], bs: int) -> int:
        """The pool's pages (subclasses size it by the model)."""
        return data.draw(self.NUM_BLOCKS, label="num_blocks")

    def _kv(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = torch.randn((LAYERS, n, HEADS, DIM), generator=self.gen)
        return k, torch.randn(k.shape, generator=self.gen)

    @rule(target=requests)
    def admit(self) -> int:
        rid = self.next_id
        self.next_id += 1
        enc = self._encoder_kv()
        before = self.paged.snapshot()
        try:
            self.paged.admit(rid, enc)
        except CapacityError:
            assert self.paged.snapshot() == before, "a refused admission changed the cache"
            return rid
        self.ref.admit(rid, enc)
        self.last_step[rid] = (0, 0)
        return rid

    def _encoder_kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Fresh encoder K/V for each cross-attention group, of its encoder length."""
        enc = []
        for g in self.model.cross_groups:
            encoder_len = self.model.groups[g].spec.encoder_len
            assert encoder_len is not None  # a cross-attention group has an encoder length
            enc.append(self._kv(encoder_len))
        return enc

    def _resident(self, rid: int) -> bool:
        return rid in self.last_step and not self.ref.is_swapped(rid)

    @staticmethod
    def _prompt_kv(tokens: list[int], group: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of a prompt as a function of (group, token, position), so a prefix hit
        serves exactly the KV the reference computes for the same tokens."""
        t = torch.tensor(tokens, dtype=torch.float32)[:, None, None]
        pos = torch.arange(len(tokens), dtype=torch.float32)[:, None, None]
        k = (t + 0.5 * pos + group + torch.arange(DIM)).expand(len(tokens), HEADS, DIM)
        k = torch.stack([k * (layer + 1) for layer in range(LAYERS)])
        return k.contiguous(), (-k).contiguous()

    @rule(
        target=requests,
        stem=st.sampled_from([(1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 3, 9, 9, 9)]),
        cut=st.integers(1, 9),
        tail=st.lists(st.integers(0, 3), max_size=4),
        salt=st.sampled_from([None, "s"]),
        data=st.data(),
    )
    def admit_prompt(
        self,
        stem: tuple[int, ...],
        cut: int,
        tail: list[int],
        salt: str | None,
        data: st.DataObject,
    ) -> int:
        """Admit with a prompt from shared stems (prefix hits when caching is on) and
        append a drawn part of the rest of its prompt now (`_admit_prompt`)."""
        return self._admit_prompt([*stem[:cut], *tail], salt, data)

    def _admit_prompt(self, prompt: list[int], salt: str | None, data: st.DataObject) -> int:
        """Admit a request with `prompt` and append a drawn part of the rest of it now
        (all of it, or 0 .. all: the `append` rule goes on with the prompt); the hit
        must be whole blocks of the prompt, short of its last token. Right after a hit
        each group holds exactly the blocks `spec_prefix.blocks_a_hit_needs` lists;
        gather and attend then refuse a window reaching a block the hit did not keep and
        read the reference's view otherwise (the invariant)."""
        rid = self.next_id
        self.next_id += 1
        self.shared.append((prompt, salt))
        enc = self._encoder_kv()
        before = self.paged.snapshot()
        try:
            hit = self.paged.admit(rid, enc, prompt=prompt, salt=salt)
        except CapacityError:
            assert self.paged.snapshot() == before, "a refused admission changed the cache"
            return rid
        assert hit % self.bs == 0 and hit < len(prompt)
        self.ref.admit(rid, enc)
        full = [self._prompt_kv(prompt, g) for g in self.model.self_groups]
        if hit:
            self.ref.append(rid, [(k[:, :hit], v[:, :hit]) for k, v in full])
            self.hit_kept[rid] = {
                gi: blocks_a_hit_needs(self.model.groups[gi].spec, hit // self.bs, self.bs).start
                * self.bs
                for gi in self.model.self_groups
            }
        self.last_step[rid] = (0, hit)
        self.prompts[rid] = (prompt, hit)
        rest = len(prompt) - hit
        first = data.draw(self.FIRST_CHUNK(rest), label="first chunk")
        if first:
            self._append(rid, first)
        return rid

    def _append(self, rid: int, n: int) -> None:
        """Append n tokens (the next of its prompt while it lasts, else random K/V); a
        refusal agrees with `blocks_needed_to_append` and changes nothing, a success
        takes exactly that many blocks."""
        kv = self._next_kv(rid, n)
        n = kv[0][0].shape[1]
        before = self.paged.snapshot()
        free = self.paged.num_free_blocks
        need = self.paged.blocks_needed_to_append(rid, n)
        try:
            self.paged.append(rid, kv)
        except CapacityError:
            assert need > free, (need, free)
            assert self.paged.snapshot() == before, "a refused append changed the cache"
            return
        assert need <= free and self.paged.num_free_blocks == free - need, (need, free)
        self._appended(rid, kv)

    def _next_kv(self, rid: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if rid in self.prompts:
            prompt, done = self.prompts[rid]
            n = min(n, len(prompt) - done)
            return [
                (k[:, done : done + n], v[:, done : done + n])
                for k, v in (self._prompt_kv(prompt, g) for g in self.model.self_groups)
            ]
        return [self._kv(n) for _ in self.model.self_groups]

    def _appended(self, rid: int, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Record an append that succeeded (the reference gets the same K/V)."""
        n = kv[0][0].shape[1]
        self.ref.append(rid, kv)
        self.last_step[rid] = (self.ref.seq_len(rid) - n, n)
        self.hit_kept.pop(rid, None)
        if rid in self.prompts:
            prompt, done = self.prompts[rid]
            if done + n == len(prompt):
                del self.prompts[rid]
            else:
                self.prompts[rid] = (prompt, done + n)

    def _refused(self, rid: int, group: int) -> bool:
        """Whether the newest token's window (or chunk) reaches a block a prefix hit did
        not keep (gather and attend must then raise IndexRangeError)."""
        kept = self.hit_kept.get(rid, {}).get(group)
        spec, length = self.model.groups[group].spec, self.ref.seq_len(rid)
        if kept is None:
            return False
        if spec.window is not None:
            return max(0, length - spec.window) < kept
        if spec.chunk is not None:  # the newest token (length - 1) reads from its chunk start
            return (length - 1) // spec.chunk * spec.chunk < kept
        return False

    @rule(data=st.data(), swap_in=st.booleans())
    def swap(self, data: st.DataObject, swap_in: bool) -> None:
        """Swap a group of requests (parents and forks together) out or back in, every
        layer group at once; a refusal (swap space or pool short) changes nothing."""
        side = [r for r in self.ref.request_ids() if self.ref.is_swapped(r) == swap_in]
        if not side:
            return
        rids = data.draw(st.lists(st.sampled_from(side), min_size=1, max_size=3, unique=True))
        before = self.paged.snapshot()
        try:
            (self.paged.swap_in if swap_in else self.paged.swap_out)(rids)
        except CapacityError:
            assert self.paged.snapshot() == before, "a refused swap changed the cache"
            return
        (self.ref.swap_in if swap_in else self.ref.swap_out)(rids)

    @rule(rid=requests, n=st.integers(1, 9))
    def append(self, rid: int, n: int) -> None:
        if self._resident(rid):
            self._append(rid, n)

    @rule(parent=requests, target=requests)
    def fork(self, parent: int) -> int:
        if not self._resident(parent):
            return parent
        child = self.next_id
        self.next_id += 1
        self.paged.fork(parent, child)
        self.ref.fork(parent, child)
        self.last_step[child] = self.last_step[parent]
        if parent in self.hit_kept:
            self.hit_kept[child] = self.hit_kept[parent]
        if parent in self.prompts:
            self.prompts[child] = self.prompts[parent]
        return child

    @rule(rid=consumes(requests))
    def free(self, rid: int) -> None:
        if rid not in self.last_step:
            return
        self.paged.free(rid)
        self.ref.free(rid)
        del self.last_step[rid]
        self.hit_kept.pop(rid, None)
        self.prompts.pop(rid, None)

    @precondition(
        lambda self: any(self._resident(r) and self.ref.seq_len(r) for r in self.last_step)
    )
    @rule(data=st.data())
    def attend(self, data: st.DataObject) -> None:
        ids = cast("list[int]", self.ref.request_ids())  # admit() numbers requests 0, 1, ...
        live = [r for r in ids if self._resident(r) and self.ref.seq_len(r)]
        rids = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=3, unique=True))
        group = data.draw(st.integers(0, len(self.model.groups) - 1))
        layer = data.draw(st.integers(0, LAYERS - 1))
        q = torch.randn((len(rids), 2 * HEADS, DIM), generator=self.gen)
        if any(self._refused(r, group) for r in rids):
            with pytest.raises(IndexRangeError, match="released"):
                self.paged.attend(rids, q, group, layer, backend="torch")
            return
        out = self.paged.attend(rids, q, group, layer, backend="torch")
        ref = self.ref.attend(rids, q, group, layer)
        assert oracle.relative_error(out, ref) <= oracle.tolerance(torch.float32)

    @invariant()
    def same_views_and_planned_blocks(self) -> None:
        if not hasattr(self, "paged"):
            return
        self.paged.check()
        ids = cast("list[int]", self.ref.request_ids())  # admit() numbers requests 0, 1, ...
        assert sorted(cast("list[int]", self.paged.request_ids())) == sorted(ids)
        for rid in ids:
            assert self.paged.is_swapped(rid) == self.ref.is_swapped(rid)
            assert self.paged.seq_len(rid) == self.ref.seq_len(rid)
            if self.ref.is_swapped(rid):
                continue
            for gi, g in enumerate(self.model.groups):
                held = len(self.paged.held_blocks(rid, gi))
                hit = rid in self.hit_kept and gi in self.hit_kept[rid]
                if hit:
                    hit_blocks = self.ref.seq_len(rid) // self.bs
                    assert held == len(blocks_a_hit_needs(g.spec, hit_blocks, self.bs))
                if self._refused(rid, gi):
                    q = torch.randn((1, 2 * HEADS, DIM), generator=self.gen)
                    with pytest.raises(IndexRangeError, match="released"):
                        self.paged.gather(rid, gi)
                    with pytest.raises(IndexRangeError, match="released"):
                        self.paged.attend([rid], q, gi, 0, backend="torch")
                    continue
                pk, pv = self.paged.gather(rid, gi)
                rk, rv = self.ref.gather(rid, gi)
                assert self.same_view(rid, gi, (pk, pv), (rk, rv)), (rid, gi)
                if hit and self.ref.seq_len(rid):  # attend accepts what gather accepts
                    q = torch.randn((1, 2 * HEADS, DIM), generator=self.gen)
                    out = self.paged.attend([rid], q, gi, 0, backend="torch")
                    ref = self.ref.attend([rid], q, gi, 0)
                    assert oracle.relative_error(out, ref) <= oracle.tolerance(torch.float32)
                if g.spec.encoder_len is not None:
                    assert held == blocks_for_tokens(g.spec.encoder_len, self.bs)
                elif not hit:
                    computed, new = self.last_step[rid]
                    assert held == blocks_in_step(g.spec, computed, new, self.bs), (rid, gi)


# examples from the hypothesis profile (ci: 25), steps per example fixed here
LayerGroupsMachine.TestCase.settings = settings(stateful_step_count=25, deadline=None)
test_hybrid_and_cross_attention_paged_vs_reference = LayerGroupsMachine.TestCase


class CrossAttentionMachine(LayerGroupsMachine):
    """Encoder-decoder models: one self-attention group (full or windowed) and one or
    two cross-attention groups."""

    MODELS = st.tuples(
        st.one_of(
            st.just(KVCacheSpec.full()), st.builds(KVCacheSpec.sliding_window, st.integers(1, 12))
        ),
        st.lists(
            st.builds(KVCacheSpec.cross_attention, st.integers(1, 12)), min_size=1, max_size=2
        ),
    ).map(lambda t: [t[0], *t[1]])


CrossAttentionMachine.TestCase.settings = settings(stateful_step_count=25, deadline=None)
test_cross_attention_paged_vs_reference = CrossAttentionMachine.TestCase


def test_hybrid_gemma_like_groups_share_one_pool() -> None:
    """Local (window 4) and global groups, blocks of 2, 12 pages: decoding 10 tokens one
    by one the local group holds at most ceil(4/2) + 1 = 3 pages (positions 1..4 touch
    blocks 0-2) and ends with 2 (positions 6..9: blocks 3, 4), the global one ends with 5,
    all from one pool; the local group's early entries are released (-1)."""
    model = _model([KVCacheSpec.sliding_window(4), KVCacheSpec.full()])
    cache = LayerGroupsPagedCache(model, num_blocks=12, block_size=2)
    cache.admit("r")
    local = []
    for _ in range(10):
        k = torch.randn((LAYERS, 1, HEADS, DIM))
        cache.append("r", [(k, k), (k, k)])
        cache.check()
        local.append(len(cache.held_blocks("r", 0)))
    assert max(local) == 3
    assert cache.held_blocks("r", 0) == [3, 4] and len(cache.held_blocks("r", 1)) == 5
    assert cache.block_table("r", 0)[:3] == [-1, -1, -1]
    assert cache.num_free_blocks == 12 - 7


def test_cross_attention_blocks_are_written_once_and_shared_by_forks() -> None:
    model = _model([KVCacheSpec.full(), KVCacheSpec.cross_attention(5)])
    cache = LayerGroupsPagedCache(model, num_blocks=10, block_size=2)
    enc = torch.randn((LAYERS, 5, HEADS, DIM))
    cache.admit("a", [(enc, enc)])
    assert cache.held_blocks("a", 1) == [0, 1, 2]  # ceil(5/2) pages at admission
    cache.fork("a", "b")
    k = torch.randn((LAYERS, 3, HEADS, DIM))
    cache.append("b", [(k, k)])
    assert cache.block_table("a", 1) == cache.block_table("b", 1)  # never copied
    torch.testing.assert_close(cache.gather("b", 1)[0], enc)
    cache.free("a")
    cache.free("b")
    cache.check()
    assert cache.num_free_blocks == 10


def test_cross_attention_prefix_hits_need_the_same_encoder_output() -> None:
    """From the second decoder layer on, self-attention K/V depend on the encoder
    output: one decoder prompt under another encoder output must not hit; under the
    same encoder output (and salt) it hits its whole blocks."""
    model = _model([KVCacheSpec.full(), KVCacheSpec.cross_attention(3)])
    cache = LayerGroupsPagedCache(model, num_blocks=40, block_size=2, enable_prefix_caching=True)
    prompt = [5, 6, 7, 8, 9]
    enc = torch.randn((LAYERS, 3, HEADS, DIM))
    other = enc.clone()
    other[0, 0, 0, 0] += 1.0  # one element differs

    def run(rid: str, encoder: torch.Tensor, salt: str | None = None) -> int:
        hit = cache.admit(rid, [(encoder, encoder)], prompt=prompt, salt=salt)
        k = torch.randn((LAYERS, len(prompt) - hit, HEADS, DIM))
        cache.append(rid, [(k, k)])
        return hit

    assert run("a", enc) == 0  # cold
    assert run("other-encoder", other) == 0
    assert run("same-encoder", enc) == 4  # two whole blocks of 2 (the last token is computed)
    assert run("same-encoder-other-salt", enc, salt="x") == 0
    cache.check()


def test_groups_of_different_shapes_are_refused() -> None:
    groups = (
        LayerGroup(KVCacheSpec.full(), 2, 2, 8, "float32"),
        LayerGroup(KVCacheSpec.sliding_window(4), 4, 1, 8, "float32"),
    )
    with pytest.raises(ConfigError, match="shapes"):
        LayerGroupsPagedCache(ModelKVSpec("m", groups), 8, 2)


def test_hybrid_and_cross_attention_caches_implement_the_spec_contract() -> None:
    model = _model([KVCacheSpec.sliding_window(3), KVCacheSpec.cross_attention(2)])
    assert isinstance(LayerGroupsPagedCache(model, 4, 2), LayerGroupsKVCache)
    assert isinstance(LayerGroupsReferenceCache(model), LayerGroupsKVCache)


def test_hybrid_swap_moves_every_group_and_keeps_sharing() -> None:
    """A window-2 group, a full group and a cross group (encoder 3), blocks of 2: a
    request and its fork swapped out together copy each distinct block once (the fork
    shares all), hold no device block while out, refuse append, and come back bit for
    bit with the sharing intact."""
    model = _model(
        [KVCacheSpec.sliding_window(2), KVCacheSpec.full(), KVCacheSpec.cross_attention(3)]
    )
    cache = LayerGroupsPagedCache(model, num_blocks=16, block_size=2, num_cpu_blocks=8)
    enc = torch.randn((LAYERS, 3, HEADS, DIM))
    cache.admit("a", [(enc, enc)])
    k = torch.randn((LAYERS, 5, HEADS, DIM))
    cache.append("a", [(k, k), (k, k)])
    cache.fork("a", "b")
    views = {(r, g): cache.gather(r, g) for r in "ab" for g in range(3)}
    held = sum(len(cache.held_blocks("a", g)) for g in range(3))
    assert held == 3 + 3 + 2  # window: 3 (released only before the next append)
    cache.swap_out(["a", "b"])
    cache.check()
    assert cache.num_free_blocks == 16 and cache.cpu.num_used == held
    with pytest.raises(RequestStateError, match="swapped out"):
        cache.append("a", [(k, k), (k, k)])
    cache.swap_in(["b", "a"])
    cache.check()
    assert cache.num_free_blocks == 16 - held and cache.cpu.num_used == 0
    for (r, g), (vk, vv) in views.items():
        gk, gv = cache.gather(r, g)
        assert torch.equal(gk, vk) and torch.equal(gv, vv)
    assert cache.block_table("a", 0) == cache.block_table("b", 0)


def test_hybrid_swap_refused_without_room_changes_nothing() -> None:
    model = _model([KVCacheSpec.full(), KVCacheSpec.sliding_window(4)])
    cache = LayerGroupsPagedCache(model, num_blocks=8, block_size=2, num_cpu_blocks=3)
    cache.admit("a")
    k = torch.randn((LAYERS, 4, HEADS, DIM))
    cache.append("a", [(k, k), (k, k)])  # 2 + 2 blocks > 3 CPU blocks
    before = cache.snapshot()
    with pytest.raises(CapacityError, match="swap space"):
        cache.swap_out(["a"])
    assert cache.snapshot() == before


def test_llama4_like_chunked_group_releases_each_finished_chunk() -> None:
    """Chunked local (chunk 4 = two blocks of 2) beside a full group: decoding 10 tokens
    one by one, the chunked group holds the blocks of the newest token's chunk only
    (positions 8, 9: block 4; blocks 0-3 released to -1 as each chunk ends), the full
    group all 5; gather returns the chunk, attend matches the oracle's chunk mask."""
    model = _model([KVCacheSpec.chunked_local(4), KVCacheSpec.full()])
    cache = LayerGroupsPagedCache(model, num_blocks=12, block_size=2)
    cache.admit("r")
    ks = []
    for _ in range(10):
        k = torch.randn((LAYERS, 1, HEADS, DIM))
        ks.append(k)
        cache.append("r", [(k, k), (k, k)])
        cache.check()
    assert cache.block_table("r", 0)[:4] == [-1] * 4 and len(cache.held_blocks("r", 0)) == 1
    assert len(cache.held_blocks("r", 1)) == 5
    whole = torch.cat(ks, dim=1)
    torch.testing.assert_close(cache.gather("r", 0)[0], whole[:, 8:])
    q = torch.randn((1, 2 * HEADS, DIM))
    out = cache.attend(["r"], q, 0, 0, backend="torch")
    ref = oracle.decode_attention(q[0], whole[0], whole[0], chunk=4)
    assert oracle.relative_error(out[0], ref) <= oracle.tolerance(torch.float32)
    with pytest.raises(ConfigError, match="chunk=6 is not a multiple of block_size=4"):
        LayerGroupsPagedCache(_model([KVCacheSpec.chunked_local(6)]), num_blocks=4, block_size=4)


def test_a_chunked_local_hit_needs_no_block_before_its_chunk() -> None:
    """vLLM's ChunkedLocalAttentionManager: a prompt of 9 tokens (chunk 4, blocks of 2)
    can hit 8 tokens on a cold cache, every block before the chunk of position 8 counted
    computed (null); the next token then reads only itself."""
    model = _model([KVCacheSpec.chunked_local(4)])
    cache = LayerGroupsPagedCache(model, num_blocks=8, block_size=2, enable_prefix_caching=True)
    assert cache.admit("r", prompt=list(range(9))) == 8
    assert cache.block_table("r", 0) == [-1] * 4 and cache.num_free_blocks == 8
    k = torch.randn((LAYERS, 1, HEADS, DIM))
    cache.append("r", [(k, k)])
    cache.check()
    torch.testing.assert_close(cache.gather("r", 0)[0], k)
