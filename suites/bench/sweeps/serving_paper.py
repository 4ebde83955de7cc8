"""[PA-deep-dive]'s and the vLLM paper's serving tables, regenerated with the time model (modeled).

* serving.batch_table: [PA-deep-dive]'s throughput against batch size (A100-80GB, Llama-70B,
  its 35 GB of weights and 42 GB KV pool): for each batch size, ShareGPT-like requests
  that share one 500-token system prompt all wait at t = 0 and the engine runs at most
  `batch` of them at once; tokens/s = output tokens / modeled seconds. Systems:
  contiguous-max (the "traditional" cache, every request reserving the 4,096-token
  context; a batch whose reservations exceed the pool is out of memory, as in the seed),
  paged (prefix caching off) and paged-prefix (prefix caching on: the system prompt's
  blocks are shared).
* serving.cow_load: copy-on-write savings the paper's way (Section 6.3: OPT-13B,
  Alpaca-like, parallel sampling and beam search under a request rate): in one run, the
  time-averaged share of KV blocks that sharing saves, (blocks the sequences' tables
  name, each counted per sequence - b) / that, where b is the blocks actually held.

Both are modeled on the engine (memory-only caches), never measured. The `calibration`
parameter names the GPU figures used: "fitted" (the profiles' fitted efficiency,
`kvbench calibrate gpu`) or "datasheet" (100% of the peaks); the batch table runs both,
CoW under load the fitted profile (its savings are ratios of block counts; the time
model only weights the steps).
"""

from __future__ import annotations

from kvbench.reports.provenance import MODELED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.workloads.setups import CALIBRATIONS

BATCHES = (1, 4, 8, 16, 32, 48, 64, 96, 128)
SYSTEM_PROMPT = 500

_TRACES: dict[tuple, object] = {}


def _batch_cases(full: bool) -> list[Case]:
    setups = ("llama-2-70b-a100-80gb", "llama-2-70b-h100") if full else ("llama-2-70b-a100-80gb",)
    return [
        {"setup": s, "system": system, "batch": b, "workload": "sharegpt", "calibration": c}
        for s in setups
        for c in CALIBRATIONS
        for system in ("contiguous-max", "paged", "paged-prefix")
        for b in BATCHES
    ]


def _system_prompt_trace(requests: int, seed: int):  # type: ignore[no-untyped-def]
    from kvbench.workloads.sharing import generate

    key = ("system-prompt", requests, seed)
    if key not in _TRACES:
        _TRACES[key] = generate(
            "sharegpt", requests, seed=seed, sharing="system-prompt", system_tokens=SYSTEM_PROMPT
        )
    return _TRACES[key]


@sweep(
    "serving.batch_table",
    "[PA-deep-dive]'s throughput vs batch size regenerated with the time model: Llama-70B on "
    "A100-80GB (35 GB weights, 42 GB KV), ShareGPT-like requests behind a shared 500-token "
    "system prompt; contiguous (4,096-token reservations), paged, paged + prefix cache",
    _batch_cases,
    requires=("kvbench.paged.serving.simulation",),
    tags=("serving", "modeled"),
    produced=(MODELED,),
)
def batch_table(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.paged.serving.simulation import setup_spec, setup_time_model, simulate
    from kvbench.paged.serving.time_model import SchedulerConfig
    from kvbench.workloads.setups import get_setup, with_calibration

    setup = with_calibration(get_setup(case["setup"]), case.get("calibration", "fitted"))
    batch, system = case["batch"], case["system"]
    kind = "contiguous-max" if system == "contiguous-max" else "paged"
    spec = setup_spec(setup, kind, prefix_caching=system == "paged-prefix")
    if kind == "contiguous-max":
        room = spec.blocks() * spec.block_size // setup.max_seq_len
        if batch > room:
            return [
                Measurement("out_of_memory", 1.0, "bool"),
                Measurement("max_batch_that_fits", room, "requests"),
            ]
    trace = _system_prompt_trace(max(8 * batch, 64), ctx.seed)
    cfg = SchedulerConfig(max_num_seqs=batch, max_batched_tokens=max(4096, batch))
    result = simulate(trace, spec, config=cfg, time_model=setup_time_model(setup))
    return [
        Measurement("tokens_per_second", result.tokens_per_second, "tokens/s"),
        Measurement("out_of_memory", 0.0, "bool"),
        Measurement("mean_running", result.mean_running, "requests"),
        Measurement("preemptions", result.preemptions, "count"),
        Measurement("modeled_seconds", result.modeled_seconds, "s"),
    ]


# --------------------------------------------------------------------- CoW under load


def _cow_cases(full: bool) -> list[Case]:
    widths = (2, 4, 6)
    return [
        {
            "setup": "opt-13b-1xa100-40gb",
            "workload": "alpaca",
            "sharing": s,
            "width": k,
            "rate": r,
            "duration": 20.0 if full else 8.0,
            "calibration": "fitted",
        }
        for s in ("parallel", "beam")
        for k in widths
        for r in ((8.0, 16.0, 32.0) if full else (16.0,))
    ]


class _SharingProbe:
    """A step hook that sums, weighted by each step's modeled duration, the blocks the
    live sequences' tables name (each counted once per sequence) and the blocks the pool
    holds (time averages, as the paper's are)."""

    def __init__(self, cache) -> None:  # type: ignore[no-untyped-def]
        self.cache = cache
        self.logical = 0.0
        self.physical = 0.0

    def __call__(self, step: int, decoded: list, chunks: list, model_ps: int) -> None:
        cache = self.cache
        named = sum(len(cache.block_table(rid)) for rid in cache.request_ids())
        self.logical += named * model_ps
        self.physical += cache.pool.num_used * model_ps


@sweep(
    "serving.cow_load",
    "copy-on-write savings under load, the vLLM paper's way: OPT-13B on A100-40GB (12 GB "
    "KV), Alpaca-like parallel sampling / beam search at a Poisson request rate; "
    "time-averaged (blocks named by the sequences' tables - blocks held) / blocks named",
    _cow_cases,
    requires=("kvbench.paged.serving.simulation", "kvbench.paged.serving.beams"),
    tags=("serving", "cow", "modeled"),
    produced=(MODELED,),
)
def cow_load(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.paged.serving.engine import Engine
    from kvbench.paged.serving.rate import RateTrace
    from kvbench.paged.serving.simulation import setup_spec, setup_time_model
    from kvbench.paged.serving.time_model import SchedulerConfig
    from kvbench.workloads.setups import get_setup
    from kvbench.workloads.sharing import generate

    setup = get_setup(case["setup"])
    k = case["width"]
    option = {"n": k} if case["sharing"] == "parallel" else {"beam_width": k}
    pool = int(case["rate"] * case["duration"] * 2) + 16
    base = generate(case["workload"], pool, seed=ctx.seed, sharing=case["sharing"], **option)
    trace = RateTrace.make(base, ctx.seed).at(case["rate"], case["duration"])
    cache = setup_spec(setup, "paged", prefix_caching=False).build()
    probe = _SharingProbe(cache)
    cfg = SchedulerConfig(mode="token", max_num_seqs=256)
    engine = Engine(cache, cfg, setup_time_model(setup), step_hook=probe)
    result = engine.run(trace)
    saved = 1 - probe.physical / probe.logical if probe.logical else 0.0
    return [
        Measurement("saved_fraction", saved, "fraction"),
        Measurement("preemptions", result.preemptions, "count"),
        Measurement("peak_concurrency", result.peak_concurrency, "requests"),
    ]
