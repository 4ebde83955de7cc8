"""Multi-turn chat traces stay within the context cap and keep their prefix sharing.

The policy under test (workloads/sharing.py, "Context cap"): no turn has prompt + output
> max_total; a conversation ends only when fewer than 2 tokens of context are left; a
turn that does not fit has its user message clipped to room - 1 and its output to the
room left, which fills the context exactly. The checks below are written against that
statement, not against the generator's code: hand-computed cases with fixed lengths, and
properties of random traces (bound, prefix extension, exact count, determinism).
"""

from __future__ import annotations

import re
from collections import defaultdict
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbench.workloads.arrivals import parse_arrivals
from kvbench.workloads.distributions import fixed
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.sharing import MAX_TOTAL, generate, multi_turn, workload
from kvbench.workloads.trace import Trace, TraceRequest

_ID = re.compile(r"c(\d+)t(\d+)")


def _conversations(trace: Trace) -> dict[int, list[TraceRequest]]:
    """Requests grouped by conversation, each list in turn order."""
    convs: dict[int, list[tuple[int, TraceRequest]]] = defaultdict(list)
    for r in trace.requests:
        m = _ID.fullmatch(str(r.id))
        assert m, r.id
        convs[int(m.group(1))].append((int(m.group(2)), r))
    return {c: [r for _, r in sorted(turns)] for c, turns in convs.items()}


def check_chat_trace(
    trace: Trace, max_total: int, turns: int, complete: bool, turn_gap: float = 1.0
) -> None:
    """Every property a capped multi-turn trace must have. `complete`: no turns were cut
    off by `generate`'s request count, so each conversation's last turn is its real end."""
    arrivals = [r.arrival for r in trace.requests]
    assert arrivals == sorted(arrivals)
    for r in trace.requests:
        assert r.prompt_len + r.output_len <= max_total, (r.id, r.prompt_len, r.output_len)
        assert r.prompt is not None and len(r.prompt) == r.prompt_len >= 1
        assert r.output_tokens is not None and len(r.output_tokens) == r.output_len >= 1
    for c, chat in _conversations(trace).items():
        assert 1 <= len(chat) <= turns
        # kept turns are turns 0..k-1 (a cut drops only a conversation's latest turns)
        assert [r.id for r in chat] == [f"c{c}t{t}" for t in range(len(chat))]
        for prev, cur in pairwise(chat):
            history = prev.prompt + prev.output_tokens
            assert cur.prompt[: len(history)] == history, cur.id
            assert cur.prompt_len > len(history), cur.id  # at least 1 new user token
            assert cur.arrival - prev.arrival == pytest.approx(turn_gap), cur.id
            # a turn that is followed by another left room for >= 1 user + 1 output token
            assert len(history) <= max_total - 2, prev.id
        if complete and len(chat) < turns:
            # a conversation ends early only when less than 2 tokens of context are left
            last = chat[-1]
            assert last.prompt_len + last.output_len >= max_total - 1, last.id


@pytest.mark.parametrize(
    ("user", "out", "max_total", "expected"),
    [
        # fits: 10+20, then 40+20 = 60, then room 4 -> user clipped to 3, output to 1
        (10, 20, 64, [(10, 20), (40, 20), (63, 1)]),
        # room 2 after turn 1: 1 user token + 1 output token
        (10, 20, 62, [(10, 20), (40, 20), (61, 1)]),
        # room 1 or 0 after turn 1: the conversation is over
        (10, 20, 61, [(10, 20), (40, 20)]),
        (10, 20, 60, [(10, 20), (40, 20)]),
        # output clipped to the room left after an unclipped user message
        (10, 20, 50, [(10, 20), (40, 10)]),
        # the very first turn does not fit: user clipped to max_total - 1, output to 1
        (100, 20, 64, [(63, 1)]),
        # user fits, output clipped on the first turn
        (30, 50, 64, [(30, 34)]),
        # the smallest context: one 1 + 1 turn
        (5, 5, 2, [(1, 1)]),
        # never reaches the cap within 12 turns
        (3, 4, MAX_TOTAL, [(3 + 7 * t, 4) for t in range(12)]),
    ],
)
def test_fixed_lengths_follow_the_policy(
    user: int, out: int, max_total: int, expected: list[tuple[int, int]]
) -> None:
    trace = multi_turn(3, 12, fixed(user), fixed(out), seed=1, max_total=max_total)
    convs = _conversations(trace)
    assert sorted(convs) == [0, 1, 2]
    for chat in convs.values():
        assert [(r.prompt_len, r.output_len) for r in chat] == expected
    check_chat_trace(trace, max_total, 12, complete=True)


@pytest.mark.parametrize("name", ["sharegpt", "alpaca"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_cap_bounds_long_chats(name: str, seed: int) -> None:
    trace = generate(name, 400, seed=seed, sharing="multi-turn", turns=12)
    assert len(trace) == 400
    check_chat_trace(trace, MAX_TOTAL, 12, complete=False)
    assert trace.meta["max_total"] == MAX_TOTAL
    if name == "sharegpt":
        # ~500 tokens a turn: 12-turn chats must hit the cap and end early, so the trace
        # needs more than ceil(400 / 12) conversations and some turns fill the context
        assert trace.meta["conversations"] > -(-400 // 12)
        assert max(r.prompt_len + r.output_len for r in trace.requests) == MAX_TOTAL


@given(
    name=st.sampled_from(["sharegpt", "alpaca"]),
    seed=st.integers(0, 2**32 - 1),
    num_requests=st.integers(0, 120),
    turns=st.integers(1, 12),
    max_total=st.one_of(st.sampled_from([2, 64, 300, MAX_TOTAL]), st.integers(2, MAX_TOTAL)),
    arrivals=st.sampled_from(["all", "poisson:4", "burst:3:0.5"]),
)
def test_generate_exact_count_bounded_and_reproducible(
    name: str, seed: int, num_requests: int, turns: int, max_total: int, arrivals: str
) -> None:
    def make() -> Trace:
        return generate(
            name,
            num_requests,
            seed=seed,
            arrivals=parse_arrivals(arrivals),
            sharing="multi-turn",
            turns=turns,
            max_total=max_total,
        )

    trace = make()
    assert len(trace) == num_requests
    check_chat_trace(trace, max_total, turns, complete=False)
    assert make() == trace


@given(
    name=st.sampled_from(["sharegpt", "alpaca"]),
    seed=st.integers(0, 2**32 - 1),
    conversations=st.integers(0, 12),
    turns=st.integers(1, 12),
    max_total=st.sampled_from([2, 64, 500, MAX_TOTAL]),
)
def test_multi_turn_keeps_every_conversation(
    name: str, seed: int, conversations: int, turns: int, max_total: int
) -> None:
    wl = workload(name)
    trace = multi_turn(conversations, turns, wl.prompt, wl.output, 0.5, seed, None, max_total)
    assert sorted(_conversations(trace)) == list(range(conversations))
    check_chat_trace(trace, max_total, turns, complete=True, turn_gap=0.5)
    rng = np.random.default_rng(seed)
    again = multi_turn(conversations, turns, wl.prompt, wl.output, 0.5, rng, None, max_total)
    assert again == trace


def test_small_cap_clips_and_starts_more_conversations() -> None:
    trace = generate("sharegpt", 200, seed=5, sharing="multi-turn", turns=8, max_total=64)
    assert len(trace) == 200
    check_chat_trace(trace, 64, 8, complete=False)
    totals = [r.prompt_len + r.output_len for r in trace.requests]
    # ShareGPT prompts average 161 tokens: most first turns are clipped to fill 64 tokens
    assert sum(t == 64 for t in totals) > 100
    assert trace.meta["conversations"] > 200 // 8
    other = generate("sharegpt", 200, seed=6, sharing="multi-turn", turns=8, max_total=64)
    assert other != trace


@pytest.mark.parametrize("bad", [1, 0, -5, True, 2.5, "64"])
def test_bad_max_total_names_the_value(bad: object) -> None:
    wl = workload("alpaca")
    with pytest.raises(ConfigError, match=re.escape(repr(bad)) + "|" + re.escape(str(bad))):
        multi_turn(2, 3, wl.prompt, wl.output, max_total=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        generate("alpaca", 5, sharing="multi-turn", max_total=bad)  # type: ignore[arg-type]
