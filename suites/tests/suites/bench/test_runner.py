"""The bench runner: sweep registry, sharding, resume after kill -9, failures, and the
sweeps' measurements against independent arithmetic."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from kvbench.reports.provenance import MEASURED
from kvbench.reports.store.frame import to_frame
from kvbench.reports.store.reader import load_run
from kvbench.suites.bench import (
    catalog,  # noqa: F401  (registers the sweeps)
    registry,
)
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.harness import TimingConfig, summarize, time_cpu
from kvbench.suites.bench.runner import DONE_METRIC, Shard, done_case_keys, plan, run_bench
from kvbench.suites.cli import main as kvbench
from kvbench.workloads import capacity as cap
from kvbench.workloads.errors import ConfigError

FAST = TimingConfig(warmup=1, repeats=3, min_sample_s=0.0)


def _ctx() -> BenchContext:
    return BenchContext(torch.device("cpu"), FAST)


# ----------------------------------------------------------------- a test-only sweep

_calls: list[int] = []


def _toy_cases(full: bool) -> list[dict]:
    return [{"i": i} for i in range(12 if full else 6)]


@registry.sweep("test.toy", "squares (test only)", _toy_cases, produced=(MEASURED,))
def _toy(case: dict, ctx: BenchContext) -> list[registry.Measurement]:
    _calls.append(case["i"])
    if case["i"] == 4 and os.environ.get("KVBENCH_TOY_FAIL"):
        raise RuntimeError("case 4 broke")
    return [registry.Measurement("square", case["i"] ** 2, "")]


# ----------------------------------------------------------------- shards and plans


@pytest.mark.parametrize("spec", ["3/2", "0/2", "1/0", "a/b", "2", "-1/3", ""])
def test_bad_shard_specs_are_refused(spec: str) -> None:
    with pytest.raises(ConfigError, match="shard"):
        Shard.parse(spec)


def test_bad_shard_exits_2_with_one_line(capsys: pytest.CaptureFixture) -> None:
    assert kvbench(["bench", "--shard", "3/2", "--only", "test.toy"]) == 2
    err = capsys.readouterr().err
    assert "3/2" in err and "Traceback" not in err


def test_unknown_sweep_exits_2_naming_it(capsys: pytest.CaptureFixture) -> None:
    assert kvbench(["bench", "--only", "no.such.sweep", "--list"]) == 2
    err = capsys.readouterr().err
    assert "no.such.sweep" in err and "capacity.footprint" in err


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_shards_partition_the_plan(n: int) -> None:
    names = ["capacity.footprint", "capacity.concurrency", "test.toy"]
    whole = [pc.key for pc in plan(names).cases]
    parts = [[pc.key for pc in plan(names, shard=Shard(k, n)).cases] for k in range(1, n + 1)]
    assert sorted(k for p in parts for k in p) == sorted(whole)
    assert len(set(whole)) == len(whole)


def test_prefix_selection_and_full_grid() -> None:
    chosen = [s.name for s in registry.select(["capacity."])]
    assert chosen and all(n.startswith("capacity.") for n in chosen)
    assert len(plan(["test.toy"], full=True).cases) == 12
    assert len(plan(["test.toy"]).cases) == 6


# ----------------------------------------------------------------- running and resuming


def test_run_appends_every_case_with_a_done_marker(tmp_path: Path) -> None:
    res = run_bench(["test.toy"], out_dir=tmp_path, run_id="r", progress=False, timing=FAST)
    assert res.measured == 6 and not res.failures
    run = load_run(tmp_path / "r.jsonl")
    squares = {r["case"]["i"]: r["value"] for r in run.rows if r["metric"] == "square"}
    assert squares == {i: i * i for i in range(6)}
    assert sum(r["metric"] == DONE_METRIC for r in run.rows) == 6
    assert run.header["bench"]["descriptions"]["test.toy"] == "squares (test only)"
    assert run.header["bench"]["produced"]["test.toy"] == [MEASURED]
    again = run_bench(["test.toy"], resume="r", out_dir=tmp_path, progress=False)
    assert (again.measured, again.skipped_done) == (0, 6)


def test_a_failing_case_is_reported_and_retried_on_resume(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("KVBENCH_TOY_FAIL", "1")
    res = run_bench(["test.toy"], out_dir=tmp_path, run_id="f", progress=False)
    assert res.measured == 5 and len(res.failures) == 1 and "case 4 broke" in res.failures[0][1]
    monkeypatch.delenv("KVBENCH_TOY_FAIL")
    _calls.clear()
    res = run_bench(["test.toy"], resume="f", out_dir=tmp_path, progress=False)
    assert res.measured == 1 and _calls == [4]
    assert len(done_case_keys(tmp_path / "f.jsonl")) == 6


def test_kill_9_mid_run_then_resume_finishes(tmp_path: Path) -> None:
    """A bench killed with SIGKILL keeps its finished cases; --resume measures the rest."""
    script = textwrap.dedent(
        f"""
        import sys, time
        from kvbench.suites.bench import registry
        from kvbench.suites.bench.runner import run_bench

        def cases(full):
            return [{{"i": i}} for i in range(40)]

        @registry.sweep("test.slow", "slow squares", cases, produced=("measured here",))
        def slow(case, ctx):
            time.sleep(0.05)
            return [registry.Measurement("square", case["i"] ** 2, ""),
                    registry.Measurement("cube", case["i"] ** 3, "")]

        run_bench(["test.slow"], out_dir={str(tmp_path)!r}, run_id="k", progress=False)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script])
    path = tmp_path / "k.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(DONE_METRIC.encode()) >= 8:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = load_run(path)
    done_before = done_case_keys(path)
    assert 8 <= len(done_before) < 40

    @registry.sweep(
        "test.slow",
        "slow squares",
        lambda full: [{"i": i} for i in range(40)],
        produced=(MEASURED,),
    )
    def slow(case: dict, ctx: BenchContext) -> list[registry.Measurement]:
        return [
            registry.Measurement("square", case["i"] ** 2, ""),
            registry.Measurement("cube", case["i"] ** 3, ""),
        ]

    try:
        res = run_bench(["test.slow"], resume=str(path), progress=False)
    finally:
        registry._REGISTRY.pop("test.slow", None)
    assert res.skipped_done == len(done_before)
    assert res.measured == 40 - len(done_before)
    after = load_run(path)
    assert after.rows[: len(before.rows)] == before.rows  # nothing measured was lost
    assert len(done_case_keys(path)) == 40
    frame = to_frame([after])
    from kvbench.reports.tables import latest

    cubes = latest(frame)[lambda f: f.metric == "cube"].set_index("i")["value"]
    assert {int(i): v for i, v in cubes.items()} == {i: i**3 for i in range(40)}


def test_shard_files_merge_into_the_whole_run(tmp_path: Path) -> None:
    for k in (1, 2, 3):
        run_bench(["test.toy"], shard=Shard(k, 3), out_dir=tmp_path, run_id=f"s{k}", progress=False)
    assert kvbench(["merge", "s1", "s2", "s3", "--into", "all", "--dir", str(tmp_path)]) == 0
    merged = load_run(tmp_path / "all.jsonl")
    assert sorted(r["case"]["i"] for r in merged.rows if r["metric"] == "square") == list(range(6))


# ----------------------------------------------------------------- harness


def test_harness_statistics_are_ordered_and_positive() -> None:
    stats = time_cpu(lambda: sum(range(1000)), TimingConfig(warmup=1, repeats=7))
    assert stats["n"] == 7
    assert 0 < stats["min"] <= stats["q1"] <= stats["median"] <= stats["q3"] <= stats["max"]
    s = summarize([3.0, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"]) == (2.0, 1.0, 3.0)


# ----------------------------------------------------------------- sweeps vs arithmetic


def test_kernel_decode_measures_the_same_attention_both_ways() -> None:
    sw = registry.get_sweep("kernel.decode")
    case = {"block_size": 16, "ctx_len": 40, "batch": 3, "dtype": "float32", "gqa": 2}
    got = {m.metric: m for m in sw.measure(case, _ctx())}
    assert got["rel_diff_vs_sdpa"].value < 1e-5
    assert got["time_paged"].value > 0 and got["time_contiguous"].value > 0
    assert (
        got["bytes_per_call"].value == 2 * 3 * 40 * 8 * 128 * 4 + 2 * 3 * 16 * 128 * 4 + 3 * 3 * 4
    )
    # the overhead is the median of paired per-repeat ratios: within the ratios' extremes
    paged, contig = got["time_paged"].stats, got["time_contiguous"].stats
    ratio = got["overhead_vs_sdpa"].value + 1
    assert paged["min"] / contig["max"] <= ratio <= paged["max"] / contig["min"]
    # paging overhead: the same kernel on the contiguous layout, paired; the same output
    layout = got["time_paged_contiguous_layout"].stats
    paging = got["paging_overhead"]
    assert paging.stats is not None and paging.stats["n"] == layout["n"]
    assert paged["min"] / layout["max"] <= paging.value + 1 <= paged["max"] / layout["min"]
    assert paging.stats["q1"] <= paging.value <= paging.stats["q3"]
    assert got["rel_diff_layouts"].value < 1e-6
    # the fraction of the copy peak is paired: a median of per-repeat fractions, each
    # (bytes / paged time) / (copy bytes / copy time), so it lies within their extremes
    copy = got["copy_time_paired"].stats
    moved = got["copy_peak_paired"].value * got["copy_time_paired"].value
    assert moved == pytest.approx(2 * 64 * 2**20)
    per_call = got["bytes_per_call"].value
    lo = (per_call / paged["max"]) / (moved / copy["min"])
    hi = (per_call / paged["min"]) / (moved / copy["max"])
    assert lo <= got["bandwidth_fraction"].value <= hi
    assert got["contiguous_form_is_gqa"].value in (0.0, 1.0)
    assert got["kernel_path_is_cpp"].value in (0.0, 1.0)
    assert got["first_call_time"].value > 0


@pytest.mark.parametrize("q_len", [5, 37], ids=["extend", "full"])
def test_kernel_prefill_matches_causal_sdpa(q_len: int) -> None:
    """Extend (causal aligned bottom right, an explicit bias) and full prefill
    (is_causal): both agree with the paged kernel, and the SDPA backend is recorded."""
    sw = registry.get_sweep("kernel.prefill")
    case = {"block_size": 8, "ctx_len": 37, "q_len": q_len, "batch": 2, "dtype": "float32"}
    got = {m.metric: m.value for m in sw.measure({**case, "gqa": 4}, _ctx())}
    assert got["rel_diff_vs_sdpa"] < 1e-5
    assert got["rel_diff_layouts"] < 1e-6 and got["time_paged_contiguous_layout"] > 0
    assert "paging_overhead" in got
    chosen = [k for k in got if k.startswith("contiguous_sdpa_backend_")]
    assert len(chosen) == 1 and got[chosen[0]] == 1.0
    # the rows name the path that ran, as decode's do (the page's provenance line reads them)
    from kvbench.kernels import cpu_paged

    assert got["kernel_path_is_cpp"] == float(cpu_paged.status().path == "cpp")
    assert got["backend_is_triton"] == 0.0 and got["first_call_time"] > 0
    # the FMA-peak rows come with the C++ path (its build holds the probe), and only then
    fma = {"fma_peak_paired", "fma_peak_fraction"}
    assert (fma <= set(got)) == (cpu_paged.status().path == "cpp")
    assert not fma & set(got) or got["fma_peak_paired"] > 0 < got["fma_peak_fraction"]


def test_fma_probe_counts_flops_and_lasts_about_as_asked() -> None:
    """FLOPs per call scale with the rounds; `lasting` scales the rounds to the time asked
    for, within [FMA_PROBE_ITERS, FMA_PROBE_MAX_ITERS]; the rows divide repeat by repeat."""
    from kvbench.kernels import cpu_paged
    from kvbench.suites.bench import harness

    if cpu_paged.status().path != "cpp":
        pytest.skip(f"no C++ CPU kernel here: {cpu_paged.status().reason}")
    probe = harness.FmaProbe(1000)
    assert probe.flops == 1000 * cpu_paged.fma_probe(1) and probe() == probe.flops
    assert harness.FmaProbe.lasting(0.0).iters == harness.FMA_PROBE_ITERS
    assert harness.FmaProbe.lasting(3600.0).iters == harness.FMA_PROBE_MAX_ITERS
    rows = {m.metric: m.value for m in probe.rows([2.0, 1.0, 4.0], [1.0, 1.0, 1.0], 10**6)}
    assert rows["fma_peak_paired"] == pytest.approx(probe.flops)  # median probe time 1 s
    # per repeat (1e6 / t) / flops: medians of 0.5, 1, 0.25 x 1e6 / flops
    assert rows["fma_peak_fraction"] == pytest.approx(0.5e6 / probe.flops)


def test_gpu_timing_reports_what_do_bench_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    """n is the number of calls do_bench timed, and every statistic comes from that one
    measurement (one do_bench call)."""
    import triton.testing

    from kvbench.suites.bench.harness import time_gpu

    calls = []

    def fake_do_bench(fn, warmup, rep, return_mode):  # type: ignore[no-untyped-def]
        calls.append(return_mode)
        return [4.0, 1.0, 2.0, 3.0, 5.0, 2.0, 3.0]  # ms

    def no_capture(fn, rep, return_mode):  # type: ignore[no-untyped-def]
        raise RuntimeError("capture refused")  # the do_bench fallback is this test's subject

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", no_capture)
    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    stats = time_gpu(lambda: None, TimingConfig(repeats=15))
    assert calls == ["all"]
    assert stats["n"] == 7 and stats["median"] == pytest.approx(3e-3)
    assert stats["min"] == pytest.approx(1e-3) and stats["max"] == pytest.approx(5e-3)
    assert stats["mean"] == pytest.approx(20 / 7 * 1e-3)


@pytest.mark.parametrize("name", ["kernel.decode", "kernel.prefill"])
def test_kernel_sweep_fails_a_case_whose_kernel_disagrees(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A paged kernel that returns a wrong answer (here: 1% off) fails the case before it is
    timed, naming the difference; the timing harness is never reached."""
    from kvbench.kernels import ops
    from kvbench.suites.bench.sweeps.kernels import KernelDisagreesError

    op = "paged_decode_attention" if name == "kernel.decode" else "paged_prefill_attention"
    real = getattr(ops, op)
    monkeypatch.setattr(ops, op, lambda *a, **kw: real(*a, **kw).mul_(1.01))
    ctx = _ctx()
    monkeypatch.setattr(ctx, "time", lambda fn: pytest.fail("a disagreeing kernel was timed"))
    case = {"block_size": 8, "ctx_len": 37, "batch": 2, "dtype": "float32", "gqa": 2}
    if name == "kernel.prefill":
        case["q_len"] = 5
    with pytest.raises(KernelDisagreesError, match=r"differs from SDPA by 0\.01"):
        list(registry.get_sweep(name).measure(case, ctx))


def test_utilization_static_matches_block_arithmetic() -> None:
    sw = registry.get_sweep("utilization.static")
    ctx = _ctx()
    from kvbench.suites.bench.sweeps.utilization import WORKLOADS, sample_lengths

    for impl in ("contiguous-max", "paged", "paged-formula"):
        case = {"workload": "seed002", "batch": 25, "impl": impl, "max_len": 2048, "block_size": 16}
        got = {m.metric: m.value for m in sw.measure(case, ctx)}
        lengths = sample_lengths("seed002", 25, ctx.rng(25, WORKLOADS.index("seed002")), 2048)
        held = (
            25 * 2048
            if impl == "contiguous-max"
            else sum(cap.slots_for_tokens(int(n), 16) for n in lengths)
        )
        assert got["held_slots"] == held
        assert got["utilization"] == pytest.approx(lengths.sum() / held)


def test_prefix_shared_prompt_counts_blocks_like_seed_000() -> None:
    sw = registry.get_sweep("prefix.shared_prompt")
    base = {"requests": 100, "prefix_tokens": 1000, "block_size": 16}
    fork = {m.metric: m.value for m in sw.measure({**base, "mode": "fork"}, _ctx())}
    assert fork["blocks_held"] == 63 and fork["blocks_without_sharing"] == 6300
    cached = {m.metric: m.value for m in sw.measure({**base, "mode": "prefix-cache"}, _ctx())}
    assert cached["blocks_held"] == 62 + 100  # full blocks shared, each keeps its last block


def test_prefix_scenarios_and_cow_savings_are_bounded_and_ordered() -> None:
    sw = registry.get_sweep("prefix.scenarios")
    none = {
        m.metric: m.value
        for m in sw.measure({"scenario": "no-shared-prefix", "block_size": 16}, _ctx())
    }
    assert none["saved_fraction"] == 0.0
    rag = {m.metric: m.value for m in sw.measure({"scenario": "rag", "block_size": 16}, _ctx())}
    assert abs(rag["saved_fraction"] - rag["token_formula_saved_fraction"]) < 0.02
    par = registry.get_sweep("cow.parallel_sampling")
    saved = [
        {
            m.metric: m.value
            for m in par.measure(
                {"workload": "alpaca", "n": n, "requests": 4, "block_size": 16}, _ctx()
            )
        }["saved_fraction"]
        for n in (2, 6)
    ]
    assert 0 < saved[0] < 1 and 0 < saved[1] < 1


def test_serving_batch_contiguous_hits_the_memory_wall_first() -> None:
    sw = registry.get_sweep("serving.batch")
    base = {
        "workload": "sharegpt",
        "requests": 120,
        "batch": 100,
        "block_size": 16,
        "profile": "a100-80gb",
        "kv_budget": "42GB",
    }
    contiguous = {
        m.metric: m.value for m in sw.measure({**base, "cache": "contiguous-max"}, _ctx())
    }
    paged = {m.metric: m.value for m in sw.measure({**base, "cache": "paged"}, _ctx())}
    # 42 GB (42,000 MiB) of 320 KiB tokens holds 134,400 slots: 65 reservations of 2,048
    assert contiguous["peak_concurrency"] == 65
    assert paged["peak_concurrency"] > 65
    assert 0 < contiguous["utilization"] < 0.5 < 0.9 < paged["utilization"] <= 1
    assert paged["tokens_per_second"] > contiguous["tokens_per_second"]


def test_serving_sharing_beams_save_more_with_width() -> None:
    """Through the engine, forked samples and beams hold fewer blocks than independent
    sequences, beams (pruned and forked every step) more so, and more with the width."""
    sw = registry.get_sweep("serving.sharing")
    saved = {}
    for sharing in ("parallel", "beam"):
        for k in (2, 4):
            case = {"workload": "alpaca", "sharing": sharing, "width": k, "requests": 6}
            saved[sharing, k] = {m.metric: m.value for m in sw.measure(case, _ctx())}[
                "saved_fraction"
            ]
    assert 0 < saved["parallel", 2] < saved["parallel", 4] < 1
    assert 0 < saved["beam", 2] < saved["beam", 4] < 1
    assert saved["beam", 2] > saved["parallel", 2]


def test_serving_sample_preemption_accounts_for_every_token() -> None:
    """Both ways of preempting samples serve every sample's tokens (modeled throughput x
    modeled time = the trace's n x output tokens) and count each preemption once as a
    swap or a recompute; with swap, keeping a family whole preempts less and serves more."""
    from kvbench.workloads.sharing import generate

    sw = registry.get_sweep("serving.sample_preemption")
    base = {"workload": "sharegpt", "requests": 120, "n": 4, "policy": "swap"}
    base |= {"kv_budget": "2GB", "profile": "a100-80gb"}
    trace = generate("sharegpt", 120, seed=0, sharing="parallel", n=4)
    tokens = sum(r.n * r.output_len for r in trace.requests)
    got = {}
    for unit in ("request", "sequence"):
        m = {x.metric: x.value for x in sw.measure({**base, "sample_preemption": unit}, _ctx())}
        assert m["tokens_per_second"] * m["modeled_seconds"] == pytest.approx(tokens)
        assert m["swaps"] + m["recomputes"] == m["preemptions"] > 0
        got[unit] = m
    assert got["request"]["preemptions"] < got["sequence"]["preemptions"]
    assert got["request"]["tokens_per_second"] > got["sequence"]["tokens_per_second"]


def test_serving_replay_measures_the_trace_and_holds_event_mode_to_token_stepping(
    monkeypatch,
) -> None:  # type: ignore[no-untyped-def]
    """The replay speed sweep: its rates are the trace's own counts over the measured
    time; a token-stepping case that preempts replays in event mode too and reports the
    speedup; and it fails, never reports, when the two modes decide differently."""
    from kvbench.suites.bench.sweeps import scheduling
    from kvbench.workloads.sharing import generate

    sw = registry.get_sweep("serving.replay")
    case = {"workload": "sharegpt", "requests": 300, "block_size": 16, "kv_budget": "1GB"}
    rows = {x.metric: x for x in sw.measure({**case, "mode": "token"}, _ctx())}
    m = {k: x.value for k, x in rows.items()}
    wall_stats = rows["replay_wall_time"].stats  # repeated: the wall time has its spread
    assert wall_stats is not None and wall_stats["n"] == scheduling.REPLAY_REPEATS
    assert wall_stats["min"] <= m["replay_wall_time"] <= wall_stats["max"]
    decode_tokens = sum(r.output_len for r in generate("sharegpt", 300, seed=0).requests)
    wall = m["replay_wall_time"]
    assert m["decode_tokens_per_second"] * wall == pytest.approx(decode_tokens)
    assert m["events_per_second"] * wall == pytest.approx(m["events"])
    assert m["preemptions"] > 0 and m["processed_step_fraction"] == 1.0
    assert m["event_mode_speedup"] > 0 and 0.9 < m["utilization"] <= 1
    event = {x.metric: x.value for x in sw.measure({**case, "mode": "event"}, _ctx())}
    assert event["events"] < m["events"] and event["preemptions"] == m["preemptions"]
    assert "event_mode_speedup" not in event

    replay = scheduling._replay

    def roomier_event_mode(case, ctx, mode):  # type: ignore[no-untyped-def]
        return replay({**case, "kv_budget": "2GB"} if mode == "event" else case, ctx, mode)

    monkeypatch.setattr(scheduling, "_replay", roomier_event_mode)
    with pytest.raises(RuntimeError, match="decided differently"):
        sw.measure({**case, "mode": "token"}, _ctx())


def test_opt_in_sweeps_run_only_when_named_or_full() -> None:
    opt_in = [s.name for s in registry.all_sweeps() if not s.in_default]
    assert "kernel.static" in opt_in
    default = {pc.sweep.name for pc in plan(None).cases}
    assert not default & set(opt_in)
    assert "kernel.static" in {s.name for s in registry.select(None, full=True)}
    assert {s.name for s in registry.select(["kernel.static"], full=False)} == {"kernel.static"}


def test_paired_fraction_divides_repeat_by_repeat_and_refuses_unpaired_samples() -> None:
    from kvbench.suites.bench.harness import paired_fraction
    from kvbench.workloads.errors import ConfigError

    # kernel: 100 B in 1, 2, 4 s; copy: 200 B in 1, 4, 2 s -> per-repeat 0.5, 1.0, 0.25
    assert paired_fraction([1.0, 2.0, 4.0], [1.0, 4.0, 2.0], 100, 200) == 0.5
    # a once-per-run division would give median(100/t) / median(200/c) = 50 / 100 = 0.5 here
    # too; a load spike that slows both sides in one repeat cancels only when paired
    assert paired_fraction([1.0, 10.0, 1.0], [1.0, 10.0, 1.0], 100, 200) == 0.5
    with pytest.raises(ConfigError, match="one copy time per kernel time"):
        paired_fraction([1.0, 2.0], [1.0], 100, 200)
    with pytest.raises(ConfigError):
        paired_fraction([], [], 100, 200)


def test_copy_probe_counts_bytes_read_and_written() -> None:
    from kvbench.suites.bench.harness import CopyProbe

    probe = CopyProbe(torch.device("cpu"), nbytes=4096)
    assert probe.bytes_moved == 2 * 4096
    probe()
    assert torch.equal(probe.dst, probe.src)
    rows = {m.metric: m for m in probe.rows([1e-6, 2e-6, 4e-6])}
    assert rows["copy_time_paired"].value == pytest.approx(2e-6)  # the median copy
    assert rows["copy_peak_paired"].value == pytest.approx(8192 / 2e-6)
    assert rows["copy_time_paired"].stats["n"] == 3
