"""Peer sweeps and the peers page, without vLLM: the sweeps register (not in the default
run), a tiny case of each kvbench row measures what it says, a plug-in peer gets a ratio
against kvbench measured in the same process, a peer that computes the wrong attention
is refused instead of timed, a peer that is not installed is left out with a logged
reason, and the site's peers page shows peers side by side from synthetic rows (and says
how to produce them when there are none)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from kvbench.reports.site import build_site
from kvbench.reports.store.reader import load_run, load_runs
from kvbench.reports.store.writer import ResultWriter
from kvbench.suites.bench import catalog  # noqa: F401  (registers the sweeps)
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.harness import TimingConfig
from kvbench.suites.bench.registry import get_sweep, select
from kvbench.suites.bench.runner import run_bench
from kvbench.suites.bench.sweeps import peers as sweeps
from kvbench.suites.peers import base, registry
from kvbench.suites.peers.kvbench_adapter import KVBenchAllocator, KVBenchAttention
from kvbench.workloads.errors import KVBenchError

PEER_SWEEPS = ("peers.pool_ops", "peers.trace_replay", "peers.cpu_decode")
#: every peers.* sweep, in registration order (scheduler_speed: vLLM's Scheduler loop
#: against kvbench's vllm-v1 engine; no impl parameter, both sides in every case)
ALL_PEER_SWEEPS = (*PEER_SWEEPS, "peers.scheduler_speed")
FAST = TimingConfig(warmup=0, repeats=2, min_sample_s=0.0)


def ctx() -> BenchContext:
    return BenchContext(torch.device("cpu"), FAST)


def by_metric(ms) -> dict[str, float]:
    return {m.metric: m.value for m in ms}


# ---------------------------------------------------------------- fake peers
class PluginAllocator(KVBenchAllocator):
    name = "plugin"


class PluginAttention(KVBenchAttention):
    name = "plugatt"


class WrongAttention(KVBenchAttention):
    """kvbench's attention with its output scaled: a peer that computes the wrong thing."""

    name = "wrong"

    def decode_fn(self, cache, query, block_tables, seq_lens, scale):
        run = super().decode_fn(cache, query, block_tables, seq_lens, scale)
        return lambda: run() * 1.01


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register an allocator plug-in, a wrong attention plug-in, and make vLLM look absent
    (whether or not it is installed here)."""
    real = registry._builtin_specs

    def specs():
        out = [s for s in real() if s.name != "vllm"]
        out.append(
            base.PeerSpec(
                "vllm",
                allocator=lambda n, b: None,
                probe=lambda: "vLLM is not installed here (test)",
            )
        )
        out.append(base.PeerSpec("plugin", allocator=PluginAllocator, version=lambda: "9.9"))
        out.append(base.PeerSpec("wrong", attention=WrongAttention))
        out.append(base.PeerSpec("plugatt", attention=PluginAttention))
        return out

    monkeypatch.setattr(registry, "_builtin_specs", specs)
    monkeypatch.setattr(sweeps, "_reported", set())


# ---------------------------------------------------------------- sweeps
def test_peer_sweeps_register_outside_the_default_run() -> None:
    for name in ALL_PEER_SWEEPS:
        sw = get_sweep(name)
        assert not sw.in_default and "peers" in sw.tags
    assert [s.name for s in select(["peers."])] == list(ALL_PEER_SWEEPS)
    assert not {s.name for s in select(None, full=False)} & set(ALL_PEER_SWEEPS)
    for name in PEER_SWEEPS:  # kvbench is always in the grid, first among its peers
        impls = [c["impl"] for c in get_sweep(name).cases(False)]
        assert "kvbench" in impls
        assert impls.index("kvbench") < min(
            (i for i, n in enumerate(impls) if n not in ("kvbench", "sdpa_contiguous")),
            default=len(impls),
        )
    full = [c["requests"] for c in get_sweep("peers.trace_replay").cases(True)]
    assert 100_000 in full and 5_000 in full


def test_uninstalled_peer_is_left_out_with_a_logged_reason(
    plugins: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="kvbench.suites.bench.sweeps.peers"):
        impls = {c["impl"] for c in get_sweep("peers.pool_ops").cases(False)}
    assert impls == {"kvbench", "plugin"}
    assert "vllm left out" in caplog.text and "not installed here (test)" in caplog.text
    versions = {c["impl"]: c["version"] for c in get_sweep("peers.pool_ops").cases(False)}
    assert versions["plugin"] == "9.9"


def test_paired_timing_alternates_and_ratios_pair_repeats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fake clock: 'slow' costs 3 ticks a call, 'fast' 1, so every paired ratio is 3;
    the order of calls alternates repeat by repeat."""
    now = [0.0]
    calls: list[str] = []

    def make(name: str, cost: float):
        def fn() -> None:
            calls.append(name)
            now[0] += cost

        return fn

    monkeypatch.setattr(sweeps.time, "perf_counter", lambda: now[0])
    timing = TimingConfig(warmup=1, repeats=4, min_sample_s=0.0)
    samples = sweeps._paired_times({"slow": make("slow", 3.0), "fast": make("fast", 1.0)}, timing)
    assert samples == {"slow": [3.0] * 4, "fast": [1.0] * 4}
    assert sweeps._paired_ratio(samples, "slow", "fast") == 3.0
    timed = calls[4:]  # after 1 warm-up + 1 calibration call each
    assert timed == ["slow", "fast", "fast", "slow", "slow", "fast", "fast", "slow"]


def test_pool_ops_rows_and_paired_ratio(plugins: None) -> None:
    c = ctx()
    case = {"impl": "plugin", "version": "9.9", "ops": 300, "block_size": 4, "num_blocks": 512}
    got = by_metric(sweeps.pool_ops(case, c))  # the plug-in and kvbench, alternately
    assert got["ops_per_s"] == pytest.approx(300 / got["time"])
    assert got["time_kvbench"] > 0 and got["ratio_vs_kvbench"] > 0
    mine = by_metric(sweeps.pool_ops({**case, "impl": "kvbench", "version": "x"}, c))
    assert "ratio_vs_kvbench" not in mine and "time_kvbench" not in mine
    assert mine["hit_tokens"] == got["hit_tokens"] > 0  # same work, same prefix hits


def test_trace_replay_rows_match_a_prefix_oracle() -> None:
    from kvbench.suites.peers.workloads import TRACE_SYSTEM_LEN, iter_trace

    n = 60
    seen: set[tuple[int, ...]] = set()
    expect = 0  # without eviction a request hits exactly its system prompt if seen before
    for prompt, _ in iter_trace(n, 0):
        system = tuple(prompt[:TRACE_SYSTEM_LEN])
        expect += TRACE_SYSTEM_LEN if system in seen else 0
        seen.add(system)
    case = {"impl": "kvbench", "version": "x", "requests": n, "window": 8, "block_size": 16}
    roomy = by_metric(sweeps.trace_replay({**case, "num_blocks": 4000}, ctx()))
    assert roomy["time"] > 0 and roomy["requests_per_s"] == pytest.approx(n / roomy["time"])
    assert roomy["hit_tokens"] == expect > 0
    assert roomy["capacity_retries"] == 0
    # 40 blocks cannot hold 8 requests of ~13 blocks: admissions free the oldest for room,
    # and evicted prefixes cost hits
    tight = by_metric(sweeps.trace_replay({**case, "num_blocks": 40}, ctx()))
    assert tight["capacity_retries"] > 0 and tight["hit_tokens"] <= expect


def decode_case(impl: str, **kw) -> dict:
    case = {
        "impl": impl,
        "batch": 2,
        "context": 40,
        "dtype": "float32",
        "num_q_heads": 8,
        "num_kv_heads": 2,
        "head_dim": 64,
    }
    if impl != "sdpa_contiguous":
        case.update(version="x", block_size=16)
    case.update(kw)
    return case


def test_cpu_decode_rows_agree_with_sdpa() -> None:
    c = ctx()
    sdpa_rows = {m.metric: m for m in sweeps.cpu_decode(decode_case("sdpa_contiguous"), c)}
    got_rows = {m.metric: m for m in sweeps.cpu_decode(decode_case("kvbench"), c)}
    sdpa = {k: m.value for k, m in sdpa_rows.items()}
    got = {k: m.value for k, m in got_rows.items()}
    assert sdpa["time"] > 0 and "ratio_vs_sdpa" not in sdpa
    assert got["rel_diff_vs_sdpa"] <= 1e-5
    assert got["time_sdpa"] > 0 and got["ratio_vs_sdpa"] > 0
    kv_bytes = 2 * 2 * 40 * 2 * 64 * 4
    assert got["kv_bandwidth"] == pytest.approx(kv_bytes / got["time"])
    assert "ratio_vs_kvbench" not in got
    # both rows carry their fraction of a 64 MiB copy timed in the same repeats: a median
    # of per-repeat fractions, so within what the repeats' extremes allow
    for rows in (sdpa_rows, got_rows):
        t, copy = rows["time"].stats, rows["copy_time_paired"].stats
        moved = rows["copy_peak_paired"].value * rows["copy_time_paired"].value
        assert moved == pytest.approx(2 * 64 * 2**20)
        lo = (kv_bytes / t["max"]) / (moved / copy["min"])
        hi = (kv_bytes / t["min"]) / (moved / copy["max"])
        assert 0 < lo <= rows["copy_peak_fraction"].value <= hi


def test_cpu_decode_default_grid_holds_the_goal_shapes() -> None:
    cases = sweeps._decode_cases(full=False)
    shapes = {(c["batch"], c["context"]) for c in cases}
    assert {(8, 4096), (32, 1024), (8, 128)} <= shapes
    assert {c["block_size"] for c in cases if "block_size" in c} == {16, 32}


def test_cpu_decode_peer_case_times_kvbench_and_sdpa_beside_it(plugins: None) -> None:
    got = by_metric(sweeps.cpu_decode(decode_case("plugatt"), ctx()))
    assert got["rel_diff_vs_sdpa"] <= 1e-5
    for metric in ("time", "time_sdpa", "time_kvbench", "ratio_vs_sdpa", "ratio_vs_kvbench"):
        assert got[metric] > 0, metric


def test_cpu_decode_refuses_a_wrong_peer(plugins: None) -> None:
    with pytest.raises(KVBenchError, match="disagrees with SDPA"):
        sweeps.cpu_decode(decode_case("wrong"), ctx())


def test_bench_runs_the_kvbench_pool_rows(tmp_path: Path) -> None:
    res = run_bench(
        ["peers.pool_ops"],
        out_dir=tmp_path,
        run_id="p",
        progress=False,
        timing=TimingConfig(warmup=0, repeats=1),
    )
    assert not res.failures and res.measured >= 1
    run = load_run(res.path)
    rows = [r for r in run.rows if r["suite"] == "peers.pool_ops" and r["metric"] == "ops_per_s"]
    assert any(r["case"]["impl"] == "kvbench" and r["value"] > 0 for r in rows)


# ---------------------------------------------------------------- the peers page
EVIL = '<script>alert("x")</script>'


def write_peer_rows(folder: Path, run_id: str, peers: tuple[str, ...]) -> None:
    """Synthetic rows shaped like the peer sweeps' (made-up numbers, easy to spot)."""
    with ResultWriter(run_id, folder) as w:
        w.record("capacity.footprint", {"model": "m"}, "bytes_per_token", 1.0, "B")
        for i, impl in enumerate(peers):
            v = {"impl": impl, "version": f"v{i}"}
            pool = {**v, "ops": 1000, "block_size": 16, "num_blocks": 64}
            w.record("peers.pool_ops", pool, "time", 0.5 * (i + 1), "s")
            w.record("peers.pool_ops", pool, "ops_per_s", 2000 / (i + 1), "ops/s")
            w.record("peers.pool_ops", pool, "hit_tokens", 4321, "tokens")
            trace = {**v, "requests": 100, "window": 8, "block_size": 16, "num_blocks": 64}
            w.record("peers.trace_replay", trace, "time", 3.0 * (i + 1), "s")
            w.record("peers.trace_replay", trace, "requests_per_s", 33.0, "requests/s")
            w.record("peers.trace_replay", trace, "hit_tokens", 777, "tokens")
            if i:
                w.record("peers.pool_ops", pool, "ratio_vs_kvbench", 1.75, "ratio")
                w.record("peers.trace_replay", trace, "ratio_vs_kvbench", 1.25, "ratio")
        common = {"dtype": "float32", "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128}
        for ctx_len in (512, 2048):
            sd = {"impl": "sdpa_contiguous", "batch": 8, "context": ctx_len, **common}
            w.record("peers.cpu_decode", sd, "time", 0.010, "s")
            for bs in (16, 32):
                for i, impl in enumerate(peers):
                    case = {"impl": impl, "version": f"v{i}", "batch": 8, "context": ctx_len,
                            "block_size": bs, **common}  # fmt: skip
                    w.record("peers.cpu_decode", case, "time", 0.02 / (i + 1), "s")
                    w.record("peers.cpu_decode", case, "ratio_vs_sdpa", 2.0 / (i + 1), "ratio")
                    w.record("peers.cpu_decode", case, "copy_peak_fraction", 0.625, "fraction")
                    if i:
                        w.record("peers.cpu_decode", case, "ratio_vs_kvbench", 0.5, "ratio")
        lone = {"impl": "kvbench", "version": "v0", "batch": 32, "context": 1024,
                "block_size": 16, **common}  # fmt: skip
        w.record("peers.cpu_decode", lone, "time", 0.04, "s")


def page(site: Path) -> str:
    return (site / "peers.html").read_text(encoding="utf-8")


def test_peers_page_puts_peers_side_by_side(tmp_path: Path) -> None:
    write_peer_rows(tmp_path, "r", ("kvbench", "vllm", EVIL))
    out = tmp_path / "site"
    build_site(load_runs(["r"], tmp_path), out)
    html = page(out)
    assert 'href="peers.html"' in (out / "index.html").read_text(encoding="utf-8")
    for text in (
        "vllm ops/s",
        "2,000",  # kvbench ops/s
        "1,000",  # vllm ops/s
        "1.75×",  # pool ops ratio, as emitted by the bench
        "1.25×",  # trace replay ratio
        "vllm time / SDPA",
        "SDPA contiguous time",
        "0.5×",  # decode vllm / kvbench
        "kvbench of copy peak",
        "62.5%",  # decode fraction of the paired copy peak
        "v1",  # vllm's version
        "null block",
        "de-duplicates",
    ):
        assert text in html, text
    assert EVIL not in html and "&lt;script&gt;" in html
    assert "No peer rows" not in html and "Only kvbench" not in html
    figs = list((out / "figures").glob("peers-*.svg"))
    assert len(figs) >= 4  # pool ops, trace replay, decode time and ratio (batch 8)
    assert "(batch 8)" in html
    assert "(batch 32)" not in html  # one context length: its table row, no lone points
    assert "<td>32</td><td>1,024</td>" in html
    for f in figs:
        assert f.read_text(encoding="utf-8").startswith("<svg")
        assert EVIL not in f.read_text(encoding="utf-8")
    # each decode row: kvbench 20 ms, peer 10 ms, SDPA 10 ms at both block sizes
    rows = [r for r in html.split("<tr>") if "<td>2,048</td><td>32</td>" in r]
    assert len(rows) == 1 and "20 ms" in rows[0] and "10 ms" in rows[0]


def test_peers_page_with_kvbench_alone_asks_for_vllm(tmp_path: Path) -> None:
    write_peer_rows(tmp_path, "k", ("kvbench",))
    out = tmp_path / "site"
    build_site(load_runs(["k"], tmp_path), out)
    html = page(out)
    assert "Only kvbench" in html and "nox -s peers" in html
    assert "kvbench ops/s" in html and "vllm ops/s" not in html


def test_peers_page_without_peer_rows_says_how_to_make_them(tmp_path: Path) -> None:
    with ResultWriter("e", tmp_path) as w:
        w.record("capacity.footprint", {"model": "m"}, "bytes_per_token", 1.0, "B")
    out = tmp_path / "site"
    build_site(load_runs(["e"], tmp_path), out)
    html = page(out)
    assert "No peer rows" in html
    assert "nox -s peers" in html and "kvbench bench --only peers." in html
    assert not list((out / "figures").glob("peers-*.svg"))


def test_peers_page_tables_static_costs_side_by_side(tmp_path: Path) -> None:
    """`kvbench kernels --peers` rows (suite kernels.aot.peers; synthetic numbers here)
    become one table: kvbench first in each (shape, arch) group, units in the header."""
    with ResultWriter("s", tmp_path) as w:
        for impl, variant, kernel, regs in (
            ("vllm", "decode stage 1 (grouped)", "vllm.fwd_grouped_kernel_stage1", 72),
            ("kvbench", "split decode", "paged_decode", 71),
        ):
            case = {"impl": impl, "role": "decode", "variant": variant, "kernel": kernel,
                    "arch": "sm_90", "dtype": "fp16", "head_dim": 128, "block_size": 16}  # fmt: skip
            for metric, value, unit in (
                ("registers", regs, "regs/thread"),
                ("spills", 0, "B"),
                ("shared_bytes", 12800, "B"),
                ("sass_instructions", 784, "instr"),
            ):
                w.record("kernels.aot.peers", case, metric, value, unit)
    out = tmp_path / "site"
    build_site(load_runs(["s"], tmp_path), out)
    html = page(out)
    assert "Static cost of the GPU kernels" in html and "regs/thread" in html
    assert html.index("paged_decode") < html.index("vllm.fwd_grouped_kernel_stage1")
    assert "any (run time)" in html  # kvbench's decode takes the block size at run time


def test_interpreted_peers_stay_out_of_timed_sweeps() -> None:
    """Peers declared `timed=False` (vLLM's Triton kernels and FlexAttention, interpreted
    or eager on CPU) are never planned into the timed decode sweep."""

    untimed = {n for n in registry.attention_names() if not registry.is_timed(n)}
    assert {"vllm-triton-unified", "vllm-triton-decode", "torch-flex-paged"} <= untimed
    impls = {c["impl"] for c in get_sweep("peers.cpu_decode").cases(False)}
    assert not impls & untimed


def test_scheduler_speed_mooncake_slice_is_the_trace_all_at_once() -> None:
    """The Mooncake case serves the first requests of the conversation trace with prompts
    <= 16k tokens, their outputs uncapped, every one arriving at 0 (vLLM's loop adds them
    all before its first step); the ShareGPT case is the system-prompt workload."""
    from kvbench.suites.bench.sweeps import scheduler_speed as speed
    from kvbench.suites.conformance.peer_vllm_scheduler import TRACES_DIR
    from kvbench.workloads.trace_import import read_mooncake

    share = speed._trace({"trace": "sharegpt", "requests": 7}, seed=3)
    assert len(share.requests) == 7
    with pytest.raises(KVBenchError, match="'sharegtp'"):
        speed._trace({"trace": "sharegtp", "requests": 7}, seed=3)
    if not speed._mooncake_present():
        pytest.skip(f"the Mooncake conversation trace is not under {TRACES_DIR}")
    moon = speed._trace({"trace": "mooncake", "requests": 5}, seed=0)
    whole = [
        r
        for r in read_mooncake(f"{TRACES_DIR}/mooncake_conversation_trace.jsonl").requests
        if r.prompt_len <= 16_384
    ][:5]
    assert [r.arrival for r in moon.requests] == [0.0] * 5
    assert [r.output_len for r in moon.requests] == [r.output_len for r in whole]
    assert [r.prompt_len for r in moon.requests] == [r.prompt_len for r in whole]
    held: dict[str, object] = {}
    first = speed._trace({"trace": "mooncake", "requests": 5}, seed=0, held=held)
    assert first.requests == moon.requests
    assert speed._trace({"trace": "mooncake", "requests": 5}, seed=0, held=held) is first
