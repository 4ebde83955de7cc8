"""Seeded trace generators, from independent requests to the sharing patterns.

Each generator takes a numpy Generator (or a seed) and returns a `Trace`, so the same
arguments always give the same trace:

    independent       no sharing: synthetic, never-overlapping prompts (`prompt_len` only);
    system_prompt     one system prompt of N tokens in front of every prompt, with
                      `tenants` distinct salts (requests of different tenants never share);
    multi_turn        conversations whose turn t prompt is turn t-1's prompt + its output
                      tokens + a new user message (output ids are in the trace so the
                      engine emits exactly them and turn t can hit turn t-1's blocks),
                      each turn within the context (see "Context cap" below);
    parallel_sampling n outputs per prompt (the engine forks after the prefill);
    beam_search       beam width w per prompt (the engine forks and prunes every step).

`WORKLOADS` names the length-distribution pairs of the CLI's `--workload` (sharegpt,
alpaca, seed002, uniform); `generate` dispatches on a sharing pattern by name.

Context cap. No generated request has prompt_len + output_len > `max_total` (default
MAX_TOTAL = 2048, the context of the models the paper serves): a real engine rejects such
a request, so a trace holding one would measure something no server does. Independent
and system-prompt requests redraw an oversized pair. A chat cannot redraw, because its
prompt is the conversation so far, which only grows; it follows what a chat frontend
that keeps the whole history (never truncating old turns, which would also break the
prefix sharing between turns) does:

    * before turn t, room = max_total - len(conversation so far); if room < 2 (no space
      for 1 user token and 1 output token) the conversation is over;
    * the user message is clipped to room - 1 tokens (the frontend truncates an overlong
      message so the model can answer at all);
    * the output is clipped to the room left after the prompt (the server caps
      max_tokens at the context, finishing with reason "length" as OpenAI-style servers
      do); such a turn fills the context exactly, so it is the conversation's last.

A conversation that never reaches the cap is drawn exactly as it would be without one.
`generate(..., sharing="multi-turn")` starts further conversations when some end early,
so it always returns exactly `num_requests` turns, the same ones for the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvbench.workloads.arrivals import ArrivalProcess, all_at_once
from kvbench.workloads.distributions import LengthDistribution, fixed, named, named_pair, uniform
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.trace import Trace, TraceRequest, requests_from_arrays

#: Token ids of explicit prompts are drawn from [0, VOCAB).
VOCAB = 32000
#: Longest prompt + output of a generated independent request (the models' context).
MAX_TOTAL = 2048


@dataclass(frozen=True)
class Workload:
    """A named pair of prompt and output length distributions."""

    name: str
    prompt: LengthDistribution
    output: LengthDistribution
    note: str


def workload(name: str) -> Workload:
    """The named workload: 'sharegpt', 'alpaca', 'seed002' or 'uniform'."""
    key = name.lower()
    if key in ("sharegpt", "alpaca"):
        prompt, output = named_pair(key, MAX_TOTAL)
        return Workload(
            key,
            prompt,
            output,
            f"log-normal fits to the PagedAttention paper's {key} means among pairs "
            f"with prompt + output <= {MAX_TOTAL}",
        )
    if key == "seed002":
        return Workload(
            key,
            fixed(1),
            named("seed002"),
            "[paged-sim]: a 1-token prompt then normal(500, 200) clipped [200, 2048] generated "
            "tokens, i.e. the request grows token by token as in the seed's simulation",
        )
    if key == "uniform":
        return Workload(key, uniform(1, 1024), uniform(1, 1024), "uniform 1..1024 both")
    raise ConfigError(f"unknown workload {name!r}; known: {', '.join(WORKLOAD_NAMES)}")


WORKLOAD_NAMES = ("sharegpt", "alpaca", "seed002", "uniform")


def _rng(seed: int | np.random.Generator) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _check_count(name: str, n: int, minimum: int = 1) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {n!r}")


def draw_pairs(
    prompt: LengthDistribution,
    output: LengthDistribution,
    n: int,
    rng: np.random.Generator,
    max_total: int | None = MAX_TOTAL,
) -> tuple[np.ndarray, np.ndarray]:
    """n (prompt, output) length pairs; pairs over `max_total` tokens are drawn again."""
    p = prompt.sample(rng, n)
    o = output.sample(rng, n)
    if max_total is not None:
        if prompt.lo + output.lo > max_total:
            raise ConfigError(f"max_total={max_total} is below the shortest possible pair")
        bad = np.flatnonzero(p + o > max_total)
        while bad.size:
            p[bad] = prompt.sample(rng, bad.size)
            o[bad] = output.sample(rng, bad.size)
            bad = bad[p[bad] + o[bad] > max_total]
    return p, o


def independent(
    num_requests: int,
    prompt: LengthDistribution,
    output: LengthDistribution,
    seed: int | np.random.Generator = 0,
    arrivals: ArrivalProcess | None = None,
    meta: dict[str, Any] | None = None,
    max_total: int | None = MAX_TOTAL,
) -> Trace:
    """Requests with independent prompt and output lengths and no shared tokens.

    Pairs with prompt + output > `max_total` are drawn again (the paper's traces keep
    sequences within the 2,048-token context; about 1% of ShareGPT-like pairs are redrawn,
    which moves the means by well under 1%).
    """
    _check_count("num_requests", num_requests, 0)
    rng = _rng(seed)
    p, o = draw_pairs(prompt, output, num_requests, rng, max_total)
    t = (arrivals or (lambda n, r: all_at_once(n)))(num_requests, rng)
    info = {"generator": "independent", "prompt": prompt.name, "output": output.name}
    return Trace(tuple(requests_from_arrays(t, p, o)), {**info, **(meta or {})})


def system_prompt(
    num_requests: int,
    system_tokens: int,
    prompt: LengthDistribution,
    output: LengthDistribution,
    tenants: int = 1,
    seed: int | np.random.Generator = 0,
    arrivals: ArrivalProcess | None = None,
    max_total: int = MAX_TOTAL,
) -> Trace:
    """Every prompt = one shared system prompt + a private user part of `prompt` length
    (user + output lengths are redrawn until the whole request fits `max_total` tokens).

    Requests are spread round-robin over `tenants` salts ("tenant-0", ...); the system
    prompt's ids are the same for all, but different salts must never share blocks.
    """
    _check_count("num_requests", num_requests, 0)
    _check_count("system_tokens", system_tokens)
    _check_count("tenants", tenants)
    rng = _rng(seed)
    sys_ids = rng.integers(0, VOCAB, size=system_tokens).tolist()
    if system_tokens + prompt.lo + output.lo > max_total:
        raise ConfigError(
            f"system_tokens={system_tokens} leaves no room within {max_total} tokens for a "
            "user prompt and an output"
        )
    user_lens, outs = draw_pairs(prompt, output, num_requests, rng, max_total - system_tokens)
    times = (arrivals or (lambda n, r: all_at_once(n)))(num_requests, rng)
    reqs = []
    for i in range(num_requests):
        user = rng.integers(0, VOCAB, size=int(user_lens[i])).tolist()
        ids = tuple(sys_ids + user)
        reqs.append(
            TraceRequest(
                f"s{i}", float(times[i]), len(ids), int(outs[i]), ids, salt=f"tenant-{i % tenants}"
            )
        )
    meta = {
        "generator": "system_prompt",
        "system_tokens": system_tokens,
        "tenants": tenants,
        "prompt": prompt.name,
        "output": output.name,
    }
    return Trace(tuple(reqs), meta)


def _check_max_total(max_total: int) -> None:
    if isinstance(max_total, bool) or not isinstance(max_total, (int, np.integer)):
        raise ConfigError(f"max_total must be an integer number of tokens, got {max_total!r}")
    if max_total < 2:
        raise ConfigError(
            f"max_total={max_total} leaves no room for a 1-token prompt and a 1-token output"
        )


def _conversation(
    turns: int,
    prompt: LengthDistribution,
    output: LengthDistribution,
    rng: np.random.Generator,
    max_total: int,
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """One chat's (prompt ids, output ids) per turn, at most `turns` turns, each turn's
    prompt + output within `max_total` tokens (see the module docstring for the policy).

    Turn t's prompt is turn t-1's prompt + output + a new user message. A drawn user
    message is clipped to leave 1 output token, a drawn output to the room left; a turn
    that had to be clipped fills the context, so it is the last. Random draws happen in
    the same order whether or not a turn is clipped, so a conversation that never reaches
    the cap is the same as without one (from the same generator state).
    """
    history: tuple[int, ...] = ()
    out: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for _ in range(turns):
        room = max_total - len(history)
        if room < 2:  # no room for 1 user token + 1 output token: the chat is over
            break
        user_len = min(int(prompt.sample(rng, 1)[0]), room - 1)
        ids = history + tuple(rng.integers(0, VOCAB, size=user_len).tolist())
        out_len = min(int(output.sample(rng, 1)[0]), max_total - len(ids))
        out_ids = tuple(rng.integers(0, VOCAB, size=out_len).tolist())
        out.append((ids, out_ids))
        history = ids + out_ids
    return out


def _chat_requests(
    c: int, start: float, turn_gap: float, chat: list[tuple[tuple[int, ...], tuple[int, ...]]]
) -> list[TraceRequest]:
    """Conversation c's turns as requests "c{c}t{t}", turn t arriving at start + gap * t."""
    return [
        TraceRequest(
            f"c{c}t{t}", start + turn_gap * t, len(ids), len(out_ids), ids, output_tokens=out_ids
        )
        for t, (ids, out_ids) in enumerate(chat)
    ]


def multi_turn(
    conversations: int,
    turns: int,
    prompt: LengthDistribution,
    output: LengthDistribution,
    turn_gap: float = 1.0,
    seed: int | np.random.Generator = 0,
    arrivals: ArrivalProcess | None = None,
    max_total: int = MAX_TOTAL,
) -> Trace:
    """Chats of up to `turns` turns; turn t's prompt is the whole conversation so far.

    Conversation c starts at its arrival time; turn t arrives `turn_gap` * t seconds later.
    Each turn carries its `output_tokens`, so the engine generates exactly the ids the
    next turn's prompt repeats. No request exceeds `max_total` tokens (prompt + output):
    a conversation ends when its context is full, after a last turn clipped to fit (module
    docstring), so a conversation may have fewer than `turns` turns and the trace fewer
    than conversations * turns requests. The trace is sorted by arrival (ties keep
    generation order).
    """
    _check_count("conversations", conversations, 0)
    _check_count("turns", turns)
    _check_max_total(max_total)
    if not turn_gap >= 0:
        raise ConfigError(f"turn_gap must be >= 0 seconds, got {turn_gap!r}")
    rng = _rng(seed)
    starts = (arrivals or (lambda n, r: all_at_once(n)))(conversations, rng)
    reqs: list[TraceRequest] = []
    for c in range(conversations):
        chat = _conversation(turns, prompt, output, rng, max_total)
        reqs.extend(_chat_requests(c, float(starts[c]), turn_gap, chat))
    reqs.sort(key=lambda r: r.arrival)
    meta = {
        "generator": "multi_turn",
        "conversations": conversations,
        "turns": turns,
        "max_total": max_total,
    }
    return Trace(tuple(reqs), meta)


def multi_turn_requests(
    num_requests: int,
    turns: int,
    prompt: LengthDistribution,
    output: LengthDistribution,
    turn_gap: float = 1.0,
    seed: int | np.random.Generator = 0,
    arrivals: ArrivalProcess | None = None,
    max_total: int = MAX_TOTAL,
) -> Trace:
    """Exactly `num_requests` chat turns: conversations (as in `multi_turn`) are started
    one after another until they hold at least `num_requests` turns, then the trace is
    sorted by arrival and cut to the first `num_requests` (cutting drops only a
    conversation's latest turns, so every kept turn's history is kept too).

    Conversations that end early at the `max_total` cap are made up for by more
    conversations, so the count never falls short. Conversation start times are the first
    k of `num_requests` draws of `arrivals` (every conversation has >= 1 turn, so k <=
    num_requests); for all-at-once, Poisson and burst arrivals the first k of n draws are
    distributed as k draws.
    """
    _check_count("num_requests", num_requests, 0)
    _check_count("turns", turns)
    _check_max_total(max_total)
    if not turn_gap >= 0:
        raise ConfigError(f"turn_gap must be >= 0 seconds, got {turn_gap!r}")
    rng = _rng(seed)
    starts = (arrivals or (lambda n, r: all_at_once(n)))(num_requests, rng)
    reqs: list[TraceRequest] = []
    c = 0
    while len(reqs) < num_requests:
        chat = _conversation(turns, prompt, output, rng, max_total)
        reqs.extend(_chat_requests(c, float(starts[c]), turn_gap, chat))
        c += 1
    reqs.sort(key=lambda r: r.arrival)
    kept = reqs[:num_requests]
    meta = {
        "generator": "multi_turn",
        "conversations": len({str(r.id).split("t")[0] for r in kept}),
        "turns": turns,
        "max_total": max_total,
    }
    return Trace(tuple(kept), meta)


def parallel_sampling(
    num_prompts: int,
    n: int,
    prompt: LengthDistribution,
    output: LengthDistribution,
    seed: int | np.random.Generator = 0,
    arrivals: ArrivalProcess | None = None,
    max_total: int = MAX_TOTAL,
) -> Trace:
    """Prompts that each ask for n samples (the engine forks n - 1 children); each
    sample's prompt + output fits `max_total` tokens."""
    _check_count("n", n)
    base = independent(num_prompts, prompt, output, seed, arrivals, max_total=max_total)
    reqs = tuple(
        TraceRequest(r.id, r.arrival, r.prompt_len, r.output_len, n=n) for r in base.requests
    )
    return Trace(reqs, {**base.meta, "generator": "parallel_sampling", "n": n})


def beam_search(
    num_prompts: int,
    width: int,
    prompt: LengthDistribution,
    output: LengthDistribution,
    seed: int | np.random.Generator = 0,
    arrivals: ArrivalProcess | None = None,
    max_total: int = MAX_TOTAL,
) -> Trace:
    """Prompts decoded by beam search of `width` beams for output_len steps; each beam's
    prompt + output fits `max_total` tokens."""
    _check_count("width", width)
    base = independent(num_prompts, prompt, output, seed, arrivals, max_total=max_total)
    reqs = tuple(
        TraceRequest(r.id, r.arrival, r.prompt_len, r.output_len, beam_width=width)
        for r in base.requests
    )
    return Trace(reqs, {**base.meta, "generator": "beam_search", "beam_width": width})


SHARING_PATTERNS = ("none", "system-prompt", "multi-turn", "parallel", "beam")


def generate(
    workload_name: str,
    num_requests: int,
    seed: int = 0,
    arrivals: ArrivalProcess | None = None,
    sharing: str = "none",
    system_tokens: int = 500,
    tenants: int = 1,
    turns: int = 4,
    n: int = 4,
    beam_width: int = 4,
    prompt: LengthDistribution | None = None,
    output: LengthDistribution | None = None,
    max_total: int = MAX_TOTAL,
) -> Trace:
    """A trace of a named workload under a sharing pattern (see SHARING_PATTERNS).

    For 'multi-turn', `num_requests` counts turns, exactly (conversations of up to `turns`
    turns, as many as needed: about ceil(n / turns), more when long chats reach the
    `max_total` cap and end early; see `multi_turn_requests`); for 'parallel' and 'beam'
    it counts prompts. `prompt` / `output` override the workload's distributions. No
    request has prompt_len + output_len > `max_total` under any pattern.
    """
    wl = workload(workload_name)
    p, o = prompt or wl.prompt, output or wl.output
    rng = np.random.default_rng(seed)
    meta = {"workload": wl.name, "seed": seed, "sharing": sharing}
    if sharing == "none":
        trace = independent(num_requests, p, o, rng, arrivals, max_total=max_total)
    elif sharing == "system-prompt":
        trace = system_prompt(
            num_requests, system_tokens, p, o, tenants, rng, arrivals, max_total=max_total
        )
    elif sharing == "multi-turn":
        trace = multi_turn_requests(num_requests, turns, p, o, 1.0, rng, arrivals, max_total)
    elif sharing == "parallel":
        trace = parallel_sampling(num_requests, n, p, o, rng, arrivals, max_total=max_total)
    elif sharing == "beam":
        trace = beam_search(num_requests, beam_width, p, o, rng, arrivals, max_total=max_total)
    else:
        raise ConfigError(
            f"unknown sharing pattern {sharing!r}; known: {', '.join(SHARING_PATTERNS)}"
        )
    return Trace(trace.requests, {**trace.meta, **meta})
