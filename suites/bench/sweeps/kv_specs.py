"""KV cache spec sweep: the memory a sliding window saves, per layer-group model.

For each spec preset (Mistral-7B: every layer windowed; Gemma-2-9B: local and global
layers alternating; Whisper-large-v3: self- plus cross-attention) and sequence length,
the pages a request holds at its peak and the requests a 16 GiB pool holds, beside the
same model with every window widened to full attention (`workloads.spec_capacity`).
Closed form (no timing, nothing measured): the planner's figures, which the property
tests tie to a block-by-block simulation and to the paged layer-group cache.
"""

from __future__ import annotations

from kvbench.reports.provenance import CLOSED_FORM
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE
from kvbench.workloads.geometry import parse_bytes
from kvbench.workloads.spec_capacity import plan_spec_capacity
from kvbench.workloads.spec_presets import get_spec_preset, spec_preset_names

#: Decoder lengths per preset where it has its own limit (Whisper: 448 target positions).
_LENGTHS = {"whisper-large-v3": [448]}


def _cases(full: bool) -> list[Case]:
    lengths = [1024, 4096, 8192, 32768, 131072] if full else [4096, 32768]
    return [
        {
            "model": m,
            "budget": "16GiB",
            "block_size": DEFAULT_BLOCK_SIZE,
            "seq_len": n,
            "step_tokens": 1,
        }
        for m in spec_preset_names()
        for n in _LENGTHS.get(m, lengths)
    ]


@sweep(
    "capacity.kv_specs",
    "sliding-window, hybrid and cross-attention models: peak pages per request and "
    "requests in a pool, against the same model with full attention (closed form)",
    _cases,
    tags=("capacity",),
    produced=(CLOSED_FORM,),
)
def kv_specs(case: Case, ctx: BenchContext) -> list[Measurement]:
    plan = plan_spec_capacity(
        get_spec_preset(case["model"]),
        parse_bytes(case["budget"]),
        block_size=case["block_size"],
        avg_len=case["seq_len"],
        max_len=case["seq_len"],
        step_tokens=case["step_tokens"],
    )
    return [
        Measurement("pages_per_request", plan.pages_per_request_at_max, "pages"),
        Measurement("requests_in_pool", plan.requests_at_max, "requests"),
        Measurement("pages_per_request_full", plan.pages_per_request_at_max_full, "pages"),
        Measurement("requests_in_pool_full", plan.requests_at_max_full, "requests"),
        Measurement("kv_saved_fraction", plan.saved_fraction_at_max, "fraction"),
        Measurement("page_bytes", plan.page_bytes, "B"),
    ]
