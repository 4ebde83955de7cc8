"""Serving a trace's own arrival stream on a serving set-up, with prefix caching (modeled).

`serve_trace` replays a trace as it arrived (every arrival divided by a time scale,
`workloads.time_scale`) through kvbench's PagedKVCache with prefix caching on a serving
set-up (`workloads.setups`: model, devices, tensor parallelism, KV memory); the engine's
time model of the set-up's GPUs prices every step, so every latency and rate here is
modeled, not measured. `serving_metrics` reads a run the way serving benchmarks report
it: TTFT, TPOT and end-to-end latency (mean, p50, p90, p99, s), goodput and SLO
attainment (`paged.serving.slo`), throughput, the prefix-cache hit rate (prefix-hit prompt tokens
/ prompt tokens) and the KV utilization (`SimulationResult.utilization`).

`timeline` cuts a run into windows of modeled time: per window the running and waiting
sequences, the KV memory in use and its utilization (each averaged over the window,
weighted by step time), and the prefix hit rate of the requests admitted in it. `slo_search` finds the
highest load (request rate, or time scale for a trace) whose p99 TTFT and p99 TPOT stay
within an SLO, by the same geometric bisection as the sustained rate (`paged.serving.rate`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from kvbench.paged.gc_pause import gc_paused
from kvbench.paged.serving.latency import flat
from kvbench.paged.serving.rate import served_throughput, sustained_rate
from kvbench.paged.serving.simulation import setup_spec, setup_time_model, simulate
from kvbench.paged.serving.slo import SLO, goodput, slo_margin
from kvbench.paged.serving.time_model import SchedulerConfig, SimulationResult
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import require_positive
from kvbench.workloads.setups import ServingSetup
from kvbench.workloads.time_scale import time_scaled
from kvbench.workloads.trace import Trace


def serve_trace(
    trace: Trace,
    setup: ServingSetup,
    *,
    time_scale: float = 1.0,
    block_size: int = DEFAULT_BLOCK_SIZE,
    config: SchedulerConfig | None = None,
    progress: Callable[[int], None] | None = None,
) -> SimulationResult:
    """Replay `trace` at `time_scale` on `setup`'s paged cache with prefix caching
    (preemption by the cost model, the engine's event mode unless `config` says
    otherwise; the set-up's scheduler policy, `ServingSetup.scheduler`, unless `config`
    is given). Under policy vllm-v1 the cache is vLLM v1's: no watermark (vLLM's
    default 0) and duplicate full blocks indexed. `result.info["kv_blocks"]` is the
    cache's block count."""
    config = config or SchedulerConfig(policy=setup.scheduler)
    v1 = config.policy == "vllm-v1"
    spec = setup_spec(
        setup,
        "paged",
        block_size,
        prefix_caching=True,
        **({"watermark": 0.0, "index_duplicates": True} if v1 else {}),
    )
    with gc_paused():  # a whole-trace replay holds millions of index entries
        result = simulate(
            time_scaled(trace, time_scale),
            spec,
            profile=setup.profile,
            config=replace(config, preemption="auto"),
            progress=progress,
            time_model=setup_time_model(setup, block_size),
        )
    result.info.update(
        setup=setup.name,
        time_scale=float(time_scale),
        kv_blocks=spec.blocks(),
        modeled=True,
        scheduler=config.policy,
    )
    return result


def prefix_hit_rate(result: SimulationResult) -> float:
    """Prompt tokens served from the prefix cache at first admission / prompt tokens, over
    the run's requests (an n-sample request's prompt counted once)."""
    prompt = hits = 0
    for rec in result.records:
        if rec.id != str(rec.request):  # a child sample shares its parent's prompt
            continue
        prompt += rec.prompt_len
        hits += rec.cached_tokens
    return hits / prompt if prompt else math.nan


def serving_metrics(result: SimulationResult, slo: SLO) -> dict[str, float]:
    """The run as flat columns: latency ("ttft_p99", ... s), "goodput" (requests/s),
    "slo_attainment" (fraction), "requests_per_second", "tokens_per_second",
    "prefix_hit_rate" and "utilization" (fractions), "peak_concurrency", "preemptions",
    "modeled_seconds" and the engine's "simulation_wall_time" (s, host)."""
    out = flat(result.latency)
    out.update(goodput(result.records, slo).as_dict())
    out.update(served_throughput(result))
    out.update(
        prefix_hit_rate=prefix_hit_rate(result),
        utilization=result.utilization,
        peak_concurrency=float(result.peak_concurrency),
        preemptions=float(result.preemptions),
        modeled_seconds=result.modeled_seconds,
        simulation_wall_time=result.wall_seconds,
    )
    return out


@dataclass(frozen=True)
class Window:
    """One window of a run's timeline (modeled seconds [start_s, start_s + width_s)).

    running, waiting: requests' sequences running / queued, averaged over the window's
        steps weighted by their modeled time;
    kv_used: KV blocks held / the cache's blocks, averaged the same way (fraction);
    utilization: live KV tokens / slots of the held blocks, the same way (fraction);
    prefix_hit_rate: prefix-hit prompt tokens / prompt tokens of the requests first
        admitted in the window (NaN when none was);
    admitted: requests first admitted in the window.
    """

    start_s: float
    width_s: float
    running: float
    waiting: float
    kv_used: float
    utilization: float
    prefix_hit_rate: float
    admitted: int


def step_starts(result: SimulationResult) -> np.ndarray:
    """Modeled start time (s) of each timeline row. A row starts where the one before it
    ended, except after the engine ran empty: it then waits for the next arrival, the
    earliest arrival among the requests first admitted in that row (with a concurrency
    cap, their join times; the cap holds nothing back while the engine is empty)."""
    rows = result.timeline
    first_arrival: dict[int, float] = {}
    for rec in result.records:
        if rec.admit_step >= 0:
            old = first_arrival.get(rec.admit_step, math.inf)
            first_arrival[rec.admit_step] = min(old, rec.arrival_s)
    out = np.empty(len(rows))
    now = 0.0
    empty = True
    for i, row in enumerate(rows):
        if empty:
            now = max(now, first_arrival.get(row.step, now))
        out[i] = now
        now += row.time_ps / 1e12
        empty = not (row.running or row.waiting or row.swapped)
    return out


def timeline(
    result: SimulationResult, windows: int = 60, width_s: float | None = None
) -> list[Window]:
    """The run in `windows` windows of modeled time (`Window`), each `width_s` seconds
    wide (default: the run's modeled time / windows). A timeline row is placed in the
    window where it starts (`step_starts`; a long quiet stretch is not split, and its
    block figures are those of its first step). A window in which no step runs is idle:
    no request running or waiting, no KV held, no utilization or hit rate (NaN)."""
    require_positive("windows", windows)
    rows = result.timeline
    blocks = result.info.get("kv_blocks") or max(
        (r.free_blocks + r.used_blocks for r in rows), default=1
    )
    dur = np.array([r.time_ps for r in rows], dtype=np.float64) / 1e12
    start = step_starts(result)
    if width_s is None:
        total = result.modeled_seconds
        width = total / windows if total > 0 else 1.0
    elif not (isinstance(width_s, (int, float)) and math.isfinite(width_s) and width_s > 0):
        raise ConfigError(f"window width must be a finite number of seconds > 0, got {width_s!r}")
    else:
        width = float(width_s)
    where = (start / width).astype(np.int64)
    keep = where < windows
    where, dur_in = where[keep], dur[keep]
    w = np.bincount(where, weights=dur_in, minlength=windows)

    def avg(values: list[float], idle: float) -> np.ndarray:
        v = np.asarray(values, dtype=np.float64)[keep]
        s = np.bincount(where, weights=dur_in * v, minlength=windows)
        mean: np.ndarray = np.divide(s, w, out=np.full(windows, idle), where=w > 0)
        return mean

    running = avg([r.running for r in rows], 0.0)
    waiting = avg([r.waiting for r in rows], 0.0)
    kv_used = avg([r.used_blocks / blocks for r in rows], 0.0)
    util = avg(
        [r.live_tokens / r.reserved_slots if r.reserved_slots else 1.0 for r in rows], math.nan
    )
    # admissions: a record's first admit step -> the start time of that step's row
    steps = np.array([r.step for r in rows], dtype=np.int64)
    prompt = np.zeros(windows)
    hits = np.zeros(windows)
    admitted = np.zeros(windows, dtype=np.int64)
    for rec in result.records:
        if rec.id != str(rec.request) or rec.admit_step < 0:
            continue
        i = max(int(np.searchsorted(steps, rec.admit_step, side="right")) - 1, 0)
        k = int(start[i] / width)
        if k >= windows:
            continue
        prompt[k] += rec.prompt_len
        hits[k] += rec.cached_tokens
        admitted[k] += 1
    hit = np.divide(hits, prompt, out=np.full(windows, np.nan), where=prompt > 0)
    return [
        Window(
            i * width,
            width,
            float(running[i]),
            float(waiting[i]),
            float(kv_used[i]),
            float(util[i]),
            float(hit[i]),
            int(admitted[i]),
        )
        for i in range(windows)
    ]


def slo_search(
    latency_at: Callable[[float], dict[str, dict[str, float]]],
    slo: SLO,
    start: float,
    *,
    limit: float = math.inf,
    rel_tol: float = 0.05,
    max_evals: int = 16,
) -> tuple[float, dict[float, float]]:
    """The highest load x (a request rate, or a trace's time scale) whose p99 TTFT and
    p99 TPOT (`latency_at(x)`: a latency summary, `paged.serving.latency.summarize`) are within
    `slo`: `paged.serving.rate.sustained_rate` on `slo_margin` with bound 1. Returns (x, the
    margin at every load tried); 0.0 when even start / 64 misses the SLO, `limit` when
    the SLO holds there. Assumes latency grows with the load."""
    if slo.ttft_s is None and slo.tpot_s is None:
        raise ConfigError("an SLO search needs a TTFT or a TPOT bound")
    return sustained_rate(
        lambda x: slo_margin(latency_at(x), slo),
        1.0,
        start,
        rel_tol=rel_tol,
        max_evals=max_evals,
        limit=limit,
    )
