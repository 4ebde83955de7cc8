"""Seeded trace generators, from independent requests to the sharing patterns.

Each generator takes a numpy Generator (or a seed) and returns a `Trace`, so the same
arguments always give the same trace:

    independent       no sharing: synthetic, never-overlapping prompts (`prompt_len` only);
    system_prompt     one system prompt of N tokens in front of every prompt, with
                      `tenants` distinct salts (requests of different tenants never share);
    multi_turn        conversations whose turn t prompt is turn t-1's prompt + its output
                      tokens + a new user message (output ids are in the trace so the
                      engine emits exactly them and turn t can hit turn t-1's blocks);
    parallel_sampling n outputs per prompt (the engine forks after the prefill);
    beam_search       beam width w per prompt (the engine forks and prunes every step).

`WORKLOADS` names the length-distribution pairs of the CLI's `--workload` (sharegpt,
alpaca, seed002, uniform); `generate` dispatches on a sharing pattern by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from workloads.arrivals import ArrivalProcess, all_at_once
from workloads.distributions import LengthDistribution, fixed, named, named_pair, uniform
from workloads.errors import ConfigError
from workloads.trace import Trace, TraceRequest, requests_from_arrays

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
            "seed 002: a 1-token prompt then normal(500, 200) clipped [200, 2048] generated "
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
) -> Trace:
    """Every prompt = one shared system prompt + a private user part of `prompt` length
    (user + output lengths are redrawn until the whole request fits MAX_TOTAL tokens).

    Requests are spread round-robin over `tenants` salts ("tenant-0", ...); the system
    prompt's ids are the same for all, but different salts must never share blocks.
    """
    _check_count("num_requests", num_requests, 0)
    _check_count("system_tokens", system_tokens)
    _check_count("tenants", tenants)
    rng = _rng(seed)
    sys_ids = rng.integers(0, VOCAB, size=system_tokens).tolist()
    if system_tokens + prompt.lo + output.lo > MAX_TOTAL:
        raise ConfigError(
            f"system_tokens={system_tokens} leaves no room within {MAX_TOTAL} tokens for a "
            "user prompt and an output"
        )
    user_lens, outs = draw_pairs(prompt, output, num_requests, rng, MAX_TOTAL - system_tokens)
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


def multi_turn(
    conversations: int,
    turns: int,
    prompt: LengthDistribution,
    output: LengthDistribution,
    turn_gap: float = 1.0,
    seed: int | np.random.Generator = 0,
    arrivals: ArrivalProcess | None = None,
) -> Trace:
    """Chats of `turns` turns; turn t's prompt is the whole conversation so far.

    Conversation c starts at its arrival time; turn t arrives `turn_gap` * t seconds later.
    Each turn carries its `output_tokens`, so the engine generates exactly the ids the
    next turn's prompt repeats. The trace is sorted by arrival (ties keep generation order).
    """
    _check_count("conversations", conversations, 0)
    _check_count("turns", turns)
    if not turn_gap >= 0:
        raise ConfigError(f"turn_gap must be >= 0 seconds, got {turn_gap!r}")
    rng = _rng(seed)
    starts = (arrivals or (lambda n, r: all_at_once(n)))(conversations, rng)
    reqs: list[TraceRequest] = []
    for c in range(conversations):
        history: list[int] = []
        for t in range(turns):
            user = rng.integers(0, VOCAB, size=int(prompt.sample(rng, 1)[0])).tolist()
            ids = tuple(history + user)
            out_len = int(output.sample(rng, 1)[0])
            out_ids = tuple(rng.integers(0, VOCAB, size=out_len).tolist())
            arrival = float(starts[c]) + turn_gap * t
            reqs.append(
                TraceRequest(f"c{c}t{t}", arrival, len(ids), out_len, ids, output_tokens=out_ids)
            )
            history = list(ids) + list(out_ids)
    reqs.sort(key=lambda r: r.arrival)
    meta = {"generator": "multi_turn", "conversations": conversations, "turns": turns}
    return Trace(tuple(reqs), meta)


def parallel_sampling(
    num_prompts: int,
    n: int,
    prompt: LengthDistribution,
    output: LengthDistribution,
    seed: int | np.random.Generator = 0,
    arrivals: ArrivalProcess | None = None,
) -> Trace:
    """Prompts that each ask for n samples (the engine forks n - 1 children)."""
    _check_count("n", n)
    base = independent(num_prompts, prompt, output, seed, arrivals)
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
) -> Trace:
    """Prompts decoded by beam search of `width` beams for output_len steps."""
    _check_count("width", width)
    base = independent(num_prompts, prompt, output, seed, arrivals)
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
) -> Trace:
    """A trace of a named workload under a sharing pattern (see SHARING_PATTERNS).

    For 'multi-turn', `num_requests` counts turns (conversations = ceil(n / turns)); for
    'parallel' and 'beam' it counts prompts. `prompt` / `output` override the workload's
    distributions.
    """
    wl = workload(workload_name)
    p, o = prompt or wl.prompt, output or wl.output
    rng = np.random.default_rng(seed)
    meta = {"workload": wl.name, "seed": seed, "sharing": sharing}
    if sharing == "none":
        trace = independent(num_requests, p, o, rng, arrivals)
    elif sharing == "system-prompt":
        trace = system_prompt(num_requests, system_tokens, p, o, tenants, rng, arrivals)
    elif sharing == "multi-turn":
        _check_count("turns", turns)
        convs = -(-num_requests // turns)
        trace = multi_turn(convs, turns, p, o, 1.0, rng, arrivals)
        trace = Trace(trace.requests[:num_requests], trace.meta)
    elif sharing == "parallel":
        trace = parallel_sampling(num_requests, n, p, o, rng, arrivals)
    elif sharing == "beam":
        trace = beam_search(num_requests, beam_width, p, o, rng, arrivals)
    else:
        raise ConfigError(
            f"unknown sharing pattern {sharing!r}; known: {', '.join(SHARING_PATTERNS)}"
        )
    return Trace(trace.requests, {**trace.meta, **meta})
