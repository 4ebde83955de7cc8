"""serving.vllm_engine's plumbing without vLLM: the traces it serves, kvbench's
prediction (decisions rebuilt into per-step work), a fake vLLM run timed by a known
machine (the fit must recover it: zero error on held-out steps, latencies equal), and
the skip with a reason where vLLM is absent. One test drives vLLM's real engine on a
tiny trace and skips without it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

pytest.importorskip("scipy")

from kvbench.paged.serving.calibration import StepWork, fit_profile, step_errors, with_profile
from kvbench.paged.serving.time_model import TimeModel
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.sweeps import serving_vllm_engine as sv
from kvbench.suites.e2e.vllm_engine_predict import (
    divergent_steps,
    latencies,
    predict,
    step_work,
)
from kvbench.suites.e2e.vllm_engine_run import VllmEngineSpec
from kvbench.workloads.errors import CaseSkipped, ConfigError
from kvbench.workloads.profiles import get_profile

SPEC = VllmEngineSpec()
SMALL = (0, 10, "alpaca", 64, 300, 0)


def _predict(trace, blocks: int = 24):  # type: ignore[no-untyped-def]
    return predict(
        trace, SPEC.geometry(), block_size=SPEC.block_size, usable_blocks=blocks,
        max_num_seqs=4, max_num_batched_tokens=128,
    )  # fmt: skip


def test_traces_are_vocab_ids_at_time_zero_with_shared_system_prompts() -> None:
    trace = sv.make_trace("t", 0, SMALL)
    assert len(trace.requests) == 10
    assert all(r.arrival == 0.0 and r.prompt is not None for r in trace.requests)
    assert max(max(r.prompt or ()) for r in trace.requests) < SPEC.vocab_size
    heads = {r.prompt[:64] for i, r in enumerate(trace.requests) if i % 3 and r.prompt}
    assert len(heads) == sv.SYSTEM_PROMPTS
    assert sv.make_trace("t", 0, SMALL) == trace  # seeded


def test_prefill_heavy_traces_cap_outputs_only_and_stay_apart_from_the_held_out() -> None:
    """An output cap changes the outputs (each the uncapped one, at most the cap) and
    nothing else; the fit traces' seeds are none of the held-out ones."""
    capped = sv.make_trace("t", 0, (*SMALL[:5], 4))
    plain = sv.make_trace("t", 0, SMALL)
    assert [r.prompt for r in capped.requests] == [r.prompt for r in plain.requests]
    assert [r.output_len for r in capped.requests] == [min(r.output_len, 4) for r in plain.requests]
    fit_seeds = {shape[0] for shape in (*sv.FIT.values(), sv.WARMUP[1])}
    assert not fit_seeds & {shape[0] for shape in sv.HELD_OUT.values()}


def test_prediction_replays_its_own_decisions_into_work() -> None:
    trace = sv.make_trace("t", 0, SMALL)
    pred = _predict(trace, blocks=12)  # tight: preemptions by recompute
    assert sum(len(p) for p in pred.preempted) > 0
    assert set(pred.last_step) == {str(r.id) for r in trace.requests}
    assert pred.prefix["hits"] > 0
    tokens = sum(sum(s.values()) for s in pred.scheduled)
    work = sum(w.decoders + sum(n for _, n in w.chunks) for w in pred.work)
    assert tokens == work
    for rid, k in pred.first_step.items():
        assert k <= pred.last_step[rid]
    assert divergent_steps(pred.scheduled, pred.scheduled) == 0
    assert divergent_steps(pred.scheduled, pred.scheduled[:-3]) == 3


def test_step_work_tells_decodes_from_chunks() -> None:
    w = step_work({"a": 1, "b": 1, "c": 40}, {"a": 10, "b": 3, "c": 0}, {"a": 10, "b": 8, "c": 50})
    assert w.decoders == 1 and w.kv_read == 11
    assert w.chunks == ((3, 1), (0, 40))


def test_fit_on_one_trace_prices_another_exactly_on_a_known_machine() -> None:
    """A fake vLLM timed by fixed 4 ms + max(bytes / 20 GB/s, FLOPs / 30 GFLOP/s): the
    fit on one trace's steps prices another trace's (held out) with ~0 error, and the
    latencies from those times equal the fake's."""
    params = 2_000_000
    tm = TimeModel(get_profile("cpu"), SPEC.geometry(), 4 * params, float(params), 32)
    machine = replace(tm.profile, hbm_bandwidth=20e9, peak_flops=30e9, step_overhead_s=4e-3)
    truth = with_profile(tm, machine)

    def timed(work: list[StepWork]) -> list[StepWork]:
        out = []
        for w in work:
            ps = truth.step_ps(w.decoders, w.kv_read, list(w.chunks))
            out.append(StepWork(w.decoders, w.kv_read, w.chunks, ps / 1e12))
        return out

    fit_trace, held = sv.make_trace("f", 1, SMALL), sv.make_trace("h", 2, SMALL)
    fit = fit_profile(tm, timed(_predict(fit_trace).work))
    assert fit.error < 1e-3
    pred = _predict(held)
    measured = timed(pred.work)
    assert step_errors(with_profile(tm, fit.profile), measured).mean() < 1e-3
    out_len = {str(r.id): r.output_len for r in held.requests}
    clock = np.cumsum([s.seconds for s in measured]).tolist()
    lat = latencies(pred.first_step, pred.last_step, clock, out_len)
    assert lat["ttft"].shape == (10,) and (lat["e2e"] >= lat["ttft"]).all()
    assert (lat["tpot"] > 0).all()


def test_spec_refuses_what_vllms_cpu_backend_refuses() -> None:
    with pytest.raises(ConfigError, match="multiple of 32"):
        VllmEngineSpec(block_size=16)
    with pytest.raises(ConfigError, match="max_model_len"):
        VllmEngineSpec(num_blocks=4)
    assert SPEC.kv_cache_bytes == 128 * 32 * SPEC.geometry().bytes_per_token


def test_the_sweep_skips_with_the_reason_where_vllm_is_absent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sv, "vllm_missing", lambda: "vllm is not installed (test)")
    ctx = BenchContext(torch.device("cpu"))
    for case in sv._cases(False):
        with pytest.raises(CaseSkipped, match="not installed"):
            sv.serving_vllm_engine(case, ctx)
    assert "vllm_server" not in ctx.cache


@pytest.mark.skipif(sv.vllm_missing() is not None, reason=str(sv.vllm_missing()))
def test_vllm_engine_makes_kvbench_decisions_on_a_tiny_trace() -> None:
    """vLLM's engine (~1 min to build on a loaded host) serves 6 requests; kvbench's
    vllm-v1 engine predicts every step and the prefix-cache counts exactly."""
    from kvbench.suites.e2e.serving_run import cpu_threads
    from kvbench.suites.e2e.vllm_engine_run import VllmServer

    spec = VllmEngineSpec(num_blocks=40, max_num_seqs=4, max_num_batched_tokens=128)
    trace = sv.make_trace("tiny", 0, (0, 6, "alpaca", 64, 300, 0))
    with cpu_threads(1):
        server = VllmServer(spec)
        try:
            run = server.serve(trace)
        finally:
            server.close()
    pred = predict(
        trace, spec.geometry(), block_size=32, usable_blocks=server.num_blocks - 1,
        max_num_seqs=4, max_num_batched_tokens=128,
    )  # fmt: skip
    assert divergent_steps(pred.scheduled, [s.scheduled for s in run.steps]) == 0
    assert pred.prefix == run.prefix and run.prefix["hits"] > 0
    assert pred.first_step == run.first_step and pred.last_step == run.last_step
    assert all(s.seconds > 0 for s in run.steps)


def test_fit_recovers_a_per_sequence_cost_with_host_speed_on_the_host_terms() -> None:
    """Synthetic steps of a machine with fixed 5 ms, 0.2 ms per sequence, 10 GB/s and
    25 GFLOP/s, the host terms slowed by a known factor per step: the 4-coefficient fit
    with the factor on the host terms finds it (error ~0); the whole-step factor and the
    3-coefficient fit do worse on the same steps."""
    from kvbench.paged.serving.calibration import predict_seconds, sequences

    params = 1_500_000
    tm = TimeModel(get_profile("cpu"), SPEC.geometry(), 8_000_000, float(params), 32)
    rng = np.random.default_rng(0)
    steps = []
    for i in range(300):
        d = int(rng.integers(0, 16))
        chunks = tuple((0, int(rng.integers(16, 500))) for _ in range(int(rng.integers(0, 3))))
        if not d and not chunks:
            d = 1
        steps.append(
            StepWork(d, d * int(rng.integers(20, 600)), chunks, 1.0, 1.0 + 0.4 * (i % 5) / 4)
        )
    truth = predict_seconds(tm, steps, 5e-3, 10e9, 25e9, 1.2, 2e-4, host_on_overhead=True)
    steps = [replace(s, seconds=float(t)) for s, t in zip(steps, truth, strict=True)]
    best = fit_profile(tm, steps, per_sequence=True, host_on_overhead=True)
    assert best.error < 0.01
    assert best.seq_overhead_s == pytest.approx(2e-4, rel=0.05)
    assert best.profile.peak_flops == pytest.approx(25e9, rel=0.05)
    err = step_errors(
        with_profile(tm, best.profile), steps, best.empty_ref, best.seq_overhead_s, True
    )
    assert err.mean() < 0.01
    assert fit_profile(tm, steps).error > best.error
    assert fit_profile(tm, steps, per_sequence=True).error > best.error
    assert sequences(steps).sum() == sum(s.decoders + len(s.chunks) for s in steps)


def _steps(n: int, chunk_every: int, seed: int = 0) -> list[StepWork]:
    """n synthetic steps (0-15 decoders over 20-600 KV tokens each), a 16-500-token prefill
    chunk in every `chunk_every`-th step (none where 0), host speed 1.0-1.4 in turn."""
    rng = np.random.default_rng(seed)
    steps = []
    for i in range(n):
        d = int(rng.integers(1, 16))
        chunks: tuple[tuple[int, int], ...] = ()
        if chunk_every and i % chunk_every == 0:
            chunks = ((int(rng.integers(0, 3)) * 32, int(rng.integers(16, 500))),)
        kv = d * int(rng.integers(20, 600))
        steps.append(StepWork(d, kv, chunks, 1.0, 1.0 + 0.4 * (i % 5) / 4))
    return steps


def _timed(tm: TimeModel, steps: list[StepWork], prefill: float) -> list[StepWork]:
    """`steps` timed by a machine of fixed 5 ms, 0.2 ms per sequence, `prefill` seconds
    per step with a chunk, 10 GB/s, 25 GFLOP/s, the host factor on the host terms."""
    from kvbench.paged.serving.calibration import predict_seconds

    truth = predict_seconds(
        tm, steps, 5e-3, 10e9, 25e9, 1.2, 2e-4, host_on_overhead=True, prefill=prefill
    )
    return [replace(s, seconds=float(t)) for s, t in zip(steps, truth, strict=True)]


def _tm() -> TimeModel:
    return TimeModel(get_profile("cpu"), SPEC.geometry(), 8_000_000, 1_500_000.0, 32)


def test_prefill_step_cost_is_a_host_term_on_steps_with_a_chunk_only() -> None:
    """By hand: the per-prefill-step cost adds h x cost to each step with a chunk (host
    factor on the host terms) and nothing to a decode-only step."""
    from kvbench.paged.serving.calibration import predict_seconds, prefill_steps

    tm = _tm()
    steps = [StepWork(4, 400, (), 1.0, 1.5), StepWork(2, 100, ((0, 64),), 1.0, 1.5)]
    args = (tm, steps, 5e-3, 10e9, 25e9, 1.0, 2e-4, True)
    diff = predict_seconds(*args, prefill=3e-3) - predict_seconds(*args)
    assert diff == pytest.approx([0.0, 1.5 * 3e-3])
    assert prefill_steps(steps).tolist() == [0.0, 1.0]


def test_fit_recovers_a_per_prefill_step_cost() -> None:
    """Synthetic steps of a machine whose steps with a prefill chunk cost 3 ms more: the
    fit with the per-prefill-step term finds the cost and the FLOP rate (error ~0, held
    out steps of another seed too); without it the FLOP rate is pulled down to pay the
    chunk steps and the error is larger."""
    tm = _tm()
    steps = _timed(tm, _steps(400, 4), 3e-3)
    best = fit_profile(tm, steps, per_sequence=True, host_on_overhead=True, prefill_step=True)
    assert best.error < 0.01
    assert best.prefill_step_s == pytest.approx(3e-3, rel=0.05)
    assert best.seq_overhead_s == pytest.approx(2e-4, rel=0.05)
    assert best.profile.peak_flops == pytest.approx(25e9, rel=0.05)
    assert "ms more for a step with a prefill chunk" in best.profile.note
    held = _timed(tm, _steps(200, 3, seed=1), 3e-3)
    err = step_errors(
        with_profile(tm, best.profile), held, best.empty_ref, best.seq_overhead_s, True,
        prefill=best.prefill_step_s,
    )  # fmt: skip
    assert err.mean() < 0.01
    plain = fit_profile(tm, steps, per_sequence=True, host_on_overhead=True)
    assert plain.prefill_step_s == 0.0 and plain.error > 3 * best.error
    assert plain.profile.peak_flops < best.profile.peak_flops


@pytest.mark.parametrize("chunk_every", [0, 1, 100])
def test_prefill_step_cost_not_fitted_without_both_kinds_of_step(chunk_every: int) -> None:
    """No step with a chunk (0), every step with one (1), or only 3 with one (100 of
    300): the cost cannot be told from the fixed cost or the FLOP rate, so it is not
    fitted (0), the fit equals the fit without the option and the note says why."""
    tm = _tm()
    steps = _timed(tm, _steps(300, chunk_every), 0.0)
    best = fit_profile(tm, steps, per_sequence=True, host_on_overhead=True, prefill_step=True)
    plain = fit_profile(tm, steps, per_sequence=True, host_on_overhead=True)
    assert best.prefill_step_s == 0.0
    assert best.error == plain.error and best.profile.peak_flops == plain.profile.peak_flops
    assert (
        "no per-prefill-step cost" in best.profile.note and "5 of each needed" in best.profile.note
    )


def test_prefill_step_cost_stays_small_where_the_machine_has_none() -> None:
    """Steps of a machine without the cost (chunks in every 4th step): the fit with the
    term still recovers the machine, the cost at most 1% of the fixed one (or 0)."""
    tm = _tm()
    steps = _timed(tm, _steps(300, 4), 0.0)
    best = fit_profile(tm, steps, per_sequence=True, host_on_overhead=True, prefill_step=True)
    assert best.error < 0.01
    assert best.prefill_step_s <= 0.01 * best.profile.step_overhead_s
    assert best.profile.peak_flops == pytest.approx(25e9, rel=0.05)


def test_fit_recovers_the_host_speeds_power_on_the_compute_term() -> None:
    """Synthetic steps whose memory / compute term slows as the host speed to the power
    0.5 (the host terms as the speed itself): the fit with `compute_exponent` finds 0.5
    and the FLOP rate (error ~1%, steps of another seed held out too); without it the
    error is 2x (2.0%); steps without a host probe leave it unfitted (0)."""
    from kvbench.paged.serving.calibration import predict_seconds

    tm = _tm()

    def timed(steps: list[StepWork]) -> list[StepWork]:
        truth = predict_seconds(
            tm, steps, 5e-3, 10e9, 25e9, 1.2, 2e-4, True, prefill=3e-3, compute_exponent=0.5
        )
        return [replace(s, seconds=float(t)) for s, t in zip(steps, truth, strict=True)]

    steps = timed(_steps(400, 4))
    kw = {"per_sequence": True, "host_on_overhead": True, "prefill_step": True}
    best = fit_profile(tm, steps, compute_exponent=True, **kw)  # type: ignore[arg-type]
    assert best.error < 0.01
    # 7 coefficients by Nelder-Mead: the exponent and the FLOP rate are found; the
    # bandwidth runs off (the memory term of these steps, <= 1.3 ms, goes to the fixed
    # cost: 5.7 ms, the per-sequence cost 0.15 ms, the chunk's 2.7 ms; 1% error left)
    assert best.compute_exponent == pytest.approx(0.5, abs=0.05)
    assert best.profile.peak_flops == pytest.approx(25e9, rel=0.05)
    assert best.prefill_step_s == pytest.approx(3e-3, rel=0.15)
    assert "host speed^0.5" in best.profile.note
    held = timed(_steps(200, 3, seed=1))
    err = step_errors(
        with_profile(tm, best.profile), held, best.empty_ref, best.seq_overhead_s, True,
        prefill=best.prefill_step_s, compute_exponent=best.compute_exponent,
    )  # fmt: skip
    assert err.mean() < 0.015
    assert fit_profile(tm, steps, **kw).error > 1.5 * best.error  # type: ignore[arg-type]
    unprobed = [replace(s, empty_s=0.0) for s in steps]
    assert fit_profile(tm, unprobed, compute_exponent=True, **kw).compute_exponent == 0.0  # type: ignore[arg-type]
