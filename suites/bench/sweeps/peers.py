"""Peer sweeps: kvbench beside other implementations (vLLM, plug-ins) on identical work.

Every peer is a case parameter (`impl`), so kvbench's rows and a peer's rows sit in one
sweep; peers whose library is not installed here are left out of the grid with a logged
reason (their rows are absent, never faked). Ratios are paired measurements from one
process: a peer's case runs the peer and kvbench (and, for decode, SDPA on the same K/V)
alternately, repeat by repeat, and records the median of the per-repeat ratios, so load
from other processes hits both sides of a ratio alike.

* peers.pool_ops: block-pool operations per second on a fixed random admit / append /
  free sequence (suites.peers.workloads.pool_ops_sequence), pool never dry, prefix
  caching on. Metrics: time (s, median over fresh allocators), ops_per_s, hit_tokens,
  and for peers other than kvbench time_kvbench and ratio_vs_kvbench (peer time /
  kvbench time, paired; > 1 means the peer is slower).
* peers.trace_replay: an N-request trace (8 shared system prompts + unique suffixes, 64
  live requests, 1,024 blocks of 16 so cached prefixes get evicted) replayed through
  each allocator; time counts the allocator's calls only. N is 5,000 by default, and
  100,000 as well under --full. Metrics: time, requests_per_s, hit_tokens,
  capacity_retries, time_kvbench, ratio_vs_kvbench.
* peers.cpu_decode: one decode step on the CPU (also on a GPU machine), float32, 32
  query / 8 KV heads, head dim 128, every sequence at the full context, batch x context
  8 x 128 / 512 / 2048 / 4096 and 32 x 1024 by default (the CPU goal shapes among them),
  batch 8-32 x context 128-4096 under --full: kvbench's CPU path (kernels.ops), vLLM's
  native cpu_attention_with_kv_cache, and SDPA over contiguous K/V (impl "sdpa_contiguous").
  Paged peers run at the same block sizes (16 and 32: vLLM's CPU op supports 16 through
  its "vec16" ISA and picks "vec" at 32), so every comparison is like for like. Metrics:
  time, time_sdpa (SDPA on the same K/V, same case), ratio_vs_sdpa, time_kvbench and
  ratio_vs_kvbench (peers other than kvbench), kv_bandwidth (K and V bytes read per
  second), copy_peak_fraction (kv_bandwidth over a 64 MiB copy's bandwidth, bytes read
  plus written, the copy timed in the same repeats: copy_peak_paired), rel_diff_vs_sdpa
  (a peer that disagrees with SDPA beyond 1e-4 fails its case instead of being timed).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

import torch

from kvbench.reports.provenance import MEASURED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.harness import CopyProbe, TimingConfig, paired_fraction, summarize
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE
from kvbench.workloads.errors import KVBenchError

log = logging.getLogger(__name__)

#: The peer every ratio is taken against, and the contiguous decode baseline's impl name.
BASELINE = "kvbench"
SDPA = "sdpa_contiguous"
#: The 64 MiB copy timed beside every decode case (its name among the paired callables).
COPY = "copy"
#: Decode geometry (Llama-class GQA head layout).
NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128
DECODE_BLOCK_SIZES = (16, 32)
#: Paged decode must agree with SDPA on float32 to this relative difference to be timed.
DECODE_AGREEMENT = 1e-4

_reported: set[str] = set()


def _available(kind: str) -> list[tuple[str, str]]:
    """(peer name, version) of the peers with a `kind` adapter whose library is installed
    here (cheap probe, no import); the others are logged once per process."""
    from kvbench.suites.peers import registry

    names = registry.allocator_names() if kind == "allocator" else registry.attention_names()
    out = []
    for name in names:
        if not registry.is_timed(name):
            continue  # checked for correctness only (an interpreted kernel)
        why = registry.unavailable_reason(name)
        if why is None:
            out.append((name, registry.peer_version(name)))
        elif name not in _reported:
            _reported.add(name)
            log.warning("peer %s left out of the peer sweeps: %s", name, why)
    out.sort(key=lambda nv: nv[0] != BASELINE)  # the baseline first: peers divide by it
    return out


def _sides(impl: str) -> list[str]:
    """Who runs in a case: the impl, then kvbench when the impl is another peer."""
    return [impl] if impl == BASELINE else [impl, BASELINE]


def _paired_ratio(samples: dict[str, list[float]], a: str, b: str) -> float:
    """Median over repeats of a's time / b's time in the same repeat."""
    return statistics.median(x / y for x, y in zip(samples[a], samples[b], strict=True))


def _paired_times(
    fns: dict[str, Callable[[], object]], timing: TimingConfig
) -> dict[str, list[float]]:
    """Per-call seconds of each callable, timed alternately: every repeat times each of
    them once (in `inner` calls, calibrated per callable as time_cpu does) before the next
    repeat starts, in reversed order every other repeat. Returns {name: one sample per
    repeat}, so sample i of two callables were taken side by side."""
    clock = time.perf_counter
    inner = {}
    for name, fn in fns.items():
        for _ in range(timing.warmup):
            fn()
        t0 = clock()
        fn()
        once = max(clock() - t0, 1e-9)
        inner[name] = (
            max(1, min(10_000, int(timing.min_sample_s / once) + 1))
            if once < timing.min_sample_s
            else 1
        )
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(timing.repeats):
        for name in names if r % 2 == 0 else names[::-1]:  # alternate who goes first
            fn = fns[name]
            t0 = clock()
            for _ in range(inner[name]):
                fn()
            samples[name].append((clock() - t0) / inner[name])
    return samples


def _vs_kvbench(case: Case, samples: dict[str, list[float]]) -> list[Measurement]:
    if case["impl"] == BASELINE:
        return []
    return [
        Measurement("time_kvbench", statistics.median(samples[BASELINE]), "s",
                    summarize(samples[BASELINE])),
        Measurement("ratio_vs_kvbench", _paired_ratio(samples, case["impl"], BASELINE), "ratio"),
    ]  # fmt: skip


# ---------------------------------------------------------------- pool ops
def _pool_cases(full: bool) -> list[Case]:
    return [
        {
            "impl": name,
            "version": version,
            "ops": 100_000 if full else 20_000,
            "block_size": DEFAULT_BLOCK_SIZE,
            "num_blocks": 4096,
        }
        for name, version in _available("allocator")
    ]


def _ops(n: int, seed: int, ctx: BenchContext) -> list[tuple]:
    from kvbench.suites.peers.workloads import pool_ops_sequence

    key = ("peers.ops", n, seed)
    if ctx.cache.get("peers.ops_key") != key:  # keep one sequence in memory at a time
        ctx.cache["peers.ops_key"] = key
        ctx.cache["peers.ops"] = pool_ops_sequence(n, seed)
    return ctx.cache["peers.ops"]


@sweep(
    "peers.pool_ops",
    "block pool operations per second, kvbench beside vLLM (and plug-ins) on one random "
    "admit / append / free sequence; ratio_vs_kvbench = peer time / kvbench time, paired",
    _pool_cases,
    requires=("kvbench.paged.cache", "kvbench.suites.peers.base"),
    tags=("peers",),
    in_default=False,
    produced=(MEASURED,),
)
def pool_ops(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.suites.peers.registry import load_allocator
    from kvbench.suites.peers.workloads import run_ops

    ops = _ops(case["ops"], ctx.seed, ctx)
    sides = _sides(case["impl"])
    samples: dict[str, list[float]] = {n: [] for n in sides}
    hits: dict[str, set[int]] = {n: set() for n in sides}
    for r in range(max(1, min(ctx.timing.repeats, 5))):
        for name in sides if r % 2 == 0 else sides[::-1]:  # alternately, fresh allocators
            alloc = load_allocator(name, case["num_blocks"], case["block_size"])
            t0 = time.perf_counter()
            hits[name].add(run_ops(alloc, ops))
            samples[name].append(time.perf_counter() - t0)
    if len(hits[case["impl"]]) != 1:
        raise KVBenchError(f"{case['impl']}: prefix hits differ between repeats: {hits}")
    if len({h for hs in hits.values() for h in hs}) != 1:
        log.warning("peers.pool_ops: prefix hits differ between peers: %s", hits)
    stats = summarize(samples[case["impl"]])
    t = float(stats["median"])
    return [
        Measurement("time", t, "s", stats),
        Measurement("ops_per_s", case["ops"] / t, "ops/s"),
        Measurement("hit_tokens", hits[case["impl"]].pop(), "tokens"),
        *_vs_kvbench(case, samples),
    ]


# ---------------------------------------------------------------- trace replay
def _trace_cases(full: bool) -> list[Case]:
    sizes = (5_000, 100_000) if full else (5_000,)
    return [
        {
            "impl": name,
            "version": version,
            "requests": n,
            "window": 64,
            "block_size": DEFAULT_BLOCK_SIZE,
            "num_blocks": 1024,
        }
        for n in sizes
        for name, version in _available("allocator")
    ]


@sweep(
    "peers.trace_replay",
    "serving-trace replay time through each allocator (shared system prompts, 64 live "
    "requests, eviction); 100k requests under --full; ratio_vs_kvbench = peer / kvbench",
    _trace_cases,
    requires=("kvbench.paged.cache", "kvbench.suites.peers.base"),
    tags=("peers",),
    in_default=False,
    produced=(MEASURED,),
)
def trace_replay(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.suites.peers.registry import load_allocator
    from kvbench.suites.peers.workloads import iter_trace, replay

    n = case["requests"]
    sides = _sides(case["impl"])
    results: dict[str, list] = {name: [] for name in sides}
    for r in range(1 if n >= 20_000 else max(1, min(ctx.timing.repeats, 3))):
        for name in sides if r % 2 == 0 else sides[::-1]:  # alternately, fresh allocators
            alloc = load_allocator(name, case["num_blocks"], case["block_size"])
            results[name].append(replay(alloc, iter_trace(n, ctx.seed), window=case["window"]))
    mine = results[case["impl"]]
    if len({(r.hit_tokens, r.capacity_retries) for r in mine}) != 1:
        raise KVBenchError(f"{case['impl']}: replay is not deterministic: {mine}")
    samples = {name: [r.seconds for r in rs] for name, rs in results.items()}
    stats = summarize(samples[case["impl"]])
    t = float(stats["median"])
    return [
        Measurement("time", t, "s", stats),
        Measurement("requests_per_s", n / t, "requests/s"),
        Measurement("hit_tokens", mine[0].hit_tokens, "tokens"),
        Measurement("capacity_retries", mine[0].capacity_retries, "requests"),
        *_vs_kvbench(case, samples),
    ]


# ---------------------------------------------------------------- CPU decode
#: (batch, context) shapes of the default grid: the CPU goal shapes (8 x 4096 and 32 x 1024
#: for bandwidth, 8 x 128 for the fixed cost of a short step) and two in between.
DEFAULT_DECODE_SHAPES = ((8, 128), (8, 512), (8, 2048), (8, 4096), (32, 1024))


def _decode_cases(full: bool) -> list[Case]:
    shapes = (
        [(b, n) for b in (8, 16, 32) for n in (128, 512, 1024, 2048, 4096)]
        if full
        else list(DEFAULT_DECODE_SHAPES)
    )
    peers = _available("attention")
    common = {
        "dtype": "float32",
        "num_q_heads": NUM_Q_HEADS,
        "num_kv_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
    }
    out: list[Case] = []
    for b, length in shapes:
        out.append({"impl": SDPA, "batch": b, "context": length, **common})
        out += [
            {"impl": name, "version": version, "batch": b, "context": length, "block_size": bs,
             **common}
            for bs in DECODE_BLOCK_SIZES
            for name, version in peers
        ]  # fmt: skip
    return out


def _decode_inputs(case: Case, ctx: BenchContext):  # type: ignore[no-untyped-def]
    """(q, k, v, sdpa_fn, sdpa_out) for the case's batch and context, shared by every impl
    of that shape (one shape held at a time: the large ones take GiBs)."""
    from kvbench.suites.peers.workloads import decode_inputs, sdpa_decode_fn

    key = (case["batch"], case["context"], case["num_q_heads"], case["num_kv_heads"])
    held = ctx.cache.get("peers.decode_inputs")
    if held is None or held[0] != key:
        ctx.cache.pop("peers.decode_inputs", None)  # free the old shape first
        q, k, v = decode_inputs(
            case["batch"],
            case["context"],
            case["num_q_heads"],
            case["num_kv_heads"],
            case["head_dim"],
            seed=ctx.seed * 1_000_003 + case["batch"] * 7919 + case["context"],
        )
        sdpa = sdpa_decode_fn(q, k, v)
        held = (key, (q, k, v, sdpa, sdpa().reshape(q.shape).clone()))
        ctx.cache["peers.decode_inputs"] = held
    return held[1]


@sweep(
    "peers.cpu_decode",
    "CPU paged decode step: kvbench (kernels.ops, the in-place C++ kernel) vs vLLM's "
    "native op vs SDPA on contiguous K/V, same block sizes; ratio_vs_sdpa, ratio_vs_kvbench "
    "and copy_peak_fraction paired in the same case",
    _decode_cases,
    requires=("kvbench.kernels.ops", "kvbench.suites.peers.base"),
    tags=("peers",),
    in_default=False,
    produced=(MEASURED,),
)
def cpu_decode(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.suites.peers.base import PeerUnavailableError
    from kvbench.suites.peers.registry import load_attention
    from kvbench.suites.peers.workloads import paged_decode_fn, relative_difference

    q, k, v, sdpa, expect = _decode_inputs(case, ctx)  # CPU tensors, whatever ctx.device
    kv_bytes = 2 * k.numel() * k.element_size()
    copy = ctx.copy_probe(torch.device("cpu"))  # the decode peers run on the CPU
    if case["impl"] == SDPA:
        alone = _paired_times({SDPA: sdpa, COPY: copy}, ctx.timing)
        stats = summarize(alone[SDPA])
        t = float(stats["median"])
        return [
            Measurement("time", t, "s", stats),
            Measurement("kv_bandwidth", kv_bytes / t, "B/s"),
            *_copy_rows(alone, SDPA, kv_bytes, copy),
        ]
    fns: dict[str, Callable[[], object]] = {}
    diffs: dict[str, float] = {}
    bs = case["block_size"]
    for name in _sides(case["impl"]):
        adapter = load_attention(name)
        why = adapter.unsupported(q.dtype, bs, case["head_dim"], case["num_q_heads"], k.shape[2])
        if why is not None:
            raise PeerUnavailableError(f"{name} cannot run this case: {why}")
        fn = paged_decode_fn(adapter, q, k, v, bs, seed=ctx.seed + case["context"])
        diffs[name] = relative_difference(fn().reshape(q.shape), expect)
        if not diffs[name] <= DECODE_AGREEMENT:  # also catches NaN
            raise KVBenchError(
                f"{name} decode disagrees with SDPA: relative difference {diffs[name]:.3g} > "
                f"{DECODE_AGREEMENT} (batch {case['batch']}, context {case['context']}, "
                f"block {bs}); not timed"
            )
        fns[name] = fn
    fns[SDPA] = sdpa
    fns[COPY] = copy
    samples = _paired_times(fns, ctx.timing)
    stats, sdpa_stats = summarize(samples[case["impl"]]), summarize(samples[SDPA])
    t = float(stats["median"])
    return [
        Measurement("time", t, "s", stats),
        Measurement("time_sdpa", float(sdpa_stats["median"]), "s", sdpa_stats),
        Measurement("ratio_vs_sdpa", _paired_ratio(samples, case["impl"], SDPA), "ratio"),
        Measurement("kv_bandwidth", kv_bytes / t, "B/s"),
        Measurement("rel_diff_vs_sdpa", diffs[case["impl"]], "ratio"),
        Measurement("sdpa_form_is_gqa", float(getattr(sdpa, "form", "") == "gqa"), "bool"),
        *_copy_rows(samples, case["impl"], kv_bytes, copy),
        *_vs_kvbench(case, samples),
    ]


def _copy_rows(
    samples: dict[str, list[float]], impl: str, kv_bytes: int, copy: CopyProbe
) -> list[Measurement]:
    """The impl's K/V read bandwidth as a fraction of a 64 MiB copy timed in the same
    repeats (median of per-repeat fractions; the copy counts bytes read plus written), and
    the copy's own rows."""
    fraction = paired_fraction(samples[impl], samples[COPY], kv_bytes, copy.bytes_moved)
    return [Measurement("copy_peak_fraction", fraction, "fraction"), *copy.rows(samples[COPY])]
