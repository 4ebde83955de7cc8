"""vLLM v1's Scheduler beside kvbench's engine in vllm-v1 mode, step by step.

Both run the same requests memory-only (`peer_vllm_scheduler`: vLLM 0.32's Scheduler in
process with no model; arrivals join both at the step their arrival time falls in) and
are compared after EVERY step: scheduled request ids with their token counts in
scheduling order, preempted ids, finished ids, the prefix-hit tokens of each admission
and the blocks in use; at the end, vLLM's PrefixCacheStats against kvbench's count.
Every trace must agree on every step. One rule is declared and applied: kvbench's cache
runs with `index_duplicates=True`, vLLM's rule for a block that fills with content
another cached block holds (both indexed, the oldest served; kvbench's default leaves
the duplicate unindexed and reuses it first, which changes later evictions and hits:
`test_duplicate_rule_parts_them` shows a trace where it does). A failure prints the
first divergent step, both decisions and the request states.

Traces: ShareGPT-like with and without shared system prompts, multi-turn chats (answers
given, so answered blocks are hit), slices of the Mooncake conversation trace (hash ids
expanded to token ids) and of the Azure conversation trace; block sizes 16 and 32;
pools with no memory pressure and with heavy preemption; max_num_batched_tokens 256,
2048 and 8192 (with and without long_prefill_token_threshold, and one without chunked
prefill). Skipped, with the reason, where vLLM is not installed.
"""

from __future__ import annotations

import pytest

from kvbench.suites.conformance.peer_vllm_scheduler import (
    Case,
    azure_slice,
    mooncake_slice,
    multi_turn,
    run_pair,
    sharegpt_like,
    vllm_missing,
)

MISSING = vllm_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


def _cases() -> list[Case]:
    cases = [
        # name, trace, block size, vLLM blocks (null included), max_num_seqs, budget
        Case("sharegpt-2048-roomy", sharegpt_like(80, 1), 16, 4000, 32, 2048),
        Case("sharegpt-256-preempt", sharegpt_like(60, 2, spread_s=2.0), 16, 90, 16, 256),
        Case(
            "sharegpt-system-8192-preempt",
            sharegpt_like(80, 3, systems=3, system_len=200),
            32,
            80,
            48,
            8192,
        ),
        Case(
            "sharegpt-system-256-lpt64",
            sharegpt_like(60, 4, systems=2, system_len=120, spread_s=1.0),
            32,
            120,
            24,
            256,
            long_prefill_token_threshold=64,
        ),
        Case(
            "sharegpt-nochunk-2048-preempt",
            sharegpt_like(60, 5),
            16,
            160,
            16,
            2048,
            chunked_prefill=False,
            max_model_len=2048,
        ),
        Case("multiturn-2048-preempt", multi_turn(12, 4, 6), 16, 150, 16, 2048),
        Case("multiturn-8192-roomy", multi_turn(12, 4, 7), 32, 2000, 64, 8192),
    ]
    moon = mooncake_slice(0, 24)
    if moon is not None:
        cases.append(Case("mooncake-2048-lpt512-preempt", moon, 32, 700, 16, 2048, 512))
        cases.append(Case("mooncake-8192-roomy", moon, 16, 14000, 32, 8192))
    azure = azure_slice(0, 60)
    long_answers = azure_slice(0, 60, max_output=400)
    if azure is not None and long_answers is not None:
        cases.append(Case("azure-2048-preempt", long_answers, 16, 300, 32, 2048))
        cases.append(Case("azure-256-roomy", azure, 32, 3000, 32, 256))
    return cases


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_vllm_scheduler_matches_every_step(case: Case) -> None:
    res = run_pair(case)
    summary = (
        f"{case.name}: {res.steps} steps, {res.preemptions} preemptions, hit tokens "
        f"kvbench {res.kv_hits} / vLLM {res.vllm_hits}, {res.seconds:.1f} s"
    )
    print(summary)
    assert res.divergence is None, f"{summary}\n{res.divergence}"
    assert res.kv_stats == res.vllm_stats, (res.kv_stats, res.vllm_stats)
    assert res.steps > 0


def test_traces_cover_the_issue() -> None:
    """At least 8 traces, both block sizes, all three budgets, pressure and none."""
    assert len(CASES) >= 8
    assert {c.block_size for c in CASES} == {16, 32}
    assert {256, 2048, 8192} <= {c.max_batched_tokens for c in CASES}


def test_duplicate_rule_parts_them() -> None:
    """The declared rule is what it says: with kvbench's default (a duplicate full block
    left unindexed) the multi-turn trace, whose turns recompute blocks an earlier turn
    still decoding holds, parts from vLLM at a prefix hit; with vLLM's rule it does not
    (the main test)."""
    case = next(c for c in CASES if c.name == "multiturn-2048-preempt")
    res = run_pair(case, index_duplicates=False)
    assert res.divergence is not None and "hits=" in res.divergence
    assert res.kv_hits != res.vllm_hits
