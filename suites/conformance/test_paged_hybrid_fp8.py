"""fp8 K/V in the layer-group cache (`paged.layer_groups`): the layer-group state machines
with fp8 storage (issue 36: "an fp8 state machine on the layer-group cache").

`Fp8Storage` turns a layer-group machine of `test_paged_hybrid` / `test_paged_hybrid_atomic`
into an fp8 one: it draws the format (e4m3, e5m2), the scale granularity (per tensor, per
KV head), dynamic or static scales and the input dtype (float32, float16, bfloat16), and
keeps every rule of the machine it extends (group orders, window residues, prefix hits
read at once, forks with copy-on-write, swap, failures injected mid-append with the
snapshot compared, now the scales included). The reference (`Fp8Reference`) holds in
float64 what the cache must hold, dequantized: each input quantized by `workloads.fp8`'s
rule with the group's scales, times the scale. So after every step

* each group's view dequantized (float64) equals the reference's exactly, and a
  swapped-in, copied-on-write or prefix-hit block keeps its bytes (the view is compared
  after each of them);
* what the reference holds is within half an fp8 step of the input (after saturation to
  +-max * scale), checked with no quantize code; a group's dynamic scales are its first
  write's amax / fp8 max (1 where that is 0), per tensor or per head, and never change;
* decode attention (windowed in a sliding-window group) is the float64 oracle over the
  dequantized K/V within the float32 tolerance;
* for a single-group model, the bytes and scales equal those of a `PagedKVCache` with the
  same fp8 options driven with the same K/V (`plain`);
* an append holding NaN or inf is refused (NonFiniteError) and changes nothing.

The machines force the torch kernels (the Triton fp8 write under the interpreter costs
~0.4 s a launch); `test_triton_and_torch_kernels_store_the_same_fp8_bytes` holds the
Triton kernels to the same bytes and attention on a fixed scenario.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from kvbench.paged import PagedKVCache
from kvbench.paged.layer_groups import LayerGroupsPagedCache
from kvbench.reference import oracle
from kvbench.reference.contract import KVPair
from kvbench.reference.layer_groups import LayerGroupsReferenceCache
from kvbench.suites.conformance.test_paged_hybrid import (
    DIM,
    HEADS,
    LAYERS,
    LayerGroupsMachine,
    _model,
)
from kvbench.suites.conformance.test_paged_hybrid_atomic import GroupOrderMachine
from kvbench.workloads import fp8
from kvbench.workloads.errors import ConfigError, ShapeError
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.kv_spec import KVCacheSpec, ModelKVSpec

FORMATS = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}


def rule_scales(x: torch.Tensor, fmt: fp8.Fp8Format, granularity: str) -> torch.Tensor:
    """The dynamic-scale rule written out for one layer's first write `x` [n, H, D]:
    amax(|x|) / max (per head or over the whole write), at least float32's smallest
    normal, 1 where the amax is 0."""
    amax = x.double().abs().amax(dim=(0, 2))
    if granularity == "tensor":
        amax = amax.max().expand(x.shape[1])
    tiny = torch.finfo(torch.float32).tiny
    return torch.where(amax > 0, (amax / fmt.max).clamp(min=tiny), torch.ones_like(amax)).float()


def within_half_step(
    got: torch.Tensor, x: torch.Tensor, s: torch.Tensor, fmt: fp8.Fp8Format
) -> bool:
    """Whether dequantized `got` (float64) is the input `x` [n, H, D] saturated to
    +-max * s (per head) and rounded to the nearest fp8 value: within half the fp8 step
    at |x| / s (the subnormal step below the smallest normal), plus float32 slack."""
    sc = s.double().view(1, -1, 1)
    y = (x.double() / sc).clamp(-fmt.max, fmt.max)
    e = torch.floor(torch.log2(y.abs().clamp(min=2.0**fmt.min_exponent)))
    half = torch.exp2(e - fmt.mantissa_bits - 1)
    return bool(((got / sc - y).abs() <= half * (1 + 2.0**-20) + y.abs() * 2.0**-23).all())


class Fp8Reference(LayerGroupsReferenceCache):
    """The float64 reference of an fp8 layer-group cache (module docstring). `plain`, for
    a single-group model, is a `PagedKVCache` driven with the same K/V (swap is not
    mirrored there: it stays resident)."""

    def __init__(
        self, model: ModelKVSpec, paged: LayerGroupsPagedCache, plain: PagedKVCache | None
    ) -> None:
        super().__init__(model, torch.float64)
        self.paged, self.plain = paged, plain
        assert paged.quant is not None
        self.quant = paged.quant
        self.fmt = paged.quant.format
        self.written: set[int] = set()  # groups written (their scales are set)

    def _expect(self, group: int, kv: KVPair) -> KVPair:
        """What `group` must hold for the input `kv`, dequantized in float64."""
        out = []
        q = self.quant.groups[group]
        for x, s in zip(kv, self.paged.scales(group), strict=True):
            if q.dynamic and group not in self.written:
                for layer in range(LAYERS):
                    want = rule_scales(x[layer], self.fmt, q.granularity)
                    assert torch.equal(s[layer], want), (group, layer, s[layer], want)
            layers = []
            for layer in range(LAYERS):
                stored = fp8.quantize(x[layer], s[layer], self.fmt)
                deq = fp8.dequantize(stored, s[layer], torch.float64)
                assert within_half_step(deq, x[layer], s[layer], self.fmt), (group, layer)
                layers.append(deq)
            out.append(torch.stack(layers))
        self.written.add(group)
        return out[0], out[1]

    def admit(
        self,
        request_id: Hashable,
        encoder_kv: Sequence[KVPair] = (),
        *,
        prompt: Sequence[int] | None = None,
        salt: str | None = None,
    ) -> int:
        cross = self.model.cross_groups
        expect = [self._expect(g, kv) for g, kv in zip(cross, encoder_kv, strict=True)]
        if self.plain is not None:
            self.plain.admit(request_id, [0])
        return super().admit(request_id, expect)

    def append(
        self, request_id: Hashable, kv: Sequence[KVPair], token_ids: Sequence[int] | None = None
    ) -> None:
        groups = self.model.self_groups
        unwritten = [
            self.quant.groups[g].dynamic and not self.quant.groups[g].is_set for g in groups
        ]
        if any(unwritten):
            self._prefix_hit_of_nothing_written(request_id, kv, groups, unwritten)
            return
        if self.plain is not None:
            self.plain.append(request_id, kv[0][0], kv[0][1])
        super().append(
            request_id, [self._expect(g, one) for g, one in zip(groups, kv, strict=True)]
        )

    def _prefix_hit_of_nothing_written(
        self,
        request_id: Hashable,
        kv: Sequence[KVPair],
        groups: Sequence[int],
        unwritten: Sequence[bool],
    ) -> None:
        """The reference is told of tokens the paged cache never wrote: a prefix hit whose
        blocks no group needs (a chunked-local group past its chunk counts them computed
        with none cached, as vLLM v1 does), in a group whose dynamic scales wait for a
        first write. Nothing was ever written there, so no block of it is kept and no read
        reaches these tokens; they are held unquantized, the group stays unwritten (its
        scales come from its first real write), and `plain`, which would write them and
        set its scales from them, no longer mirrors the cache."""
        self.plain = None
        super().append(
            request_id,
            [
                (one[0].double(), one[1].double()) if fresh else self._expect(g, one)
                for g, one, fresh in zip(groups, kv, unwritten, strict=True)
            ],
        )

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        super().fork(parent_id, child_id)
        if self.plain is not None:
            self.plain.fork(parent_id, child_id)

    def free(self, request_id: Hashable) -> None:
        super().free(request_id)
        if self.plain is not None:
            self.plain.free(request_id)


class Fp8Storage(LayerGroupsMachine):
    """The fp8 draws and checks a layer-group machine gains (module docstring); put
    before the machine among the bases."""

    def draw_storage(self, data: st.DataObject) -> dict[str, Any]:
        dtype = data.draw(st.sampled_from(list(FORMATS)), label="fp8 dtype")
        granularity = data.draw(st.sampled_from(["tensor", "head"]), label="granularity")
        self.input_dtype = data.draw(
            st.sampled_from([torch.float32, torch.float16, torch.bfloat16]), label="input dtype"
        )
        # the torch kernels: Triton's fp8 write under the interpreter takes ~0.4 s a launch
        # (`test_triton_and_torch_kernels_store_the_same_fp8_bytes` holds it to these)
        kw: dict[str, Any] = {
            "dtype": dtype,
            "scale_granularity": granularity,
            "kernel_backend": "torch",
        }
        if data.draw(st.booleans(), label="static scales"):  # saturate now and then
            values = st.sampled_from([0.01, 0.05, 0.25, 1.0])
            form = data.draw(st.sampled_from(["number", "per head", "per layer"]), label="form")

            def one() -> Any:  # a number, [heads] or [layers, heads] (one value per layer)
                if form == "number" or (form == "per head" and granularity == "tensor"):
                    return data.draw(values)
                if form == "per head":
                    return [data.draw(values) for _ in range(HEADS)]
                return [[data.draw(values)] * HEADS for _ in range(LAYERS)]

            kw["k_scale"], kw["v_scale"] = one(), one()
        self.storage_kw = kw
        return kw

    def make_reference(self) -> LayerGroupsReferenceCache:
        plain = None
        if len(self.model.groups) == 1:
            kw = self.storage_kw
            geometry = KVGeometry(LAYERS, HEADS, DIM, FORMATS[kw["dtype"]], 2 * HEADS)
            plain = PagedKVCache(
                geometry, 4096, self.bs, enable_prefix_caching=False, kernel_backend="torch",
                k_scale=kw.get("k_scale"), v_scale=kw.get("v_scale"),
                scale_granularity=kw["scale_granularity"],
            )  # fmt: skip
        return Fp8Reference(self.model, self.paged, plain)

    def same_view(self, rid: int, group: int, paged: KVPair, ref: KVPair) -> bool:
        """The paged view dequantized (float64) equals the reference's exactly."""
        if paged[0].dtype != self.paged.k.dtype or paged[0].shape != ref[0].shape:
            return False
        if not paged[0].shape[1]:  # nothing written yet: maybe no scales either
            return True
        scales = self.paged.scales(group)
        return all(
            torch.equal(fp8.dequantize(p[layer], s[layer], torch.float64), r[layer])
            for p, r, s in zip(paged, ref, scales, strict=True)
            for layer in range(LAYERS)
        )

    def _kv(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = super()._kv(n)
        return k.to(self.input_dtype), v.to(self.input_dtype)

    def _prompt_kv(self, tokens: list[int], group: int) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        k, v = LayerGroupsMachine._prompt_kv(tokens, group)
        return k.to(self.input_dtype), v.to(self.input_dtype)

    @invariant()
    def same_bytes_as_the_plain_paged_cache(self) -> None:
        """Single-group models: the group's bytes and scales are a PagedKVCache's."""
        ref = getattr(self, "ref", None)
        if not isinstance(ref, Fp8Reference) or ref.plain is None:
            return
        plain = ref.plain
        if 0 in ref.written:
            assert plain.kv_quant is not None
            for mine, theirs in zip(self.paged.scales(0), plain.kv_quant.scales(), strict=True):
                assert torch.equal(mine, theirs)
        for rid in self.last_step:
            if not self._resident(rid) or self._refused(rid, 0) or not ref.seq_len(rid):
                continue
            pk, pv = self.paged.gather(rid, 0)
            qk, qv = plain.gather(rid)
            start = qk.shape[1] - pk.shape[1]
            for a, b in ((pk, qk[:, start:]), (pv, qv[:, start:])):
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), rid

    @precondition(
        lambda self: any(self._resident(r) and self.ref.seq_len(r) for r in self.last_step)
    )
    @rule(data=st.data())
    def attend_every_layer(self, data: st.DataObject) -> None:
        """Decode attention of one request in every group and layer (each layer has its
        own scales) against the float64 oracle over the dequantized K/V."""
        live = [r for r in self.last_step if self._resident(r) and self.ref.seq_len(r)]
        rid = data.draw(st.sampled_from(live))
        q = torch.randn((1, 2 * HEADS, DIM), generator=self.gen)
        for group in range(len(self.model.groups)):
            if self._refused(rid, group):
                continue
            for layer in range(LAYERS):
                out = self.paged.attend([rid], q, group, layer)
                want = self.ref.attend([rid], q, group, layer)
                err = oracle.relative_error(out, want)
                assert err <= oracle.tolerance(torch.float32), (rid, group, layer, err)

    @precondition(lambda self: any(self._resident(r) for r in self.last_step))
    @rule(data=st.data(), n=st.integers(1, 4), bad=st.sampled_from([float("nan"), float("inf")]))
    def append_non_finite(self, data: st.DataObject, n: int, bad: float) -> None:
        """An append with one NaN or inf element (drawn group, K or V, position) is
        refused, naming it, and changes nothing (scales included)."""
        rid = data.draw(st.sampled_from([r for r in self.last_step if self._resident(r)]))
        kv = [list(pair) for pair in self._next_kv(rid, n)]
        g = data.draw(st.integers(0, len(kv) - 1), label="group")
        side = data.draw(st.integers(0, 1), label="K or V")
        t = kv[g][side].clone()
        t[data.draw(st.integers(0, LAYERS - 1)), data.draw(st.integers(0, t.shape[1] - 1))] = bad
        kv[g][side] = t
        before = self.paged.snapshot()
        with pytest.raises(fp8.NonFiniteError, match=str(bad)):
            self.paged.append(rid, [(k, v) for k, v in kv])
        assert self.paged.snapshot() == before, "a refused fp8 append changed the cache"


class Fp8LayerGroupsMachine(Fp8Storage, LayerGroupsMachine):
    """fp8 on the random-model machine: full, windowed and cross-attention groups
    (one to three), single-group models compared with a PagedKVCache too."""


Fp8LayerGroupsMachine.TestCase.settings = settings(stateful_step_count=20, deadline=None)
test_fp8_hybrid_and_cross_attention_paged_vs_reference = Fp8LayerGroupsMachine.TestCase


class Fp8GroupOrderMachine(Fp8Storage, GroupOrderMachine):
    """fp8 on the group-order machine: drawn group orders and window residues, tight
    pools, prefix hits read at once, failures injected mid-append."""

    @precondition(
        lambda self: (
            any(self._resident(r) for r in self.last_step)
            and any(q.dynamic and not q.is_set for q in self.paged.quant.groups)
        )
    )
    @rule(data=st.data(), n=st.integers(1, 9), at=st.sampled_from(["allocate", "write"]))
    def first_write_failing(self, data: st.DataObject, n: int, at: str) -> None:
        """The first write of groups whose dynamic scales are not set yet fails (in its
        allocation or a group's write): no scale is set (`append_failing` compares the
        snapshot, scales included)."""
        self.append_failing(data, n, at)


Fp8GroupOrderMachine.TestCase.settings = settings(stateful_step_count=20, deadline=None)
test_fp8_group_orders_and_injected_failures_paged_vs_reference = Fp8GroupOrderMachine.TestCase


# ---------------------------------------------------------------------- enumerated cases
@pytest.mark.parametrize(
    ("k_scale", "v_scale", "granularity", "match"),
    [
        (0.0, 1.0, "tensor", r"k_scale holds 0\.0"),
        (-1.0, -1.0, "tensor", r"k_scale holds -1\.0"),
        (1.0, float("nan"), "tensor", r"v_scale holds nan"),
        (float("inf"), 1.0, "tensor", r"k_scale holds inf"),
        ([1.0, 2.0, 3.0], 1.0, "head", r"k_scale has shape \(3,\)"),
        ([[1.0]] * 5, 1.0, "head", r"k_scale has shape \(5, 1\)"),
        ("big", 1.0, "tensor", r"k_scale='big' must be 'dynamic'"),
        (1.0, None, "tensor", "both be 'dynamic' or both static"),
        (1.0, 1.0, "layer", "granularity 'layer'"),
        (1e-320, 1.0, "tensor", r"k_scale holds 1e-320 \(element 0\), 0\.0 as a float32"),
        (1.0, 1e39, "tensor", r"v_scale holds 1e\+39 \(element 0\), inf as a float32"),
        (1e-39, 1.0, "tensor", "must be a normal float32"),
    ],
)
def test_bad_fp8_scales_are_refused_at_construction(
    k_scale: Any, v_scale: Any, granularity: str, match: str
) -> None:
    """Zero, negative, NaN, infinite, wrong-shaped or half-given scales and an unknown
    granularity: ConfigError naming the value, before anything is allocated."""
    with pytest.raises(ConfigError, match=match):
        LayerGroupsPagedCache(
            _model_full(), num_blocks=4, block_size=2, dtype=torch.float8_e4m3fn,
            k_scale=k_scale, v_scale=v_scale, scale_granularity=granularity,
        )  # fmt: skip


def _model_full() -> ModelKVSpec:
    return _model([KVCacheSpec.full(), KVCacheSpec.sliding_window(3)])


def test_scales_are_refused_for_a_dtype_that_is_not_fp8() -> None:
    with pytest.raises(ConfigError, match="float16 is not fp8"):
        LayerGroupsPagedCache(_model_full(), 4, 2, dtype=torch.float16, k_scale=1.0, v_scale=1.0)
    with pytest.raises(ConfigError, match="not fp8: it has no scales"):
        LayerGroupsPagedCache(_model_full(), 4, 2).scales(0)


@pytest.mark.parametrize("bad", ["float64", "int8", "fp8"])
def test_fp8_appends_of_a_wrong_input_dtype_change_nothing(bad: str) -> None:
    """K/V in float64 or int8, or already fp8, or K and V of different dtypes: ShapeError
    naming the dtypes, nothing changed (no block taken, no dynamic scale set)."""
    cache = LayerGroupsPagedCache(_model_full(), 8, 2, dtype=torch.float8_e5m2)
    cache.admit("r")
    k = torch.ones(LAYERS, 2, HEADS, DIM)
    wrong = {"float64": k.double(), "int8": k.to(torch.int8), "fp8": k.to(torch.float8_e5m2)}
    before = cache.snapshot()
    with pytest.raises(ShapeError, match="takes K and V of one dtype"):
        cache.append("r", [(wrong[bad], wrong[bad]), (k, k)])
    with pytest.raises(ShapeError, match="takes K and V of one dtype"):
        cache.append("r", [(k, k.half()), (k, k)])
    assert cache.snapshot() == before
    with pytest.raises(ConfigError, match="dynamic"):
        cache.scales(0)


def test_tiny_dynamic_scales_stay_normal_and_store_no_nan() -> None:
    """A first write whose amax is 1e-37 (amax / 448 would be a subnormal float32 scale,
    whose reciprocal overflows: zeros would be stored as NaN): the scale is float32's
    smallest normal, zeros stay zeros and 1e-37 dequantizes to within half a step."""
    cache = LayerGroupsPagedCache(_model_full(), 8, 2, dtype=torch.float8_e4m3fn)
    cache.admit("r")
    k = torch.zeros(LAYERS, 2, HEADS, DIM)
    k[:, 0] = 1e-37
    cache.append("r", [(k, k), (k, k)])
    ks, _ = cache.scales(0)
    assert bool((ks == torch.finfo(torch.float32).tiny).all())
    got, _ = cache.gather("r", 0)
    deq = fp8.dequantize(got, ks[0], torch.float64)
    assert not bool(deq.isnan().any()) and bool((deq[:, 1] == 0).all())
    assert within_half_step(deq[0], k[0], ks[0], fp8.fp8_format(torch.float8_e4m3fn))


@pytest.mark.parametrize("dtype", list(FORMATS))
def test_triton_and_torch_kernels_store_the_same_fp8_bytes(dtype: torch.dtype) -> None:
    """One scenario on two fp8 caches, Triton kernels (under the interpreter on a CPU)
    and torch ones: a window-3 group, a full group and a cross group, blocks of 2,
    per-head dynamic scales; a prompt, a fork with copy-on-write of the shared partial
    block, decode steps past the window, swap out and in. Every view's bytes and the
    scales are equal, and windowed decode attention (float16 queries, which the Triton
    fp8 decode needs) agrees within the float16 tolerance."""
    specs = [KVCacheSpec.sliding_window(3), KVCacheSpec.full(), KVCacheSpec.cross_attention(3)]
    model = _model(specs)
    caches = [
        LayerGroupsPagedCache(
            model,
            24,
            2,
            dtype=dtype,
            num_cpu_blocks=24,
            scale_granularity="head",
            kernel_backend=backend,
        )
        for backend in ("triton", "torch")
    ]
    gen = torch.Generator().manual_seed(3)

    def kv(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = torch.randn((LAYERS, n, HEADS, DIM), generator=gen)
        return k, torch.randn(k.shape, generator=gen) * 4

    enc, prompt = kv(3), [kv(5), kv(5)]
    steps = [[kv(1), kv(1)] for _ in range(4)]
    for c in caches:
        c.admit("a", [enc])
        c.append("a", prompt)
        c.fork("a", "b")
        for step in steps:
            c.append("b", step)
        c.swap_out(["a", "b"])
        c.swap_in(["b", "a"])
        c.check()
    tri, tor = caches
    for g in range(3):
        assert all(torch.equal(x, y) for x, y in zip(tri.scales(g), tor.scales(g), strict=True))
        for rid in "ab":
            for x, y in zip(tri.gather(rid, g), tor.gather(rid, g), strict=True):
                assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), (rid, g)
        q = torch.randn((2, 2 * HEADS, DIM), generator=gen).half()  # Triton: 16-bit queries
        got = tri.attend(["a", "b"], q, g, 1)
        want = tor.attend(["a", "b"], q, g, 1)
        assert oracle.relative_error(got, want.double()) <= oracle.tolerance(torch.float16)


def test_a_cold_chunked_local_hit_leaves_the_dynamic_scales_to_the_first_write() -> None:
    """A chunked-local prompt of 9 tokens (chunk 4, blocks of 2) hits 8 tokens on a cold
    fp8 cache with nothing written (every block before its chunk counts computed): the
    dynamic scales stay unset through the hit and come from the first real write (its
    amax / fp8 max), which reads back within half a step. CI's hypothesis run found the
    reference taking the hit's tokens as a write."""
    model = _model([KVCacheSpec.chunked_local(4)])
    cache = LayerGroupsPagedCache(
        model, num_blocks=8, block_size=2, dtype=torch.float8_e4m3fn, enable_prefix_caching=True
    )
    assert cache.admit("r", prompt=list(range(9))) == 8
    assert cache.quant is not None and not cache.quant.groups[0].is_set
    with pytest.raises(ConfigError, match="nothing has been written yet"):
        cache.scales(0)
    k = torch.randn((LAYERS, 1, HEADS, DIM), generator=torch.Generator().manual_seed(5))
    cache.append("r", [(k, 2 * k)])
    cache.check()
    ks, vs = cache.scales(0)
    fmt = fp8.fp8_format(torch.float8_e4m3fn)
    for layer in range(LAYERS):
        assert torch.equal(ks[layer], rule_scales(k[layer], fmt, "tensor"))
        assert torch.equal(vs[layer], rule_scales(2 * k[layer], fmt, "tensor"))
    got, _ = cache.gather("r", 0)
    for layer in range(LAYERS):
        deq = fp8.dequantize(got[layer], ks[layer], torch.float64)
        assert within_half_step(deq, k[layer], ks[layer], fmt)
