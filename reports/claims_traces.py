"""Checks of the claims about production traces: the Mooncake paper's prefix-cache
capacity claim, judged on the trace.prefix_capacity rows of the shipped conversation
trace (computed exactly: kvbench's real cache, memory-only, LRU)."""

from __future__ import annotations

import pandas as pd

from kvbench.reports.claims_model import FAILS, HOLDS, Verdict, _missing, _pct, _rows

MOONCAKE_PAPER = (
    "Qin et al., “Mooncake: Trading More Storage for Less Computation — A KVCache-centric "
    "Architecture for Serving LLM Chatbot”, FAST 2025, Section 5 and Fig. 9"
)
#: "Nearly all" of the ceiling, as this check reads it.
NEARLY_ALL = 0.9


def prefix_capacity(frame: pd.DataFrame) -> Verdict:
    """LRU at 3M tokens under half the ceiling, at 50M at least NEARLY_ALL of it, on the
    conversation trace at the paper's 512-token blocks."""
    rows = _rows(
        frame,
        "trace.prefix_capacity",
        "fraction_of_ceiling",
        trace="mooncake-conversation",
        policy="lru",
        block_size=512,
    )
    if "method" in rows.columns:  # runs before the method column: policy rows are replays
        rows = rows[rows["method"].isna() | (rows["method"] == "replay")]
    at = {int(c): float(v) for c, v in zip(rows["capacity_tokens"], rows["value"], strict=True)}
    if 3_000_000 not in at or 50_000_000 not in at:
        return _missing("run the trace.prefix_capacity sweep (LRU, block 512, 3M and 50M tokens)")
    small, large = at[3_000_000], at[50_000_000]
    ok = small < 0.5 and large >= NEARLY_ALL
    return Verdict(
        f"LRU reaches {_pct(small)} of the ceiling at 3M tokens, {_pct(large)} at 50M",
        HOLDS if ok else FAILS,
        "the shipped Mooncake conversation trace (12,031 requests) replayed through "
        "kvbench's PagedKVCache (memory-only, LRU eviction, 512-token blocks), requests one "
        f"at a time; 'nearly all' read as >= {_pct(NEARLY_ALL)}; one workload of the "
        "paper's several",
    )
