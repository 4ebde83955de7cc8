"""One call from a trace to a SimulationResult: build the cache, the clock, the engine.

For the bench and report helpers:

    from kvbench.paged.scheduler_setup import CacheSpec, simulate
    spec = CacheSpec(kind="paged", model="llama-2-70b", kv_budget="42GB", block_size=16)
    result = simulate(trace, spec, policy="auto", profile="a100-80gb")
    result.summary()   # utilization, peak_concurrency, preemptions, swaps, recomputes,
                       # steps, generated_tokens, tokens_per_step, modeled_seconds,
                       # tokens_per_second, processed_steps, wall_seconds, mean_running,
                       # ttft_/tpot_/e2e_/normalized_latency_ + mean/p50/p90/p99 (s)
    result.latency["normalized_latency"]["mean"]   # s per output token (paged.latency)

`CacheSpec.kind` is "paged" or "contiguous-max" / "contiguous-pow2" / "contiguous-oracle".
The KV budget is converted as [PA-deep-dive] does ("42GB" = 42,000 MiB = 8,400 blocks of
5 MiB for the 70B geometry at block 16); a contiguous cache gets the same bytes as token
slots. Caches are memory-only unless `store_kv=True`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from kvbench.paged.cache import PagedKVCache
from kvbench.paged.engine import Engine
from kvbench.paged.scheduler_model import SchedulerConfig, SimulationResult, TimeModel
from kvbench.reference.contiguous import ContiguousKVCache
from kvbench.reference.contract import KVCache
from kvbench.workloads.capacity import blocks_in_budget
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry, parse_bytes
from kvbench.workloads.presets import get_preset
from kvbench.workloads.profiles import get_profile
from kvbench.workloads.setups import ServingSetup
from kvbench.workloads.trace import Trace

CACHE_KINDS = ("paged", "contiguous-max", "contiguous-pow2", "contiguous-oracle")


@dataclass(frozen=True)
class CacheSpec:
    """How to build the cache a simulation runs on.

    Attributes:
        kind: one of CACHE_KINDS.
        model: preset name (geometry, weight bytes, parameter count).
        kv_budget: KV bytes ("42GB" read as 42,000 MiB, or an int).
        block_size: tokens per block (paged).
        max_seq_len: longest request (contiguous max reservation); paged: no limit.
        watermark: fraction of blocks admission keeps free (paged).
        cpu_blocks: swap space in blocks (paged; 0 = as many as the GPU pool).
        prefix_caching: index full blocks for reuse (paged).
        store_kv: hold real KV tensors (slow; for small geometries in tests).
        geometry: overrides the preset's geometry (tests use tiny ones).
        num_blocks: overrides the budget's block count (tests).
    """

    kind: str = "paged"
    model: str = "llama-2-70b"
    kv_budget: str | int = "42GB"
    block_size: int = 16
    max_seq_len: int = 2048
    watermark: float = 0.01
    cpu_blocks: int = 0
    prefix_caching: bool = True
    store_kv: bool = False
    geometry: KVGeometry | None = None
    num_blocks: int | None = None

    def resolved_geometry(self) -> KVGeometry:
        return self.geometry or get_preset(self.model).geometry

    def blocks(self) -> int:
        if self.num_blocks is not None:
            return self.num_blocks
        budget = parse_bytes(self.kv_budget, decimal_gb_as_mib=True)
        return blocks_in_budget(self.resolved_geometry(), budget, self.block_size)

    def build(self) -> KVCache:
        """A fresh, empty cache."""
        g = self.resolved_geometry()
        blocks = self.blocks()
        if self.kind == "paged":
            return PagedKVCache(
                g,
                blocks,
                self.block_size,
                watermark=self.watermark,
                num_cpu_blocks=self.cpu_blocks or blocks,
                enable_prefix_caching=self.prefix_caching,
                store_kv=self.store_kv,
            )
        if self.kind.startswith("contiguous-"):
            policy = self.kind.split("-", 1)[1]
            return ContiguousKVCache(
                g, blocks * self.block_size, self.max_seq_len, policy, store_kv=self.store_kv
            )
        raise ConfigError(f"unknown cache kind {self.kind!r}; known: {', '.join(CACHE_KINDS)}")


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
    setup: ServingSetup, kind: str, block_size: int = 16, **options: object
) -> CacheSpec:
    """The cache of a serving set-up: its model, KV memory and longest sequence."""
    setup.check_fits()
    return CacheSpec(
        kind=kind,
        model=setup.model,
        kv_budget=setup.kv_budget,
        block_size=block_size,
        max_seq_len=setup.max_seq_len,
        **options,  # type: ignore[arg-type]
    )


def setup_time_model(setup: ServingSetup, block_size: int = 16) -> TimeModel:
    """The step pricing of a serving set-up: its weights and FLOPs over `tp` ranks of its
    device, with the all-reduces tensor parallelism adds."""
    preset = setup.preset
    return TimeModel(
        setup.device,
        preset.geometry,
        setup.total_weight_bytes(),
        preset.weight_bytes / 2,
        block_size,
        tp=setup.tp,
        hidden_size=preset.hidden_size,
    )


def simulate(
    trace: Trace,
    spec: CacheSpec | KVCache,
    policy: str = "auto",
    profile: str = "a100-80gb",
    config: SchedulerConfig | None = None,
    progress: Callable[[int], None] | None = None,
    model: str = "llama-2-70b",
    time_model: TimeModel | None = None,
) -> SimulationResult:
    """Replay `trace` on a cache built from `spec` (or a given empty cache) with the
    preemption `policy` ("swap", "recompute", "auto"), priced on device `profile` (or by
    `time_model`, e.g. a set-up's)."""
    cfg = replace(config or SchedulerConfig(), preemption=policy)
    if isinstance(spec, CacheSpec):
        cache = spec.build()
        tm = time_model or time_model_for(spec, profile)
        label = spec.kind
    else:
        cache = spec
        tm = time_model or time_model_for(CacheSpec(model=model, geometry=spec.geometry), profile)
        label = type(spec).__name__
    result = Engine(cache, cfg, tm).run(trace, progress)
    result.info.update(cache=label, policy=policy, profile=profile, batching=cfg.batching)
    return result
