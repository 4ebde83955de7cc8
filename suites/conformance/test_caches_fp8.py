"""fp8 KV storage in both caches: paged vs reference byte for byte, values vs a float64 bound.

A hypothesis-driven sequence of admits, appends, forks (copy-on-write on the paged side),
swaps and frees runs on a `ContiguousKVCache` and a `PagedKVCache` with the same fp8
geometry and scale options; after every step each request's gathered K/V bytes must be
identical in the two, and their float64 dequantized values must lie within half an fp8
step of the input that was appended (the independent oracle: no quantize code involved).
Decode attention of the paged cache (torch and Triton under the interpreter) is compared
with the reference's float64 oracle over the dequantized K/V.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.paged import PagedKVCache
from kvbench.reference import ContiguousKVCache, oracle
from kvbench.workloads import fp8
from kvbench.workloads.errors import CapacityError, ConfigError
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.kv_quant import KVQuant, ScaleSpec

LAYERS, HEADS, Q_HEADS, HEAD_DIM, BLOCK = 2, 2, 4, 16, 4


def _caches(
    dtype: str,
    backend: str,
    *,
    k_scale: ScaleSpec | None = None,
    v_scale: ScaleSpec | None = None,
    scale_granularity: str = "tensor",
) -> tuple[ContiguousKVCache, PagedKVCache]:
    """The reference and the paged cache with the same fp8 scales (the caches' defaults
    where not given: dynamic, per tensor)."""
    g = KVGeometry(LAYERS, HEADS, HEAD_DIM, dtype, Q_HEADS)
    # room for every request OPS can make (at most 14, each under 64 tokens): no capacity
    # error interrupts the comparison
    ref = ContiguousKVCache(
        g,
        capacity_tokens=14 * 64,
        max_seq_len=64,
        k_scale=k_scale,
        v_scale=v_scale,
        scale_granularity=scale_granularity,
    )
    paged = PagedKVCache(
        g,
        num_blocks=14 * 16,
        block_size=BLOCK,
        num_cpu_blocks=14 * 16,
        kernel_backend=backend,
        k_scale=k_scale,
        v_scale=v_scale,
        scale_granularity=scale_granularity,
    )
    return ref, paged


def _quant(cache: ContiguousKVCache | PagedKVCache) -> KVQuant:
    """The cache's fp8 quantization state (every cache these tests build stores fp8)."""
    assert cache.kv_quant is not None
    return cache.kv_quant


def _step_bound(x: torch.Tensor, scale: torch.Tensor, fmt: fp8.Fp8Format) -> torch.Tensor:
    """Half the fp8 step at each |x| / scale, times the scale (float64), for |x| within
    range: the largest error round-to-nearest may make (plus float32 slack)."""
    y = (x.to(torch.float64) / scale.to(torch.float64).view(-1, 1)).abs()
    e = torch.floor(torch.log2(y.clamp(min=2.0**fmt.min_exponent)))
    half_step = torch.exp2(e - fmt.mantissa_bits - 1)
    return (half_step * (1 + 2.0**-20) + y * 2.0**-23) * scale.to(torch.float64).view(-1, 1)


def _check_against_inputs(cache, rid, inputs, fmt: fp8.Fp8Format) -> None:
    k, v = cache.gather(rid)
    ks, vs = cache.kv_quant.scales()
    for layer in range(LAYERS):
        for got, want, sc in ((k, inputs[0], ks), (v, inputs[1], vs)):
            deq = fp8.dequantize(got[layer], sc[layer], torch.float64)
            x = want[layer].to(torch.float64)
            sat = x.clamp(
                -fmt.max * sc[layer].double().view(-1, 1), fmt.max * sc[layer].double().view(-1, 1)
            )
            assert bool(((deq - sat).abs() <= _step_bound(sat, sc[layer], fmt)).all())


OPS = st.lists(
    st.tuples(st.sampled_from(["admit", "append", "fork", "swap", "free"]), st.integers(0, 9)),
    min_size=4,
    max_size=14,
)


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize(
    "scales",
    [
        {},  # dynamic, per tensor
        {"scale_granularity": "head"},  # dynamic, per head
        {"k_scale": [0.01, 0.03], "v_scale": 0.02, "scale_granularity": "head"},  # static
    ],
    ids=["dynamic-tensor", "dynamic-head", "static-head"],
)
@settings(max_examples=12)
@given(ops=OPS, seed=st.integers(0, 2**20))
def test_fp8_paged_and_reference_store_identical_bytes(
    dtype: str, scales: dict, ops: list[tuple[str, int]], seed: int
) -> None:
    ref, paged = _caches(dtype, "torch", **scales)
    fmt = fp8.fp8_format(dtype)
    gen = torch.Generator().manual_seed(seed)
    inputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    next_id = 0
    for op, arg in ops:
        live = sorted(inputs)
        if op == "admit" or not live:
            rid, next_id = next_id, next_id + 1
            n = 1 + arg
            prompt = list(range(100 * rid, 100 * rid + n))
            for c in (ref, paged):
                c.admit(rid, prompt)
            k = torch.randn(LAYERS, n, HEADS, HEAD_DIM, generator=gen) * (1 + arg)
            v = torch.randn(LAYERS, n, HEADS, HEAD_DIM, generator=gen)
            in_dtype = torch.float16 if arg % 2 else torch.float32  # any float input dtype
            k, v = k.to(in_dtype), v.to(in_dtype)
            for c in (ref, paged):
                c.append(rid, k, v)
            inputs[rid] = (k.float(), v.float())
        elif op == "append":
            rid = live[arg % len(live)]
            if paged.is_swapped(rid):
                continue
            k = torch.randn(LAYERS, 1, HEADS, HEAD_DIM, generator=gen) * 3  # may saturate
            v = torch.randn(LAYERS, 1, HEADS, HEAD_DIM, generator=gen)
            for c in (ref, paged):
                c.append(rid, k, v, token_ids=[7])
            old = inputs[rid]
            inputs[rid] = (torch.cat([old[0], k], 1), torch.cat([old[1], v], 1))
        elif op == "fork":
            rid = live[arg % len(live)]
            if paged.is_swapped(rid):
                continue
            child, next_id = next_id, next_id + 1
            for c in (ref, paged):
                c.fork(rid, child)
            inputs[child] = inputs[rid]
        elif op == "swap":
            rid = live[arg % len(live)]
            if paged.is_swapped(rid):
                paged.swap_in(rid)
            else:
                paged.swap_out(rid)
        else:
            rid = live[arg % len(live)]
            for c in (ref, paged):
                c.free(rid)
            del inputs[rid]
        assert torch.equal(_quant(ref).scales()[0], _quant(paged).scales()[0])
        for rid in inputs:
            if paged.is_swapped(rid):
                continue
            rk, rv = ref.gather(rid)
            pk, pv = paged.gather(rid)
            assert pk.dtype == fmt.dtype
            assert torch.equal(rk.view(torch.uint8), pk.view(torch.uint8))
            assert torch.equal(rv.view(torch.uint8), pv.view(torch.uint8))
            _check_against_inputs(paged, rid, inputs[rid], fmt)


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_fp8_paged_attend_matches_reference_oracle(dtype: str, backend: str) -> None:
    ref, paged = _caches(dtype, backend, scale_granularity="head")
    gen = torch.Generator().manual_seed(11)
    for rid, n in enumerate([9, 21]):
        k = torch.randn(LAYERS, n, HEADS, HEAD_DIM, generator=gen)
        v = torch.randn(LAYERS, n, HEADS, HEAD_DIM, generator=gen)
        for c in (ref, paged):
            c.admit(rid, list(range(100 * rid, 100 * rid + n)))  # no prefix hit
            c.append(rid, k.half(), v.half())
    paged.fork(0, 2)
    ref.fork(0, 2)
    extra = torch.randn(LAYERS, 1, HEADS, HEAD_DIM, generator=gen).half()
    for c in (ref, paged):
        c.append(2, extra, extra)  # copy-on-write of the shared partial block
    q = torch.randn(3, Q_HEADS, HEAD_DIM, generator=gen).half()
    for layer in range(LAYERS):
        want = ref.attend([0, 1, 2], q, layer=layer)
        got = paged.attend([0, 1, 2], q, layer=layer)
        assert oracle.relative_error(got, want.double()) <= oracle.tolerance(torch.float16)


def test_fp8_dynamic_scales_follow_the_first_write_and_then_saturate() -> None:
    ref, paged = _caches("fp8_e4m3", "torch", scale_granularity="head")
    k = torch.zeros(LAYERS, 2, HEADS, HEAD_DIM)
    k[0, 1, 0, 3] = -8.96  # layer 0 head 0 amax; head 1 all zero
    k[1, 0, 1, 0] = 0.5
    v = torch.ones(LAYERS, 2, HEADS, HEAD_DIM)
    for c in (ref, paged):
        c.admit("a", [1, 2, 3])
        c.append("a", k, v)
        ks, vs = _quant(c).scales()
        want = torch.tensor([[8.96 / 448, 1.0], [1.0, 0.5 / 448]], dtype=torch.float64)
        assert torch.equal(ks, want.to(torch.float32))
        assert torch.equal(vs, torch.full((LAYERS, HEADS), 1 / 448, dtype=torch.float64).float())
        big = torch.full((LAYERS, 1, HEADS, HEAD_DIM), 100.0)
        c.append("a", big, big)
        assert torch.equal(_quant(c).scales()[0], ks)  # never changed after the first write
        gk, _ = c.gather("a")
        top = fp8.dequantize(gk[0, 2], ks[0], torch.float64)
        assert float(top[0, 0]) == pytest.approx(448 * float(ks[0, 0]), rel=1e-6)  # saturated


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_fp8_caches_refuse_non_finite_and_change_nothing(bad: float) -> None:
    ref, paged = _caches("fp8_e5m2", "torch")
    k = torch.randn(LAYERS, 3, HEADS, HEAD_DIM)
    k[1, 2, 1, 7] = bad
    for c in (ref, paged):
        c.admit("a", [1, 2, 3])
        before = c.stats()
        with pytest.raises(fp8.NonFiniteError, match=rf"keys holds {bad} at index \(1, 2, 1, 7\)"):
            c.append("a", k, k.abs())
        assert c.stats() == before and c.seq_len("a") == 0
        assert not _quant(c).is_set  # the dynamic scales wait for a write that succeeds


def test_fp8_failed_append_sets_no_dynamic_scale() -> None:
    g = KVGeometry(1, 1, 8, "fp8_e4m3")
    paged = PagedKVCache(g, num_blocks=1, block_size=4)
    paged.admit("a", [1])
    with pytest.raises(CapacityError):
        paged.append("a", torch.ones(1, 9, 1, 8), torch.ones(1, 9, 1, 8))
    assert not _quant(paged).is_set


def test_fp8_cache_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="is not fp8"):
        ContiguousKVCache(KVGeometry(1, 1, 8, "float16"), 16, 16, k_scale=1.0, v_scale=1.0)
    with pytest.raises(ConfigError, match=r"holds -1\.0"):
        PagedKVCache(KVGeometry(1, 2, 8, "fp8"), 4, k_scale=-1.0, v_scale=1.0)
    with pytest.raises(ConfigError, match="both be 'dynamic' or both static"):
        PagedKVCache(KVGeometry(1, 2, 8, "fp8"), 4, k_scale=1.0)
    with pytest.raises(ConfigError, match="differs across heads"):
        PagedKVCache(KVGeometry(1, 2, 8, "fp8"), 4, k_scale=[1.0, 2.0], v_scale=1.0)
    with pytest.raises(ConfigError, match="granularity 'layer'"):
        ContiguousKVCache(KVGeometry(1, 1, 8, "e5m2"), 16, 16, scale_granularity="layer")
