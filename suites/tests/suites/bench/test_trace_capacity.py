"""The trace.prefix_capacity sweep: its grids, its rows on the shipped trace, the
Mooncake capacity claim's judgement and the sweep's page (figure on a log axis)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kvbench.reports import claims
from kvbench.reports.site import build_site
from kvbench.reports.store.reader import load_run, load_runs
from kvbench.reports.store.writer import ResultWriter
from kvbench.suites.bench import catalog  # noqa: F401  (registers the sweeps)
from kvbench.suites.bench.registry import get_sweep
from kvbench.suites.bench.sweeps import trace_capacity as tc
from kvbench.workloads import prefix_oracle as po
from kvbench.workloads.shipped import shipped_trace

SWEEP = "trace.prefix_capacity"


def test_default_grid_is_small_and_full_grid_covers_the_issue(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from kvbench.paged.eviction import POLICIES

    monkeypatch.setattr(tc, "_peer_version", lambda: None)  # where vLLM is not installed
    sweep = get_sweep(SWEEP)
    default = sweep.cases(False)
    replayed = [c for c in default if c["method"] == "replay"]
    assert {(c["capacity_tokens"], c["block_size"]) for c in replayed} == {
        (3_000_000, 512),
        (50_000_000, 512),
    }
    full = sweep.cases(True)
    caps = sorted({c["capacity_tokens"] for c in full})
    assert caps[0] == 10_000 and caps[-1] == 10**9 and {3_000_000, 50_000_000} <= set(caps)
    assert {c["block_size"] for c in full} == {16, 512}
    # the policy column holds eviction policies only, every one of the registry
    assert {c["method"] for c in full} == {"replay", "optimal"}
    assert {c.get("policy") for c in full if c["method"] == "replay"} == set(POLICIES)
    assert all("policy" not in c for c in full if c["method"] == "optimal")
    base = {"trace", "capacity_tokens", "block_size", "method"}
    assert all(set(c) - base <= {"policy"} for c in full)


def test_the_vllm_peer_rows_join_where_vllm_is_installed(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """With the peer installed, each grid gains vLLM rows (method peer, peer vllm) at the
    LRU default points (3M, 50M) at each of its block sizes, the version a parameter;
    the rest is unchanged."""
    monkeypatch.setattr(tc, "_peer_version", lambda: None)
    without = {False: tc.capacity_cases(False), True: tc.capacity_cases(True)}
    monkeypatch.setattr(tc, "_peer_version", lambda: "0.32.0")
    for full, plain in without.items():
        cases = tc.capacity_cases(full)
        peer = [c for c in cases if c["method"] == "peer"]
        assert [c for c in cases if c["method"] != "peer"] == plain
        sizes = (512, 16) if full else (512,)
        assert sorted((c["block_size"], c["capacity_tokens"]) for c in peer) == sorted(
            (bs, cap) for bs in sizes for cap in (3_000_000, 50_000_000)
        )
        assert all(c["version"] == "0.32.0" and c["peer"] == "vllm" for c in peer)
        assert all("policy" not in c for c in peer)


def _metrics(case: dict) -> dict[str, float]:
    return {m.metric: m.value for m in get_sweep(SWEEP).measure(case, None)}  # type: ignore[arg-type]


def test_rows_on_the_shipped_trace() -> None:
    case = {"trace": tc.TRACE, "block_size": 512, "method": "optimal"}
    small = _metrics({**case, "capacity_tokens": 100_000})
    big = _metrics({**case, "capacity_tokens": 10**9})
    # the ceiling is the trace's (about 37% at 512-token blocks; the paper says ~40%)
    assert small["hit_rate_ceiling"] == big["hit_rate_ceiling"]
    assert 0.3 < big["hit_rate_ceiling"] < 0.45
    assert big["unbounded"] == 1.0 and big["fraction_of_ceiling"] == 1.0
    assert small["unbounded"] == 0.0
    assert 0 < small["hit_rate"] < big["hit_rate"]
    assert small["fraction_of_ceiling"] == small["hit_rate"] / small["hit_rate_ceiling"]
    assert small["prompt_tokens"] == 144_793_823  # the trace's input_length sum


#: The rows' parameters beside trace, capacity and block size: today's (a method column,
#: the policy an eviction policy only) and an older run's (policy: lru, optimal, vllm).
_NEW = ({"method": "replay", "policy": "lru"}, {"method": "optimal"},
        {"method": "peer", "peer": "vllm", "version": "0.32.0"})  # fmt: skip
_OLD = ({"policy": "lru"}, {"policy": "optimal"}, {"policy": "vllm", "version": "0.32.0"})


def _frame(at_3m: float, at_50m: float, method: bool = False) -> pd.DataFrame:
    rows = []
    for cap, value in ((3_000_000, at_3m), (50_000_000, at_50m)):
        rows.append(
            {
                "suite": SWEEP,
                "metric": "fraction_of_ceiling",
                "value": value,
                "unit": "fraction",
                "run_id": "r",
                "case_key": str(cap),
                "trace": tc.TRACE,
                "capacity_tokens": cap,
                "block_size": 512,
                "policy": "lru",
                **({"method": "replay"} if method else {}),
            }
        )
    if method:  # the bound's rows beside (no policy): never judged as the LRU's
        rows += [
            {**r, "method": "optimal", "policy": None, "value": 1.0, "case_key": f"o{i}"}
            for i, r in enumerate(rows)
        ]
    return pd.DataFrame(rows)


def _verdict(frame: pd.DataFrame) -> claims.Verdict:
    return dict((c.key, v) for c, v in claims.evaluate(frame))["mooncake-capacity"]


@pytest.mark.parametrize("method", [True, False], ids=["method-column", "older-run"])
def test_the_capacity_claim_is_judged_on_both_points(method: bool) -> None:
    assert _verdict(_frame(0.38, 0.99, method)).verdict == claims.HOLDS
    assert _verdict(_frame(0.55, 0.99, method)).verdict == claims.FAILS  # 3M past half
    assert _verdict(_frame(0.38, 0.80, method)).verdict == claims.FAILS  # 50M short
    assert "38.0%" in _verdict(_frame(0.38, 0.99, method)).measured
    assert _verdict(_frame(0.38, 0.99, method).iloc[:1]).verdict == claims.NOT_MEASURED


@pytest.mark.parametrize("params", [_NEW, _OLD], ids=["method-column", "older-run"])
def test_the_sweep_page_draws_the_capacity_curve(tmp_path: Path, params: tuple[dict, ...]) -> None:
    with ResultWriter("c", tmp_path) as w:
        for extra, scale in zip(params[:2], (0.5, 0.9), strict=True):
            for cap in (10_000, 3_000_000, 50_000_000, 10**9):
                case = {"trace": tc.TRACE, "capacity_tokens": cap, "block_size": 512}
                case.update(extra)
                rate = min(0.37, scale * 0.37 * (cap / 5e7) ** 0.2)
                w.record(SWEEP, case, "hit_rate", rate, "fraction")
                w.record(SWEEP, case, "hit_rate_ceiling", 0.37, "fraction")
                w.record(SWEEP, case, "fraction_of_ceiling", rate / 0.37, "fraction")
    out = tmp_path / "site"
    build_site(load_runs(["c"], tmp_path), out)
    pages = list(out.glob("*prefix_capacity*.html")) + list(out.glob("*prefix-capacity*.html"))
    assert pages, sorted(p.name for p in out.iterdir())
    html = pages[0].read_text(encoding="utf-8")
    assert "Prefix hit rate vs cache capacity" in html
    assert "mooncake-capacity" in html or "3M-token prefix cache" in html
    figs = [f for f in (out / "figures").glob("*.svg") if "prefix" in f.name]
    assert figs and figs[0].read_text(encoding="utf-8").startswith("<svg")


def test_bench_writes_the_rows(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Through the runner, on one case of the default grid (the bound: a second)."""
    import dataclasses

    from kvbench.suites.bench import registry
    from kvbench.suites.bench.runner import run_bench

    one = [c for c in get_sweep(SWEEP).cases(False) if c["capacity_tokens"] == 3_000_000]
    one = [c for c in one if c["method"] == "optimal"]
    small = dataclasses.replace(get_sweep(SWEEP), cases=lambda full: one)
    monkeypatch.setitem(registry._REGISTRY, SWEEP, small)
    res = run_bench([SWEEP], out_dir=tmp_path, run_id="t", progress=False)
    assert not res.failures and res.measured == 1
    rows = {r["metric"]: r for r in load_run(res.path).rows if r["suite"] == SWEEP}
    assert {"hit_rate", "hit_rate_ceiling", "fraction_of_ceiling"} <= set(rows)
    assert rows["hit_rate"]["case"] == one[0]
    assert 0.9 < rows["fraction_of_ceiling"]["value"] <= 1.0
    assert rows["peak_rss_self"]["value"] > 0 and rows["peak_rss_self"]["unit"] == "B"


@pytest.mark.parametrize("params", [_NEW, _OLD], ids=["method-column", "older-run"])
def test_the_capacity_figure_draws_the_ceiling_once_on_decades(
    tmp_path: Path, params: tuple[dict, ...]
) -> None:
    """The ceiling (the same for every series) is one series named by its metric; each
    method's (and policy's) hit rate is its own; the x axis is log 10 (capacities are
    decades). A results file written before the method column draws as it did."""
    from kvbench.reports import figure_specs, figures

    with ResultWriter("c", tmp_path) as w:
        for extra in params:
            for cap in (10_000, 3_000_000, 10**9):
                case = {"trace": tc.TRACE, "capacity_tokens": cap, "block_size": 512}
                case.update(extra)
                w.record(SWEEP, case, "hit_rate", 0.1, "fraction")
                w.record(SWEEP, case, "hit_rate_ceiling", 0.37, "fraction")
    (run,) = load_runs(["c"], tmp_path)
    frame = run.frame()
    (spec,) = [s for s in figure_specs.specs_for(SWEEP) if s.fixed.get("block_size") == 512]
    assert spec.logx_base == 10
    sub = figures._select(figures._suite_rows(frame, spec), spec)
    ceiling = sub[sub["metric"] == "hit_rate_ceiling"]
    assert sorted(ceiling["capacity_tokens"]) == [10_000, 3_000_000, 10**9]
    assert ceiling["policy"].isna().all() and (ceiling["block_size"] == 512).all()
    series = sub[sub["metric"] == "hit_rate"].drop_duplicates("case_key")
    assert len(series.groupby([c for c in ("method", "policy", "peer") if c in sub.columns],
                              dropna=False)) == 3  # fmt: skip
    svg = figures.render(frame, spec)
    assert svg is not None and svg.startswith("<svg")


def test_the_pipeline_answers_every_query_as_a_direct_replay_or_bound(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`hit_rates` (the one pipeline of the sweep and `kvbench hitrate`), inline and with
    a worker (run as a thread here, so the test pays no process start): every replay
    point equals a direct `replay` of that cache, every optimal point Belady's bound, a
    capacity holding the footprint the ceiling (method "ceiling"); the same numbers
    whatever the workers (on a slice of the trace)."""
    import concurrent.futures
    from concurrent.futures import ThreadPoolExecutor

    from kvbench.paged.eviction import POLICIES
    from kvbench.paged.hitrate import HitRateQuery, hit_rates, replay
    from kvbench.workloads.trace import Trace

    class InProcess(ThreadPoolExecutor):
        def __init__(self, workers: int, mp_context: object = None) -> None:
            super().__init__(workers)

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", InProcess)
    small = Trace(shipped_trace(tc.TRACE).requests[:120])
    acc = po.block_accesses(small, 16)
    fp = acc.footprint_blocks()
    caps = (10_000, 1_000_000, 1_600_000, fp * 16)
    queries = [HitRateQuery(c, "replay", p) for p in POLICIES for c in caps]
    queries += [HitRateQuery(c, "optimal", None) for c in caps]
    answers = [hit_rates(small, 16, queries, workers=w) for w in (0, 1)]
    assert answers[0] == answers[1]
    rates = answers[0]
    assert rates.footprint_blocks == fp and rates.ceiling_tokens == po.ceiling_hit_tokens(acc)
    assert [p.query for p in rates.points] == queries
    for point in rates.points:
        q = point.query
        if q.capacity_tokens == fp * 16:
            assert point.method == "ceiling" and point.hit_tokens == rates.ceiling_tokens
        elif q.method == "optimal":
            assert point.hit_tokens == po.belady_hit_tokens(acc, q.capacity_tokens)
        else:
            assert q.policy is not None
            direct = replay(small, q.capacity_tokens, 16, q.policy, pool_limit=fp)
            assert point.method == "replay" and point.hit_tokens == direct.hit_tokens, q
    assert all(p.hit_tokens > 0 for p in rates.points)


def test_the_sweep_runs_the_pipeline_once_per_block_size_and_keeps_no_state(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The sweep's rows come from one `hit_rates` call per (trace, block size) of the
    run, kept in the run's context: a second context computes again (nothing is held by
    the module), and the rows are the pipeline's (on a slice of the trace)."""
    import torch

    from kvbench.paged import hitrate
    from kvbench.suites.bench.context import BenchContext
    from kvbench.workloads.trace import Trace

    small = Trace(shipped_trace(tc.TRACE).requests[:60])
    monkeypatch.setattr(tc, "shipped_trace", lambda name: small)
    monkeypatch.setattr(tc, "_peer_version", lambda: None)
    monkeypatch.setenv("KVBENCH_REPLAY_WORKERS", "0")
    calls: list[int] = []

    def counted(trace, bs, queries, **kw):  # type: ignore[no-untyped-def]
        calls.append(bs)
        return hitrate.hit_rates(trace, bs, queries, **kw)

    monkeypatch.setattr(tc, "hit_rates", counted)
    cases = [c for c in tc.capacity_cases(True) if c["capacity_tokens"] <= 1_000_000]
    for _ in range(2):
        ctx = BenchContext(torch.device("cpu"), full=True)
        rows = [{m.metric: m.value for m in get_sweep(SWEEP).measure(c, ctx)} for c in cases]
    assert sorted(calls) == [16, 16, 512, 512]
    acc = po.block_accesses(small, 16)
    for case, row in zip(cases, rows, strict=True):
        if case["block_size"] == 16 and case["method"] == "optimal":
            bound = po.belady_hit_tokens(acc, case["capacity_tokens"])
            assert row["hit_tokens"] == bound
        assert row["hit_rate"] == row["hit_tokens"] / row["prompt_tokens"]


@pytest.mark.parametrize(
    ("query", "match"),
    [
        (("replay", "fifo", 10_000), "'fifo'"),
        (("optimal", "lru", 10_000), "'lru'"),
        (("peer", None, 10_000), "'peer'"),
        (("replay", "lru", 8), "holds no block"),
        (("replay", "lru", 0), "capacity_tokens"),
    ],
)
def test_the_pipeline_refuses_a_bad_query_by_name_before_any_work(query: tuple, match: str) -> None:
    from kvbench.paged.hitrate import HitRateQuery, hit_rates
    from kvbench.workloads.errors import ConfigError
    from kvbench.workloads.trace import Trace

    method, policy, cap = query
    small = Trace(shipped_trace(tc.TRACE).requests[:2])
    with pytest.raises(ConfigError, match=match):
        hit_rates(small, 16, [HitRateQuery(cap, method, policy)])
