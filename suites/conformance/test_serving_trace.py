"""Serving a trace's own arrivals: the concurrency cap, timestamps and time scale, goodput
and SLO attainment against hand-computed cases, the SLO search, the timeline, and the
Llama-3-70B 8 x H100 set-up (`paged.serving.slo`, `paged.serving.replay`, `SchedulerConfig.max_concurrency`).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.paged.cache_spec import CacheSpec
from kvbench.paged.serving.engine import Engine
from kvbench.paged.serving.latency import summarize
from kvbench.paged.serving.records import SeqRecord
from kvbench.paged.serving.replay import (
    prefix_hit_rate,
    serve_trace,
    slo_search,
    step_starts,
    timeline,
)
from kvbench.paged.serving.simulation import simulate
from kvbench.paged.serving.slo import SLO, goodput, slo_margin
from kvbench.paged.serving.time_model import SchedulerConfig, TimeModel
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.profiles import get_profile
from kvbench.workloads.setups import ServingSetup, get_setup
from kvbench.workloads.time_scale import time_scaled
from kvbench.workloads.trace import Trace, TraceRequest

GEOM = KVGeometry(2, 2, 8, "float16", 4)
TM = TimeModel(get_profile("a100-80gb"), GEOM, 10**9, 5e8, 4)


def _trace(seed: int, n: int, rate: float = 2.0, samples: int = 1) -> Trace:
    rng = np.random.default_rng(seed)
    t = 0.0
    reqs = []
    for i in range(n):
        t += float(rng.exponential(1 / rate))
        k = samples if i % 3 == 0 else 1
        reqs.append(TraceRequest(i, t, int(rng.integers(1, 40)), int(rng.integers(1, 30)), n=k))
    return Trace(tuple(reqs))


def _run(trace: Trace, cap: int, mode: str = "event", blocks: int = 60):  # type: ignore[no-untyped-def]
    spec = CacheSpec(kind="paged", geometry=GEOM, num_blocks=blocks, block_size=4, max_seq_len=80)
    cfg = SchedulerConfig(mode=mode, max_concurrency=cap)
    return simulate(trace, spec, config=cfg, time_model=TM)


# ------------------------------------------------------------------ the concurrency cap


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), cap=st.integers(1, 6), samples=st.integers(1, 3))
def test_never_more_than_cap_requests_in_flight(seed: int, cap: int, samples: int) -> None:
    """Property: with max_concurrency N, no step has more than N requests joined and not
    finished (an n-sample request's samples are one request), so never more than N
    running when every request has one sample; event mode decides exactly as token
    stepping does."""
    trace = _trace(seed, 30, rate=5.0, samples=samples)
    token = _run(trace, cap, "token")
    event = _run(trace, cap, "event")
    assert token.decisions() == event.decisions()
    assert sorted(r.times() for r in token.records) == sorted(r.times() for r in event.records)
    # after every step, the requests in flight are the running, waiting and swapped
    # sequences (with n samples, a request may count up to n times)
    for row in token.timeline:
        assert row.running + row.waiting + row.swapped <= cap * samples
        if samples == 1:
            assert row.running <= cap
    assert token.peak_concurrency <= cap * samples


def test_a_cap_of_one_serves_requests_one_after_another() -> None:
    """Cap 1: each request joins when the one before it finished (its latency counts from
    then), so no two requests' [join, finish] spans overlap."""
    trace = _trace(3, 12, rate=50.0)
    result = _run(trace, 1, "token")
    spans = sorted((r.arrival_s, r.finish_s) for r in result.records)
    for (_, f0), (a1, _) in itertools.pairwise(spans):
        assert a1 >= f0 - 1e-12
    trace_arrivals = sorted(r.arrival for r in trace.requests)
    assert all(s[0] >= a - 1e-12 for s, a in zip(spans, trace_arrivals, strict=True))
    assert result.peak_concurrency == 1


def test_no_cap_and_a_cap_above_the_load_decide_alike() -> None:
    trace = _trace(5, 25)
    assert _run(trace, 0).decisions() == _run(trace, 10_000).decisions()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_bad_caps_are_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="max_concurrency"):
        SchedulerConfig(max_concurrency=bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------ timestamps and scale


def test_replay_respects_the_timestamps() -> None:
    """No request is admitted (its first prefill chunk runs) in a step that starts before
    its arrival, every record keeps its trace arrival, and an idle engine serves a lone
    late request from its timestamp."""
    trace = _trace(7, 30, rate=0.5)
    spec = CacheSpec(kind="paged", geometry=GEOM, num_blocks=60, block_size=4, max_seq_len=80)
    engine = Engine(spec.build(), SchedulerConfig(mode="token"), TM, step_hook=lambda *a: None)
    first_chunk: dict[str, int] = {}

    def hook(step: int, decoded: list, chunks: list, model_ps: int) -> None:
        for sid, _, _ in chunks:
            first_chunk.setdefault(sid, engine.st.now_ps)  # the step's start

    engine.step_hook = hook
    result = engine.run(trace)
    assert len(first_chunk) == len(trace)
    for req in trace.requests:
        assert first_chunk[str(req.id)] >= round(req.arrival * 1e12)
    by_id = {str(r.id): r for r in trace.requests}
    for rec in result.records:
        assert rec.arrival_s == by_id[rec.id].arrival and rec.first_token_s > rec.arrival_s
    late = Trace((TraceRequest("x", 100.0, 8, 2),))
    (rec,) = _run(late, 0, "token").records
    prefill = TM.step_ps(0, 0, [(0, 8)])
    assert rec.first_token_s == pytest.approx(100.0 + prefill / 1e12, rel=1e-12)


def test_time_scale_divides_arrivals() -> None:
    trace = _trace(2, 10)
    fast = time_scaled(trace, 2.0)
    assert [r.arrival for r in fast.requests] == [r.arrival / 2 for r in trace.requests]
    assert [r.prompt_len for r in fast.requests] == [r.prompt_len for r in trace.requests]
    assert time_scaled(trace, 1.0) is trace
    for bad in (0, -1.0, math.nan, math.inf, "2", True):
        with pytest.raises(ConfigError, match="time scale"):
            time_scaled(trace, bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------ goodput and SLOs


def _rec(rid: str, arrival: float, first: float, finish: float, out: int) -> SeqRecord:
    rec = SeqRecord(rid, rid, arrival, 10, out)
    rec.first_token_s, rec.finish_s = first, finish
    return rec


def test_goodput_by_hand() -> None:
    """Four requests over [0, 10] s; SLO TTFT <= 1 s, TPOT <= 0.1 s:
    a: ttft 0.5, tpot (2.5 - 0.5) / 20 = 0.1 (on the bound: good)
    b: ttft 1.5 (bad)
    c: ttft 0.2, tpot (10 - 2.2) / 10 = 0.78 (bad)
    d: ttft 1.0 (on the bound), one output token: no TPOT (good)
    goodput = 2 good / 10 s = 0.2 requests/s, attainment 2 / 4."""
    recs = [
        _rec("a", 0.0, 0.5, 2.5, 21),
        _rec("b", 1.0, 2.5, 3.0, 5),
        _rec("c", 2.0, 2.2, 10.0, 11),
        _rec("d", 3.0, 4.0, 4.0, 1),
    ]
    g = goodput(recs, SLO(1.0, 0.1))
    assert (g.requests, g.good, g.duration_s) == (4, 2, 10.0)
    assert g.goodput == pytest.approx(0.2) and g.slo_attainment == 0.5
    only_ttft = goodput(recs, SLO(ttft_s=1.0))
    assert only_ttft.good == 3  # c's TPOT is not checked
    assert goodput(recs, SLO()).good == 4  # no bound: throughput
    assert goodput(recs, SLO(tpot_s=0.05)).good == 1  # only the one-token d (b: 0.125)


def test_samples_of_one_request_are_judged_together() -> None:
    """An n-sample request: the first token of any sample, the finish of the last."""
    recs = [_rec("r", 0.0, 0.4, 1.0, 11), _rec("r#1", 0.0, 0.4, 3.0, 11)]
    recs[1].request = "r"
    g = goodput(recs, SLO(1.0, 0.1))  # tpot (3.0 - 0.4) / 10 = 0.26 > 0.1
    assert (g.requests, g.good) == (1, 0)


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, "1", True])
def test_bad_slo_bounds_are_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="SLO"):
        SLO(ttft_s=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="SLO"):
        SLO(tpot_s=bad)  # type: ignore[arg-type]


def test_slo_margin_is_the_worse_p99_ratio() -> None:
    recs = [_rec(str(i), 0.0, 0.1 * (i + 1), 0.1 * (i + 1) + 0.02 * 10, 11) for i in range(10)]
    lat = summarize(recs)
    p99_ttft = float(np.percentile([0.1 * (i + 1) for i in range(10)], 99))
    assert slo_margin(lat, SLO(2.0, 1.0)) == pytest.approx(p99_ttft / 2.0)
    assert slo_margin(lat, SLO(tpot_s=0.01)) == pytest.approx(0.02 / 0.01)


def test_slo_search_is_monotone_in_the_bounds() -> None:
    """A looser SLO never finds a lower load; the load found meets the SLO and a load 10%
    above it (when the search did not hit its limit) does not."""
    trace = _trace(11, 120, rate=1.0)
    spec = CacheSpec(kind="paged", geometry=GEOM, num_blocks=60, block_size=4, max_seq_len=80)

    def latency_at(scale: float) -> dict:
        return simulate(time_scaled(trace, scale), spec, policy="auto", time_model=TM).latency

    found = []
    for ttft in (0.002, 0.005, 0.02, 0.1):
        x, seen = slo_search(latency_at, SLO(ttft, 1.0), 4.0, rel_tol=0.02, max_evals=30)
        found.append(x)
        assert x > 0 and slo_margin(latency_at(x), SLO(ttft, 1.0)) <= 1.0
        above = [s for s, m in seen.items() if s > x]
        assert above and all(seen[s] > 1.0 for s in above)
    assert found == sorted(found)
    with pytest.raises(ConfigError, match="needs a TTFT or a TPOT"):
        slo_search(latency_at, SLO(), 1.0)


# ------------------------------------------------------------------ prompts, hit rate, set-up


def _shared_trace() -> Trace:
    """Requests whose prompts share 512-token blocks by hash id, Mooncake style."""
    shapes = [((0, 1, 2), 1400), ((0, 1, 3), 1200), ((0, 4), 700), ((0, 1, 2, 5), 1700)]
    return Trace(
        tuple(
            TraceRequest(i, 0.5 * i, n, 4, prompt_blocks=ids, prompt_block_tokens=512)
            for i, (ids, n) in enumerate(shapes)
        )
    )


def test_hash_block_prompts_share_what_their_ids_share() -> None:
    """Served one by one (no eviction), each request hits exactly the full blocks of its
    longest prefix of hash ids shared with an earlier request, at block sizes 16 and 64
    (the last prompt token is always computed)."""
    trace = _shared_trace()
    for bs in (16, 64):
        spec = CacheSpec(
            kind="paged", geometry=GEOM, num_blocks=2000, block_size=bs, max_seq_len=4096
        )
        result = simulate(trace, spec, config=SchedulerConfig(max_concurrency=1), time_model=TM)
        cached = {int(r.id): r.cached_tokens for r in result.records}
        shared_tokens = {0: 0, 1: 2 * 512, 2: 512, 3: 1400}  # 3 shares all of 0's prompt
        for i, tokens in shared_tokens.items():
            n = trace.requests[i].prompt_len
            assert cached[i] == min(tokens, n - 1) // bs * bs
        assert prefix_hit_rate(result) == pytest.approx(
            sum(cached.values()) / sum(r.prompt_len for r in trace.requests)
        )


def test_the_mooncake_setup_fits_and_serves() -> None:
    """Llama-3-70B on 8 x H100 (TP 8): weights and KV fit, 1.31M KV slots; a short trace
    replays on it with prefix caching, and the timeline's windows cover the run."""
    setup = get_setup("llama-3-70b-8xh100-tp8")
    setup.check_fits()
    assert (setup.tp, setup.profile, setup.kv_slots()) == (8, "h100", 1_310_720)
    assert setup.preset.geometry.bytes_per_token == 320 * 1024
    result = serve_trace(_shared_trace(), setup, time_scale=2.0)
    assert result.info["time_scale"] == 2.0 and result.info["kv_blocks"] == 81_920
    assert [r.arrival_s for r in sorted(result.records, key=lambda r: int(r.id))] == [
        0.25 * i for i in range(4)
    ]
    windows = timeline(result, 4)
    assert len(windows) == 4
    assert sum(w.admitted for w in windows) == 4
    assert windows[0].start_s == 0.0
    assert sum(w.width_s for w in windows) == pytest.approx(result.modeled_seconds)
    assert all(0 <= w.kv_used <= 1 for w in windows if not math.isnan(w.kv_used))
    one = timeline(result, 1)[0]
    assert one.prefix_hit_rate == pytest.approx(prefix_hit_rate(result))


def test_timeline_starts_follow_the_clock_through_idle_gaps() -> None:
    """Rows start where the previous one ended, or at the next arrival after the engine
    ran empty: the last row ends at the run's modeled time, and a request arriving long
    after the others are done is admitted in a row that starts at its arrival."""
    reqs = [TraceRequest(i, 0.01 * i, 12, 5) for i in range(5)]
    reqs.append(TraceRequest(99, 50.0, 12, 5))
    result = _run(Trace(tuple(reqs)), 0, "event")
    starts = step_starts(result)
    end = starts[-1] + result.timeline[-1].time_ps / 1e12
    assert end == pytest.approx(result.modeled_seconds, rel=1e-12)
    (late,) = [r for r in result.records if r.id == "99"]
    row = next(i for i, r in enumerate(result.timeline) if r.step == late.admit_step)
    assert starts[row] == 50.0
    windows = timeline(result, 10, width_s=10.0)
    assert [w.admitted for w in windows] == [5, 0, 0, 0, 0, 1, 0, 0, 0, 0]
    assert windows[2].running == 0.0 and math.isnan(windows[2].utilization)
    assert windows[0].running > 0


def test_a_setup_that_does_not_fit_is_refused() -> None:
    bad = ServingSetup("x", "llama-3-70b", "h100", 1, "400GiB", 4096, "test")
    with pytest.raises(ConfigError, match="exceed"):
        serve_trace(_shared_trace(), bad)
