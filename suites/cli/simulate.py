"""`kvbench simulate`: replay a workload through the serving engine and print a summary.

Examples:
    kvbench simulate --workload sharegpt --requests 1000 --model llama-2-70b \
        --kv-budget 42GB --block-size 16 --policy auto
    kvbench simulate --trace out/traces/sg.jsonl --cache paged,contiguous-max
    kvbench simulate --workload sharegpt --requests 1000 --cache all --out out/sim

Each cache kind (`--cache`, comma-separated, or `all`) runs the same trace; the table has
one row per kind, and a second table gives each kind's per-request latency (TTFT, time per
output token, end-to-end and normalized latency: mean, p50, p90, p99, modeled seconds). With `--out DIR` the trace that was replayed (`trace.jsonl`), one
summary line per kind (`summary.jsonl`), each kind's per-sequence records
(`records-<kind>.jsonl`: admission, first-token and finish steps, preemptions; arrival,
first-token and finish times and the sequence's ttft_s, tpot_s, e2e_s and
normalized_latency_s, in modeled seconds) and its
per-step metrics (`timeline-<kind>.jsonl`: running, decoding, waiting, swapped, free /
used / cached blocks, live tokens, reserved slots, modeled picoseconds; a row with
span > 1 stands for that many quiet steps) are written.

Load shapes (as `vllm bench serve` offers them): `--burstiness B` turns generated Poisson
arrivals (`--arrivals poisson:RATE`) into gamma arrivals of shape B at the same rate (1 is
Poisson, lower is burstier); `--time-scale S` divides every arrival, generated or read
with `--trace`, by S (2 replays twice as fast); `--max-concurrency N` lets at most N
requests be in flight (the rest wait outside; their latency counts from when they are
let in). With `--slo-ttft` / `--slo-tpot` (seconds) a third table gives each kind's
goodput (requests/s meeting both bounds, DistServe's definition as vLLM computes it)
and SLO attainment (the fraction that does; `paged.serving.slo`). Modeled, like every time here.

Overload: when the prompt tokens arriving per second (those the run had to compute, over
the span of the arrivals) exceed the most the set-up can prefill per second (modeled:
steps of --max-batched-tokens prompt tokens, no decoding), a warning line says so on
stderr and after the tables, and each summary row carries `arriving_prompt_tps`,
`prefill_capacity_tps` and `prefill_overloaded` (`paged.serving.overload`: how both are
computed). `--max-seq-len` bounds the contiguous caches only (the longest request they
take, and what contiguous-max reserves per request); the paged cache is bounded by its
pool, and every trace by its format's 2^24 tokens per prompt and output.

Layer-group models (`--model mistral-7b` or `gemma-2-9b`: sliding windows, hybrid) run
over the layer-group serving cache, optionally tensor parallel with `--tp N`
(`suites.cli.simulate_spec`, which also names what it refuses); `--tp` > 1 for the
full-attention presets is refused (their tensor-parallel set-ups: `kvbench rate --setup`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, replace
from pathlib import Path

from tqdm import tqdm

from kvbench.paged.cache_spec import CACHE_KINDS, CacheSpec
from kvbench.paged.serving.overload import prefill_load
from kvbench.paged.serving.rate import served_throughput
from kvbench.paged.serving.simulation import simulate, time_model_for
from kvbench.paged.serving.slo import SLO, goodput
from kvbench.paged.serving.time_model import SchedulerConfig, TimeModel
from kvbench.suites.cli.argtypes import (
    add_block_size_option,
    check_input_file,
    check_output_dir,
    float_range,
    int_range,
)
from kvbench.suites.cli.load_args import add_load_args, slo_from_args
from kvbench.suites.cli.simulate_tables import format_latency, format_table
from kvbench.suites.cli.workload import add_generator_args, trace_from_args
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.time_scale import MAX_TIME_SCALE, MIN_TIME_SCALE, time_scaled
from kvbench.workloads.trace import Trace
from kvbench.workloads.units import format_bytes

#: Bytes of host memory the memory-only paged cache keeps per block, device and CPU pool
#: together (reference counts, fill counts, free stacks; measured: about 104 bytes).
BOOKKEEPING_BYTES_PER_BLOCK = 128


def available_memory_bytes() -> int | None:
    """Memory this machine can still give a process (MemAvailable), or None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def spec_from_args(args: argparse.Namespace) -> CacheSpec:
    """The run's one cache spec; each simulated cache is it with its own `kind`."""
    return CacheSpec(
        model=args.model,
        kv_budget=args.kv_budget,
        block_size=args.block_size,
        max_seq_len=args.max_seq_len,
        watermark=args.watermark,
        prefix_caching=not args.no_prefix_caching,
    )


def validate_args(args: argparse.Namespace, kinds: tuple[str, ...], spec: CacheSpec) -> TimeModel:
    """Refuse, before anything is allocated or written, what the run could not do: an
    output folder that cannot be written, a trace file that is missing, an unknown model
    or profile, and a KV budget whose block bookkeeping would not fit in the memory this
    machine has free. Returns the run's time model (the spec's model on the profile)."""
    if args.out is not None:
        check_output_dir(args.out, "--out")
    if args.trace is not None:
        check_input_file(args.trace, "--trace")
    if args.mode not in ("event", "token"):
        raise ConfigError(f"unknown --mode {args.mode!r}; known: event, token")
    time_model = time_model_for(spec, args.profile)  # ConfigError names a bad model/profile
    blocks = spec.blocks()  # parses the budget: ConfigError names it
    if blocks < 1:
        raise ConfigError(
            f"KV budget {args.kv_budget!r} holds no block of {args.block_size} tokens of "
            f"{args.model}"
        )
    if any(k.startswith("paged") for k in kinds):
        need = blocks * BOOKKEEPING_BYTES_PER_BLOCK
        free = available_memory_bytes()
        if free is not None and need > free // 2:
            raise ConfigError(
                f"KV budget {args.kv_budget!r} is {blocks:,} blocks of {args.block_size} "
                f"tokens of {args.model}; simulating it needs about {format_bytes(need)} of "
                f"host memory, more than half of the {format_bytes(free)} free: use a smaller "
                "--kv-budget"
            )
    return time_model


def _kinds(text: str) -> tuple[str, ...]:
    """The cache kinds `--cache` names (ConfigError names an unknown one)."""
    kinds = CACHE_KINDS if text == "all" else tuple(k.strip() for k in text.split(","))
    for k in kinds:
        if k not in CACHE_KINDS:
            raise ConfigError(f"unknown cache kind {k!r}; known: {', '.join(CACHE_KINDS)}, all")
    return kinds


def _arrivals_with_burstiness(args: argparse.Namespace) -> None:
    """`--burstiness B` with `--arrivals poisson:RATE`: gamma arrivals of shape B at RATE
    (ConfigError for anything else)."""
    if args.burstiness is None:
        return
    if args.trace is not None:
        raise ConfigError("--burstiness shapes generated arrivals; a --trace has its own")
    parts = str(args.arrivals).strip().lower().split(":")
    if parts[0] != "poisson" or len(parts) != 2:
        raise ConfigError(
            f"--burstiness needs --arrivals poisson:RATE (got {args.arrivals!r}): it draws "
            "gamma gaps at that rate"
        )
    args.arrivals = f"gamma:{parts[1]}:{args.burstiness!r}"


def _slo_rows(rows: list[dict], slo: SLO) -> str:
    """A plain-text table of each cache's goodput and SLO attainment."""
    lines = [f"goodput, modeled (a good request meets {slo.describe()})"]
    for row in rows:
        lines.append(
            f"  {row['cache']:18s} goodput {row['goodput']:.3f} requests/s, SLO attainment "
            f"{row['slo_attainment']:.1%} ({row['good_requests']:.0f} of "
            f"{row['requests']:.0f} requests)"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from kvbench.suites.cli import simulate_spec

    if simulate_spec.is_spec_model(args.model):
        return _run_spec(args)
    if args.tp != 1:
        raise ConfigError(
            f"--tp {args.tp} with --model {args.model!r}: simulate runs tensor parallelism "
            "for the layer-group models (mistral-7b, gemma-2-9b) only; full-attention "
            "set-ups with tensor parallelism: kvbench rate --setup (--list)"
        )
    base = spec_from_args(args)
    time_model = validate_args(args, _kinds(args.cache), base)
    _arrivals_with_burstiness(args)
    slo = slo_from_args(args)
    trace = Trace.read(args.trace) if args.trace else trace_from_args(args)
    if args.time_scale is not None:
        trace = time_scaled(trace, args.time_scale, "--time-scale")
    kinds = _kinds(args.cache)
    if args.cache == "all" and any(r.beam_width > 1 for r in trace.requests):
        kinds = tuple(k for k in kinds if k.startswith("paged"))
        sys.stderr.write("beam search needs block sharing: simulating the paged caches only\n")
    config = SchedulerConfig(
        max_batched_tokens=args.max_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        chunked_prefill=not args.no_chunked_prefill,
        preemption=args.policy,
        max_preemptions=args.max_preemptions,
        batching=args.batching,
        static_batch_size=args.static_batch_size,
        mode=args.mode,
        sample_preemption=args.sample_preemption,
        max_concurrency=args.max_concurrency or 0,
    )
    out = Path(args.out) if args.out else None
    rows: list[dict] = []
    warnings: list[str] = []
    for kind in kinds:
        spec = replace(base, kind=kind)
        with tqdm(
            total=sum(r.n for r in trace.requests),
            desc=kind,
            unit="seq",
            disable=args.quiet or None,
            file=sys.stderr,
        ) as bar:
            result = simulate(
                trace,
                spec,
                config=config,
                profile=args.profile,
                progress=bar.update,
                time_model=time_model,
            )
        row = result.summary()
        if slo is not None:
            row.update(goodput(result.records, slo).as_dict())
            row.update(served_throughput(result))
        load = prefill_load(trace, result.records, time_model, args.max_batched_tokens)
        row.update(
            arriving_prompt_tps=load.arriving_tps if load else None,
            prefill_capacity_tps=load.capacity_tps if load else None,
            prefill_overloaded=bool(load and load.overloaded),
        )
        if load is not None and load.overloaded:
            warnings.append(f"warning: {kind}: {load.describe()}")
            sys.stderr.write(f"kvbench simulate: {warnings[-1]}\n")
        rows.append(row)
        if out is not None:
            if len(rows) == 1:  # created once a run has succeeded: a refused run writes nothing
                out.mkdir(parents=True, exist_ok=True)
                trace.write(out / "trace.jsonl")
            with (out / "summary.jsonl").open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")
            with (out / f"records-{kind}.jsonl").open("w", encoding="utf-8") as fh:
                for rec in result.records:
                    fh.write(json.dumps(rec.as_dict()) + "\n")
            with (out / f"timeline-{kind}.jsonl").open("w", encoding="utf-8") as fh:
                for step in result.timeline:
                    fh.write(json.dumps(asdict(step)) + "\n")
    sys.stdout.write(
        f"{len(trace)} requests, model {args.model}, KV budget {args.kv_budget}, block "
        f"{args.block_size}, policy {args.policy}, {args.batching} batching, profile "
        f"{args.profile}\n"
    )
    sys.stdout.write(format_table(rows) + "\n")
    sys.stdout.write(format_latency(rows) + "\n")
    if slo is not None:
        sys.stdout.write(_slo_rows(rows, slo) + "\n")
    for line in warnings:
        sys.stdout.write(line + "\n")
    return 0


def _run_spec(args: argparse.Namespace) -> int:
    """A layer-group model (`simulate_spec`): the same trace and scheduler arguments."""
    from kvbench.suites.cli import simulate_spec

    kinds = _kinds(args.cache)
    simulate_spec.check_spec_args(args, kinds)  # refuse before the trace is made
    if args.out is not None:
        raise ConfigError("--out is not written for layer-group models yet: drop --out")
    if args.mode not in ("event", "token"):
        raise ConfigError(f"unknown --mode {args.mode!r}; known: event, token")
    _arrivals_with_burstiness(args)
    if args.slo_ttft is not None or args.slo_tpot is not None:
        raise ConfigError(
            "--slo-ttft / --slo-tpot: goodput of layer-group models is not reported yet"
        )
    trace = Trace.read(args.trace) if args.trace else trace_from_args(args)
    if args.time_scale is not None:
        trace = time_scaled(trace, args.time_scale, "--time-scale")
    config = SchedulerConfig(
        max_batched_tokens=args.max_batched_tokens, max_num_seqs=args.max_num_seqs,
        chunked_prefill=not args.no_chunked_prefill, preemption=args.policy,
        max_preemptions=args.max_preemptions, batching=args.batching,
        static_batch_size=args.static_batch_size, mode=args.mode,
        sample_preemption=args.sample_preemption, max_concurrency=args.max_concurrency or 0,
    )  # fmt: skip
    return simulate_spec.run_spec(args, kinds, config, trace)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("simulate", help="replay a workload through the serving engine")
    add_generator_args(p)
    p.add_argument("--trace", default=None, help="replay this trace file instead of generating")
    p.add_argument("--cache", default="paged", help=f"{', '.join(CACHE_KINDS)}, or all")
    p.add_argument("--model", default="llama-2-70b")
    p.add_argument(
        "--tp",
        type=int_range(1, 64),
        default=1,
        help="tensor-parallel ranks (layer-group models: mistral-7b, gemma-2-9b)",
    )
    p.add_argument("--kv-budget", default="42GB")
    add_block_size_option(p)
    p.add_argument(
        "--max-seq-len",
        type=int_range(1, 1 << 24),
        default=2048,
        help="longest request (prompt + output tokens) the contiguous caches take; "
        "contiguous-max reserves this many slots for every request. It does not bound the "
        "paged cache: a paged request is bounded by the pool (and a trace's 2^24 tokens)",
    )
    p.add_argument("--watermark", type=float_range(0.0, 1.0, hi_open=True), default=0.01)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--policy", default="auto", help="preemption: swap | recompute | auto")
    p.add_argument("--profile", default="a100-80gb", help="device profile for modeled time")
    p.add_argument("--batching", default="continuous", help="continuous | static")
    p.add_argument("--static-batch-size", type=int_range(0, 1 << 20), default=0)
    p.add_argument("--max-batched-tokens", type=int_range(1, 1 << 24), default=4096)
    p.add_argument("--max-num-seqs", type=int_range(1, 1 << 20), default=256)
    p.add_argument("--max-preemptions", type=int_range(1, 1 << 20), default=8)
    p.add_argument(
        "--sample-preemption",
        default="request",
        help="request (an n-sample request's running samples go together) | sequence",
    )
    p.add_argument("--no-chunked-prefill", action="store_true")
    add_load_args(p, "with --arrivals poisson:RATE: gamma gaps of this shape (1 = Poisson)")
    p.add_argument(
        "--time-scale",
        type=float_range(MIN_TIME_SCALE, MAX_TIME_SCALE),
        default=None,
        help="divide every arrival by this (2 = twice as fast; in [1e-6, 1e6], and every "
        "arrival after it within 2^22 s)",
    )
    p.add_argument("--mode", default="event", help="event | token")
    p.add_argument("--out", default=None, help="folder for trace, summaries and records")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
