"""Requests the engine could never serve, rejected before a run starts.

A request is rejected (naming its trace line, counted from 2 as in the JSONL file after
its header) when it could never finish on the cache: longer than max_seq_len, more
memory than the cache can ever give one request (`ServingCache.footprint`), a prompt over
the token budget without chunked prefill (under the vllm-v1 policy, its prompt and all
but its last output: a recompute after a preemption prefills them in one step, as vLLM
v1, which refuses a budget under max_model_len without chunked prefill), or a beam group
whose beams could not all be re-admitted alone. Such a request would otherwise wait
forever.
"""

from __future__ import annotations

from kvbench.paged.serving.beams import max_group_blocks
from kvbench.paged.serving.engine.sequence import CHILDREN
from kvbench.paged.serving.time_model import SchedulerConfig
from kvbench.reference.contract import ServingCache, ServingTraits
from kvbench.workloads.errors import ConfigError, KVBenchError
from kvbench.workloads.trace import SYNTH_BASE, Trace, TraceRequest

#: Generated beam ids of one request must stay below the next request's synthetic ids.
ID_ROOM = SYNTH_BASE // 2


class SchedulerError(KVBenchError):
    """The engine cannot serve the trace on this cache."""


class RequestTooLargeError(SchedulerError):
    """A request that could never fit the cache (rejected before the run starts, so it
    is never retried forever)."""


def check_trace(
    cache: ServingCache, traits: ServingTraits, cfg: SchedulerConfig, trace: Trace
) -> None:
    """Raise RequestTooLargeError / ConfigError for the first request that could never
    be served (see the module docstring); nothing else is checked or changed."""
    max_len = traits.max_seq_len
    for i, r in enumerate(trace.requests):
        line = f"trace line {i + 2}: request {r.id!r}"
        total = r.prompt_len + r.output_len
        if r.beam_width > 1:
            check_beam(cache, traits, cfg, line, r)
        if r.n >= CHILDREN:
            raise ConfigError(
                f"{line} has n={r.n}; the engine serves at most {CHILDREN - 1} sequences "
                "per request"
            )
        if not cfg.chunked_prefill and r.prompt_len > cfg.max_batched_tokens:
            raise RequestTooLargeError(
                f"{line} has a {r.prompt_len}-token prompt, over max_batched_tokens="
                f"{cfg.max_batched_tokens} without chunked prefill"
            )
        if (
            cfg.policy == "vllm-v1"
            and not cfg.chunked_prefill
            and total - 1 > cfg.max_batched_tokens
        ):
            raise RequestTooLargeError(
                f"{line} may need {total - 1} tokens in one step (its prompt and all but "
                f"its last output, recomputed after a preemption), over max_batched_tokens="
                f"{cfg.max_batched_tokens} without chunked prefill (vLLM v1 refuses "
                "max_num_batched_tokens < max_model_len without chunked prefill)"
            )
        if total - 1 > max_len:
            raise RequestTooLargeError(
                f"{line} needs {total - 1} tokens, past the cache's max_seq_len={max_len}; "
                "it could never finish"
            )
        fp = cache.footprint(total)
        if fp.need > fp.room:
            raise RequestTooLargeError(
                f"{line} needs {fp.need} {fp.unit} ({total} tokens) but only {fp.room} can "
                "ever be given to one request"
            )


def check_beam(
    cache: ServingCache, traits: ServingTraits, cfg: SchedulerConfig, line: str, r: TraceRequest
) -> None:
    """A beam group needs a cache with blocks (sharing), w sequences under max_num_seqs,
    and its worst case (every beam holding its history alone) within the admissible
    blocks."""
    w = r.beam_width
    if not traits.block_size:
        raise ConfigError(
            f"{line} has beam_width={w}; beam search needs block sharing (a paged cache), "
            "this cache has no blocks"
        )
    if w > cfg.max_num_seqs:
        raise RequestTooLargeError(
            f"{line} has beam_width={w}, over max_num_seqs={cfg.max_num_seqs}"
        )
    if 2 * w * r.output_len >= ID_ROOM:
        raise ConfigError(
            f"{line} may number {2 * w * r.output_len} beam tokens; the engine numbers at "
            f"most {ID_ROOM - 1} per request"
        )
    total = r.prompt_len + r.output_len
    fp = cache.footprint(total)
    usable = fp.room
    # w beams each holding its history alone (a page per block of every layer group)
    need = max(max_group_blocks(w, total, traits.block_size), w * fp.need)
    if need > usable:
        raise RequestTooLargeError(
            f"{line} (beam_width={w}) can need {need} blocks (every beam recomputed alone) "
            f"but only {usable} can ever be admitted"
        )
