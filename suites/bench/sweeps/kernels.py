"""Kernel sweeps: paged decode and prefill attention (kernels.ops) against SDPA on the
same KV laid out contiguously, over block size x context length x batch x dtype x GQA.

On a GPU the ops dispatch to the Triton kernels and are timed with do_bench; on a CPU
they dispatch to the torch versions and are timed with the warm-up / repeats / median
harness. The paged calls are told the longest context and query run (known here
without reading the device) and skip index checks, so a timed call reads nothing back
from the GPU. Each case records both times, the overhead vs SDPA (paged / contiguous - 1), the
bytes one call must move (K and V of every cached token, the queries and the outputs, the
block tables), the achieved bandwidth and its fraction of the copy peak (on a CPU a 64
MiB copy timed in the same repeats as the kernel, so the fraction is paired; on a GPU the
run's peak), and the relative difference between the two outputs (proof they did the same
work). A case whose paged output differs from SDPA's by more than twice the dtype's
oracle tolerance (each side may be that far from the exact result) fails before it is
timed, so a miscompiled kernel yields a failed case, never a timing.

Pool layout: each sequence's blocks are scattered over the pool by a seeded permutation,
as in a pool that has served many requests. What paging itself costs is measured apart
from SDPA (suites.bench.paging_layout): the same paged kernel over a contiguous layout of
the same K/V (sequential block tables), paired repeat by repeat with the scattered pool,
gives `paging_overhead`; the SDPA comparison stays as a second baseline,
`overhead_vs_sdpa`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from kvbench.kernels.backends import Launch
from kvbench.reference.oracle import tolerance
from kvbench.reports.provenance import MEASURED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.harness import FmaProbe, host_call_time, paired_fraction, summarize
from kvbench.suites.bench.paging_layout import (
    PagingTimes,
    contiguous_layout,
    layout_agreement,
    paging_from_samples,
    paired_gpu_times,
)
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.suites.bench.sdpa_baseline import decode_forms, fastest
from kvbench.suites.bench.sweeps.peers import _paired_ratio, _paired_times
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE
from kvbench.workloads.errors import KVBenchError
from kvbench.workloads.torch_dtypes import torch_dtype

NUM_KV_HEADS = 8
HEAD_DIM = 128


def _on_gpu(gpu: bool | None) -> bool:
    """`gpu`, or whether CUDA is here when None (the grid a machine plans for itself; the
    GPU plan, `kvbench gpu --dry-run`, asks for the GPU grid on any machine)."""
    return torch.cuda.is_available() if gpu is None else gpu


def _default_dtypes(full: bool, gpu: bool | None = None) -> list[str]:
    if _on_gpu(gpu):
        return ["float16", "bfloat16", "float32"] if full else ["float16"]
    return ["float32", "bfloat16"] if full else ["float32"]


def _decode_cases(full: bool, gpu: bool | None = None) -> list[Case]:
    dtypes = _default_dtypes(full, gpu)
    if full:
        return [
            {"block_size": bs, "ctx_len": L, "batch": b, "dtype": dt, "gqa": g}
            for dt in dtypes
            for g in (1, 4, 8)
            for b in (1, 8, 16, 32, 64, 128)
            for L in (128, 256, 512, 1024, 2048, 4096, 8192)
            for bs in (8, 16, 32, 64, 128)
        ]
    gpu = _on_gpu(gpu)
    batch = 32 if gpu else 8
    seq = [
        {
            "block_size": DEFAULT_BLOCK_SIZE,
            "ctx_len": L,
            "batch": batch,
            "dtype": dtypes[0],
            "gqa": 4,
        }
        for L in (128, 512, 1024, 2048, 4096)
    ]
    blocks = [
        {"block_size": bs, "ctx_len": 1024, "batch": batch, "dtype": dtypes[0], "gqa": 4}
        for bs in (8, 32, 64, 128)
    ]
    batches = [
        {
            "block_size": DEFAULT_BLOCK_SIZE,
            "ctx_len": 1024,
            "batch": b,
            "dtype": dtypes[0],
            "gqa": 4,
        }
        for b in ((1, 16, 64) if gpu else (1, 16))
    ]
    goals = (
        []
        if gpu
        else [  # the CPU goal shapes (fp32, 32 q / 8 KV heads), then 16-bit at the longest
            {"block_size": bs, "ctx_len": L, "batch": b, "dtype": "float32", "gqa": 4}
            for b, L in ((8, 4096), (32, 1024), (8, 128))
            for bs in (16, 32)
        ]
        + [
            {"block_size": DEFAULT_BLOCK_SIZE, "ctx_len": 4096, "batch": 8, "dtype": dt, "gqa": 4}
            for dt in ("bfloat16", "float16")
        ]
    )
    cases = seq + blocks + batches
    return cases + [c for c in goals if c not in cases]


def scattered_pool(
    keys: torch.Tensor, values: torch.Tensor, block_size: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lay contiguous K/V ([B, H, L, D]) out as a paged pool with scattered blocks.

    Returns (k_cache, v_cache, block_tables): caches [num_blocks, block_size, H, D],
    tables int32 [B, ceil(L / block_size)] (a seeded permutation of the pool's blocks).
    """
    b, h, length, d = keys.shape
    nb = -(-length // block_size)
    pad = nb * block_size - length
    perm = torch.randperm(b * nb, generator=gen).to(keys.device)
    tables = perm.view(b, nb).to(torch.int32)

    def pool(x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x, (0, 0, 0, pad))  # [B, H, nb*bs, D]
        blocks = (
            x.view(b, h, nb, block_size, d).permute(0, 2, 3, 1, 4).reshape(b * nb, block_size, h, d)
        )
        out = torch.empty_like(blocks)
        out[perm] = blocks
        return out.contiguous()

    return pool(keys), pool(values), tables


def _backend(device: torch.device) -> str:
    """Triton kernels on a GPU; the torch versions on a CPU (the Triton interpreter is a
    correctness tool, far too slow to time)."""
    return "triton" if device.type == "cuda" else "torch"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    return float(torch.linalg.vector_norm(a64 - b64) / torch.linalg.vector_norm(b64))


#: SDPA backends in the order torch itself prefers them (fastest first).
SDPA_BACKENDS: tuple[tuple[str, SDPBackend], ...] = (
    ("flash", SDPBackend.FLASH_ATTENTION),
    ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ("cudnn", SDPBackend.CUDNN_ATTENTION),
    ("math", SDPBackend.MATH),
)


def fastest_sdpa(call: Callable[[], torch.Tensor]) -> tuple[str, Callable[[], torch.Tensor]]:
    """The first of `SDPA_BACKENDS` that accepts `call` (an SDPA call), and `call` pinned
    to it, so the baseline is never a silent fall back to the math backend."""
    for name, backend in SDPA_BACKENDS:
        try:
            with sdpa_kernel(backend):
                call()
        except RuntimeError:
            continue

        def pinned(backend: SDPBackend = backend) -> torch.Tensor:
            with sdpa_kernel(backend):
                return call()

        return name, pinned
    raise KVBenchError("no SDPA backend accepts the contiguous baseline")  # math always does


class KernelDisagreesError(KVBenchError):
    """The paged kernel's output differs from SDPA's on the same K/V beyond tolerance."""


def agreement(paged: torch.Tensor, sdpa: torch.Tensor, case: Case) -> float:
    """The relative difference of the two outputs; raises KernelDisagreesError (naming
    the case) when it exceeds twice the dtype's oracle tolerance or is not finite."""
    diff = _rel(paged, sdpa)
    limit = 2 * tolerance(paged.dtype)
    if not diff <= limit:  # NaN fails too
        raise KernelDisagreesError(
            f"paged output differs from SDPA by {diff:.3g} (relative) > {limit:.3g} for "
            f"{paged.dtype} in case {case}; not timed"
        )
    return diff


@sweep(
    "kernel.decode",
    "paged decode attention vs SDPA on contiguous KV: time, overhead, bandwidth",
    _decode_cases,
    requires=("kvbench.kernels.ops",),
    tags=("kernel",),
    produced=(MEASURED,),
)
def decode(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.kernels import ops

    dev, dt = ctx.device, torch_dtype(case["dtype"])
    b, length, bs, g = case["batch"], case["ctx_len"], case["block_size"], case["gqa"]
    h, d = NUM_KV_HEADS, HEAD_DIM
    gen = torch.Generator().manual_seed(hash((b, length, bs, g)) & 0xFFFF)
    keys = torch.randn(b, h, length, d, generator=gen).to(dev, dt)
    values = torch.randn(b, h, length, d, generator=gen).to(dev, dt)
    query = torch.randn(b, h * g, d, generator=gen).to(dev, dt)
    k_cache, v_cache, tables = scattered_pool(keys, values, bs, gen)
    tables = tables.to(dev)
    seq_lens = torch.full((b,), length, dtype=torch.int32, device=dev)
    scale = 1.0 / math.sqrt(d)
    out = torch.empty_like(query)

    seq_pool = contiguous_layout(k_cache, v_cache, tables)

    def paged(
        pool: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = (k_cache, v_cache, tables),
    ) -> torch.Tensor:
        return ops.paged_decode_attention(
            query,
            *pool,
            seq_lens,
            scale,
            out=out,
            check_indices=False,
            backend=_backend(dev),
            max_seq_len=length,
        )

    launch = ops.decode_launch(
        query, k_cache, v_cache, tables, seq_lens, check_indices=False, backend=_backend(dev),
        max_seq_len=length,
    )  # fmt: skip
    form, contiguous = fastest(decode_forms(query, keys, values, scale), _sync(dev))
    first = _first_call_seconds(paged, dev)
    scattered_out = paged().clone()
    diff = agreement(scattered_out, contiguous(), case)
    layouts = layout_agreement(scattered_out, paged(seq_pool), tolerance(query.dtype))
    esize = keys.element_size()
    nbytes = 2 * b * length * h * d * esize + 2 * b * h * g * d * esize + tables.numel() * 4
    timed = _timed_trio(
        ctx, paged, contiguous, nbytes, paged_contiguous_layout=lambda: paged(seq_pool)
    )
    backend = _backend(dev)
    return [
        Measurement("time_paged", timed.paged["median"], "s", timed.paged),
        Measurement("time_contiguous", timed.contiguous["median"], "s", timed.contiguous),
        Measurement("overhead_vs_sdpa", timed.ratio - 1, "fraction"),
        *timed.paging_rows(layouts),
        Measurement("bytes_per_call", nbytes, "B"),
        Measurement("achieved_bandwidth", nbytes / timed.paged["median"], "B/s"),
        Measurement("bandwidth_fraction", timed.fraction_paged, "fraction"),
        Measurement("contiguous_bandwidth_fraction", timed.fraction_contiguous, "fraction"),
        *timed.copy_rows,
        *timed.gpu_rows,
        Measurement("rel_diff_vs_sdpa", diff, "fraction"),
        Measurement("backend_is_triton", float(backend == "triton"), "bool"),
        Measurement("contiguous_form_is_gqa", float(form == "gqa"), "bool"),
        *_path_rows(dev, first, launch),
    ]


def _sync(dev: torch.device):  # type: ignore[no-untyped-def]
    return torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)


def _first_call_seconds(fn, dev: torch.device) -> float:  # type: ignore[no-untyped-def]
    """Wall time of the first call (kernel build or cache load, warm-up), apart from the
    step times, which are taken after warm-up."""
    t0 = time.perf_counter()
    fn()
    _sync(dev)()
    return time.perf_counter() - t0


@dataclass(frozen=True)
class TimedTrio:
    """Paged and contiguous timings of one case and their fractions of the copy peak.

    Attributes:
        paged, contiguous: per-call time statistics (s).
        ratio: median paired paged / contiguous time.
        fraction_paged, fraction_contiguous: bytes per call over time, as a fraction of
            the copy peak (bytes read plus written per second); paired with a copy timed in
            the same repeats on a CPU, the run's once-measured peak on a GPU.
        copy_rows: the paired copy's own rows (bandwidth, time); none on a GPU, where the
            run-level peak is used.
        gpu_rows: on a GPU, how the kernels were timed (`timing_method_is_cudagraph`:
            1 for CUDA-graph replay, 0 for the do_bench fallback) and the host cost of
            one paged call (`host_time_paged`, s), apart from the device time.
        samples: on a CPU, every timed callable's per-repeat seconds (side by side).
    """

    paged: dict[str, float | int]
    contiguous: dict[str, float | int]
    ratio: float
    fraction_paged: float
    fraction_contiguous: float
    copy_rows: tuple[Measurement, ...] = ()
    gpu_rows: tuple[Measurement, ...] = ()
    samples: dict[str, list[float]] = field(default_factory=dict)
    paging: PagingTimes | None = None

    def paging_rows(self, layouts_diff: float) -> list[Measurement]:
        """The paging-overhead rows (same kernel, contiguous vs scattered layout)."""
        return self.paging.rows(layouts_diff) if self.paging is not None else []


def _timed_trio(  # type: ignore[no-untyped-def]
    ctx: BenchContext, paged, contiguous, nbytes: int, extra=None, paged_contiguous_layout=None
) -> TimedTrio:
    """Time the paged call and its contiguous baseline, and judge both against the copy peak.

    On a CPU the paged call, the contiguous call and a 64 MiB copy are timed alternately
    repeat by repeat (load from other processes hits all three alike) and every ratio and
    fraction is a median of per-repeat values. Where the Triton kernels run (a GPU) each is
    timed by the context (do_bench) against the run's copy peak.

    `paged_contiguous_layout`, the same paged call over the contiguous layout, joins the
    CPU's paired repeats (on a GPU it is paired with the paged call repeat by repeat);
    the result's `paging` then holds the paging overhead.
    """
    if _backend(ctx.device) == "triton":
        a, c = ctx.time(paged), ctx.time(contiguous)
        peak = ctx.copy_peak()
        host = host_call_time(paged, ctx.device, ctx.timing)
        rows = (
            Measurement("timing_method_is_cudagraph", float(a.get("cuda_graph", 0.0)), "bool"),
            Measurement("host_time_paged", float(host["median"]), "s", host),
        )
        paging = (
            paired_gpu_times(ctx, paged, paged_contiguous_layout)
            if paged_contiguous_layout is not None
            else None
        )
        return TimedTrio(
            a, c, a["median"] / c["median"], nbytes / a["median"] / peak,
            nbytes / c["median"] / peak, gpu_rows=rows, paging=paging,
        )  # fmt: skip
    probe = ctx.copy_probe()
    fns = {"paged": paged}
    if paged_contiguous_layout is not None:  # next to the paged call in every repeat's order
        fns["layout"] = paged_contiguous_layout
    fns = {**fns, "contiguous": contiguous, "copy": probe, **(extra or {})}
    samples = _paired_times(fns, ctx.timing)
    return TimedTrio(
        summarize(samples["paged"]),
        summarize(samples["contiguous"]),
        _paired_ratio(samples, "paged", "contiguous"),
        paired_fraction(samples["paged"], samples["copy"], nbytes, probe.bytes_moved),
        paired_fraction(samples["contiguous"], samples["copy"], nbytes, probe.bytes_moved),
        copy_rows=tuple(probe.rows(samples["copy"])),
        samples=samples,
        paging=(
            paging_from_samples(samples["paged"], samples["layout"])
            if "layout" in samples
            else None
        ),
    )


def backend_rows(launch: Launch) -> list[Measurement]:
    """Which backend ran the paged call and why (`kernels.backends`): a
    `backend_<name>` row (1, bool) whose note is the reason (the request or the
    preference order, each backend skipped before it with its reason) and the plan."""
    note = f"{launch.reason} [{launch.plan.describe()}]"
    return [Measurement(f"backend_{launch.backend}", 1.0, "bool", note=note)]


def _path_rows(dev: torch.device, first_call: float, launch: Launch) -> list[Measurement]:
    """Which backend ran and why (`backend_rows`), which CPU path it was (the in-place
    C++ kernel or the gather + SDPA fallback: `kernel_path_is_cpp`, as the plan chose it)
    and what the first call and the build cost, apart from the step time."""
    rows = [Measurement("first_call_time", first_call, "s"), *backend_rows(launch)]
    if dev.type == "cpu":
        from kvbench.kernels import cpu_paged

        status = cpu_paged.status()
        rows += [
            Measurement("kernel_path_is_cpp", float(launch.backend == "cpu_paged"), "bool"),
            Measurement("kernel_build_time", status.build_seconds, "s"),
        ]
    return rows


def _warm_call_seconds(fn: Callable[[], object]) -> float:
    """Wall time of one call after the warm-up (CPU only: no device sync)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _prefill_cases(full: bool, gpu: bool | None = None) -> list[Case]:
    dtypes = _default_dtypes(full, gpu)
    if full:
        return [
            {"block_size": bs, "ctx_len": L, "q_len": q, "batch": b, "dtype": dt, "gqa": 4}
            for dt in dtypes
            for b in (1, 4, 16)
            for q in (16, 128, 512)
            for L in (512, 1024, 2048, 4096, 8192)
            for bs in (8, 16, 32, 64, 128)
            if q <= L
        ]
    return [  # 512 / 2048 / 4096 at block size 16: the paging overhead's growth with length
        {"block_size": bs, "ctx_len": L, "q_len": 128, "batch": 2, "dtype": dtypes[0], "gqa": 4}
        for bs, L in ((16, 512), (16, 2048), (16, 4096), (64, 2048))
    ]


@sweep(
    "kernel.prefill",
    "paged prefill/extend attention vs causal SDPA on contiguous KV",
    _prefill_cases,
    requires=("kvbench.kernels.ops",),
    tags=("kernel",),
    produced=(MEASURED,),
)
def prefill(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.kernels import ops

    dev, dt = ctx.device, torch_dtype(case["dtype"])
    b, length, bs, g, n = (
        case["batch"],
        case["ctx_len"],
        case["block_size"],
        case["gqa"],
        case["q_len"],
    )
    h, d = NUM_KV_HEADS, HEAD_DIM
    gen = torch.Generator().manual_seed(hash((b, length, bs, g, n)) & 0xFFFF)
    keys = torch.randn(b, h, length, d, generator=gen).to(dev, dt)
    values = torch.randn(b, h, length, d, generator=gen).to(dev, dt)
    query = torch.randn(b * n, h * g, d, generator=gen).to(dev, dt)
    k_cache, v_cache, tables = scattered_pool(keys, values, bs, gen)
    tables = tables.to(dev)
    seq_lens = torch.full((b,), length, dtype=torch.int32, device=dev)
    cu = torch.arange(0, (b + 1) * n, n, dtype=torch.int32, device=dev)
    scale = 1.0 / math.sqrt(d)
    out = torch.empty_like(query)
    # query i sits at position L - n + i: causal aligned to the bottom right, which
    # is_causal (top left) is only when n == L; an explicit bias keeps flash eligible
    mask = None if n == length else causal_lower_right(n, length)
    q4 = query.view(b, n, h * g, d).transpose(1, 2)  # [B, Hq, n, D]

    seq_pool = contiguous_layout(k_cache, v_cache, tables)

    def paged(
        pool: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = (k_cache, v_cache, tables),
    ) -> torch.Tensor:
        return ops.paged_prefill_attention(
            query,
            *pool,
            cu,
            seq_lens,
            scale,
            out=out,
            check_indices=False,
            backend=_backend(dev),
            max_seq_len=length,
            max_q_len=n,
        )

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q4, keys, values, attn_mask=mask, is_causal=mask is None, scale=scale,
            enable_gqa=g > 1,
        )  # fmt: skip

    launch = ops.prefill_launch(
        query, k_cache, v_cache, tables, cu, seq_lens, check_indices=False,
        backend=_backend(dev), max_seq_len=length, max_q_len=n,
    )  # fmt: skip
    sdpa_backend, contiguous = fastest_sdpa(sdpa)
    ref = contiguous().transpose(1, 2).reshape(b * n, h * g, d)
    first = _first_call_seconds(paged, dev)
    scattered_out = paged().clone()
    diff = agreement(scattered_out, ref, case)
    layouts = layout_agreement(scattered_out, paged(seq_pool), tolerance(query.dtype))
    esize = keys.element_size()
    nbytes = 2 * b * length * h * d * esize + 2 * b * n * h * g * d * esize + tables.numel() * 4
    flops = 4 * b * h * g * d * (n * (length - n) + n * (n + 1) // 2)
    # on the C++ CPU path, the FMA peak timed in the same repeats (fma_peak_fraction), by
    # a probe about as long as one warm call (the C++ build also has the probe)
    on_cpu = launch.backend == "cpu_paged"
    fma = FmaProbe.lasting(_warm_call_seconds(paged)) if on_cpu else None
    timed = _timed_trio(
        ctx, paged, contiguous, nbytes, {"fma": fma} if fma else None,
        paged_contiguous_layout=lambda: paged(seq_pool),
    )  # fmt: skip
    fma_rows = fma.rows(timed.samples["paged"], timed.samples["fma"], flops) if fma else []
    return [
        Measurement("time_paged", timed.paged["median"], "s", timed.paged),
        *fma_rows,
        Measurement("time_contiguous", timed.contiguous["median"], "s", timed.contiguous),
        Measurement("overhead_vs_sdpa", timed.ratio - 1, "fraction"),
        *timed.paging_rows(layouts),
        Measurement("bytes_per_call", nbytes, "B"),
        Measurement("flops_per_call", flops, "FLOP"),
        Measurement("achieved_flops", flops / timed.paged["median"], "FLOP/s"),
        Measurement("achieved_bandwidth", nbytes / timed.paged["median"], "B/s"),
        Measurement("bandwidth_fraction", timed.fraction_paged, "fraction"),
        *timed.copy_rows,
        *timed.gpu_rows,
        Measurement("rel_diff_vs_sdpa", diff, "fraction"),
        Measurement(f"contiguous_sdpa_backend_{sdpa_backend}", 1.0, "bool"),
        Measurement("backend_is_triton", float(_backend(dev) == "triton"), "bool"),
        *_path_rows(dev, first, launch),
    ]
