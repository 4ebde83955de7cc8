"""`kvbench capacity`: what a KV budget holds for a model, paged versus contiguous."""

from __future__ import annotations

import argparse
import json

from kvbench.suites.cli.argtypes import (
    add_block_size_option,
    check_input_file,
    float_range,
    int_range,
)
from kvbench.suites.cli.spec_capacity import SPEC_ONLY_OPTIONS, run_spec_plan
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry, parse_bytes
from kvbench.workloads.planner import CapacityPlan, plan_capacity
from kvbench.workloads.presets import PRESETS, get_preset
from kvbench.workloads.spec_presets import spec_preset_names
from kvbench.workloads.units import format_bytes

_count = int_range(1, 1 << 16)
_length = int_range(1, 1 << 30)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capacity",
        help="KV capacity plan: blocks, tokens and concurrent requests in a KV budget",
        description=(
            "Print what a KV-cache budget holds for a model: bytes per token and block, "
            "blocks and token slots, concurrent requests at an average length (paged) vs "
            "at the maximum length (contiguous), and per-rank figures under tensor "
            "parallelism. Sizes: KB/MB/GB are decimal, KiB/MiB/GiB binary ([PA-deep-dive]'s "
            "'42 GB' pool is 42000MiB)."
        ),
    )
    p.add_argument(
        "--model",
        default="llama-2-70b",
        help=f"preset: {', '.join(PRESETS)}; with sliding-window, hybrid or cross-attention "
        f"layers (planned per layer group over one pool): {', '.join(spec_preset_names())}",
    )
    p.add_argument(
        "--hf-config",
        metavar="PATH",
        help="plan the model a Hugging Face config.json describes (sliding_window, "
        "layer_types, encoder-decoder) instead of --model",
    )
    p.add_argument(
        "--encoder-len",
        type=_length,
        help="encoder tokens each cross-attention layer holds (encoder-decoder models; "
        "default: the config's max_source_positions)",
    )
    p.add_argument(
        "--step-tokens",
        type=_length,
        help="spec models: tokens a step computes (the chunked-prefill chunk; default 1, "
        "token by token): a window holds window - 1 + step tokens during a step",
    )
    p.add_argument("--layers", type=_count, help="override: number of layers")
    p.add_argument("--kv-heads", type=_count, help="override: KV heads")
    p.add_argument("--head-dim", type=_count, help="override: head dim")
    p.add_argument("--dtype", default=None, help="KV dtype (float16, bfloat16, float32, fp8_e4m3)")
    p.add_argument("--kv-budget", required=True, help="KV budget per rank, e.g. 42GB, 8GiB")
    add_block_size_option(p)
    p.add_argument("--avg-len", type=_length, default=500, help="average live tokens per request")
    p.add_argument("--max-len", type=_length, default=2048, help="max sequence length reserved")
    p.add_argument("--tp", type=_count, default=1, help="tensor-parallel ranks (default 1)")
    p.add_argument(
        "--tail", type=float_range(1.0, 100.0), default=1.04, help="tail-waste allowance (1.04)"
    )
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=run)


def _geometry(args: argparse.Namespace) -> KVGeometry:
    base = get_preset(args.model).geometry
    kv_heads = args.kv_heads if args.kv_heads is not None else base.num_kv_heads
    return KVGeometry(
        args.layers if args.layers is not None else base.num_layers,
        kv_heads,
        args.head_dim if args.head_dim is not None else base.head_dim,
        args.dtype if args.dtype is not None else base.dtype,
        None if args.kv_heads is not None else base.num_q_heads,
    )


def run(args: argparse.Namespace) -> int:
    if args.hf_config is not None:
        check_input_file(args.hf_config, "--hf-config")
    if args.hf_config is not None or args.model.lower() in spec_preset_names():
        return run_spec_plan(args)
    given = [opt for opt, dest in SPEC_ONLY_OPTIONS if getattr(args, dest) is not None]
    if given:
        raise ConfigError(
            f"{', '.join(given)} apply to models with sliding-window or cross-attention "
            f"layers ({', '.join(spec_preset_names())} or --hf-config), not to {args.model!r}"
        )
    plan = plan_capacity(
        args.model,
        _geometry(args),
        parse_bytes(args.kv_budget),
        block_size=args.block_size,
        avg_len=args.avg_len,
        max_len=args.max_len,
        tp=args.tp,
        tail_allowance=args.tail,
    )
    if args.format == "json":
        print(json.dumps(plan.as_dict(), indent=2))
    else:
        print(render_table(plan))
    return 0


def render_table(plan: CapacityPlan) -> str:
    """A two-column table of the plan."""
    rows = [
        (
            "model",
            f"{plan.model} ({plan.num_layers} layers, {plan.num_kv_heads} KV heads, "
            f"head dim {plan.head_dim}, {plan.dtype})",
        ),
        ("KV per token", format_bytes(plan.bytes_per_token)),
        (
            "tensor parallel",
            f"TP={plan.tp}: {plan.kv_heads_per_rank} KV heads per rank ({plan.kv_sharding})",
        ),
        ("KV per token per rank", format_bytes(plan.bytes_per_token_per_rank)),
        (
            "KV budget per rank",
            f"{format_bytes(plan.kv_budget_per_rank)} ({plan.kv_budget_per_rank:,} bytes)",
        ),
        (f"block ({plan.block_size} tokens) per rank", format_bytes(plan.bytes_per_block_per_rank)),
        ("blocks in budget", f"{plan.blocks:,}"),
        ("token slots in budget", f"{plan.token_slots:,}"),
        (
            f"concurrent requests, paged at avg {plan.avg_len}",
            f"{plan.paged_concurrent_requests:,}",
        ),
        (
            "  ... each rounded up to whole blocks",
            f"{plan.paged_concurrent_requests_block_rounded:,}",
        ),
        (
            f"concurrent requests, contiguous at max {plan.max_len}",
            f"{plan.contiguous_concurrent_requests:,}",
        ),
        ("slot utilization at avg length, contiguous", f"{plan.contiguous_utilization_at_avg:.1%}"),
        ("slot utilization at avg length, paged", f"{plan.paged_utilization_at_avg:.1%}"),
        (
            f"one {plan.max_len}-token request per rank (x{plan.tail_allowance:g} tail)",
            format_bytes(plan.max_len_request_bytes_per_rank),
        ),
        (
            f"{plan.max_len}-token requests admissible per rank",
            f"{plan.max_len_requests_admissible:,}",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
