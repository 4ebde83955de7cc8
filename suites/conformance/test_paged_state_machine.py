"""PagedKVCache against ContiguousKVCache: one hypothesis state machine drives both.

Operations: admit (prompts from a 3-token vocabulary so prefixes collide often; random
salts), append (prompt chunks and generated tokens, ids given or withheld), fork, free,
swap out and in, and invalid operations; a small pool forces capacity errors, watermark
refusals and prefix-cache evictions. K and V come from `paged_model.kv_for`, a function of
(token, position, salt, layer, whole prefix), so a wrong hit or lost copy is wrong data.

After every step: the pool, prefix index and swap invariants hold (`check`); both caches
hold the same requests; for every running request gather is bitwise equal in both and
to the model, seq_len and token ids agree; decode attention agrees within the dtype's
tolerance; every failed paged operation left the whole state (storage included) unchanged.
Free blocks are poisoned after every step, so reading memory no request owns
fails. At teardown everything is freed and nothing leaks.

Parametrized over block sizes 1, 2, 16 and dtypes float32, bfloat16, with the tensors on
the CPU (torch ops; fp8 attention on a CPU runs the C++ fp8 kernels where they build).

fp8 machines (fp8_e4m3 / fp8_e5m2 storage, float32 inputs; dynamic scales set by the first
write, per tensor or per KV head, or static per-head scales small enough that some values
saturate): both caches get the same scales, and gather must return the same bytes in
both, equal to the model's K/V quantized by `workloads.fp8.quantize` with those scales.
Decode attention is judged against the reference's float64 oracle over the dequantized
K/V, and so is a prefill/extend over each running request's last few tokens through the
paged block tables (`ops.paged_prefill_attention`), at float32 tolerance. Free blocks are
poisoned with large finite fp8 bytes.

The gpu machines the `gpu` machines hold the paged cache on CUDA, where its writes,
copy-on-write, swap (through a pinned pool) and attention run the compiled Triton kernels
(the dispatch's own choice), and compare it with the CPU reference the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest
import torch
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kvbench.kernels import ops
from kvbench.paged.cache import PagedKVCache
from kvbench.paged.snapshots import snapshots_equal
from kvbench.reference.contiguous import ContiguousKVCache
from kvbench.reference.oracle import extend_attention, relative_error, tolerance
from kvbench.suites.conformance.paged_model import bitwise_equal, kv_for
from kvbench.workloads import fp8
from kvbench.workloads.errors import (
    CapacityError,
    DuplicateRequestError,
    KVBenchError,
    RequestStateError,
    ShapeError,
    UnknownRequestError,
)
from kvbench.workloads.geometry import KVGeometry

VOCAB = (0, 1, 2)
SALTS = (None, "alice", "bob")
MAX_REQUESTS = 24
POISON = 4096.0
BASES = (tuple((i * 7 + i // 3) % 3 for i in range(40)), tuple((i * i + 1) % 3 for i in range(40)))
#: block size -> (device blocks, longest prompt)
SHAPES = {1: (24, 9), 2: (16, 11), 16: (8, 40)}
#: fp8 pools' poison bytes for K and V (finite in both formats: e4m3 +-240, e5m2 +-28672).
POISON_BYTES = (0x77, 0xF7)
#: Static per-head scales [num_layers, num_kv_heads] of an fp8 machine: K/V lie in
#: [-0.5, 0.5), so the 5e-6 / 1e-3 heads saturate part of their values in e5m2 / e4m3.
STATIC_SCALES = torch.tensor([[2e-3, 5e-6], [1e-4, 1e-3]])
#: fp8 scale options of a machine: cache keyword arguments.
FP8_SCALES: dict[str, dict[str, object]] = {
    "dyn_tensor": {},
    "dyn_head": {"scale_granularity": "head"},
    "static_head": {
        "k_scale": STATIC_SCALES,
        "v_scale": STATIC_SCALES.flip(1),
        "scale_granularity": "head",
    },
}


class _Tracked:
    """The test's model of one request: its true token ids and salt."""

    def __init__(self, prompt: list[int], salt: str | None) -> None:
        self.prompt = prompt
        self.salt = salt
        self.tokens: list[int] = []  # true ids of the cached tokens (KV derives from them)

    def copy(self) -> _Tracked:
        other = _Tracked(self.prompt, self.salt)
        other.tokens = list(self.tokens)
        return other


class PagedVsContiguous(RuleBasedStateMachine):
    """See the module docstring. Subclassed per (block_size, dtype) below."""

    block_size = 16
    dtype = "float32"
    device = "cpu"
    #: fp8 machines: a key of FP8_SCALES; "" for 16/32-bit storage.
    scales = ""

    def __init__(self) -> None:
        super().__init__()
        self.geometry = KVGeometry(2, 2, 8, self.dtype, num_q_heads=4)
        self.fp8 = self.dtype in fp8.FORMATS
        # K/V inputs (and queries): float32 for fp8 storage
        self.tdtype = torch.bfloat16 if self.dtype == "bfloat16" else torch.float32
        self.num_blocks, self.max_prompt = SHAPES[self.block_size]
        self.max_seq_len = 2 * self.max_prompt
        self.scale_kwargs = dict(FP8_SCALES[self.scales]) if self.fp8 else {}
        self.ref = ContiguousKVCache(
            self.geometry,
            (MAX_REQUESTS + 2) * self.max_seq_len,
            self.max_seq_len,
            **self.scale_kwargs,  # type: ignore[arg-type]
        )
        self.paged: PagedKVCache | None = None
        self.model: dict[int, _Tracked] = {}
        self.swapped: set[int] = set()
        self.next_id = 0
        self.steps = 0
        # Tiny tensors: intra-op threads only add contention (softmax on a busy 2-core
        # machine goes from microseconds to milliseconds); restored at teardown.
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)

    # ------------------------------------------------------------------ helpers
    @initialize(
        watermark=st.sampled_from([0.0, 0.0, 0.1, 0.25]),
        cpu_blocks=st.sampled_from([0, 3, 32, 32]),
    )
    def make_cache(self, watermark: float, cpu_blocks: int) -> None:
        self.paged = PagedKVCache(
            self.geometry,
            self.num_blocks,
            self.block_size,
            max_seq_len=self.max_seq_len,
            watermark=watermark,
            num_cpu_blocks=cpu_blocks,
            # The machine judges bookkeeping; on the CPU the torch ops keep it fast where
            # nox sets TRITON_INTERPRET=1 (the Triton versions of the same ops are held
            # to the oracle by test_kernels_*, and the e2e suite runs the cache on them).
            # On CUDA the dispatch chooses: the compiled Triton kernels.
            device=self.device,
            kernel_backend="torch" if self.device == "cpu" else None,
            **self.scale_kwargs,  # type: ignore[arg-type]
        )

    @property
    def cache(self) -> PagedKVCache:
        assert self.paged is not None
        return self.paged

    def running(self) -> list[int]:
        return [r for r in self.model if r not in self.swapped]

    def failed_atomically(self, before: dict, exc: KVBenchError) -> None:
        event(f"refused: {type(exc).__name__}")
        assert snapshots_equal(before, self.cache.snapshot()), f"state changed by {exc!r}"

    def poison_free_blocks(self) -> None:
        """Overwrite never-cached free blocks: a later read of memory no request owns (a
        stale table entry, a swap-in that did not copy) then shows up as wrong data. The
        poison is finite because attention kernels may read slots past a sequence's end
        and mask them (test_paged_cache.py covers NaN garbage there)."""
        free = self.cache.pool.free_stack()
        if free:
            for layer in range(self.geometry.num_layers):
                if self.fp8:
                    self.cache.key_cache(layer).view(torch.uint8)[free] = POISON_BYTES[0]
                    self.cache.value_cache(layer).view(torch.uint8)[free] = POISON_BYTES[1]
                else:
                    self.cache.key_cache(layer)[free] = POISON
                    self.cache.value_cache(layer)[free] = -POISON

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    # ------------------------------------------------------------------ rules
    @precondition(lambda self: len(self.model) < MAX_REQUESTS)
    @rule(
        base=st.sampled_from(range(len(BASES))),
        cut=st.integers(0, 40),
        tail=st.lists(st.sampled_from(VOCAB), max_size=6),
        salt=st.sampled_from(SALTS),
        prefill=st.integers(0, 40),
        data=st.data(),
    )
    def admit(
        self,
        base: int,
        cut: int,
        tail: list[int],
        salt: str | None,
        prefill: int,
        data: st.DataObject,
    ) -> None:
        """Prompts are a prefix of one of two fixed bases plus a short random tail, so
        full blocks repeat across requests and the prefix cache gets hits. `prefill`
        prompt tokens are appended at once (a chunked prefill's first chunk)."""
        prompt = (list(BASES[base][:cut]) + tail)[: self.max_prompt] or [0]
        rid = self.new_id()
        before = self.cache.snapshot()
        try:
            cached = self.cache.admit(rid, prompt, salt=salt)
        except CapacityError as exc:
            self.failed_atomically(before, exc)
            return
        bs = self.block_size
        assert cached % bs == 0 and 0 <= cached <= (len(prompt) - 1) // bs * bs
        assert self.ref.admit(rid, prompt, salt=salt) == 0
        event("admit: prefix hit" if cached else "admit: no hit")
        tracked = _Tracked(prompt, salt)
        self.model[rid] = tracked
        if cached:
            tracked.tokens = prompt[:cached]
            k, v = kv_for(self.geometry, self.tdtype, tracked.tokens, salt, 0, cached)
            self.ref.append(rid, k, v)
        chunk = min(prefill, len(prompt) - cached)
        if chunk:
            self._append(data, rid, chunk, False)

    @precondition(lambda self: any(True for _ in self.running()))
    @rule(data=st.data(), n=st.integers(1, 18), give_ids=st.booleans(), finish=st.booleans())
    def append(self, data: st.DataObject, n: int, give_ids: bool, finish: bool) -> None:
        """Append n tokens (or, with `finish`, the rest of the prompt when some is left)."""
        rid = data.draw(st.sampled_from(self.running()))
        tracked = self.model[rid]
        n = min(n, self.block_size + 2)
        if finish and len(tracked.tokens) < len(tracked.prompt):
            n = len(tracked.prompt) - len(tracked.tokens)
        self._append(data, rid, n, give_ids)

    def _append(self, data: st.DataObject, rid: int, n: int, give_ids: bool) -> None:
        tracked = self.model[rid]
        start = len(tracked.tokens)
        ids: list[int] = []
        for pos in range(start, start + n):
            if pos < len(tracked.prompt):
                ids.append(tracked.prompt[pos])
            else:
                ids.append(data.draw(st.sampled_from(VOCAB)))
        true_tokens = tracked.tokens + ids
        k, v = kv_for(self.geometry, self.tdtype, true_tokens, tracked.salt, start, start + n)
        token_ids = ids if give_ids else None
        before = self.cache.snapshot()
        try:
            self.cache.append(rid, k, v, token_ids=token_ids)
        except CapacityError as exc:
            self.failed_atomically(before, exc)
            if start + n > self.max_seq_len:
                with pytest.raises(CapacityError):
                    self.ref.append(rid, k, v, token_ids=token_ids)
            return
        self.ref.append(rid, k, v, token_ids=token_ids)
        tracked.tokens = true_tokens

    def _fork(self, parent: int) -> int | None:
        child = self.new_id()
        before = self.cache.snapshot()
        try:
            self.cache.fork(parent, child)
        except CapacityError as exc:
            self.failed_atomically(before, exc)
            return None
        self.ref.fork(parent, child)
        self.model[child] = self.model[parent].copy()
        return child

    @precondition(lambda self: len(self.model) < MAX_REQUESTS and any(True for _ in self.running()))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        self._fork(data.draw(st.sampled_from(self.running())))

    @precondition(lambda self: len(self.model) < MAX_REQUESTS and any(True for _ in self.running()))
    @rule(data=st.data(), child_first=st.booleans(), n=st.integers(1, 3))
    def fork_and_diverge(self, data: st.DataObject, child_first: bool, n: int) -> None:
        """Fork, then append to the child or the parent: the first write into a shared
        partial last block must copy it, and the other side must keep its KV."""
        parent = data.draw(st.sampled_from(self.running()))
        child = self._fork(parent)
        if child is not None:
            self._append(data, child if child_first else parent, n, True)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.model)))
        self.cache.free(rid)
        self.ref.free(rid)
        del self.model[rid]
        self.swapped.discard(rid)

    @precondition(lambda self: any(True for _ in self.running()))
    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        """Swap out one request, or several together (forks among them keep sharing)."""
        ids = data.draw(
            st.lists(st.sampled_from(self.running()), min_size=1, max_size=3, unique=True)
        )
        before = self.cache.snapshot()
        try:
            if len(ids) == 1:
                self.cache.swap_out(ids[0])
            else:
                self.cache.swap_out_group(ids)
        except CapacityError as exc:
            self.failed_atomically(before, exc)
            return
        self.swapped.update(ids)

    @precondition(lambda self: bool(self.swapped))
    @rule(data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        """Swap in one request, or several together."""
        ids = data.draw(
            st.lists(st.sampled_from(sorted(self.swapped)), min_size=1, max_size=3, unique=True)
        )
        before = self.cache.snapshot()
        try:
            if len(ids) == 1:
                self.cache.swap_in(ids[0])
            else:
                self.cache.swap_in_group(ids)
        except CapacityError as exc:
            self.failed_atomically(before, exc)
            return
        self.swapped.difference_update(ids)

    @precondition(lambda self: any(True for _ in self.running()))
    @rule(data=st.data())
    def swap_round_trip(self, data: st.DataObject) -> None:
        """Swap a request out and straight back in: its KV must come back bit for bit."""
        self.swap_out(data)
        if self.swapped:
            self.poison_free_blocks()
            self.swap_in(data)

    @rule(data=st.data(), kind=st.sampled_from(["free", "fork", "admit", "shape", "swapped"]))
    def invalid(self, data: st.DataObject, kind: str) -> None:
        """An operation that must fail with a specific error and change nothing."""
        before = self.cache.snapshot()
        unknown = -1
        expected: type[KVBenchError]
        call: Callable[[], object]
        if kind == "free":
            expected, call = UnknownRequestError, lambda: self.cache.free(unknown)
        elif kind == "fork" and self.model:
            rid = data.draw(st.sampled_from(sorted(self.model)))
            expected, call = DuplicateRequestError, lambda: self.cache.fork(rid, rid)
            if rid in self.swapped:
                expected = RequestStateError
        elif kind == "admit" and self.model:
            rid = data.draw(st.sampled_from(sorted(self.model)))
            expected, call = DuplicateRequestError, lambda: self.cache.admit(rid, [0])
        elif kind == "shape" and self.running():
            rid = data.draw(st.sampled_from(self.running()))
            bad = torch.zeros(2, 1, 2, 7, dtype=self.tdtype)
            expected, call = ShapeError, lambda: self.cache.append(rid, bad, bad)
        elif kind == "swapped" and self.swapped:
            rid = data.draw(st.sampled_from(sorted(self.swapped)))
            k = torch.zeros(2, 1, 2, 8, dtype=self.tdtype)
            expected, call = RequestStateError, lambda: self.cache.append(rid, k, k)
        else:
            expected, call = UnknownRequestError, lambda: self.cache.fork(unknown, unknown - 1)
        with pytest.raises(expected):
            call()
        self.failed_atomically(before, expected("expected"))

    # ------------------------------------------------------------------ invariants
    def serving_accounting_agrees(self, stats) -> None:
        """The serving contract's per-step reading (what the engine sees) agrees with
        stats() for both caches, and block boundaries are growth points."""
        for c, snap in ((self.cache, stats), (self.ref, self.ref.stats())):
            occ = c.occupancy()
            assert occ.live_slots == snap.live_slots and occ.free_blocks == snap.free_blocks
            assert occ.used_blocks == snap.used_blocks  # (its cached_blocks: evictable only)
            assert occ.cached_blocks <= snap.cached_blocks
            held = c.blocks_held(self.running())
            assert (
                held == len({b for r in self.running() for b in c.block_table(r)})
                if (c is self.cache)
                else held == 0
            )
        bs = self.cache.block_size
        assert self.cache.occupancy().reserved_slots == stats.used_blocks * bs
        for rid in self.running():
            length = self.cache.seq_len(rid)
            point = self.cache.next_growth(rid, length)
            assert point >= length and point % bs == 0 and point - length < bs

    @invariant()
    def caches_agree(self) -> None:
        if self.paged is None:
            return
        self.steps += 1
        cache = self.cache
        cache.check()
        self.poison_free_blocks()
        assert cache.request_ids() == self.ref.request_ids()
        assert set(cache.swapped_ids()) == self.swapped
        attendable = []
        for rid in self.running():
            tracked = self.model[rid]
            length = len(tracked.tokens)
            assert cache.seq_len(rid) == self.ref.seq_len(rid) == length
            assert cache.token_ids(rid) == self.ref.token_ids(rid)
            pk, pv = (t.cpu() for t in cache.gather(rid))
            rk, rv = self.ref.gather(rid)
            assert bitwise_equal(pk, rk) and bitwise_equal(pv, rv), f"KV of {rid} differs"
            if length:
                mk, mv = kv_for(self.geometry, self.tdtype, tracked.tokens, tracked.salt, 0, length)
                if self.fp8:
                    mk, mv = self.quantized_model(mk, mv)
                assert bitwise_equal(pk, mk) and bitwise_equal(pv, mv), f"KV of {rid} is wrong"
                attendable.append(rid)
        stats = cache.stats()
        self.serving_accounting_agrees(stats)
        assert stats.logical_tokens == sum(len(self.model[r].tokens) for r in self.running())
        assert stats.num_requests == len(self.model)
        assert stats.live_slots <= stats.logical_tokens  # sharing only ever saves slots
        if attendable:
            gen = torch.Generator().manual_seed(self.steps)
            g = self.geometry
            assert g.num_q_heads is not None  # KVGeometry's __post_init__ fills it in
            query = torch.randn(len(attendable), g.num_q_heads, g.head_dim, generator=gen)
            query = query.to(self.tdtype)
            layer = self.steps % g.num_layers
            out = cache.attend(attendable, query, layer).cpu()
            ref = self.ref.attend(attendable, query, layer)
            err = relative_error(out, ref)
            assert err <= tolerance(self.tdtype), f"attend error {err:.2e}"
            if self.fp8:
                self.fp8_prefill_agrees(attendable, layer, gen)

    def quantized_model(
        self, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's K/V [layers, n, H, D] as an fp8 cache must store them: quantized
        with the cache's scales (which both caches must share)."""
        quant, ref_quant = self.cache.kv_quant, self.ref.kv_quant
        assert quant is not None and ref_quant is not None
        ks, vs = quant.scales()
        rks, rvs = ref_quant.scales()
        assert torch.equal(ks, rks) and torch.equal(vs, rvs), "the caches' fp8 scales differ"
        fmt = fp8.fp8_format(self.dtype)
        layers = range(self.geometry.num_layers)
        return (
            torch.stack([fp8.quantize(k[i], ks[i], fmt) for i in layers]),
            torch.stack([fp8.quantize(v[i], vs[i], fmt) for i in layers]),
        )

    def fp8_prefill_agrees(self, ids: list[int], layer: int, gen: torch.Generator) -> None:
        """Prefill/extend of each request's last 1-5 tokens over the paged pool (its block
        tables as they are now: shared prefix blocks, forks, swapped-in blocks) against
        the float64 extend oracle over the reference's dequantized K/V."""
        g = self.geometry
        assert g.num_q_heads is not None and self.ref.kv_quant is not None
        lens = [self.cache.seq_len(r) for r in ids]
        news = [min(n, 1 + (self.steps + i) % 5) for i, n in enumerate(lens)]
        cu = torch.tensor([0, *torch.tensor(news).cumsum(0).tolist()], dtype=torch.int32)
        query = torch.randn(sum(news), g.num_q_heads, g.head_dim, generator=gen)
        tables, seq_lens = self.cache.block_tables(ids)
        ks, vs = self.cache.kv_quant.scales()  # type: ignore[union-attr]
        out = ops.paged_prefill_attention(
            query,
            self.cache.key_cache(layer),
            self.cache.value_cache(layer),
            tables,
            cu,
            seq_lens,
            backend="torch" if self.device == "cpu" else None,
            k_scale=ks[layer].to(self.cache.device),
            v_scale=vs[layer].to(self.cache.device),
        ).cpu()
        for i, rid in enumerate(ids):
            rk, rv = self.ref.gather(rid)
            kd, vd = self.ref.kv_quant.dequantize(layer, rk[layer], rv[layer])
            rows = slice(int(cu[i]), int(cu[i + 1]))
            ref = extend_attention(query[rows].double(), kd, vd)
            err = relative_error(out[rows], ref)
            assert err <= tolerance(torch.float32), f"fp8 prefill error {err:.2e} ({rid})"

    def teardown(self) -> None:
        torch.set_num_threads(self._threads)
        if self.paged is None:
            return
        cache = self.cache
        stats, prefix = cache.stats(), cache.prefix_stats()
        event(f"cow copies > 0: {stats.cow_copies > 0}")
        event(f"evictions > 0: {prefix.evictions > 0}")
        event(f"swap round trips > 0: {cache.swap_ins > 0}")
        for rid in list(self.model):
            cache.free(rid)
        cache.check()
        stats = cache.stats()
        assert stats.used_blocks == 0 and stats.live_slots == 0 and stats.swapped_blocks == 0
        assert stats.free_blocks == self.num_blocks
        assert all(count == 0 for count in cache.pool.ref)
        assert cache.pool.num_evictable == stats.cached_blocks


_STEPS = settings(stateful_step_count=30)


def _machine(block_size: int, dtype: str, device: str = "cpu", scales: str = "") -> type:
    name = f"PagedVsContiguous_bs{block_size}_{dtype}{'_' + scales if scales else ''}_{device}"
    attrs = {"block_size": block_size, "dtype": dtype, "device": device, "scales": scales}
    machine = cast("type[PagedVsContiguous]", type(name, (PagedVsContiguous,), attrs))
    test_case = _STEPS(machine).TestCase
    return pytest.mark.gpu(test_case) if device == "cuda" else test_case


TestBs1Float32 = _machine(1, "float32")
TestBs2Float32 = _machine(2, "float32")
TestBs16Float32 = _machine(16, "float32")
TestBs1Bfloat16 = _machine(1, "bfloat16")
TestBs2Bfloat16 = _machine(2, "bfloat16")
TestBs16Bfloat16 = _machine(16, "bfloat16")
TestBs1Fp8E4m3DynTensor = _machine(1, "fp8_e4m3", scales="dyn_tensor")
TestBs2Fp8E5m2StaticHead = _machine(2, "fp8_e5m2", scales="static_head")
TestBs16Fp8E4m3DynHead = _machine(16, "fp8_e4m3", scales="dyn_head")
TestBs16Fp8E5m2DynTensor = _machine(16, "fp8_e5m2", scales="dyn_tensor")
TestBs1Float32Cuda = _machine(1, "float32", "cuda")
TestBs16Float32Cuda = _machine(16, "float32", "cuda")
TestBs16Bfloat16Cuda = _machine(16, "bfloat16", "cuda")
