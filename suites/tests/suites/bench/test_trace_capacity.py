"""The trace.prefix_capacity sweep: its grids, its rows on the shipped trace, the
Mooncake capacity claim's judgement and the sweep's page (figure on a log axis)."""

from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd

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
    monkeypatch.setattr(tc, "_peer_version", lambda: None)  # where vLLM is not installed
    sweep = get_sweep(SWEEP)
    default = sweep.cases(False)
    replayed = [c for c in default if c["policy"] != "optimal"]
    assert {(c["capacity_tokens"], c["block_size"]) for c in replayed} == {
        (3_000_000, 512),
        (50_000_000, 512),
    }
    full = sweep.cases(True)
    caps = sorted({c["capacity_tokens"] for c in full})
    assert caps[0] == 10_000 and caps[-1] == 10**9 and {3_000_000, 50_000_000} <= set(caps)
    assert {c["block_size"] for c in full} == {16, 512}
    assert {c["policy"] for c in full} == {"lru", "lfu", "optimal"}
    assert all(set(c) == {"trace", "capacity_tokens", "block_size", "policy"} for c in full)


def test_the_vllm_peer_rows_join_where_vllm_is_installed(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """With the peer installed, each grid gains vLLM rows at the LRU default points (3M,
    50M) at each of its block sizes, the version a parameter; the rest is unchanged."""
    monkeypatch.setattr(tc, "_peer_version", lambda: None)
    without = {False: tc.capacity_cases(False), True: tc.capacity_cases(True)}
    monkeypatch.setattr(tc, "_peer_version", lambda: "0.32.0")
    for full, plain in without.items():
        cases = tc.capacity_cases(full)
        peer = [c for c in cases if c["policy"] == "vllm"]
        assert [c for c in cases if c["policy"] != "vllm"] == plain
        sizes = (512, 16) if full else (512,)
        assert sorted((c["block_size"], c["capacity_tokens"]) for c in peer) == sorted(
            (bs, cap) for bs in sizes for cap in (3_000_000, 50_000_000)
        )
        assert all(c["version"] == "0.32.0" for c in peer)


def _metrics(case: dict) -> dict[str, float]:
    return {m.metric: m.value for m in get_sweep(SWEEP).measure(case, None)}  # type: ignore[arg-type]


def test_rows_on_the_shipped_trace() -> None:
    case = {"trace": tc.TRACE, "block_size": 512, "policy": "optimal"}
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


def _frame(at_3m: float, at_50m: float) -> pd.DataFrame:
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
            }
        )
    return pd.DataFrame(rows)


def _verdict(frame: pd.DataFrame) -> claims.Verdict:
    return dict((c.key, v) for c, v in claims.evaluate(frame))["mooncake-capacity"]


def test_the_capacity_claim_is_judged_on_both_points() -> None:
    assert _verdict(_frame(0.38, 0.99)).verdict == claims.HOLDS
    assert _verdict(_frame(0.55, 0.99)).verdict == claims.FAILS  # 3M past half
    assert _verdict(_frame(0.38, 0.80)).verdict == claims.FAILS  # 50M short of nearly all
    assert "38.0%" in _verdict(_frame(0.38, 0.99)).measured
    assert _verdict(_frame(0.38, 0.99).iloc[:1]).verdict == claims.NOT_MEASURED


def test_the_sweep_page_draws_the_capacity_curve(tmp_path: Path) -> None:
    with ResultWriter("c", tmp_path) as w:
        for policy, scale in (("lru", 0.5), ("optimal", 0.9)):
            for cap in (10_000, 3_000_000, 50_000_000, 10**9):
                case = {"trace": tc.TRACE, "capacity_tokens": cap, "block_size": 512}
                case["policy"] = policy
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
    one = [c for c in one if c["policy"] == "optimal"]
    small = dataclasses.replace(get_sweep(SWEEP), cases=lambda full: one)
    monkeypatch.setitem(registry._REGISTRY, SWEEP, small)
    res = run_bench([SWEEP], out_dir=tmp_path, run_id="t", progress=False)
    assert not res.failures and res.measured == 1
    rows = {r["metric"]: r for r in load_run(res.path).rows if r["suite"] == SWEEP}
    assert {"hit_rate", "hit_rate_ceiling", "fraction_of_ceiling"} <= set(rows)
    assert rows["hit_rate"]["case"] == one[0]
    assert 0.9 < rows["fraction_of_ceiling"]["value"] <= 1.0


def test_the_capacity_figure_draws_the_ceiling_once_on_decades(tmp_path: Path) -> None:
    """The ceiling (the same for every policy) is one series named by its metric; each
    policy's hit rate is its own; the x axis is log 10 (capacities are decades)."""
    from kvbench.reports import figures

    with ResultWriter("c", tmp_path) as w:
        for policy in ("lru", "optimal", "vllm"):
            for cap in (10_000, 3_000_000, 10**9):
                case = {"trace": tc.TRACE, "capacity_tokens": cap, "block_size": 512}
                case["policy"] = policy
                if policy == "vllm":
                    case["version"] = "0.32.0"
                w.record(SWEEP, case, "hit_rate", 0.1, "fraction")
                w.record(SWEEP, case, "hit_rate_ceiling", 0.37, "fraction")
    (run,) = load_runs(["c"], tmp_path)
    frame = run.frame()
    (spec,) = [s for s in figures.specs_for(SWEEP) if s.fixed.get("block_size") == 512]
    assert spec.logx_base == 10
    sub = figures._select(figures._suite_rows(frame, spec), spec)
    ceiling = sub[sub["metric"] == "hit_rate_ceiling"]
    assert sorted(ceiling["capacity_tokens"]) == [10_000, 3_000_000, 10**9]
    assert ceiling["policy"].isna().all() and (ceiling["block_size"] == 512).all()
    assert sorted(sub[sub["metric"] == "hit_rate"]["policy"].unique()) == ["lru", "optimal", "vllm"]
    svg = figures.render(frame, spec)
    assert svg is not None and svg.startswith("<svg")


def test_sibling_passes_in_workers_give_the_inline_passes_hits(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The first replayed case of a block size starts the other policy's pass in a
    worker; every capacity's hits equal a direct `replay` of that cache (on a slice of
    the trace, the worker run in-process so the slice reaches it)."""
    from concurrent.futures import Future

    from kvbench.paged.hitrate import replay
    from kvbench.workloads.trace import Trace

    small = Trace(shipped_trace(tc.TRACE).requests[:120])
    monkeypatch.setattr(tc, "shipped_trace", lambda name: small)
    monkeypatch.setenv("KVBENCH_REPLAY_WORKERS", "1")
    submitted: list[tuple] = []

    class InProcess:
        def submit(self, fn, *args):  # type: ignore[no-untyped-def]
            submitted.append(args)
            done: Future = Future()
            done.set_result(fn(*args))
            return done

    monkeypatch.setattr(tc, "_make_pool", lambda workers: InProcess())
    monkeypatch.setattr(tc, "_POOL", [])
    monkeypatch.setattr(
        tc,
        "_accesses",
        functools.lru_cache(maxsize=2)(lambda trace, bs: po.block_accesses(small, bs)),
    )
    monkeypatch.setattr(tc, "_ceiling", lambda trace, bs: 0)
    monkeypatch.setattr(
        tc, "_footprint", lambda trace, bs: po.block_accesses(small, bs).footprint_blocks()
    )
    monkeypatch.setattr(tc.os, "cpu_count", lambda: 2)
    tc.capacity_cases(full=True)
    fp = po.block_accesses(small, 16).footprint_blocks()
    caps = (10_000, 1_000_000, 1_600_000)
    for policy in ("lru", "lfu"):
        monkeypatch.setitem(tc._PLAN, (tc.TRACE, 16, policy), caps)
    got = {
        (p, c): tc.hit_tokens({"trace": tc.TRACE, "capacity_tokens": c, "block_size": 16,
                               "policy": p})[0]
        for p in ("lru", "lfu") for c in caps
    }  # fmt: skip
    # lru ran here first; lfu's pass and the bounds below the footprint in the "worker"
    assert [(a[2], a[3]) for a in submitted] == [
        ("lfu", caps),
        *(("optimal", (c,)) for c in tc.CAPACITIES if c // 16 < fp),
    ]
    for (p, c), hits in got.items():
        assert hits == replay(small, c, 16, p, pool_limit=fp).hit_tokens, (p, c)
    for c in caps:
        bound = tc.hit_tokens({"trace": tc.TRACE, "capacity_tokens": c, "block_size": 16,
                               "policy": "optimal"})[0]  # fmt: skip
        assert bound == po.belady_hit_tokens(po.block_accesses(small, 16), c)
        assert bound >= got[("lru", c)]
    assert all(hits > 0 for hits in got.values())
