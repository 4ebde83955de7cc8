"""Serving sweeps through the scheduler (`paged.serving.simulation.simulate`): seeded traces
replayed, memory-only, on the paged cache and the contiguous max-reservation cache with
the same KV budget, timed by the device profile's model (decode = bytes / bandwidth,
prefill = FLOPs / peak; see workloads.profiles).

* serving.batch: utilization, peak concurrency and modeled throughput against the batch
  size limit (max running sequences, 10 ... 200), Llama-2-70B with a 42 GB KV budget on
  the A100-80GB profile. The contiguous cache runs out of memory first.
* serving.block_size: block-size ablation under memory pressure (KV budget set so the
  batch limit of 256 does not bind), ShareGPT-like and Alpaca-like. This model prices
  memory only (fragmentation -> concurrency -> throughput); the kernel's block-size cost
  is on the kernel.decode page.
* serving.sample_preemption: parallel sampling under memory pressure, each n-sample
  request preempted whole (vLLM's sequence-group rule) or one sample at a time: what
  keeping a family's shared blocks shared through a swap is worth.
* serving.replay: how fast the engine itself replays: the issue's benchmark trace
  (ShareGPT-like, Llama-2-70B, [PA-deep-dive]'s 8,400 blocks of 16, prefix caching on,
  memory-only, event mode) at 10k requests, and 100k with --full (goal: 20 s on the
  2-core build machine). A token-stepping case replays the 10k trace both ways in one
  process: the event-mode speedup is a ratio that survives a noisy machine, and the case
  fails unless both modes decide identically.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbench.reports.provenance import COUNTED, MEASURED, MODELED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.harness import summarize
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE

if TYPE_CHECKING:
    from kvbench.workloads.trace import Trace

_TRACES: dict[tuple[str, int, int, str, int], Trace] = {}


def _trace(workload: str, requests: int, seed: int, sharing: str = "none", n: int = 4) -> Trace:
    """A generated trace, made once per process for every case that replays it (`sharing`
    and `n` as `generate` takes them, with its defaults)."""
    from kvbench.workloads.sharing import generate

    key = (workload, requests, seed, sharing, n)
    if key not in _TRACES:
        _TRACES[key] = generate(workload, requests, seed=seed, sharing=sharing, n=n)
    return _TRACES[key]


def _simulate(case: Case, ctx: BenchContext, budget: str, max_seqs: int) -> dict:
    from kvbench.paged.cache_spec import CacheSpec
    from kvbench.paged.serving.simulation import simulate
    from kvbench.paged.serving.time_model import SchedulerConfig

    trace = _trace(case["workload"], case["requests"], ctx.seed)
    spec = CacheSpec(
        kind=case["cache"],
        model="llama-2-70b",
        kv_budget=budget,
        block_size=case["block_size"],
        max_seq_len=2048,
    )
    result = simulate(
        trace,
        spec,
        profile=case["profile"],
        config=SchedulerConfig(max_num_seqs=max_seqs),
    )
    return result.summary()


def _metrics(s: dict) -> list[Measurement]:
    return [
        Measurement("utilization", s["utilization"], "fraction"),
        Measurement("peak_concurrency", s["peak_concurrency"], "requests"),
        Measurement("mean_running", s["mean_running"], "requests"),
        Measurement("tokens_per_second", s["tokens_per_second"], "tokens/s"),
        Measurement("tokens_per_step", s["tokens_per_step"], "tokens"),
        Measurement("modeled_seconds", s["modeled_seconds"], "s"),
        Measurement("preemptions", s["preemptions"], "count"),
        Measurement("simulation_wall_time", s["wall_seconds"], "s"),
    ]


def _batch_cases(full: bool) -> list[Case]:
    workloads = ("sharegpt", "alpaca") if full else ("sharegpt",)
    return [
        {
            "workload": w,
            "requests": 2000 if full else 500,
            "batch": b,
            "cache": c,
            "block_size": DEFAULT_BLOCK_SIZE,
            "profile": "a100-80gb",
            "kv_budget": "42GB",
        }
        for w in workloads
        for c in ("contiguous-max", "paged")
        for b in (10, 25, 50, 100, 150, 200)
    ]


@sweep(
    "serving.batch",
    "scheduler replay: utilization, peak concurrency and modeled throughput vs batch "
    "size, contiguous (max reservation) vs paged, same 42 GB KV budget",
    _batch_cases,
    requires=("kvbench.paged.serving.simulation",),
    tags=("serving",),
    produced=(
        COUNTED,
        MODELED,
    ),
)
def serving_batch(case: Case, ctx: BenchContext) -> list[Measurement]:
    return _metrics(_simulate(case, ctx, case["kv_budget"], case["batch"]))


#: KV budgets that make memory, not the 256-sequence limit, bind (see module docstring).
ABLATION_BUDGET = {"sharegpt": "20GB", "alpaca": "4GB"}


def _block_cases(full: bool) -> list[Case]:
    sizes = (1, 2, 4, 8, 16, 32, 64, 128, 256) if full else (8, 16, 32, 64, 128, 256)
    return [
        {
            "workload": w,
            "requests": 1000 if full else 400,
            "block_size": b,
            "cache": "paged",
            "profile": "a100-80gb",
            "kv_budget": ABLATION_BUDGET[w],
        }
        for w in ("sharegpt", "alpaca")
        for b in sizes
    ]


@sweep(
    "serving.block_size",
    "scheduler replay under memory pressure: utilization and modeled throughput vs "
    "block size (ShareGPT-like, Alpaca-like)",
    _block_cases,
    requires=("kvbench.paged.serving.simulation",),
    tags=("serving",),
    produced=(
        COUNTED,
        MODELED,
    ),
)
def serving_block_size(case: Case, ctx: BenchContext) -> list[Measurement]:
    return _metrics(_simulate(case, ctx, case["kv_budget"], 256))


# --------------------------------------------------------------------- sharing in the loop


def _sharing_cases(full: bool) -> list[Case]:
    workloads = ("sharegpt", "alpaca") if full else ("alpaca",)
    return [
        {"workload": w, "sharing": s, "width": k, "requests": 30 if full else 12}
        for w in workloads
        for s in ("parallel", "beam")
        for k in (2, 4, 6)
    ]


def _unshared(trace, width: int):  # type: ignore[no-untyped-def]
    """The same work without sharing: each request as `width` independent sequences."""
    from kvbench.workloads.trace import Trace, TraceRequest

    return Trace(
        tuple(
            TraceRequest(f"{r.id}.{k}", r.arrival, r.prompt_len, r.output_len)
            for r in trace.requests
            for k in range(width)
        )
    )


@sweep(
    "serving.sharing",
    "parallel sampling and beam search through the serving engine: time-averaged KV blocks "
    "held with forks (copy-on-write; beams pruned and forked every step) vs the same work "
    "as independent sequences; Llama-2-70B, 42 GB, no memory pressure, prefix caching off",
    _sharing_cases,
    requires=("kvbench.paged.serving.simulation", "kvbench.paged.serving.beams"),
    tags=("serving", "cow"),
    produced=(COUNTED,),
)
def serving_sharing(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.paged.cache_spec import CacheSpec
    from kvbench.paged.serving.simulation import simulate
    from kvbench.paged.serving.time_model import SchedulerConfig
    from kvbench.workloads.sharing import generate

    k = case["width"]
    option = {"n": k} if case["sharing"] == "parallel" else {"beam_width": k}
    trace = generate(
        case["workload"], case["requests"], seed=ctx.seed, sharing=case["sharing"], **option
    )
    spec = CacheSpec(kind="paged", model="llama-2-70b", kv_budget="42GB", prefix_caching=False)
    held = []
    for work in (trace, _unshared(trace, k)):
        result = simulate(work, spec, config=SchedulerConfig(max_num_seqs=256))
        if result.preemptions:
            raise RuntimeError(f"the case preempted ({result.preemptions}): it is not memory-free")
        rows = result.timeline
        held.append(sum(r.used_blocks * r.span for r in rows) / sum(r.span for r in rows))
    return [
        Measurement("saved_fraction", 1 - held[0] / held[1], "fraction"),
        Measurement("mean_blocks_shared", held[0], "blocks"),
        Measurement("mean_blocks_unshared", held[1], "blocks"),
    ]


def _sample_preemption_cases(full: bool) -> list[Case]:
    return [
        {
            "workload": "sharegpt",
            "requests": 1000 if full else 300,
            "n": n,
            "policy": policy,
            "sample_preemption": unit,
            "kv_budget": "4GB",
            "profile": "a100-80gb",
        }
        for n in ((2, 4, 8) if full else (2, 4))
        for policy in ("swap", "recompute")
        for unit in ("request", "sequence")
    ]


@sweep(
    "serving.sample_preemption",
    "parallel sampling under memory pressure: an n-sample request preempted whole (its "
    "running samples swapped as one group, shared blocks copied once, or all recomputed; "
    "vLLM's sequence-group rule) vs one sample at a time; Llama-2-70B, 4 GB KV budget",
    _sample_preemption_cases,
    requires=("kvbench.paged.serving.simulation",),
    tags=("serving", "cow"),
    produced=(
        COUNTED,
        MODELED,
    ),
)
def serving_sample_preemption(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.paged.cache_spec import CacheSpec
    from kvbench.paged.serving.simulation import simulate
    from kvbench.paged.serving.time_model import SchedulerConfig

    trace = _trace(case["workload"], case["requests"], ctx.seed, sharing="parallel", n=case["n"])
    spec = CacheSpec(kind="paged", model="llama-2-70b", kv_budget=case["kv_budget"])
    config = SchedulerConfig(preemption=case["policy"], sample_preemption=case["sample_preemption"])
    s = simulate(trace, spec, profile=case["profile"], config=config).summary()
    return [
        *_metrics(s),
        Measurement("swaps", s["swaps"], "count"),
        Measurement("recomputes", s["recomputes"], "count"),
    ]


# --------------------------------------------------------------------- engine speed

#: The replay benchmark's pool: [PA-deep-dive]'s 42 GB of Llama-2-70B, 8,400 blocks of 16.
REPLAY_BUDGET = "42GB"
#: Requests replayed both ways: the benchmark trace itself (it preempts), token stepping
#: costing ~4x the event mode's time.
TOKEN_COMPARE_REQUESTS = 10_000


#: Replays per serving.replay case: its wall and CPU times carry q1-q3 and n.
REPLAY_REPEATS = 3


def _replay_cases(full: bool) -> list[Case]:
    sizes = (10_000, 100_000) if full else (10_000,)
    base = {"workload": "sharegpt", "block_size": DEFAULT_BLOCK_SIZE, "kv_budget": REPLAY_BUDGET}
    return [{**base, "requests": n, "mode": "event"} for n in sizes] + [
        {**base, "requests": TOKEN_COMPARE_REQUESTS, "mode": "token"}
    ]


def _replay(case: Case, ctx: BenchContext, mode: str):  # type: ignore[no-untyped-def]
    from kvbench.paged.cache_spec import CacheSpec
    from kvbench.paged.serving.simulation import simulate
    from kvbench.paged.serving.time_model import SchedulerConfig

    trace = _trace(case["workload"], case["requests"], ctx.seed)
    spec = CacheSpec(
        kind="paged",
        model="llama-2-70b",
        kv_budget=case["kv_budget"],
        block_size=case["block_size"],
    )
    return simulate(trace, spec, config=SchedulerConfig(mode=mode))


def _decisions(result) -> tuple:  # type: ignore[no-untyped-def]
    """What the two modes must agree on (as the conformance property checks): every
    sequence's decisions and the run's modeled totals."""
    fields = ("utilization", "modeled_seconds", "steps", "peak_concurrency", "mean_running")
    return result.decisions(), tuple(getattr(result, f) for f in fields)


@sweep(
    "serving.replay",
    "engine speed: memory-only replay of ShareGPT-like requests (Llama-2-70B, 8,400 blocks "
    "of 16, prefix caching on, auto preemption); wall and CPU seconds, events per second; "
    "token-stepping cases also replay in event mode and report the speedup (the two must "
    "decide identically)",
    _replay_cases,
    requires=("kvbench.paged.serving.simulation",),
    tags=("serving", "engine"),
    produced=(MEASURED,),
)
def serving_replay(case: Case, ctx: BenchContext) -> list[Measurement]:
    runs = [_replay(case, ctx, case["mode"]) for _ in range(REPLAY_REPEATS)]
    walls = summarize([r.wall_seconds for r in runs])
    cpus = summarize([r.info["cpu_seconds"] for r in runs])
    result = min(runs, key=lambda r: abs(r.wall_seconds - walls["median"]))  # the median run
    wall, info = result.wall_seconds, result.info
    out = [
        Measurement("replay_wall_time", wall, "s", walls),
        Measurement("replay_cpu_time", info["cpu_seconds"], "s", cpus),
        Measurement("events", info["events"], "count"),
        Measurement("events_per_second", info["events"] / wall, "events/s"),
        Measurement("decode_tokens_per_second", result.generated_tokens / wall, "tokens/s"),
        Measurement("processed_step_fraction", result.processed_steps / result.steps, "fraction"),
        Measurement("utilization", result.utilization, "fraction"),
        Measurement("preemptions", result.preemptions, "count"),
    ]
    if case["mode"] == "token":
        event = _replay(case, ctx, "event")
        if _decisions(event) != _decisions(result):
            raise RuntimeError("event mode and token stepping decided differently on this trace")
        out.append(Measurement("event_mode_speedup", wall / event.wall_seconds, "x"))
    return out
