"""An iteration-level serving engine over the KV cache contract.

The engine replays a `workloads.trace.Trace` against any `ServingCache`
(`paged.PagedKVCache`, `reference.ContiguousKVCache`, with or without KV tensors) and
records what a serving loop would do with it. One step (iteration) is, in this order
(`Engine.step`, each phase a method):

1. arrivals whose modeled time has come join the waiting queue (FCFS by trace order),
   while fewer than `max_concurrency` requests are in flight when a cap is set;
2. every decoding sequence appends the KV of its last token (oldest first). When the
   cache cannot grow it, the latest-arrived running sequence (below the preemption
   bound) is preempted with the rest of its unit (a beam group, or every running
   sample of an n-sample request, as vLLM preempts a sequence group) - by swap (their
   blocks to the CPU pool, shared blocks copied once; they come back together) or
   recompute (freed and requeued, each with all its tokens), per policy or by the cost
   model - until the append fits or the sequence itself was preempted;
3. prefilling sequences continue their prompt within the token budget (chunked);
4. unless this step preempted: swapped sequences come back (oldest first, respecting
   the watermark), then waiting ones are admitted FCFS while the cache admits them
   (watermark), `max_num_seqs` allows and budget remains (chunking long prompts);
5. a sequence whose prefill completes samples its first token (n-sample requests
   fork their children here); a decoding one samples its next token; those with
   all their output tokens retire and free their memory at once;
6. (event mode) the quiet stretch before the next event is skipped in closed form.

Output-token bookkeeping: after prefill of P prompt tokens a sequence has generated 1
token and holds P tokens of KV; each decode step appends one token's KV and generates one
more, so a finished sequence generated exactly output_len tokens and held at most
P + output_len - 1 tokens of KV.

Beam search (`paged.serving.beams`, `engine.groups`): a request with beam_width w is prefilled
once, forked into w beams at its first token, and then, in lockstep, decodes a token per
beam and selects (prunes and forks) every step; a group decodes a step only if the whole
step fits, and is preempted (swap or recompute), re-admitted and resumed as a unit, so it
is never split. A group finishes with one record; its generated tokens count
w x output_len.

Event mode (`engine.decode`). A decoding sequence's append only matters on a step where
it needs memory (a block boundary, a pow2 relocation, a copy-on-write after a fork), fills
a block whose ids are indexed, or finishes; on every other step it is a non-allocating
append that no decision can observe. In `mode="event"` such appends are deferred and
flushed in one call at the sequence's next event, steps where nothing else happens are
skipped (time and metrics of the skipped stretch are closed-form sums, `engine.clock`),
and an admission that failed is not retried until the cache, the queue head or the batch
changed. `mode="token"` appends every token every step and retries admission every step;
the conformance suite proves the two make identical decisions on random traces.

The engine reads caches only through the contract (`reference.contract.ServingCache`):
`serving_traits`, `footprint`, `next_growth`, `occupancy`, block counts, `append_tokens`
and group swaps. Its state is one dataclass (`engine.state.EngineState`); sequence
states are `SeqState`; `Engine.check` asserts the invariants between steps
(`engine.invariants`).

Bad input: a request that could never be served (longer than max_seq_len, more memory
than the cache can ever give one request, a prompt over the token budget without chunked
prefill, a beam group whose beams could not all be re-admitted alone) is rejected before
the run with `RequestTooLargeError` naming its trace line (`engine.validate`); a beam
request on a cache without blocks is refused (`ConfigError`). A run that could never
change state again, or whose preemptions cycle without progress (nothing decoded,
prefilled or finished for 10,000 steps), raises `SchedulerError` instead of looping (`engine.guards`).
Nothing is dropped silently: the run ends only when every sequence finished, and the
cache is empty afterwards.

Entry point for other layers: `paged.serving.simulation.simulate`.
"""

from kvbench.paged.serving.engine.engine import Engine
from kvbench.paged.serving.engine.guards import BARREN_STEP_LIMIT
from kvbench.paged.serving.engine.sequence import Seq, SeqState, kv_for_tokens
from kvbench.paged.serving.engine.validate import RequestTooLargeError, SchedulerError

__all__ = [
    "BARREN_STEP_LIMIT",
    "Engine",
    "RequestTooLargeError",
    "SchedulerError",
    "Seq",
    "SeqState",
    "kv_for_tokens",
]
