"""serving.kv_specs: the memory a sliding window saves when the engine serves a trace
(modeled).

For each model with windows (Mistral-7B: every layer a 4096-token window; Gemma-2-9B:
local 4096-token and global layers alternating), the same model with every window
widened to full attention (`workloads.spec_capacity.as_full_attention`), and two traces,
the serving engine runs the requests over `paged.spec_serving.LayerGroupServingCache`
(one pool of equal pages, a block table per layer group, windows releasing blocks as
decoding passes them, recompute preemption) with one KV budget:

* ShareGPT-like: `workloads.sharing.generate("sharegpt", N, seed)`, every request
  under 2,048 tokens;
* long-context: a slice of the shipped Mooncake conversation trace
  (`workloads.shipped`, "mooncake-conversation"): its first N requests in arrival order
  (their prompt and output lengths; mean prompt of the default 200 is about 14k tokens).

Per (trace, model, attention) two kinds of figure, all modeled (the engine's time model
of an A100-80GB at the fitted profile, attention priced per layer group
(`paged.serving.attention_layout`): a windowed layer reads at most its window of KV per
query, so a window saves step time as well as memory):

* burst: every request arrives at t = 0: KV utilization (live / reserved slots, over
  steps), peak and mean concurrency (requests running), peak pages in use and its
  fraction of the pool, preemptions, output tokens/s over the makespan;
* sustained rate: the highest Poisson request rate (the same requests, unit-rate
  arrivals / rate, those arriving within DURATION seconds) whose mean normalized latency
  stays under 10 x the model's one-token decode step
  (`paged.serving.rate.sustained_rate`, geometric bisection to 10%; capped at
  requests / DURATION, where the trace runs out).

A window can only save memory on requests longer than it: ShareGPT-like requests never
reach 4,096 tokens, so there the windowed and full rows should agree; Mooncake's prompts
are mostly longer.
"""

from __future__ import annotations

from dataclasses import replace

from kvbench.reports.provenance import MODELED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.kv_spec import ModelKVSpec

#: The models (parameters, width, query heads: `paged.serving.spec_time.FACTS`).
MODELS = ("mistral-7b", "gemma-2-9b")
#: KV budget: what an A100-80GB leaves after the weights, rounded down (both models).
KV_BUDGET = 40 * 2**30
PROFILE = "a100-80gb"
BLOCK_SIZE = DEFAULT_BLOCK_SIZE
#: Requests per trace (default run, --full): the burst runs take them all; the rate
#: search serves those arriving within DURATION seconds (so its highest rate is
#: requests / duration).
REQUESTS = {"sharegpt": (1500, 3000), "mooncake": (200, 400)}
#: Seconds of Poisson arrivals per rate evaluation (a duration, not a count: see
#: `paged.serving.rate`).
DURATION = {"sharegpt": 45.0, "mooncake": 250.0}
#: First rate the search tries (requests/s).
START_RATE = {"sharegpt": 8.0, "mooncake": 0.5}
BOUND_FACTOR = 10.0

_TRACES: dict[tuple, object] = {}


def layout_label(model: ModelKVSpec) -> str:
    """The attention layout of a model in words, e.g. "sliding window 4096 on all 32
    layers" or "sliding window 4096 on 21 of 42 layers, full attention on 21"."""
    total = model.num_layers
    parts: dict[str, int] = {}
    for g in model.groups:
        label = g.spec.describe()
        parts[label] = parts.get(label, 0) + g.num_layers
    if len(parts) == 1:
        return f"{next(iter(parts))} on all {total} layers"
    first, *rest = parts.items()
    return f"{first[0]} on {first[1]} of {total} layers, " + ", ".join(
        f"{label} on {n}" for label, n in rest
    )


def _layouts(name: str) -> dict[str, ModelKVSpec]:
    """The model's published layout and its full-attention twin, by their labels
    (published first)."""
    from kvbench.workloads.spec_capacity import as_full_attention
    from kvbench.workloads.spec_presets import get_spec_preset

    model = get_spec_preset(name)
    full = as_full_attention(model)
    return {layout_label(model): model, layout_label(full): full}


def _cases(full: bool) -> list[Case]:
    return [
        {
            "trace": t,
            "requests": REQUESTS[t][int(full)],
            "model": m,
            "attention": a,
            "kv_budget": KV_BUDGET,
            "block_size": BLOCK_SIZE,
            "profile": PROFILE,
            "duration_s": DURATION[t],
        }
        for t in ("sharegpt", "mooncake")
        for m in MODELS
        for a in _layouts(m)
    ]


def _trace(name: str, n: int, seed: int):  # type: ignore[no-untyped-def]
    """The case's requests (arrivals at t = 0), made once per process."""
    from kvbench.workloads.sharing import generate
    from kvbench.workloads.shipped import shipped_trace
    from kvbench.workloads.trace import Trace

    key = (name, n, seed)
    if key not in _TRACES:
        if name == "sharegpt":
            base = generate("sharegpt", n, seed=seed)
        else:
            base = shipped_trace("mooncake-conversation")
        reqs = tuple(replace(r, arrival=0.0) for r in base.requests[:n])
        _TRACES[key] = Trace(reqs, {**base.meta, "slice": f"first {n} requests"})
    return _TRACES[key]


def _setup(case: Case):  # type: ignore[no-untyped-def]
    """(model spec, a fresh cache, the time model, the scheduler config) of a case."""
    from kvbench.paged.serving.spec_time import FACTS, spec_time_model
    from kvbench.paged.serving.time_model import SchedulerConfig
    from kvbench.paged.spec_serving import spec_serving_cache

    layouts = _layouts(case["model"])
    if case["attention"] not in layouts:
        raise ConfigError(
            f"attention layout {case['attention']!r} is not one of {case['model']!r}'s: "
            f"{sorted(layouts)}"
        )
    model = layouts[case["attention"]]
    cfg = SchedulerConfig(preemption="recompute")
    tm = spec_time_model(model, FACTS[case["model"]], case["profile"], BLOCK_SIZE, 1)

    def cache():  # type: ignore[no-untyped-def]
        return spec_serving_cache(
            model, case["kv_budget"], case["block_size"], max_seq_len=1 << 20,
            prefill_chunk=cfg.max_batched_tokens,
        )  # fmt: skip

    return cache, tm, cfg


@sweep(
    "serving.kv_specs",
    "modeled serving of windowed and hybrid models (Mistral-7B, Gemma-2-9B) against the "
    "same models with full attention, on ShareGPT-like requests and a slice of the "
    "Mooncake conversation trace: utilization, peak concurrency, pages in use, sustained "
    f"rate (mean normalized latency under {BOUND_FACTOR:g} x one decode step), one 40 GiB "
    "pool on an A100-80GB time model",
    _cases,
    requires=("kvbench.paged.spec_serving",),
    tags=("serving", "modeled"),
    produced=(MODELED,),
)
def serving_kv_specs(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.paged.serving.engine import Engine
    from kvbench.paged.serving.rate import (
        RateTrace,
        latency_floor,
        served_throughput,
        sustained_rate,
    )

    trace = _trace(case["trace"], case["requests"], ctx.seed)
    cache, tm, cfg = _setup(case)
    pool = cache()
    burst = Engine(pool, cfg, tm).run(trace)
    peak_pages = max(row.used_blocks for row in burst.timeline)
    page_steps = sum(row.used_blocks * row.span for row in burst.timeline)
    seq_steps = sum(row.running * row.span for row in burst.timeline)
    out = [
        Measurement("utilization", burst.utilization, "fraction"),
        Measurement("peak_concurrency", burst.peak_concurrency, "requests"),
        Measurement("mean_running", burst.mean_running, "requests"),
        Measurement("peak_pages_used", peak_pages, "pages"),
        Measurement("peak_pool_fraction", peak_pages / pool.num_blocks, "fraction"),
        Measurement("pool_pages", pool.num_blocks, "pages"),
        Measurement("pages_per_running_request", page_steps / seq_steps, "pages"),
        Measurement("page_bytes", pool.model.page_bytes(case["block_size"]), "B"),
        Measurement("windowed_layers", sum(
            g.num_layers for g in pool.model.groups if g.spec.window is not None), "layers"),
        Measurement("preemptions", burst.preemptions, "count"),
        Measurement("burst_tokens_per_second", served_throughput(burst)["tokens_per_second"],
                    "tokens/s"),
    ]  # fmt: skip
    rates = RateTrace.make(trace, ctx.seed)
    bound = BOUND_FACTOR * latency_floor(tm)

    duration = DURATION[case["trace"]]

    def latency_at(rate: float) -> float:
        result = Engine(cache(), cfg, tm).run(rates.at(rate, duration))
        return float(result.latency["normalized_latency"]["mean"])

    rate, seen = sustained_rate(
        latency_at, bound, START_RATE[case["trace"]], rel_tol=0.1, max_evals=8,
        limit=rates.max_rate(duration),
    )  # fmt: skip
    out += [
        Measurement("sustained_rate", rate, "requests/s"),
        Measurement("latency_bound", bound, "s/token"),
        Measurement("rate_evaluations", len(seen), "count"),
        Measurement("rate_limit", rates.max_rate(duration), "requests/s"),
    ]
    return out
