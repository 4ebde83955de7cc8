"""`kvbench capacity` for models with sliding-window, hybrid or cross-attention layers:
the plan of `workloads.spec_capacity`, one row per layer group and one per request."""

from __future__ import annotations

import argparse
import json
from itertools import pairwise

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import parse_bytes
from kvbench.workloads.hf_spec import model_spec_from_hf_config, read_hf_config
from kvbench.workloads.kv_spec import ModelKVSpec
from kvbench.workloads.spec_capacity import SpecCapacityPlan, plan_spec_capacity
from kvbench.workloads.spec_presets import get_spec_preset
from kvbench.workloads.units import format_bytes

#: (option, argparse dest) of the options only spec models use.
SPEC_ONLY_OPTIONS = (("--encoder-len", "encoder_len"), ("--step-tokens", "step_tokens"))
#: (option, argparse dest) of the plain-preset options a spec plan does not model yet.
_NOT_FOR_SPECS = (("--layers", "layers"), ("--kv-heads", "kv_heads"), ("--head-dim", "head_dim"))


def _model(args: argparse.Namespace) -> ModelKVSpec:
    dtype = args.dtype if args.dtype is not None else "float16"
    if args.hf_config is not None:
        config = read_hf_config(args.hf_config)
        return model_spec_from_hf_config(config, args.hf_config, dtype, args.encoder_len)
    model = get_spec_preset(args.model, dtype)
    if args.encoder_len is not None:
        raise ConfigError(
            f"--encoder-len applies to --hf-config encoder-decoders; preset {args.model!r} "
            "has its encoder length fixed"
        )
    return model


def run_spec_plan(args: argparse.Namespace) -> int:
    """Print the spec plan of `--model` / `--hf-config` (table or JSON)."""
    refused = [opt for opt, dest in _NOT_FOR_SPECS if getattr(args, dest) is not None]
    if args.tp != 1:
        refused.append(f"--tp={args.tp}")
    if refused:
        raise ConfigError(
            f"{', '.join(refused)}: not modeled for models planned per layer group yet "
            "(give the shape in a --hf-config file instead; tensor parallelism: TP=1 only)"
        )
    model = _model(args)
    plan = plan_spec_capacity(
        model,
        parse_bytes(args.kv_budget),
        block_size=args.block_size,
        avg_len=args.avg_len,
        max_len=args.max_len,
        step_tokens=args.step_tokens if args.step_tokens is not None else 1,
    )
    if args.format == "json":
        print(json.dumps(plan.as_dict(), indent=2))
    else:
        print(render_spec_table(plan, model))
    return 0


def _layers(ids: tuple[int, ...]) -> str:
    if not ids:
        return ""
    if len(ids) > 2 and len({b - a for a, b in pairwise(ids)}) == 1:
        step = ids[1] - ids[0]
        return f"layers {ids[0]}..{ids[-1]}" + (f" step {step}" if step != 1 else "")
    return "layers " + ",".join(map(str, ids))


def render_spec_table(plan: SpecCapacityPlan, model: ModelKVSpec) -> str:
    """A two-column table of the plan (closed-form figures: no measurement)."""
    g0 = model.groups[0]
    rows = [
        ("model", f"{plan.model} ({'hybrid, ' if plan.hybrid else ''}{len(plan.groups)} "
                  f"layer group(s), {g0.num_kv_heads} KV heads x {g0.head_dim}, {g0.dtype})"),
        ("source", plan.source or "-"),
        ("KV budget (one pool)", f"{format_bytes(plan.kv_budget)} ({plan.kv_budget:,} bytes)"),
        (f"page: one block of {plan.block_size} tokens of one group",
         f"{format_bytes(plan.page_bytes)} ({plan.page_bytes:,} bytes)"),
        ("pages in budget", f"{plan.pages:,}"),
        ("tokens per step (window holds window - 1 + step)", f"{plan.step_tokens}"),
    ]  # fmt: skip
    for i, g in enumerate(plan.groups):
        rows.append(
            (
                f"group {i}: {g.spec}, {g.num_layers} layers",
                f"{g.blocks_at_avg:,} pages at {plan.avg_len} tokens, "
                f"{g.blocks_at_max:,} at {plan.max_len}   {_layers(g.layer_ids)}",
            )
        )
    rows += [
        (f"pages per request, peak up to {plan.avg_len} tokens",
         f"{plan.pages_per_request_at_avg:,}"),
        (f"pages per request, peak up to {plan.max_len} tokens",
         f"{plan.pages_per_request_at_max:,} ({format_bytes(plan.pages_per_request_at_max * plan.page_bytes)})"),
        (f"concurrent requests at {plan.avg_len} tokens", f"{plan.requests_at_avg:,}"),
        (f"concurrent requests at {plan.max_len} tokens", f"{plan.requests_at_max:,}"),
        ("  ... with every window full attention", f"{plan.requests_at_max_full:,} "
         f"({plan.pages_per_request_at_max_full:,} pages per request)"),
        (f"KV a window saves at {plan.max_len} tokens", f"{plan.saved_fraction_at_max:.1%}"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines.append("(closed form: workloads.spec_capacity; pages = blocks of one layer group)")
    return "\n".join(lines)
