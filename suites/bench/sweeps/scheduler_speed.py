"""peers.scheduler_speed: kvbench's vllm-v1 engine against vLLM v1's own Scheduler loop.

Both serve the same memory-only trace to the end with the same decisions (the scheduler
differential, suites/conformance/test_peers_vllm_scheduler.py, holds them equal step by
step): kvbench's ShareGPT workload (`workloads.sharing`: log-normal fits to the
PagedAttention paper's ShareGPT means, prompt + output <= 2,048) behind one shared
200-token system prompt, all arriving at once, max_num_seqs 256, 8,192 tokens a step,
160k token slots in blocks of 16 or of 32 (vLLM's CPU backend takes multiples of 32);
and, where the trace file is present, the first 300 requests of the Mooncake conversation
trace with prompts of at most 16k tokens (`mooncake_slice`: hash ids expanded to token
ids, outputs uncapped, all arriving at once) in 400k token slots, the same limits: long
prompts and few decode steps, so both sides spend most of their time per block (hashing
and indexing each one) rather than per request-step, and the ratio is far lower.
vLLM's side is its `Scheduler` driven in process with no model (add every request,
schedule, answer one token per finished prefill or decode, update, until none is left);
kvbench's side is `Engine.run` in event mode over a memory-only PagedKVCache (vLLM's
duplicate-block rule). They run alternately in one process, repeat by repeat, fresh
each time (building vLLM's scheduler is not timed).

Metrics (measured here, host seconds): time (kvbench's run), time_vllm, ratio_vllm_over_kvbench
(median of the per-repeat ratios; the spread holds every repeat's ratio), the same three
in CPU seconds of this process (cpu_time, cpu_time_vllm, cpu_ratio_vllm_over_kvbench:
on a loaded machine a run gets a varying share of a core, so wall ratios swing with the
load and CPU ratios much less), steps (both sides, equal or the case fails), load_avg
(1-minute load average at the start, from /proc/loadavg: this machine is shared). 1,000 requests by default; 10,000 as well under
--full. Skipped (left out of the grid with the reason) where vLLM is absent.
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import time
from dataclasses import replace
from typing import Any

from kvbench.reports.provenance import MEASURED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.harness import summarize
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.workloads.errors import KVBenchError
from kvbench.workloads.trace import Trace

log = logging.getLogger(__name__)


def _cases(full: bool) -> list[Case]:
    from kvbench.suites.conformance.peer_vllm_scheduler import vllm_missing

    missing = vllm_missing()
    if missing is not None:
        log.info("peers.scheduler_speed left out: %s", missing)
        return []
    sizes = (1_000, 10_000) if full else (1_000,)
    cases: list[Case] = [
        {
            "trace": "sharegpt",
            "requests": n,
            "block_size": bs,
            "num_blocks": 160_000 // bs,  # 160k token slots either way
            "max_num_seqs": 256,
            "max_batched_tokens": 8_192,
            "mode": "event",
        }
        for n in sizes
        for bs in (16, 32)
    ]
    if _mooncake_present():
        cases += [
            {
                "trace": "mooncake",
                "requests": MOONCAKE_REQUESTS,
                "block_size": bs,
                "num_blocks": 400_000 // bs,
                "max_num_seqs": 256,
                "max_batched_tokens": 8_192,
                "mode": "event",
            }
            for bs in (16, 32)
        ]
    else:
        log.info("peers.scheduler_speed: the Mooncake trace file is absent; its cases left out")
    return cases


#: Requests of the Mooncake slice (its prompts average ~6.4k tokens).
MOONCAKE_REQUESTS = 300


def _mooncake_present() -> bool:
    """Whether the Mooncake conversation trace file is where the differential reads it."""
    from kvbench.suites.conformance.peer_vllm_scheduler import TRACES_DIR

    return os.path.exists(os.path.join(TRACES_DIR, "mooncake_conversation_trace.jsonl"))


def _mooncake(n: int) -> Trace | None:
    """The first n Mooncake requests with prompts <= 16k tokens, outputs uncapped, all
    arriving at once (vLLM's loop adds every request first); None without the file."""
    from kvbench.suites.conformance.peer_vllm_scheduler import mooncake_slice

    part = mooncake_slice(0, n, max_output=1 << 30)
    if part is None:
        return None
    return Trace(tuple(replace(r, arrival=0.0) for r in part.requests))


#: The traces a case may name: "sharegpt" (the system-prompt workload), "mooncake".
TRACES = ("sharegpt", "mooncake")


def _trace(case: Case, seed: int, held: dict[str, Any] | None = None) -> Trace:
    """The case's trace: ShareGPT-like behind a 200-token system prompt, or the Mooncake
    slice (read once per run when `held`, the bench context's cache, is given: both
    block sizes replay the same slice)."""
    from kvbench.workloads.sharing import system_prompt, workload

    n = case["requests"]
    name = case.get("trace", "sharegpt")
    if name not in TRACES:
        raise KVBenchError(f"trace {name!r}: peers.scheduler_speed replays one of {TRACES}")
    if name == "sharegpt":
        w = workload("sharegpt")
        return system_prompt(n, 200, w.prompt, w.output, seed=seed)
    key = f"peers.scheduler_speed.mooncake.{n}"
    moon = held.get(key) if held is not None else None
    if moon is None:
        moon = _mooncake(n)
    if moon is None:
        from kvbench.suites.conformance.peer_vllm_scheduler import TRACES_DIR

        raise KVBenchError(
            f"the Mooncake conversation trace is not at {TRACES_DIR}/"
            "mooncake_conversation_trace.jsonl (KVBENCH_TRACES names the folder)"
        )
    if held is not None:
        held[key] = moon
    return moon


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


@sweep(
    "peers.scheduler_speed",
    "vLLM v1's Scheduler loop vs kvbench's vllm-v1 engine on the same trace (memory-only, "
    "same decisions); ratio_vllm_over_kvbench = vLLM time / kvbench time, paired",
    _cases,
    requires=("vllm",),
    tags=("peers",),
    in_default=False,
    produced=(MEASURED,),
)
def scheduler_speed(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.paged.serving.engine.sequence import Seq
    from kvbench.suites.conformance.peer_vllm_scheduler import (
        Case as Pair,
    )
    from kvbench.suites.conformance.peer_vllm_scheduler import VllmDriver, engine_for, vllm_loop

    n = case["requests"]
    trace = _trace(case, ctx.seed, ctx.cache)
    pair = Pair(
        f"speed-{case.get('trace', 'sharegpt')}-{n}",
        trace,
        case["block_size"],
        case["num_blocks"],
        case["max_num_seqs"],
        case["max_batched_tokens"],
    )
    seqs = [Seq(r, i, 0, r.prompt_ids(i)) for i, r in enumerate(trace.requests)]

    def token_of(i: int, p: int) -> int:
        return seqs[i].token(p)

    load = _load()
    kv_t: list[float] = []
    vl_t: list[float] = []
    kv_c: list[float] = []
    vl_c: list[float] = []
    steps: set[int] = set()
    repeats = 2 if n >= 10_000 else max(3, min(ctx.timing.repeats, 5))
    with tempfile.TemporaryDirectory() as folder:
        for r in range(repeats):
            for side in ("vllm", "kvbench") if r % 2 == 0 else ("kvbench", "vllm"):
                if side == "vllm":
                    drv = VllmDriver(pair, folder)
                    c0, t0 = time.process_time(), time.perf_counter()
                    steps.add(vllm_loop(drv, trace, token_of))
                    vl_t.append(time.perf_counter() - t0)
                    vl_c.append(time.process_time() - c0)
                else:
                    eng = engine_for(pair, mode=case["mode"])
                    c0, t0 = time.process_time(), time.perf_counter()
                    res = eng.run(trace)
                    kv_t.append(time.perf_counter() - t0)
                    kv_c.append(time.process_time() - c0)
                    steps.add(res.steps)
    if len(steps) != 1:
        raise KVBenchError(f"vLLM and kvbench took different step counts: {sorted(steps)}")
    ratios = [v / k for v, k in zip(vl_t, kv_t, strict=True)]
    cpu_ratios = [v / k for v, k in zip(vl_c, kv_c, strict=True)]
    return [
        Measurement("time", statistics.median(kv_t), "s", summarize(kv_t)),
        Measurement("time_vllm", statistics.median(vl_t), "s", summarize(vl_t)),
        Measurement(
            "ratio_vllm_over_kvbench", statistics.median(ratios), "ratio", summarize(ratios)
        ),
        Measurement("cpu_time", statistics.median(kv_c), "s", summarize(kv_c)),
        Measurement("cpu_time_vllm", statistics.median(vl_c), "s", summarize(vl_c)),
        Measurement(
            "cpu_ratio_vllm_over_kvbench",
            statistics.median(cpu_ratios),
            "ratio",
            summarize(cpu_ratios),
        ),
        Measurement("steps", float(steps.pop()), "steps"),
        Measurement("load_avg", load, "load"),
    ]
