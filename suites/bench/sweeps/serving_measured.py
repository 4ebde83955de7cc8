"""serving.measured: a real model served through kvbench's caches and kernels, timed.

The engine's decisions drive real forward passes (`suites.e2e.serving_run`): a
random-weight Llama-architecture model built in code (4 layers, hidden 256, 8 query /
4 KV heads, ~3.6M parameters, float32) serves Alpaca-like requests, its attention
reading the engine's cache through kvbench's kernels (torch path on a CPU, Triton on a
GPU: `backend=None` lets `kernels.ops` choose by device). Paged and contiguous-max get
the same KV memory: 4,096 token slots, i.e. 8 contiguous reservations of the 512-token
maximum, so the contiguous cache hits its wall at batch 8 inside the batch grid while
paged grows to the batch limit.

Cases:
* batch (`batch` set): every request waits at t = 0, at most `batch` run at once
  ([PA-deep-dive]'s table shape): measured tokens/s;
* rate (`rate` set): Poisson arrivals; measured normalized latency, TTFT and tokens/s,
  beside the same trace modeled with the calibrated CPU profile;
* calibration (`calibration` set): fits the time model's CPU coefficients (fixed step
  cost, bandwidth, FLOP/s) to the steps of dedicated runs (paged, batches 1 / 6 / 24 and
  Poisson arrivals at 8 requests/s, other seeds), bounded by peaks measured in the same
  process (bandwidth <= a copy peak, FLOP/s <= an FMA peak: `suites.e2e.host_peaks`,
  the best of bursts before and after each fit run), each step priced at the host speed
  of its moment: an empty call (one token, no context) is timed between every two steps
  of every run (`PROBE_EVERY`), and a step's
  modeled time is scaled by the mean of its two bracketing empty calls over their
  median in the fit runs (`paged.serving.calibration.host_factor`: measured, paired,
  never fitted). Reports the coefficients, the peaks, the fit error, the measured empty
  call beside the model's price of it, and two diagnostics paired on the same steps: the
  fit without the bounds (`unbounded_*`, `step_error_mean_unbounded`) and the fit
  without the empty calls (every step at factor 1: `constant_*`,
  `step_error_mean_constant`, the definition before the empty calls); every batch and
  rate case then reports the fitted model's mean absolute per-step error on its own
  steps (held out: never fitted) and the tokens/s the model predicts for its steps.

Every number here is measured on this machine (device and backend in the run's
environment), except the `*_modeled` metrics, which are the calibrated model's.
"""

from __future__ import annotations

from typing import Any

from kvbench.reports.provenance import MEASURED, MODELED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.harness import summarize
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE

KV_SLOTS = 4096
MAX_SEQ_LEN = 512
BLOCK = DEFAULT_BLOCK_SIZE
BATCHES = (4, 8, 16, 32)
RATES = (12.0, 32.0)
#: Requests of every batch case (the same trace at every batch size and system).
BATCH_REQUESTS = {False: 32, True: 48}
FIT_BATCHES = (1, 6, 24)
#: A Poisson run in the fit set too (light-load, prefill-heavy steps), at this rate.
FIT_RATE = 8.0
SYSTEMS = ("paged", "contiguous-max")
#: Seconds of arrivals of a rate case.
DURATION = 4.0
#: An empty call after every PROBE_EVERY-th step (and before the first:
#: `ModelStep.probe_every`), so each step is bracketed by two, the host's speed measured
#: beside it (`paged.serving.calibration.host_factor`). Every step (1): a drift over a
#: few steps cancels; costs ~one empty call (~4-10 ms) per step, untimed by the engine.
PROBE_EVERY = 1


def _cases(full: bool) -> list[Case]:
    batches = (1, 2, 4, 8, 12, 16, 24, 32, 48) if full else BATCHES
    rates = (4.0, 8.0, 16.0, 24.0, 32.0, 48.0) if full else RATES
    out: list[Case] = [{"calibration": "cpu"}]
    n = BATCH_REQUESTS[full]
    out += [{"system": s, "batch": b, "requests": n} for s in SYSTEMS for b in batches]
    out += [{"system": s, "rate": r, "duration": DURATION} for s in SYSTEMS for r in rates]
    return out


def _setup(ctx: BenchContext) -> dict[str, Any]:
    """The model and its time model, built once per process."""
    if "measured_model" not in ctx.cache:
        from kvbench.paged.serving.time_model import TimeModel
        from kvbench.suites.e2e.serving_run import ServingModelSpec, build_model, param_count
        from kvbench.workloads.profiles import get_profile

        spec = ServingModelSpec()
        model = build_model(spec, ctx.device)
        params = param_count(model)
        tm = TimeModel(get_profile("cpu"), spec.geometry(), 4 * params, float(params), BLOCK)
        ctx.cache["measured_model"] = {"spec": spec, "model": model, "tm": tm}
    return ctx.cache["measured_model"]


def _trace(n: int, seed: int, rate: float | None = None, duration: float | None = None):  # type: ignore[no-untyped-def]
    from kvbench.paged.serving.rate import RateTrace
    from kvbench.workloads.sharing import generate

    base = generate("alpaca", n, seed=seed, max_total=MAX_SEQ_LEN)
    if rate is None:
        return base
    return RateTrace.make(base, seed).at(rate, duration)


def _run(ctx: BenchContext, system: str, trace, max_num_seqs: int, tm=None):  # type: ignore[no-untyped-def]
    """Serve `trace` with real forward passes; (result, step samples)."""
    from kvbench.paged.cache import PagedKVCache
    from kvbench.paged.serving.engine import Engine
    from kvbench.paged.serving.time_model import SchedulerConfig
    from kvbench.reference.contiguous import ContiguousKVCache
    from kvbench.suites.e2e.serving_run import ModelStep, cpu_threads

    env = _setup(ctx)
    geom = env["spec"].geometry()
    backend = "triton" if ctx.is_gpu else "torch"
    cache: PagedKVCache | ContiguousKVCache
    if system == "paged":
        cache = PagedKVCache(
            geom,
            KV_SLOTS // BLOCK,
            BLOCK,
            enable_prefix_caching=False,
            device=ctx.device,
            kernel_backend=backend,
        )
    else:
        cache = ContiguousKVCache(geom, KV_SLOTS, MAX_SEQ_LEN, "max", device=ctx.device)
    hook = ModelStep(env["model"], cache, backend, BLOCK, probe_every=PROBE_EVERY)
    cfg = SchedulerConfig(mode="token", max_num_seqs=max_num_seqs, preemption="recompute")
    with cpu_threads(torch_threads(ctx)):
        result = Engine(cache, cfg, tm or env["tm"], step_hook=hook).run(trace)
    return result, hook.samples


def torch_threads(ctx: BenchContext) -> int:
    """Intra-op threads of the measured runs: one on a CPU (see `cpu_threads`)."""
    import torch

    return torch.get_num_threads() if ctx.is_gpu else 1


def _work(samples):  # type: ignore[no-untyped-def]
    from kvbench.paged.serving.calibration import StepWork

    return [
        StepWork(s.decoders, s.kv_read, tuple(s.chunks), s.measured_s, s.empty_s) for s in samples
    ]


def _calibrated(ctx: BenchContext):  # type: ignore[no-untyped-def]
    """The fitted CPU profile's time model (fitting it on first use)."""
    if "measured_fit" not in ctx.cache:
        from kvbench.paged.serving.calibration import (
            fit_profile,
            with_profile,
            without_empty_calls,
        )

        env = _setup(ctx)
        steps = []
        _peak_burst(ctx)
        for b in FIT_BATCHES:
            _, samples = _run(ctx, "paged", _trace(2 * b, ctx.seed + 101), b)
            steps += _work(samples)
            _peak_burst(ctx)
        poisson = _trace(int(FIT_RATE * DURATION * 3), ctx.seed + 102, FIT_RATE, DURATION)
        steps += _work(_run(ctx, "paged", poisson, 256)[1])
        _peak_burst(ctx)
        ctx.cache["measured_fit_empty"] = [s.empty_s for s in steps if s.empty_s > 0]
        copy, fma = _peaks(ctx)
        fit = fit_profile(env["tm"], steps, max_bandwidth=copy.best, max_flops=fma.best)
        free = fit_profile(env["tm"], steps, "cpu-fit-unbounded")
        const = fit_profile(
            env["tm"],
            without_empty_calls(steps),
            "cpu-fit-constant",
            max_bandwidth=copy.best,
            max_flops=fma.best,
        )
        ctx.cache["measured_fit"] = (fit, with_profile(env["tm"], fit.profile))
        ctx.cache["measured_fit_unbounded"] = (free, with_profile(env["tm"], free.profile))
        ctx.cache["measured_fit_constant"] = (const, with_profile(env["tm"], const.profile))
    return ctx.cache["measured_fit"]


def _unbounded(ctx: BenchContext):  # type: ignore[no-untyped-def]
    """The same fit without the measured bounds (a diagnostic: what physicality costs,
    paired with the bounded fit on the same steps)."""
    _calibrated(ctx)
    return ctx.cache["measured_fit_unbounded"]


def _constant(ctx: BenchContext):  # type: ignore[no-untyped-def]
    """The same bounded fit without the empty calls (every step at host factor 1: the
    definition before them), a diagnostic paired with the fit on the same steps."""
    _calibrated(ctx)
    return ctx.cache["measured_fit_constant"]


def _peak_burst(ctx: BenchContext) -> None:
    """One burst of the copy and FMA probes (`suites.e2e.host_peaks`, 9 samples each),
    with the serving runs' thread count; none once the peaks are settled (`_peaks`)."""
    if "measured_peaks" in ctx.cache:
        return
    from kvbench.suites.e2e.host_peaks import copy_peak, fma_peak
    from kvbench.suites.e2e.serving_run import cpu_threads

    with cpu_threads(torch_threads(ctx)):
        burst = (copy_peak(ctx.device), fma_peak(ctx.device))
    ctx.cache.setdefault("peak_bursts", []).append(burst)


def _peaks(ctx: BenchContext):  # type: ignore[no-untyped-def]
    """This run's copy and FMA peaks, the bounds of the fitted bandwidth and FLOP/s: the
    best of the bursts measured before and after each fit run (`host_peaks.best_of`: on a
    shared host one burst of 9 copies caught 17.9 GB/s where another run's reached 33.5),
    settled at first use."""
    if "measured_peaks" not in ctx.cache:
        from kvbench.suites.e2e.host_peaks import best_of

        if not ctx.cache.get("peak_bursts"):
            _peak_burst(ctx)
        bursts = ctx.cache["peak_bursts"]
        ctx.cache["measured_peaks"] = (
            best_of([c for c, _ in bursts]),
            best_of([f for _, f in bursts]),
        )
    return ctx.cache["measured_peaks"]


def _llc_rows(ctx: BenchContext) -> list[Measurement]:
    """The last-level-cache copy peak (CPU only), shown beside the bound, not used as one:
    the steps' working set (16 MB of weights + up to 16 MiB of KV) is larger than what
    streams at that rate from an LLC other jobs share."""
    if ctx.is_gpu:
        return []
    from kvbench.suites.e2e.host_peaks import llc_bytes, llc_copy_peak
    from kvbench.suites.e2e.serving_run import cpu_threads

    with cpu_threads(torch_threads(ctx)):
        peak = llc_copy_peak(ctx.device)
    return [
        Measurement("llc_copy_peak_measured", peak.best, "B/s"),
        Measurement("llc_bytes", float(llc_bytes()), "B"),
    ]


def _empty_rows(ctx: BenchContext) -> list[Measurement]:
    """The fit steps' empty-call seconds (each the mean of the two calls that bracket it;
    median, q1-q3, n = steps), where timed, beside the fitted model's price of the empty
    call at that median speed (a check of the fixed term against a measurement)."""
    from kvbench.paged.serving.calibration import empty_call_seconds

    empty = ctx.cache.get("measured_fit_empty", [])
    if not empty:
        return []
    stats = summarize(empty)
    fit, tm = _calibrated(ctx)
    p = fit.profile
    modeled = empty_call_seconds(tm, p.step_overhead_s, p.hbm_bandwidth, p.peak_flops)
    return [
        Measurement("empty_call_median", float(stats["median"]), "s", stats),
        Measurement("empty_call_modeled", modeled, "s"),
    ]


def _model_check(ctx: BenchContext, samples) -> list[Measurement]:  # type: ignore[no-untyped-def]
    """The calibrated model on these (held-out) steps: per-step error, predicted tokens/s."""
    from kvbench.paged.serving.calibration import predict_seconds, step_errors

    fit, tm = _calibrated(ctx)
    work = _work(samples)
    err = step_errors(tm, work, fit.empty_ref)
    free, free_tm = _unbounded(ctx)
    err_free = step_errors(free_tm, work, free.empty_ref)
    err_const = step_errors(_constant(ctx)[1], work)
    p = tm.profile
    modeled = float(
        predict_seconds(
            tm, work, p.step_overhead_s, p.hbm_bandwidth, p.peak_flops, fit.empty_ref
        ).sum()
    )
    return [
        Measurement("step_error_mean", float(err.mean()), "fraction"),
        Measurement("step_error_p90", float(sorted(err)[int(0.9 * (len(err) - 1))]), "fraction"),
        Measurement("step_error_mean_unbounded", float(err_free.mean()), "fraction"),
        Measurement("step_error_mean_constant", float(err_const.mean()), "fraction"),
        Measurement("steps_timed", len(work), "count"),
        Measurement("model_seconds_modeled", modeled, "s"),
    ]


def _fit_rows(fit, prefix: str = "") -> list[Measurement]:  # type: ignore[no-untyped-def]
    """A fit's fit-set error and coefficients, metric names under `prefix`."""
    p = fit.profile
    return [
        Measurement(f"{prefix}fit_step_error_mean", fit.error, "fraction"),
        Measurement(f"{prefix}fitted_step_overhead", p.step_overhead_s, "s"),
        Measurement(f"{prefix}fitted_bandwidth", p.hbm_bandwidth, "B/s"),
        Measurement(f"{prefix}fitted_flops", p.peak_flops, "FLOP/s"),
    ]


@sweep(
    "serving.measured",
    "a random-weight Llama (4 layers, hidden 256, float32) served through kvbench's caches "
    "and kernels, every step a real forward pass timed on this machine: tokens/s vs batch "
    "size and latency vs Poisson rate, paged vs contiguous-max under one 4,096-slot KV "
    "budget; the time model's CPU coefficients fitted to separate runs and its per-step "
    "error on these (held out)",
    _cases,
    requires=(
        "transformers",
        "kvbench.suites.e2e.serving_run",
        "kvbench.paged.serving.calibration",
    ),
    tags=("serving", "measured"),
    produced=(
        MEASURED,
        MODELED,
    ),
)
def serving_measured(case: Case, ctx: BenchContext) -> list[Measurement]:
    if "calibration" in case:
        fit, _ = _calibrated(ctx)
        copy, fma = _peaks(ctx)
        p = fit.profile
        return [
            *_fit_rows(fit),
            Measurement("fit_steps", fit.steps, "count"),
            Measurement("copy_peak_measured", copy.best, "B/s"),
            Measurement("copy_peak_measured_median", copy.median, "B/s"),
            Measurement("fma_peak_measured", fma.best, "FLOP/s"),
            Measurement("fma_peak_measured_median", fma.median, "FLOP/s"),
            Measurement("fitted_bandwidth_of_copy_peak", p.hbm_bandwidth / copy.best, "fraction"),
            Measurement("fitted_flops_of_fma_peak", p.peak_flops / fma.best, "fraction"),
            *_empty_rows(ctx),
            *_llc_rows(ctx),
            *_fit_rows(_unbounded(ctx)[0], "unbounded_"),
            *_fit_rows(_constant(ctx)[0], "constant_"),
        ]
    system = case["system"]
    if "batch" in case:
        b = case["batch"]
        result, samples = _run(ctx, system, _trace(case["requests"], ctx.seed), b)
        checks = _model_check(ctx, samples)
        measured_s = sum(s.measured_s for s in samples)
        modeled_s = next(m.value for m in checks if m.metric == "model_seconds_modeled")
        gen = result.generated_tokens
        return [
            Measurement("tokens_per_second", gen / result.modeled_seconds, "tokens/s"),
            Measurement("tokens_per_second_modeled", gen / modeled_s, "tokens/s"),
            Measurement("peak_concurrency", result.peak_concurrency, "requests"),
            Measurement(  # the spread of the measured steps' times (n = steps)
                "mean_step_time",
                measured_s / len(samples),
                "s",
                summarize([s.measured_s for s in samples]),
            ),
            *checks,
        ]
    from kvbench.paged.cache_spec import CacheSpec
    from kvbench.paged.serving.latency import flat
    from kvbench.paged.serving.rate import served_throughput
    from kvbench.paged.serving.simulation import simulate

    trace = _trace(
        int(case["rate"] * case["duration"] * 3) + 8, ctx.seed, case["rate"], case["duration"]
    )
    result, samples = _run(ctx, system, trace, 256)
    m = {**flat(result.latency), **served_throughput(result)}
    _, tm = _calibrated(ctx)
    spec = CacheSpec(
        kind=system, geometry=tm.geometry, num_blocks=KV_SLOTS // BLOCK, block_size=BLOCK,
        max_seq_len=MAX_SEQ_LEN, prefix_caching=False,
    )  # fmt: skip
    from kvbench.paged.serving.time_model import SchedulerConfig

    modeled = simulate(
        trace,
        spec,
        config=SchedulerConfig(max_num_seqs=256, preemption="recompute"),
        time_model=tm,
    )
    mm = {**flat(modeled.latency), **served_throughput(modeled)}
    return [
        Measurement("normalized_latency", m["normalized_latency_mean"], "s/token"),
        Measurement("normalized_latency_p99", m["normalized_latency_p99"], "s/token"),
        Measurement("ttft_p50", m["ttft_p50"], "s"),
        Measurement("ttft_p99", m["ttft_p99"], "s"),
        Measurement("tokens_per_second", m["tokens_per_second"], "tokens/s"),
        Measurement("requests_per_second", m["requests_per_second"], "requests/s"),
        Measurement("normalized_latency_modeled", mm["normalized_latency_mean"], "s/token"),
        Measurement("tokens_per_second_modeled", mm["tokens_per_second"], "tokens/s"),
        Measurement("peak_concurrency", result.peak_concurrency, "requests"),
        *_model_check(ctx, samples),
    ]
