"""Capacity per KV cache spec: the blocks a sequence holds, per group and for a model.

Each kind's rule lives in `workloads.kv_rules` (the table every layer asks); this module
sums and maximizes it over a model's groups and a request's steps.

The release rule (sliding window), which the paged cache and the kernels follow: before
a step computes the tokens at positions n .. n + c - 1, a windowed group releases every
block that lies wholly before position n - window + 1, the first position the query at n
reads (vLLM puts its null block in the freed table entries; kvbench does the same with
-1). During that step the group therefore holds the blocks touched by positions
max(0, n - window + 1) .. n + c - 1. Decoding one token at a time (c = 1) that is at most
`window` tokens, touching at most ceil(window / block_size) + 1 blocks.

Full attention holds ceil(n / block_size) blocks after n tokens; cross-attention holds
ceil(encoder_len / block_size) blocks from admission to finish, whatever the decoder
length. A model's groups grow in lockstep (every layer sees every token), so a request
needs, at each step, the sum over its groups, all drawn from one pool of equal pages.

All functions are exact integer arithmetic; `suites/tests/workloads/test_spec_capacity.py`
checks them against hand-computed figures and against a block-by-block simulation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from math import lcm

from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE, check_block_size
from kvbench.workloads.capacity import blocks_for_tokens
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import require_positive
from kvbench.workloads.kv_rules import rule_for
from kvbench.workloads.kv_spec import KVCacheSpec, LayerGroup, ModelKVSpec


def blocks_in_step(spec: KVCacheSpec, computed: int, new: int, block_size: int) -> int:
    """Blocks one sequence's group holds while a step computes `new` tokens after
    `computed` cached ones (the rule of `spec`'s kind, `KindRule.blocks_in_step`)."""
    check_block_size(block_size)
    if computed < 0 or new < 0:
        raise ConfigError(f"token counts must be >= 0, got computed={computed}, new={new}")
    return rule_for(spec).blocks_in_step(computed, new, block_size)


def _step_blocks(model: ModelKVSpec, k: int, seq_len: int, step: int, block_size: int) -> int:
    computed = k * step
    new = min(step, seq_len - computed)
    return sum(blocks_in_step(g.spec, computed, new, block_size) for g in model.groups)


def _candidate_steps(model: ModelKVSpec, seq_len: int, step: int, block_size: int) -> set[int]:
    """Steps among which the request's peak lies.

    Between phase boundaries every group's block count is either non-decreasing in the
    step index (full attention, a window still filling, the capped last step) or periodic
    with its rule's `period` (a full window sliding: both of its ends move by
    block_size / gcd(step, block_size) steps' tokens, a multiple of block_size; another
    kind's rule says its own). A non-decreasing plus a P-periodic sequence (P the
    least common multiple of the groups' periods) peaks within the last P steps of each
    stretch, so only those are evaluated.
    """
    last = (seq_len - 1) // step
    period = 1
    ends = {last, last - 1}
    for g in model.groups:
        rule = rule_for(g.spec)
        period = lcm(period, rule.period(step, block_size))
        ends.update(min(last, e) for e in rule.phase_ends(step))
    return {e - j for e in ends for j in range(period + 1) if 0 <= e - j <= last}


def request_peak_blocks(
    model: ModelKVSpec, seq_len: int, block_size: int, step_tokens: int = 1
) -> int:
    """Most pages (blocks summed over groups) a request holds while it grows to
    `seq_len` tokens in steps of `step_tokens` (the last step may be shorter)."""
    require_positive("seq_len", seq_len)
    check_block_size(block_size)
    for g in model.groups:
        g.spec.check_block_size(block_size)
    require_positive("step_tokens", step_tokens)
    steps = _candidate_steps(model, seq_len, step_tokens, block_size)
    return max(_step_blocks(model, k, seq_len, step_tokens, block_size) for k in steps)


def group_peak_blocks(
    group: LayerGroup, seq_len: int, block_size: int, step_tokens: int = 1
) -> int:
    """Most blocks one group of a request holds while it grows to `seq_len` tokens."""
    alone = ModelKVSpec("group", (group,))
    return request_peak_blocks(alone, seq_len, block_size, step_tokens)


def window_block_bound(window: int, block_size: int) -> int:
    """ceil(window / block_size) + 1: blocks a decoding windowed layer never exceeds."""
    return blocks_for_tokens(require_positive("window", window), block_size) + 1


def as_full_attention(model: ModelKVSpec) -> ModelKVSpec:
    """The same model with every sliding window widened to full attention (the baseline
    a window's savings are measured against, `KindRule.as_full`; cross-attention is left
    as it is)."""
    groups = tuple(replace(g, spec=rule_for(g.spec).as_full()) for g in model.groups)
    return ModelKVSpec(f"{model.name} (all full attention)", groups, model.source)


@dataclass(frozen=True)
class GroupPlan:
    """One layer group's share of a request (blocks are pool pages)."""

    spec: str
    num_layers: int
    layer_ids: tuple[int, ...]
    blocks_at_avg: int
    blocks_at_max: int


@dataclass(frozen=True)
class SpecCapacityPlan:
    """What one pool holds for a model of one or more layer groups.

    Sizes in bytes, counts in pages (one block of one group) or requests. `*_full`
    figures are the same model with its windows widened to full attention.
    """

    model: str
    source: str
    hybrid: bool
    block_size: int
    step_tokens: int
    page_bytes: int
    kv_budget: int
    pages: int
    avg_len: int
    max_len: int
    groups: tuple[GroupPlan, ...]
    pages_per_request_at_avg: int
    pages_per_request_at_max: int
    requests_at_avg: int
    requests_at_max: int
    pages_per_request_at_max_full: int
    requests_at_max_full: int
    saved_fraction_at_max: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def plan_spec_capacity(
    model: ModelKVSpec,
    kv_budget: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    avg_len: int = 500,
    max_len: int = 2048,
    step_tokens: int = 1,
) -> SpecCapacityPlan:
    """The capacity plan of `model` in a pool of `kv_budget` bytes; ConfigError names
    any bad value."""
    check_block_size(block_size)
    for name, value in (
        ("kv_budget", kv_budget),
        ("avg_len", avg_len),
        ("max_len", max_len),
        ("step_tokens", step_tokens),
    ):
        require_positive(name, value)
    if avg_len > max_len:
        raise ConfigError(f"avg_len={avg_len} is above max_len={max_len}")
    page = model.page_bytes(block_size)
    pages = kv_budget // page
    groups = tuple(
        GroupPlan(
            g.spec.describe(),
            g.num_layers,
            g.layer_ids,
            group_peak_blocks(g, avg_len, block_size, step_tokens),
            group_peak_blocks(g, max_len, block_size, step_tokens),
        )
        for g in model.groups
    )
    at_avg = request_peak_blocks(model, avg_len, block_size, step_tokens)
    at_max = request_peak_blocks(model, max_len, block_size, step_tokens)
    full_at_max = request_peak_blocks(as_full_attention(model), max_len, block_size, step_tokens)
    return SpecCapacityPlan(
        model=model.name,
        source=model.source,
        hybrid=model.is_hybrid,
        block_size=block_size,
        step_tokens=step_tokens,
        page_bytes=page,
        kv_budget=kv_budget,
        pages=pages,
        avg_len=avg_len,
        max_len=max_len,
        groups=groups,
        pages_per_request_at_avg=at_avg,
        pages_per_request_at_max=at_max,
        requests_at_avg=pages // at_avg,
        requests_at_max=pages // at_max,
        pages_per_request_at_max_full=full_at_max,
        requests_at_max_full=pages // full_at_max,
        saved_fraction_at_max=1.0 - at_max / full_at_max,
    )
