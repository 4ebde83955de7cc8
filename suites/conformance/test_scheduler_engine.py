"""Engine behaviour on fixed traces: batching policies, preemption choice, the paper's
utilization claim, the CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvbench.paged.cache import PagedKVCache
from kvbench.paged.cache_spec import CacheSpec
from kvbench.paged.serving.engine import Engine
from kvbench.paged.serving.simulation import simulate
from kvbench.paged.serving.time_model import SchedulerConfig, TimeModel
from kvbench.suites.cli import main
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.profiles import DeviceProfile, get_profile
from kvbench.workloads.sharing import generate
from kvbench.workloads.trace import Trace, TraceRequest

GEOM = KVGeometry(2, 2, 4, "float32", 4)
TM = TimeModel(get_profile("a100-80gb"), GEOM, weight_bytes=10**9, params=5e8, block_size=4)


def _trace(*lens: tuple[int, int]) -> Trace:
    return Trace(tuple(TraceRequest(f"r{i}", 0.0, p, o) for i, (p, o) in enumerate(lens)))


def _records(result):
    return {r.id: r for r in result.records}


def test_static_batch_waits_for_its_longest_request() -> None:
    trace = _trace((4, 3), (4, 12), (4, 5), (4, 5))
    cfg = SchedulerConfig(max_num_seqs=2, max_batched_tokens=16, preemption="recompute")
    runs = {}
    for batching in ("static", "continuous"):
        cache = PagedKVCache(GEOM, 64, 4, store_kv=False)
        runs[batching] = _records(Engine(cache, replace(cfg, batching=batching), TM).run(trace))
    st, co = runs["static"], runs["continuous"]
    # static: the second batch starts the step after the first batch's longest finished
    assert st["r2"].admit_step == max(st["r0"].finish_step, st["r1"].finish_step) + 1
    # continuous: r2 takes r0's seat as soon as r0 retires
    assert co["r2"].admit_step == co["r0"].finish_step + 1
    assert max(r.finish_step for r in co.values()) < max(r.finish_step for r in st.values())
    for recs in (st, co):
        assert all(
            recs[f"r{i}"].generated == o
            for i, (_, o) in enumerate([(4, 3), (4, 12), (4, 5), (4, 5)])
        )


def test_first_token_at_prefill_and_one_token_per_step() -> None:
    trace = _trace((10, 6))
    cache = PagedKVCache(GEOM, 16, 4, store_kv=False)
    rec = _records(
        Engine(
            cache, SchedulerConfig(max_batched_tokens=4, max_num_seqs=1, preemption="recompute"), TM
        ).run(trace)
    )["r0"]
    # 10 prompt tokens in chunks of 4: steps 0, 1, 2; first token at step 2; 5 more decode steps
    assert (rec.admit_step, rec.first_token_step, rec.finish_step) == (0, 2, 7)
    # modeled times, priced here step by step from the time model's own formulas: three
    # prefill chunks (context, tokens), then decode steps reading 11 .. 15 tokens of KV
    prefill = sum(TM.prefill_ps([chunk]) for chunk in [(0, 4), (4, 4), (8, 2)])
    decode = sum(TM.step_ps(1, c + 1) for c in range(10, 15))
    assert rec.arrival_s == 0.0
    assert rec.first_token_s == prefill / 1e12
    assert rec.finish_s == (prefill + decode) / 1e12
    assert rec.as_dict()["tpot_s"] == pytest.approx(decode / 1e12 / 5, rel=1e-12)


def test_latency_summary_per_request() -> None:
    """The summary groups a request's samples (first token of any, finish of the last) and
    gives mean / p50 / p90 / p99; normalized latency is e2e over the output length."""
    from kvbench.paged.serving.latency import request_latencies, stats, summarize
    from kvbench.paged.serving.time_model import SeqRecord

    def rec(sid: str, req: str, arrival: float, first: float, finish: float, out: int):
        r = SeqRecord(sid, req, arrival, 4, out)
        r.first_token_s, r.finish_s = first, finish
        return r

    records = [
        rec("a", "a", 0.0, 1.0, 5.0, 5),
        rec("a#1", "a", 0.0, 1.0, 9.0, 5),
        rec("b", "b", 2.0, 2.5, 2.5, 1),
    ]
    values = request_latencies(records)
    assert values["ttft"] == [1.0, 0.5]
    assert values["e2e"] == [9.0, 0.5]
    assert values["tpot"] == [2.0]  # (9 - 1) / 4; b has one output token
    assert values["normalized_latency"] == [9.0 / 5, 0.5]
    summary = summarize(records)
    assert summary["e2e"]["mean"] == 4.75 and summary["e2e"]["p50"] == 4.75
    assert summary["e2e"]["p90"] == pytest.approx(0.5 + 0.9 * 8.5)
    assert stats([])["p99"] != stats([])["p99"]  # NaN: no values


def test_poisson_arrivals_stay_event_driven_with_token_exact_latency() -> None:
    """A Poisson-rate trace (the serving.rate sweep's input) replays in event mode - it
    skips quiet stretches between arrivals and block boundaries rather than falling back
    to token stepping - with the same decisions and latencies."""
    from kvbench.workloads.arrivals import parse_arrivals

    trace = generate("sharegpt", 120, seed=5, arrivals=parse_arrivals("poisson:4"))
    spec = CacheSpec(kind="paged", kv_budget="4GB")
    runs = {
        mode: simulate(trace, spec, config=SchedulerConfig(mode=mode))
        for mode in ("token", "event")
    }
    ev, tok = runs["event"], runs["token"]
    assert ev.decisions() == tok.decisions()
    assert sorted(r.times() for r in ev.records) == sorted(r.times() for r in tok.records)
    assert repr(ev.latency) == repr(tok.latency)
    # it skipped quiet stretches (rows standing for several steps), about half the steps
    assert any(row.span > 1 for row in ev.timeline)
    assert ev.processed_steps * 1.5 < tok.processed_steps
    assert ev.latency["ttft"]["p50"] > 0 and ev.latency["normalized_latency"]["mean"] > 0


@pytest.mark.parametrize("host_link", [25e9, 1e3])
def test_auto_follows_the_cost_model(host_link: float) -> None:
    profile = DeviceProfile("test", 2e12, 312e12, host_link)
    tm = TimeModel(profile, GEOM, weight_bytes=10**9, params=5e8, block_size=4)
    trace = generate("alpaca", 12, seed=3, output=None)
    trace = Trace(
        tuple(
            TraceRequest(r.id, 0.0, min(r.prompt_len, 12), min(r.output_len, 24))
            for r in trace.requests
        )
    )
    cache = PagedKVCache(GEOM, 16, 4, num_cpu_blocks=64, store_kv=False)
    res = Engine(cache, SchedulerConfig(max_num_seqs=8, preemption="auto"), tm).run(trace)
    assert res.preemptions > 0
    if host_link > 1e6:  # fast link: swapping 2 x blocks beats recomputing
        assert res.swaps > 0 and res.recomputes == 0
    else:  # a 1 kB/s link: recompute is always cheaper
        assert res.swaps == 0 and res.recomputes == res.preemptions


def test_swap_policy_falls_back_to_recompute_without_swap_space() -> None:
    trace = Trace(tuple(TraceRequest(f"r{i}", 0.0, 8, 20) for i in range(6)))
    cache = PagedKVCache(GEOM, 16, 4, num_cpu_blocks=0, store_kv=False)
    res = Engine(cache, SchedulerConfig(max_num_seqs=8, preemption="swap"), TM).run(trace)
    assert res.preemptions > 0 and res.swaps == 0 and res.recomputes == res.preemptions


def test_auto_needs_a_time_model() -> None:
    with pytest.raises(ConfigError, match="auto"):
        Engine(PagedKVCache(GEOM, 8, 4, store_kv=False), SchedulerConfig(preemption="auto"))


def test_paper_utilization_claim_sharegpt() -> None:
    """Paged >= 96% vs contiguous max-reservation 20-40% (paper: 96.3% vs 20.4-38.2%)."""
    trace = generate("sharegpt", 300, seed=11)
    util = {}
    for kind in ("paged", "contiguous-max"):
        util[kind] = simulate(trace, CacheSpec(kind=kind), policy="auto").utilization
    assert util["paged"] >= 0.96
    assert 0.20 <= util["contiguous-max"] <= 0.40


def test_simulate_cli(tmp_path, capsys) -> None:
    rc = main(
        [
            "simulate",
            "--workload",
            "alpaca",
            "--requests",
            "60",
            "--cache",
            "paged,contiguous-oracle",
            "--quiet",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "util %" in out and "contiguous-oracle" in out
    assert "normalized_latency" in out and "p99" in out
    rows = [json.loads(line) for line in (tmp_path / "summary.jsonl").read_text().splitlines()]
    assert all(r["ttft_p50"] > 0 and r["normalized_latency_mean"] > 0 for r in rows)
    recs = [json.loads(x) for x in (tmp_path / "records-paged.jsonl").read_text().splitlines()]
    assert all(r["e2e_s"] == r["finish_s"] - r["arrival_s"] for r in recs)
    assert [r["cache"] for r in rows] == ["paged", "contiguous-oracle"]
    assert all(r["generated_tokens"] == rows[0]["generated_tokens"] for r in rows)
    assert Trace.read(tmp_path / "trace.jsonl").meta["workload"] == "alpaca"
    timeline = [json.loads(x) for x in (tmp_path / "timeline-paged.jsonl").read_text().splitlines()]
    assert sum(row["span"] for row in timeline) == rows[0]["steps"]
    assert main(["simulate", "--requests", "5", "--cache", "bogus", "--quiet"]) == 2
    assert "bogus" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"policy": "vllm-v2"}, "unknown policy 'vllm-v2'"),
        ({"policy": "vllm-v1", "preemption": "swap"}, "preemption='swap'"),
        ({"policy": "vllm-v1", "batching": "static"}, "batching='static'"),
        ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold .* -1"),
        ({"long_prefill_token_threshold": True}, "long_prefill_token_threshold .* True"),
    ],
)
def test_bad_scheduler_policy_names_the_value(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        SchedulerConfig(**kwargs)


def test_vllm_v1_refuses_n_sample_and_beam_requests_before_the_run() -> None:
    cache = PagedKVCache(GEOM, 16, 4, store_kv=False)
    cfg = SchedulerConfig(max_num_seqs=4, preemption="recompute", policy="vllm-v1")
    for n, width in ((2, 1), (1, 2)):
        b = TraceRequest("b", 0.0, 8, 4, n=n, beam_width=width)
        trace = Trace((TraceRequest("a", 0.0, 8, 4), b))
        with pytest.raises(ConfigError, match="trace line 3: request 'b'"):
            Engine(cache, cfg, TM).run(trace)
        assert cache.request_ids() == []


def test_vllm_v1_budget_goes_in_running_order() -> None:
    """An older request still prefilling takes the budget before younger decoders: with
    a threshold, two long prompts share the budget and a decoder admitted between them
    waits while the first uses it up (vLLM's running order, not decodes first)."""
    reqs = (
        TraceRequest("long", 0.0, 40, 2),
        TraceRequest("short", 0.0, 4, 6),
    )
    cfg = SchedulerConfig(
        max_batched_tokens=8, max_num_seqs=4, preemption="recompute", policy="vllm-v1",
        mode="token",
    )  # fmt: skip
    seen: list[dict[str, int]] = []
    eng = Engine(PagedKVCache(GEOM, 64, 4, store_kv=False), cfg, TM)
    assert eng.v1 is not None
    eng.v1.on_step = lambda d: seen.append(dict(d.scheduled))
    eng.run(Trace(reqs))
    # step 0: "long" takes all 8 tokens (it is first); "short" waits for budget
    assert seen[0] == {"long": 8}
    # "long" prefills 40 tokens in 5 steps; "short" is admitted only once budget is left
    assert [s.get("short", 0) for s in seen[:5]] == [0, 0, 0, 0, 0]
    assert seen[5] == {"long": 1, "short": 4}
