"""One call from a trace to a SimulationResult: build the cache (from a `CacheSpec`), price
its steps (a `TimeModel`), run the engine over the trace.

For the bench and report helpers:

    from kvbench.paged.cache_spec import CacheSpec
    from kvbench.paged.serving.simulation import simulate
    spec = CacheSpec(kind="paged", model="llama-2-70b", kv_budget="42GB", block_size=16)
    result = simulate(trace, spec, policy="auto", profile="a100-80gb")  # keywords only
    result.summary()   # utilization, peak_concurrency, preemptions, swaps, recomputes,
                       # steps, generated_tokens, tokens_per_step, modeled_seconds,
                       # tokens_per_second, processed_steps, wall_seconds, mean_running,
                       # ttft_/tpot_/e2e_/normalized_latency_ + mean/p50/p90/p99 (s)
    result.latency["normalized_latency"]["mean"]   # s per output token (paged.serving.latency)

The cache kinds and how a KV budget becomes blocks: `paged.cache_spec`.
"""

from __future__ import annotations

from collections.abc import Callable

from kvbench.paged.cache_spec import CacheSpec
from kvbench.paged.serving.engine import Engine
from kvbench.paged.serving.time_model import SchedulerConfig, SimulationResult, TimeModel
from kvbench.reference.contract import ServingCache
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.presets import get_preset
from kvbench.workloads.profiles import get_profile
from kvbench.workloads.setups import ServingSetup
from kvbench.workloads.trace import Trace


def time_model_for(spec: CacheSpec, profile: str = "a100-80gb") -> TimeModel:
    """The step pricing of the spec's model on a named device profile."""
    preset = get_preset(spec.model)
    return TimeModel(
        get_profile(profile),
        spec.resolved_geometry(),
        preset.weight_bytes,
        preset.weight_bytes / 2,
        spec.block_size,
    )


def setup_spec(
    setup: ServingSetup, kind: str, block_size: int = DEFAULT_BLOCK_SIZE, **options: object
) -> CacheSpec:
    """The cache of a serving set-up: its model, KV memory and longest sequence."""
    setup.check_fits()
    return CacheSpec(
        kind=kind,
        model=setup.model,
        kv_budget=setup.kv_budget,
        block_size=block_size,
        max_seq_len=setup.max_seq_len,
        geometry=setup.geometry if setup.kv_dtype else None,
        **options,  # type: ignore[arg-type]
    )


def setup_time_model(setup: ServingSetup, block_size: int = DEFAULT_BLOCK_SIZE) -> TimeModel:
    """The step pricing of a serving set-up: its weights and FLOPs over `tp` ranks of its
    device, with the all-reduces tensor parallelism adds."""
    preset = setup.preset
    return TimeModel(
        setup.device,
        setup.geometry,
        setup.total_weight_bytes(),
        preset.weight_bytes / 2,
        block_size,
        tp=setup.tp,
        hidden_size=preset.hidden_size,
    )


def simulate(
    trace: Trace,
    spec: CacheSpec | ServingCache,
    *,
    config: SchedulerConfig | None = None,
    policy: str | None = None,
    profile: str = "a100-80gb",
    progress: Callable[[int], None] | None = None,
    model: str = "llama-2-70b",
    time_model: TimeModel | None = None,
) -> SimulationResult:
    """Replay `trace` on a cache built from `spec` (or a given empty cache), priced on
    device `profile` (or by `time_model`, e.g. a set-up's).

    The cache decides the block size swaps are priced at: without `time_model` the
    model is built at the cache's block size, and a `time_model` built for another block
    size prices the cache's swaps at the cache's (the engine's `TimeModel.for_cache`).

    The preemption policy ("swap", "recompute", "auto") has one place: `config.preemption`.
    `policy` is shorthand for `config=SchedulerConfig(preemption=policy)`; giving both is a
    ConfigError (one would silently overwrite the other)."""
    if policy is not None:
        if config is not None:
            raise ConfigError(
                f"give the preemption policy once: policy={policy!r} or "
                f"config.preemption={config.preemption!r}, not both"
            )
        config = SchedulerConfig(preemption=policy)
    cfg = config or SchedulerConfig()
    if isinstance(spec, CacheSpec):
        cache = spec.build()
        tm = time_model or time_model_for(spec, profile)
        label = spec.kind
    else:
        cache = spec
        # priced at the given cache's own block size (swaps move whole blocks)
        block_size = spec.serving_traits().block_size or DEFAULT_BLOCK_SIZE
        own = CacheSpec(model=model, geometry=spec.geometry, block_size=block_size)
        tm = time_model or time_model_for(own, profile)
        label = type(spec).__name__
    result = Engine(cache, cfg, tm).run(trace, progress)
    result.info.update(cache=label, policy=cfg.preemption, profile=profile, batching=cfg.batching)
    return result
