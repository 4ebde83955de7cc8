"""kvbench's prediction of a vLLM engine run, and the comparison with what vLLM did.

Decisions: kvbench's engine in the vllm-v1 policy (`paged.serving.engine.v1`), memory
only (`PagedKVCache(store_kv=False)`), with the block size, the budgets and the blocks
vLLM had: vLLM's `num_gpu_blocks` less its null block (block 0 of vLLM's pool is never
handed out), prefix caching on, every request at t = 0 as vLLM's offline engine gets
them. Each step's work (decoders with the KV tokens they read, prefill chunks with the
tokens cached before them) is rebuilt from the engine's own decisions (`V1Decision`:
tokens per request, preempted requests, each admission's hit), never from vLLM's.

Times: the CPU step-time model of `paged.serving.calibration` (fixed + max(bytes /
bandwidth, FLOPs / FLOP/s), each step optionally at the host speed measured beside it),
fitted to OTHER vLLM runs' steps (`fit`); a request's TTFT is the predicted clock at the
end of the step that gives its first token, its end-to-end latency the clock at its
last, its TPOT (e2e - TTFT) / (output tokens - 1): the same definitions on vLLM's
measured steps (`latencies`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvbench.paged.serving.calibration import StepWork
from kvbench.workloads.trace import Trace


@dataclass
class Prediction:
    """kvbench's decisions for a trace: per step the tokens per request (scheduling
    order), the work, preempted ids; per request the first- and last-token steps; the
    prefix-cache counts (as vLLM's PrefixCacheStats)."""

    scheduled: list[dict[str, int]]
    work: list[StepWork]
    preempted: list[list[str]]
    first_step: dict[str, int]
    last_step: dict[str, int]
    prefix: dict[str, int] = field(default_factory=dict)


def step_work(
    scheduled: dict[str, int],
    starts: dict[str, int],
    prompt_len: dict[str, int],
    seconds: float = 0.0,
    empty_s: float = 0.0,
) -> StepWork:
    """One step's work: a request computing one token past its prompt decodes (it reads
    its context + 1 KV tokens); any other is a prefill chunk (tokens cached before, n)."""
    decoders = kv_read = 0
    chunks: list[tuple[int, int]] = []
    for rid, n in scheduled.items():
        start = starts[rid]
        if n == 1 and start >= prompt_len[rid]:
            decoders += 1
            kv_read += start + 1
        else:
            chunks.append((start, n))
    return StepWork(decoders, kv_read, tuple(chunks), seconds, empty_s)


def predict(
    trace: Trace,
    geometry,  # type: ignore[no-untyped-def]
    *,
    block_size: int,
    usable_blocks: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    long_prefill_token_threshold: int = 0,
) -> Prediction:
    """kvbench's vllm-v1 decisions for `trace` (module docstring)."""
    from kvbench.paged.cache import PagedKVCache
    from kvbench.paged.serving.engine import Engine
    from kvbench.paged.serving.engine.v1 import V1Decision
    from kvbench.paged.serving.time_model import SchedulerConfig

    cache = PagedKVCache(
        geometry, usable_blocks, block_size, enable_prefix_caching=True, store_kv=False
    )
    cfg = SchedulerConfig(
        policy="vllm-v1",
        mode="token",
        preemption="recompute",
        max_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        long_prefill_token_threshold=long_prefill_token_threshold,
    )
    engine = Engine(cache, cfg)
    decisions: list[V1Decision] = []
    assert engine.v1 is not None
    engine.v1.on_step = decisions.append
    engine.run(trace)
    prompt_len = {str(r.id): r.prompt_len for r in trace.requests}
    output_len = {str(r.id): r.output_len for r in trace.requests}
    computed: dict[str, int] = {}
    produced: dict[str, int] = {}
    out = Prediction([], [], [], {}, {})
    for k, d in enumerate(decisions):
        for rid in d.preempted:
            computed.pop(rid, None)
        starts = {rid: d.hits.get(rid, computed.get(rid, 0)) for rid in d.scheduled}
        out.scheduled.append(dict(d.scheduled))
        out.preempted.append(list(d.preempted))
        out.work.append(step_work(d.scheduled, starts, prompt_len))
        for rid, n in d.scheduled.items():
            computed[rid] = starts[rid] + n
            if computed[rid] >= prompt_len[rid] + produced.get(rid, 0):
                produced[rid] = produced.get(rid, 0) + 1
                out.first_step.setdefault(rid, k)
                if produced[rid] >= output_len[rid]:
                    out.last_step[rid] = k
    s = engine.v1.stats
    out.prefix = {
        "requests": s.requests, "queries": s.queries, "hits": s.hits,
        "preempted_requests": s.preempted_requests, "preempted_queries": s.preempted_queries,
        "preempted_hits": s.preempted_hits,
    }  # fmt: skip
    return out


def latencies(
    first_step: dict[str, int],
    last_step: dict[str, int],
    clock: Sequence[float],
    output_len: dict[str, int],
) -> dict[str, np.ndarray]:
    """TTFT, TPOT and end-to-end seconds per request (arrays in sorted request order):
    `clock[k]` is the time at the end of step k, every request arrived at 0; TPOT is
    over requests with more than one output token."""
    ids = sorted(output_len)
    ttft = np.array([clock[first_step[r]] for r in ids])
    e2e = np.array([clock[last_step[r]] for r in ids])
    many = [i for i, r in enumerate(ids) if output_len[r] > 1]
    tpot = np.array([(e2e[i] - ttft[i]) / (output_len[ids[i]] - 1) for i in many])
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e}


def percentile(values: np.ndarray, q: float) -> float:
    """The q-th percentile (linear interpolation), NaN for no values."""
    return float(np.percentile(values, q)) if values.size else float("nan")


def divergent_steps(a: Sequence[dict[str, int]], b: Sequence[dict[str, int]]) -> int:
    """Steps whose scheduled tokens per request (in order) differ, plus the steps one
    run has beyond the other."""
    same = sum(list(x.items()) == list(y.items()) for x, y in zip(a, b, strict=False))
    return max(len(a), len(b)) - same
