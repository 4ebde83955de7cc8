"""fp8 KV decode: its time against 16-bit K/V (paired) and its accuracy cost.

`kernel.decode_fp8` builds one scattered pool per case (the same K/V in float16, bfloat16
and fp8 with amax scales per tensor or per KV head, `workloads.fp8`'s dynamic rule) and
times paged decode over the fp8 pool (float16 queries), over the float16 pool and over the
bfloat16 pool. On a CPU the three calls and a 64 MiB copy are timed alternately repeat by
repeat, so the ratios fp8 / fp16 and fp8 / bf16 and the fraction of the copy peak are
medians of per-repeat values (with q1-q3); on a GPU each is timed with do_bench against
the run's copy peak. The bytes of one fp8 call are those of the 16-bit call with K/V at
1 byte per element.

Cases: format (e4m3 / e5m2) x scale granularity (per tensor / per KV head) x the spread of
magnitudes across KV heads (`SPREADS`). Accuracy rows, per case: the relative error of the fp8 output against float64 attention
over the dequantized K/V (the kernel's own semantics; must stay within the query dtype's
tolerance, else the case fails before timing) and against float64 attention over the
unquantized K/V (the accuracy cost of fp8 storage), beside the float16 pool's error
against the same exact attention (what 16-bit storage costs).
"""

from __future__ import annotations

import math

import torch

from kvbench.reference import oracle
from kvbench.reports.provenance import MEASURED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.harness import paired_fraction, summarize
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.suites.bench.sweeps.kernels import (
    HEAD_DIM,
    NUM_KV_HEADS,
    KernelDisagreesError,
    _backend,
    _first_call_seconds,
    _path_rows,
    scattered_pool,
)
from kvbench.suites.bench.sweeps.peers import _paired_times
from kvbench.workloads import fp8
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE
from kvbench.workloads.torch_dtypes import torch_dtype

#: The 16-bit pools every fp8 case is timed against.
BASELINES = ("float16", "bfloat16")
#: Ratio of the largest to the smallest KV head's magnitude: 1 (all heads alike) or 256
#: (head h of 8 scaled by 16^(2h/7 - 1), as in a layer with outlier heads), where per-head scales matter.
SPREADS = (1, 256)


def _cases(full: bool) -> list[Case]:
    kv = ("fp8_e4m3", "fp8_e5m2")
    grans = ("tensor", "head")
    base = {"block_size": DEFAULT_BLOCK_SIZE, "gqa": 4}
    if full:
        return [
            {**base, "ctx_len": L, "batch": b, "kv_dtype": k, "scales": g, "head_spread": sp}
            for k in kv
            for g in grans
            for sp in SPREADS
            for b in (1, 8, 32)
            for L in (512, 1024, 4096)
        ]
    # the default run stays short: per-tensor scales on alike heads, per-head on spread ones,
    # at the shape of issue 39's goal (batch >= 8, context >= 2048)
    return [
        {**base, "ctx_len": 2048, "batch": 8, "kv_dtype": k, "scales": g, "head_spread": sp}
        for k in kv
        for g, sp in zip(grans, SPREADS, strict=True)
    ]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    return float(torch.linalg.vector_norm(a64 - b64) / torch.linalg.vector_norm(b64))


def _exact(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """float64 decode attention, [B, Hq, D], over [B, H, L, D] K/V (GQA groups)."""
    q = query.double().cpu()
    out = [
        oracle.decode_attention(q[b], keys[b].transpose(0, 1), values[b].transpose(0, 1))
        for b in range(q.shape[0])
    ]
    return torch.stack(out)


@sweep(
    "kernel.decode_fp8",
    "paged decode over fp8 K/V vs fp16 and bf16 K/V (paired) and its accuracy cost",
    _cases,
    requires=("kvbench.kernels.ops",),
    tags=("kernel",),
    produced=(MEASURED,),
)
def decode_fp8(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.kernels import ops

    dev = ctx.device
    b, length, bs, g = case["batch"], case["ctx_len"], case["block_size"], case["gqa"]
    h, d = NUM_KV_HEADS, HEAD_DIM
    fmt = fp8.fp8_format(case["kv_dtype"])
    gen = torch.Generator().manual_seed(hash((b, length, bs, g)) & 0xFFFF)
    spread = torch.exp2(torch.linspace(-0.5, 0.5, h) * math.log2(case["head_spread"]))
    spread = spread.view(1, h, 1, 1)
    keys = torch.randn(b, h, length, d, generator=gen) * spread  # float32 originals, CPU
    values = torch.randn(b, h, length, d, generator=gen) * spread
    query = torch.randn(b, h * g, d, generator=gen)
    scale = 1.0 / math.sqrt(d)
    ks = fp8.dynamic_scale(keys.transpose(1, 2), fmt, case["scales"])
    vs = fp8.dynamic_scale(values.transpose(1, 2), fmt, case["scales"])
    kq = fp8.quantize(keys.transpose(1, 2), ks, fmt).transpose(1, 2)  # [B, H, L, D] bytes
    vq = fp8.quantize(values.transpose(1, 2), vs, fmt).transpose(1, 2)
    pools: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    for name in BASELINES:
        dt = torch_dtype(name)
        k_c, v_c, tables = scattered_pool(
            keys.to(dt), values.to(dt), bs, torch.Generator().manual_seed(1)
        )
        pools[name] = (k_c.to(dev), v_c.to(dev), tables.to(dev))
    k_c, v_c, tables = scattered_pool(
        kq.view(torch.uint8), vq.view(torch.uint8), bs, torch.Generator().manual_seed(1)
    )
    pools["fp8"] = (k_c.view(fmt.dtype).to(dev), v_c.view(fmt.dtype).to(dev), tables.to(dev))
    seq_lens = torch.full((b,), length, dtype=torch.int32, device=dev)
    backend = _backend(dev)
    kd, vd = ks.to(dev), vs.to(dev)

    def call(name: str, q_dtype: torch.dtype):  # type: ignore[no-untyped-def]
        kc, vc, tab = pools[name]
        q = query.to(dev, q_dtype)
        out = torch.empty_like(q)
        k_scale, v_scale = (kd, vd) if name == "fp8" else (None, None)  # None: not fp8

        def run() -> torch.Tensor:
            return ops.paged_decode_attention(
                q, kc, vc, tab, seq_lens, scale, out=out, check_indices=False,
                backend=backend, max_seq_len=length, k_scale=k_scale, v_scale=v_scale,
            )  # fmt: skip

        return run

    fns = {
        "fp8": call("fp8", torch.float16),
        "float16": call("float16", torch.float16),
        "bfloat16": call("bfloat16", torch.bfloat16),
    }
    k8, v8, tab8 = pools["fp8"]
    launch = ops.decode_launch(
        query.to(dev, torch.float16), k8, v8, tab8, seq_lens, check_indices=False,
        backend=backend, max_seq_len=length, k_scale=kd, v_scale=vd,
    )  # fmt: skip
    first = _first_call_seconds(fns["fp8"], dev)
    exact = _exact(query, keys, values)
    dequant = _exact(
        query,
        fp8.dequantize(kq.transpose(1, 2), ks, torch.float64).transpose(1, 2),
        fp8.dequantize(vq.transpose(1, 2), vs, torch.float64).transpose(1, 2),
    )
    out8 = fns["fp8"]().clone().cpu()
    err_semantics = _rel(out8, dequant)
    limit = oracle.tolerance(torch.float16)
    if not err_semantics <= limit:
        raise KernelDisagreesError(
            f"fp8 decode differs from float64 over the dequantized K/V by {err_semantics:.3g} "
            f"> {limit:.3g} in case {case}; not timed"
        )
    err_fp8 = _rel(out8, exact)
    err_fp16 = _rel(fns["float16"]().clone().cpu(), exact)
    err_bf16 = _rel(fns["bfloat16"]().clone().cpu(), exact)
    elems = 2 * b * length * h * d
    fixed = 2 * b * h * g * d * 2 + tables.numel() * 4  # queries + outputs (16-bit), tables
    nbytes = {"fp8": elems + fixed, "float16": 2 * elems + fixed, "bfloat16": 2 * elems + fixed}
    rows: list[Measurement] = []
    if backend == "triton":
        timed = {n: ctx.time(fn) for n, fn in fns.items()}
        peak = ctx.copy_peak()
        for base in BASELINES:
            ratio = timed["fp8"]["median"] / timed[base]["median"]
            rows.append(Measurement(f"ratio_fp8_vs_{base}", ratio, "ratio"))
        rows.append(
            Measurement(
                "bandwidth_fraction", nbytes["fp8"] / timed["fp8"]["median"] / peak, "fraction"
            )
        )
    else:
        probe = ctx.copy_probe()
        samples = _paired_times({**fns, "copy": probe}, ctx.timing)
        timed = {n: summarize(samples[n]) for n in fns}
        for base in BASELINES:
            per_repeat = [x / y for x, y in zip(samples["fp8"], samples[base], strict=True)]
            stats = summarize(per_repeat)
            rows.append(Measurement(f"ratio_fp8_vs_{base}", stats["median"], "ratio", stats))
        rows.append(
            Measurement(
                "bandwidth_fraction",
                paired_fraction(samples["fp8"], samples["copy"], nbytes["fp8"], probe.bytes_moved),
                "fraction",
            )
        )
        rows += list(probe.rows(samples["copy"]))
    for name in fns:
        rows.append(Measurement(f"time_{name}", timed[name]["median"], "s", timed[name]))
        rows.append(Measurement(f"bytes_per_call_{name}", nbytes[name], "B"))
    return [
        *rows,
        Measurement("achieved_bandwidth", nbytes["fp8"] / timed["fp8"]["median"], "B/s"),
        Measurement("rel_err_fp8_vs_dequantized_fp64", err_semantics, "fraction"),
        Measurement("rel_err_fp8_vs_exact_fp64", err_fp8, "fraction"),
        Measurement("rel_err_float16_vs_exact_fp64", err_fp16, "fraction"),
        Measurement("rel_err_bfloat16_vs_exact_fp64", err_bf16, "fraction"),
        Measurement("backend_is_triton", float(backend == "triton"), "bool"),
        *_path_rows(dev, first, launch),
    ]
