"""Peer benches: kvbench beside vLLM (and any plug-in) on identical work, ratios in one run.

    python -m suites.peers.bench [--quick] [--run-id ID] [--requests N]

Three measurements, each appended as result rows (reports.results.ResultWriter) to
out/results/<run-id>.jsonl as soon as it is taken:

* `peers.pool_ops` — allocator operations per second: a fixed random sequence of admit /
  append / free on a pool that never runs dry (metric "ops_per_s", plus "time").
* `peers.trace_replay` — replay of an N-request trace (default 100k) through each allocator:
  requests share one of 8 system prompts (64 tokens) plus a unique suffix; a window of 64
  live requests; each request is admitted, grows to its output length in block-sized
  appends, and is freed oldest-first; the pool is small enough that cached prefixes get
  evicted. Metrics "time" (s), "hit_tokens", and "ratio_vs_kvbench" for the others.
* `peers.cpu_decode` — one decode step on CPU (float32, 32 query / 8 KV heads, head dim
  128, block size 16 for kvbench and 32 for vLLM's "vec" ISA — each its native choice —
  uniform context), batch 8..32 x context 512..4096: kvbench `kernels.ops` torch path,
  vLLM's native `cpu_attention_with_kv_cache`, and SDPA on contiguous KV; "time" per
  implementation and "ratio_vs_sdpa" (time / SDPA time) from the same process.

Peers that are not importable are logged and left out (their rows are absent, never faked).
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections.abc import Callable, Hashable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from reports.results import ResultWriter
from suites.bench.harness import TimingConfig, time_cpu
from suites.peers.base import (
    AllocatorAdapter,
    PeerUnavailableError,
    allocator_names,
    attention_names,
    load_allocator,
    load_attention,
)
from workloads.errors import CapacityError

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- allocator workloads
def pool_ops_sequence(n_ops: int, seed: int = 0) -> list[tuple]:
    """A random admit / append / free sequence over at most 64 live requests (prompts from
    4 shared stems plus random suffixes, so some admissions hit the prefix cache)."""
    rng = np.random.default_rng(seed)
    stems = [list(rng.integers(0, 1000, size=48)) for _ in range(4)]
    ops: list[tuple] = []
    live: list[int] = []
    next_id = 0
    while len(ops) < n_ops:
        r = rng.random()
        if (r < 0.35 and len(live) < 64) or not live:
            stem = stems[int(rng.integers(0, 4))]
            suffix = list(rng.integers(0, 1000, size=int(rng.integers(1, 40))))
            ops.append(("admit", next_id, [int(t) for t in stem + suffix]))
            live.append(next_id)
            next_id += 1
        elif r < 0.8:
            rid = live[int(rng.integers(0, len(live)))]
            ops.append(("append", rid, [int(t) for t in rng.integers(0, 1000, size=8)]))
        else:
            rid = live.pop(int(rng.integers(0, len(live))))
            ops.append(("free", rid, None))
    return ops


def run_ops(alloc: AllocatorAdapter, ops: Sequence[tuple]) -> int:
    """Apply `ops`; returns prompt tokens served from the prefix cache."""
    hits = 0
    for kind, rid, tokens in ops:
        if kind == "admit":
            hits += alloc.admit(rid, tokens)
        elif kind == "append":
            alloc.append(rid, tokens)
        else:
            alloc.free(rid)
    return hits


def trace_requests(n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt, output_len) of n requests: one of 8 shared 64-token system prompts plus a
    unique 16..128-token suffix; outputs of 16..128 tokens."""
    rng = np.random.default_rng(seed)
    systems = [[int(t) for t in rng.integers(0, 32000, size=64)] for _ in range(8)]
    out = []
    for i in range(n):
        suffix_len = int(rng.integers(16, 129))
        suffix = [32000 + (i * 131 + j) % 1_000_000 for j in range(suffix_len)]
        out.append((systems[int(rng.integers(0, 8))] + suffix, int(rng.integers(16, 129))))
    return out


def replay(
    alloc: AllocatorAdapter,
    requests: Sequence[tuple[list[int], int]],
    window: int = 64,
    progress: Callable[[int], None] | None = None,
) -> tuple[int, int]:
    """Replay `requests` through `alloc` (see module docstring); returns (hit tokens,
    admissions retried after freeing the oldest request for room)."""
    bs = alloc.block_size
    live: list[Hashable] = []
    hits = 0
    retries = 0
    for i, (prompt, out_len) in enumerate(requests):
        while True:
            try:
                hits += alloc.admit(i, prompt)
                break
            except CapacityError:
                if not live:
                    raise
                alloc.free(live.pop(0))
                retries += 1
        live.append(i)
        done = 0
        base = 10_000_000 + i * 256
        while done < out_len:
            step = min(bs - (len(prompt) + done) % bs, out_len - done)
            toks = list(range(base + done, base + done + step))
            while True:
                try:
                    alloc.append(i, toks)
                    break
                except CapacityError:
                    if live[0] == i:
                        raise
                    alloc.free(live.pop(0))
                    retries += 1
            done += step
        if len(live) >= window:
            alloc.free(live.pop(0))
        if progress is not None and i % 1000 == 999:
            progress(1000)
    for rid in live:
        alloc.free(rid)
    return hits, retries


# ---------------------------------------------------------------- decode
def _decode_inputs(batch: int, ctx: int, hq: int, hkv: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(batch, ctx, hkv, d, generator=g)
    v = torch.randn(batch, ctx, hkv, d, generator=g)
    q = torch.randn(batch, hq, d, generator=g)
    return q, k, v


def _paged_fn(adapter, q, k, v, block_size: int, seed: int) -> Callable[[], torch.Tensor]:
    batch, ctx, hkv, d = k.shape
    per = -(-ctx // block_size)
    num_blocks = batch * per
    cache = adapter.make_cache(num_blocks, block_size, hkv, d, k.dtype)
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    tables = perm.view(batch, per).to(torch.int32)
    pos = torch.arange(ctx)
    for b in range(batch):
        slots = tables[b].long()[pos // block_size] * block_size + pos % block_size
        adapter.write(cache, k[b], v[b], slots)
    lens = torch.full((batch,), ctx, dtype=torch.int32)
    return adapter.decode_fn(cache, q, tables, lens, 1.0 / math.sqrt(d))


def _sdpa_fn(q, k, v) -> Callable[[], torch.Tensor]:
    batch, _ctx, hkv, d = k.shape
    hq = q.shape[1]
    kc = k.transpose(1, 2).contiguous()  # [B, Hkv, L, D]
    vc = v.transpose(1, 2).contiguous()
    qg = q.view(batch, hkv, hq // hkv, d)

    def run() -> torch.Tensor:
        return F.scaled_dot_product_attention(qg, kc, vc, scale=1.0 / math.sqrt(d))

    return run


def _peer(kind: str, name: str, *args):
    try:
        return load_allocator(name, *args) if kind == "allocator" else load_attention(name)
    except PeerUnavailableError as exc:
        log.warning("peer %s left out: %s", name, exc)
        return None


def bench_allocators(writer: ResultWriter, n_ops: int, n_requests: int) -> None:
    ops = pool_ops_sequence(n_ops)
    reqs = trace_requests(n_requests)
    replay_times: dict[str, float] = {}
    ops_times: dict[str, float] = {}
    for name in allocator_names():
        alloc = _peer("allocator", name, 4096, 16)
        if alloc is None:
            continue
        case = {"peer": name, "ops": n_ops, "block_size": 16, "num_blocks": 4096}
        start = time.perf_counter()
        hits = run_ops(alloc, ops)
        elapsed = time.perf_counter() - start
        ops_times[name] = elapsed
        writer.record("peers.pool_ops", case, "time", elapsed, "s")
        writer.record("peers.pool_ops", case, "ops_per_s", n_ops / elapsed, "ops/s")
        writer.record("peers.pool_ops", case, "hit_tokens", hits, "tokens")
        log.info("%s: %d pool ops in %.2f s (%.0f ops/s)", name, n_ops, elapsed, n_ops / elapsed)

        alloc = _peer("allocator", name, 1024, 16)
        assert alloc is not None
        case = {"peer": name, "requests": n_requests, "block_size": 16, "num_blocks": 1024}
        with tqdm(total=n_requests, desc=f"replay {name}", unit="req") as bar:
            start = time.perf_counter()
            hits, retries = replay(alloc, reqs, progress=bar.update)
            elapsed = time.perf_counter() - start
        replay_times[name] = elapsed
        writer.record("peers.trace_replay", case, "time", elapsed, "s")
        writer.record("peers.trace_replay", case, "hit_tokens", hits, "tokens")
        writer.record("peers.trace_replay", case, "capacity_retries", retries, "requests")
        log.info(
            "%s: replayed %d requests in %.1f s, %d hit tokens", name, n_requests, elapsed, hits
        )
    # time ratios (peer / kvbench) from this process: > 1 means the peer is slower
    for name, t in ops_times.items():
        if name != "kvbench" and "kvbench" in ops_times:
            case = {"peer": name, "ops": n_ops, "block_size": 16, "num_blocks": 4096}
            ratio = t / ops_times["kvbench"]
            writer.record("peers.pool_ops", case, "ratio_vs_kvbench", ratio, "ratio")
    for name, t in replay_times.items():
        if name != "kvbench" and "kvbench" in replay_times:
            case = {"peer": name, "requests": n_requests, "block_size": 16, "num_blocks": 1024}
            ratio = t / replay_times["kvbench"]
            writer.record("peers.trace_replay", case, "ratio_vs_kvbench", ratio, "ratio")


def bench_decode(
    writer: ResultWriter,
    batches: Sequence[int],
    contexts: Sequence[int],
    timing: TimingConfig,
    hq: int = 32,
    hkv: int = 8,
    d: int = 128,
) -> None:
    adapters = {n: a for n in attention_names() if (a := _peer("attention", n)) is not None}
    native_bs = {"kvbench": 16, "vllm": 32}
    for batch in batches:
        for ctx in contexts:
            q, k, v = _decode_inputs(batch, ctx, hq, hkv, d, seed=batch * 7919 + ctx)
            ref = _sdpa_fn(q, k, v)
            impls: dict[str, tuple[Callable[[], torch.Tensor], int]] = {"sdpa_contiguous": (ref, 0)}
            for name, adapter in adapters.items():
                bs = native_bs.get(name, 16)
                if adapter.unsupported(q.dtype, bs, d, hq, hkv) is None:
                    impls[name] = (_paged_fn(adapter, q, k, v, bs, seed=ctx), bs)
            expect = ref().reshape(batch, hq, d)
            times = {}
            for name, (fn, bs) in impls.items():
                got = fn().reshape(batch, hq, d)
                err = float((got - expect).norm() / expect.norm())
                if not err < 1e-4:
                    log.error(
                        "%s disagrees with SDPA at batch %d ctx %d: %.3g", name, batch, ctx, err
                    )
                    continue
                stats = time_cpu(fn, timing)
                times[name] = stats["median"]
                case = {
                    "impl": name, "batch": batch, "context": ctx, "block_size": bs,
                    "dtype": "float32", "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d,
                }  # fmt: skip
                writer.record("peers.cpu_decode", case, "time", stats["median"], "s", stats)
                kv_bytes = 2 * batch * ctx * hkv * d * 4
                writer.record(
                    "peers.cpu_decode", case, "kv_bandwidth", kv_bytes / stats["median"], "B/s"
                )
            for name, t in times.items():
                if name != "sdpa_contiguous" and "sdpa_contiguous" in times:
                    case = {"impl": name, "batch": batch, "context": ctx, "dtype": "float32",
                            "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d,
                            "block_size": impls[name][1]}  # fmt: skip
                    writer.record(
                        "peers.cpu_decode",
                        case,
                        "ratio_vs_sdpa",
                        t / times["sdpa_contiguous"],
                        "ratio",
                    )
            log.info(
                "decode batch %d ctx %d: %s",
                batch, ctx, ", ".join(f"{n} {t * 1e3:.2f} ms" for n, t in times.items()),
            )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suites.peers.bench", description=__doc__)
    parser.add_argument("--run-id", default=None, help="append to this run (default: new)")
    parser.add_argument("--requests", type=int, default=100_000, help="trace replay size")
    parser.add_argument("--ops", type=int, default=50_000, help="pool ops sequence length")
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    parser.add_argument("--skip-allocators", action="store_true")
    parser.add_argument("--skip-decode", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    batches, contexts = (8, 16, 32), (512, 1024, 2048, 4096)
    timing = TimingConfig(warmup=1, repeats=5)
    if args.quick:
        args.requests, args.ops = min(args.requests, 2000), min(args.ops, 5000)
        batches, contexts = (8,), (512,)
        timing = TimingConfig(warmup=1, repeats=3)
    with ResultWriter(args.run_id) as writer:
        log.info("writing %s", writer.path)
        if not args.skip_allocators:
            bench_allocators(writer, args.ops, args.requests)
        if not args.skip_decode:
            bench_decode(writer, batches, contexts, timing)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
