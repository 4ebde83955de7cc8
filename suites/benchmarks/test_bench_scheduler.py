"""Benchmarks of the serving engine's memory-only replay (pytest-benchmark).

    replay-10k    10,000 ShareGPT-like requests, Llama-2-70B geometry, 8,400 blocks of 16
                  tokens ([PA-deep-dive]'s 42 GB pool), prefix caching on, event-driven mode
    replay-100k   the same with 100,000 requests (~33 million decode tokens); the issue's
                  goal is 20 s or less on the 2-core build machine. Marked `slow`.

Each benchmark runs once (pedantic, one round: a replay is seconds to minutes) and
attaches to extra_info: wall seconds, CPU seconds of the process (the honest figure on
a shared machine), events (decoder block-boundary / finish events,
admissions, finishes) and events per second, decode tokens and tokens per wall second,
processed versus total steps, and the simulated utilization and preemptions.
"""

from __future__ import annotations

import pytest

from kvbench.paged.cache_spec import CacheSpec
from kvbench.paged.serving.simulation import simulate
from kvbench.workloads.sharing import generate

SPEC = CacheSpec(kind="paged", model="llama-2-70b", kv_budget="42GB", block_size=16)


def _replay(benchmark, num_requests: int) -> None:
    trace = generate("sharegpt", num_requests, seed=0)
    decode_tokens = sum(r.output_len for r in trace.requests)
    result = benchmark.pedantic(
        lambda: simulate(trace, SPEC, policy="auto"), rounds=1, iterations=1
    )
    assert result.generated_tokens == decode_tokens
    assert result.utilization >= 0.96
    wall = result.wall_seconds
    benchmark.extra_info.update(
        requests=num_requests,
        blocks=SPEC.blocks(),
        wall_seconds=wall,
        cpu_seconds=result.info["cpu_seconds"],
        events=result.info["events"],
        events_per_s=result.info["events"] / wall,
        decode_tokens=decode_tokens,
        decode_tokens_per_s=decode_tokens / wall,
        steps=result.steps,
        processed_steps=result.processed_steps,
        utilization=result.utilization,
        preemptions=result.preemptions,
    )


def test_bench_replay_10k(benchmark) -> None:
    _replay(benchmark, 10_000)


@pytest.mark.slow
def test_bench_replay_100k(benchmark) -> None:
    _replay(benchmark, 100_000)


@pytest.mark.slow
def test_bench_replay_mooncake_conversation(benchmark) -> None:
    """The whole Mooncake conversation trace (12,031 requests, 145M prompt tokens) at its
    own arrival times on Llama-3-70B, 8 x H100 TP8, block 16, prefix caching, event mode;
    the issue's goal: under 3 minutes on the 2-core build machine."""
    from kvbench.paged.serving.replay import prefix_hit_rate, serve_trace
    from kvbench.workloads.setups import get_setup
    from kvbench.workloads.shipped import shipped_trace

    trace = shipped_trace("mooncake-conversation")
    setup = get_setup("llama-3-70b-8xh100-tp8")
    result = benchmark.pedantic(lambda: serve_trace(trace, setup), rounds=1, iterations=1)
    assert len({r.request for r in result.records}) == len(trace)
    benchmark.extra_info.update(
        requests=len(trace),
        prompt_tokens=sum(r.prompt_len for r in trace.requests),
        wall_seconds=result.wall_seconds,
        cpu_seconds=result.info["cpu_seconds"],
        processed_steps=result.processed_steps,
        prefix_hit_rate=prefix_hit_rate(result),
        modeled_seconds=result.modeled_seconds,
    )
