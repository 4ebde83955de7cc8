"""The step-time model, serving set-ups, latency metrics and the rate search (issue 15).

* `decode_span_ps` equals the sum of `step_ps` over the span, exactly, on memory-bound,
  compute-bound and tensor-parallel models (the event engine relies on it);
* event mode and token stepping agree on decisions, modeled time and every request's
  latency with Poisson arrivals on a compute-bound model (the max switching sides);
* tensor parallelism divides weights and adds all-reduces; the paper's set-ups give its
  slot counts; latency metrics match a hand computation; bad rates and bounds are refused.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from kvbench.paged.cache_spec import CacheSpec
from kvbench.paged.serving.rate import (
    RateTrace,
    check_bound,
    check_rate,
    check_system,
    sustained_rate,
)
from kvbench.paged.serving.simulation import setup_time_model, simulate
from kvbench.paged.serving.time_model import SchedulerConfig, TimeModel
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.profiles import DeviceProfile, get_profile
from kvbench.workloads.setups import SETUPS, ServingSetup, get_setup
from kvbench.workloads.trace import Trace, TraceRequest

GEOM = KVGeometry(2, 2, 4, "float32", 4)
#: A device so slow at compute that steps of a few sequences are compute-bound.
SLOW = DeviceProfile("slow", 2e12, 2e12, 25e9, step_overhead_s=1e-4, allreduce_latency_s=1e-6)
MODELS = [
    TimeModel(get_profile("a100-80gb"), GEOM, weight_bytes=10**9, params=5e8, block_size=4),
    TimeModel(SLOW, GEOM, weight_bytes=10**9, params=5e8, block_size=4),
    TimeModel(SLOW, GEOM, weight_bytes=10**9, params=5e8, block_size=4, tp=4, hidden_size=64),
]


@pytest.mark.parametrize("tm", MODELS, ids=["a100", "compute-bound", "tp4"])
def test_decode_span_is_the_sum_of_its_steps(tm: TimeModel) -> None:
    rng = random.Random(0)
    for _ in range(300):
        d, kv0, k = rng.randint(1, 400), rng.randint(0, 10**6), rng.randint(0, 60)
        want = sum(tm.step_ps(d, kv0 + d * j) for j in range(k))
        assert tm.decode_span_ps(d, kv0, k) == want


@pytest.mark.parametrize("q_heads", [2, 16], ids=["memory-overtakes", "compute-overtakes"])
def test_decode_span_across_the_crossover(q_heads: int) -> None:
    """Spans that start on one side of max(memory, compute) and end on the other (KV
    grows memory by kv_ps and compute by attn_ps per token: which overtakes depends on
    the query heads per KV head)."""
    geom = KVGeometry(4, 2, 64, "float16", q_heads)
    dev = DeviceProfile("x", 1e12, 4e12, 25e9, step_overhead_s=1e-4)
    tm = TimeModel(dev, geom, weight_bytes=10**8, params=5e7)
    slope = tm.kv_ps_per_token - tm.attn_ps_per_kv_token
    crossed = 0
    for d in (1, 3, 8, 17, 40):
        gap = tm.weight_ps - tm.dense_ps_per_token * d  # memory - compute at kv = 0
        if gap * slope >= 0:
            continue  # one side wins at every KV length
        root = -gap // slope  # KV where the two sides meet
        for kv0 in range(max(0, root - 30 * d), root + 3 * d, max(1, d // 2)):
            want = sum(tm.step_ps(d, kv0 + d * j) for j in range(25))
            assert tm.decode_span_ps(d, kv0, 25) == want, (d, kv0)
            crossed += 1
    assert crossed > 20


def test_the_max_switches_sides() -> None:
    tm = MODELS[1]
    small, big = tm.step_ps(1, 10), tm.step_ps(2000, 10)
    # one sequence: memory-bound (weights); 2,000: compute-bound (2 P per token)
    assert small == tm.fixed_ps + tm.weight_ps + tm.kv_ps_per_token * 10
    assert big == tm.fixed_ps + tm.dense_ps_per_token * 2000 + tm.attn_ps_per_kv_token * 10


def test_tensor_parallelism_divides_and_adds_allreduce() -> None:
    one = TimeModel(SLOW, GEOM, weight_bytes=10**9, params=5e8, hidden_size=64)
    four = TimeModel(SLOW, GEOM, weight_bytes=10**9, params=5e8, tp=4, hidden_size=64)
    assert four.weight_ps == pytest.approx(one.weight_ps / 4, abs=1)
    assert four.dense_ps_per_token == pytest.approx(one.dense_ps_per_token / 4, abs=1)
    assert one.allreduce_fixed_ps == one.allreduce_ps_per_token == 0
    # two all-reduces per layer: latency, and 2 (tp - 1) / tp of 64 fp16 values per token
    assert four.allreduce_fixed_ps == round(2 * 2 * 1e-6 * 1e12)
    assert four.allreduce_ps_per_token == round(2 * 2 * 64 * 2 * 1.5 / 300e9 * 1e12)
    with pytest.raises(ConfigError, match="tp"):
        TimeModel(SLOW, GEOM, weight_bytes=1, params=1.0, tp=0)


def _arrival_trace(n: int, seed: int) -> Trace:
    rng = np.random.default_rng(seed)
    t, reqs = 0.0, []
    for i in range(n):
        t += float(rng.exponential(0.002)) if i % 7 else 0.05  # idle gaps too
        reqs.append(TraceRequest(i, t, int(rng.integers(1, 40)), int(rng.integers(1, 30))))
    return Trace(tuple(reqs))


@pytest.mark.parametrize("kind", ["paged", "contiguous-max", "contiguous-pow2"])
@pytest.mark.parametrize("tm", MODELS, ids=["a100", "compute-bound", "tp4"])
def test_event_and_token_modes_agree_on_latency(kind: str, tm: TimeModel) -> None:
    trace = _arrival_trace(40, 1)
    spec = CacheSpec(kind=kind, geometry=GEOM, num_blocks=40, block_size=4, max_seq_len=80)
    runs = [
        simulate(trace, spec, config=SchedulerConfig(mode=m), time_model=tm)
        for m in ("event", "token")
    ]
    assert runs[0].decisions() == runs[1].decisions()
    assert runs[0].modeled_seconds == runs[1].modeled_seconds
    times = [sorted(rec.times() for rec in r.records) for r in runs]
    assert times[0] == times[1]
    arrival, first, finish = (np.array([t[i] for t in times[0]]) for i in (1, 2, 3))
    assert (first > arrival).all() and (finish >= first).all()
    assert finish.max() == pytest.approx(runs[0].modeled_seconds, rel=1e-12)


def test_request_times_follow_the_clock_by_hand() -> None:
    """One request arriving at 1 s into an idle engine: its first token comes one
    prefill step after its arrival, its finish one decode step per further token."""
    tm = MODELS[0]
    trace = Trace((TraceRequest("a", 1.0, 8, 3),))
    spec = CacheSpec(kind="paged", geometry=GEOM, num_blocks=40, block_size=4)
    result = simulate(trace, spec, config=SchedulerConfig(mode="token"), time_model=tm)
    (rec,) = result.records
    first, finish = [rec.first_token_s], [rec.finish_s]
    prefill = tm.step_ps(0, 0, [(0, 8)])
    decodes = tm.step_ps(1, 9) + tm.step_ps(1, 10)
    assert first[0] == pytest.approx(1.0 + prefill / 1e12, rel=1e-12)
    assert finish[0] == pytest.approx(1.0 + (prefill + decodes) / 1e12, rel=1e-12)


def test_setups_give_the_papers_slots() -> None:
    slots = {name: s.kv_slots() for name, s in SETUPS.items()}
    assert slots["opt-13b-1xa100-40gb"] == 15_728  # "15.7K"
    assert slots["opt-66b-4xa100-40gb"] == 9_557  # quoted 9.7K (module docstring)
    assert slots["opt-175b-8xa100-80gb"] == 60_074  # "60.1K"
    assert slots["llama-2-70b-a100-80gb"] == 134_400  # [PA-deep-dive]: 8,400 blocks of 16
    for s in SETUPS.values():
        s.check_fits()
    tm = setup_time_model(get_setup("opt-66b-4xa100-40gb"))
    assert tm.tp == 4 and tm.allreduce_ps_per_token > 0
    too_big = ServingSetup("x", "opt-66b", "a100-40gb", 1, "21GiB", 2048, "test")
    with pytest.raises(ConfigError, match="exceed"):
        too_big.check_fits()
    with pytest.raises(ConfigError, match="unknown serving set-up 'nope'"):
        get_setup("nope")


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, "2", True])
def test_bad_rates_and_bounds_are_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="request rate"):
        check_rate(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="latency bound"):
        check_bound(bad)  # type: ignore[arg-type]


def test_unknown_system_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown system 'orca'"):
        check_system("orca")


def test_rate_trace_scales_one_draw() -> None:
    base = Trace(tuple(TraceRequest(i, 0.0, 4, 2) for i in range(50)))
    rt = RateTrace.make(base, 0)
    a, b = rt.at(2.0), rt.at(4.0)
    for x, y in zip(a.requests, b.requests, strict=True):
        assert x.arrival == pytest.approx(2 * y.arrival)
    short = rt.at(2.0, duration=5.0)
    assert short.requests[-1].arrival <= 5.0 < rt.at(2.0).requests[len(short.requests)].arrival
    with pytest.raises(ConfigError, match="make more requests"):
        rt.at(2.0, duration=1e6)


def test_sustained_rate_finds_the_knee() -> None:
    knee = 3.7
    rate, _seen = sustained_rate(lambda r: 0.01 if r <= knee else 1.0, 0.1, 1.0, rel_tol=0.01)
    assert knee / 1.01 <= rate <= knee
    assert sustained_rate(lambda r: 1.0, 0.1, 1.0)[0] == 0.0
    capped, seen = sustained_rate(lambda r: 0.01, 0.1, 1.0, limit=5.0)
    assert capped == 5.0 and max(seen) == 5.0


@pytest.mark.parametrize("block_size", [8, 32])
def test_a_built_cache_is_priced_at_its_own_block_size(block_size: int) -> None:
    """`simulate` on a cache built from a spec prices steps exactly as on the spec: swaps
    move blocks of the cache's size (they were priced at 16 tokens whatever the cache)."""
    spec = CacheSpec(
        model="opt-13b", kv_budget="1GB", block_size=block_size, geometry=GEOM, num_blocks=24
    )
    rng = random.Random(5)
    reqs = [
        TraceRequest(f"r{i}", 0.01 * i, rng.randint(20, 60), rng.randint(20, 80)) for i in range(12)
    ]
    trace = Trace(tuple(reqs))
    cfg = SchedulerConfig(preemption="swap")
    from_spec = simulate(trace, spec, config=cfg, model="opt-13b")
    from_cache = simulate(trace, spec.build(), config=cfg, model="opt-13b")
    assert from_spec.swaps > 0, "the case must swap"
    assert [r.times() for r in from_cache.records] == [r.times() for r in from_spec.records]
