"""`kvbench simulate --model mistral-7b|gemma-2-9b`: the serving engine over a layer-group
model (sliding windows, hybrid), optionally tensor parallel (`--tp`).

The cache is `paged.spec_serving.LayerGroupServingCache` (one pool of pages, a block table
per layer group, windows releasing blocks) holding `--kv-budget` bytes of pages over all
ranks, with swap space as large as the pool (as `--cache paged` has); the time model
prices attention per layer group (`paged.serving.attention_layout`) on `--profile`, with
weights, KV heads and FLOPs divided over `--tp` ranks and two all-reduces per layer.

Refused by name: other cache kinds (contiguous and static caches of layer-group models
are not modeled), prefix caching (the layer-group cache has none: pass
--no-prefix-caching), a --tp that does not divide the KV heads, and encoder-decoder
presets (the encoder's own pass is not priced).
"""

from __future__ import annotations

import argparse
import sys

from kvbench.paged.serving.engine import Engine
from kvbench.paged.serving.spec_time import FACTS, spec_time_model
from kvbench.paged.serving.time_model import SchedulerConfig
from kvbench.paged.spec_serving import LayerGroupServingCache, spec_serving_cache
from kvbench.suites.cli.simulate_tables import format_latency, format_table
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import parse_bytes
from kvbench.workloads.kv_spec import ModelKVSpec
from kvbench.workloads.spec_presets import get_spec_preset, spec_preset_names
from kvbench.workloads.trace import Trace


def is_spec_model(name: str) -> bool:
    """Whether `--model` names a layer-group preset (`workloads.spec_presets`)."""
    return name.lower() in spec_preset_names()


def check_spec_args(args: argparse.Namespace, kinds: tuple[str, ...]) -> ModelKVSpec:
    """The preset, after refusing by name what this path does not model."""
    name = args.model.lower()
    if name not in FACTS:
        raise ConfigError(
            f"--model {args.model!r} is an encoder-decoder preset: serving it is not modeled "
            f"here (the encoder's own pass is not priced); layer-group models served: "
            f"{', '.join(FACTS)}"
        )
    if kinds != ("paged",):
        raise ConfigError(
            f"--cache {','.join(kinds)!r}: a layer-group model ({args.model}) is served by the "
            "paged layer-group cache only (--cache paged); contiguous and static caches of "
            "windowed models are not modeled"
        )
    if not args.no_prefix_caching:
        raise ConfigError(
            f"prefix caching of a layer-group model ({args.model}) is not modeled by the "
            "serving cache: pass --no-prefix-caching"
        )
    model = get_spec_preset(name)
    heads = {g.num_kv_heads for g in model.groups}
    if any(h % args.tp for h in heads):
        raise ConfigError(
            f"--tp {args.tp} does not divide {args.model}'s {sorted(heads)} KV heads per layer"
        )
    return model


def spec_cache(model: ModelKVSpec, args: argparse.Namespace, prefill_chunk: int) -> LayerGroupServingCache:  # fmt: skip
    """`--kv-budget` bytes of pages (over all ranks) and as much swap space."""
    budget = parse_bytes(args.kv_budget, decimal_gb_as_mib=True)
    return spec_serving_cache(
        model, budget, args.block_size, max_seq_len=args.max_seq_len, watermark=args.watermark,
        prefill_chunk=prefill_chunk, swap_bytes=budget,
    )  # fmt: skip


def run_spec(args: argparse.Namespace, kinds: tuple[str, ...], config: SchedulerConfig,
             trace: Trace) -> int:  # fmt: skip
    """Simulate `trace` for a layer-group model and print the tables `simulate` prints."""
    model = check_spec_args(args, kinds)
    tm = spec_time_model(model, FACTS[args.model.lower()], args.profile, args.block_size, args.tp)
    cache = spec_cache(model, args, config.max_batched_tokens)
    result = Engine(cache, config, tm).run(trace)
    result.info.update(cache="paged", policy=config.preemption, profile=args.profile)
    row = result.summary()
    sys.stdout.write(
        f"{len(trace)} requests, model {args.model} ({model.source}), tp {args.tp}, KV budget "
        f"{args.kv_budget} ({cache.num_blocks:,} pages of {args.block_size} tokens of one "
        f"layer group), policy {args.policy}, profile {args.profile}; modeled\n"
    )
    sys.stdout.write(format_table([row]) + "\n")
    sys.stdout.write(format_latency([row]) + "\n")
    return 0
