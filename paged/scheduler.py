"""An iteration-level serving engine over the KV cache contract.

The engine replays a `workloads.trace.Trace` against any KVCache (`paged.PagedKVCache`,
`reference.ContiguousKVCache`, with or without KV tensors) and records what a serving
loop would do with it. One step (iteration) is, in this order:

1. arrivals whose modeled time has come join the waiting queue (FCFS by trace order);
2. every decoding sequence appends the KV of its last token (oldest first). When the
   cache cannot grow it, the latest-arrived running sequence (below the preemption
   bound) is preempted with the rest of its request (a beam group, or every running
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
   all their output tokens retire and free their memory at once.

Output-token bookkeeping: after prefill of P prompt tokens a sequence has generated 1
token and holds P tokens of KV; each decode step appends one token's KV and generates one
more, so a finished sequence generated exactly output_len tokens and held at most
P + output_len - 1 tokens of KV.

Beam search (`paged.beams`): a request with beam_width w is prefilled once, forked into
w beams at its first token, and then, in lockstep, decodes a token per beam and selects
(prunes and forks) every step; a group decodes a step only if the whole step fits, and is
preempted (swap or recompute), re-admitted and resumed as a unit, so it is never split. A
group finishes with one record; its generated tokens count w x output_len.

Event mode. A decoding sequence's append only matters on a step where it needs memory
(a block boundary, a pow2 relocation, a copy-on-write after a fork), fills a block whose
ids are indexed, or finishes; on every other step it is a non-allocating append that no
decision can observe. In `mode="event"` such appends are deferred and flushed in one call
at the sequence's next event, steps where nothing else happens are skipped (time and
metrics of the skipped stretch are closed-form sums), and an admission that failed is
not retried until the cache, the queue head or the batch changed. `mode="token"` appends
every token every step and retries admission every step; the conformance suite proves
the two make identical decisions on random traces.

Bad input: a request that could never be served (longer than max_seq_len, more blocks
than the pool minus the watermark, a reservation larger than a contiguous arena, a prompt
over the token budget without chunked prefill, a beam group whose beams could not all
be re-admitted alone) is rejected before the run with `RequestTooLargeError` naming its
trace line; a beam request on a contiguous cache is refused (`ConfigError`). A run that
could never change state again, or whose preemptions cycle without progress (nothing
decoded, prefilled or finished for 10,000 steps), raises `SchedulerError` instead of
looping. Nothing is dropped silently: the run ends only when every sequence finished,
and the cache is empty afterwards.

Entry point for other layers: `paged.scheduler_setup.simulate`.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Sequence
from heapq import heappop, heappush

from kvbench.paged.beams import BeamGroup, max_group_blocks, plan_selection
from kvbench.paged.scheduler_model import (
    SchedulerConfig,
    SimulationResult,
    StepRow,
    TimeModel,
)
from kvbench.paged.scheduler_seq import (
    CHILDREN,
    FINISHED,
    NEVER,
    RUNNING,
    SWAPPED,
    WAITING,
    CacheAdapter,
    Seq,
    by_order,
)
from kvbench.reference.contiguous import next_pow2
from kvbench.reference.contract import KVCache
from kvbench.workloads.errors import CapacityError, ConfigError, KVBenchError
from kvbench.workloads.trace import SYNTH_BASE, Trace, TraceRequest

log = logging.getLogger(__name__)

#: Generated beam ids of one request must stay below the next request's synthetic ids.
_ID_ROOM = SYNTH_BASE // 2
#: Consecutive steps in which nothing decodes, prefills or finishes before the engine
#: calls it a livelock. A sound run has such steps only between a preemption or swap-in
#: and the next decode (a few in a row); a cycle of preemptions that can never make
#: progress has nothing else, and is cheap to run this long.
_BARREN_STEP_LIMIT = 10_000


class SchedulerError(KVBenchError):
    """The engine cannot serve the trace on this cache."""


class RequestTooLargeError(SchedulerError):
    """A request that could never fit the cache (rejected before the run starts, so it
    is never retried forever)."""


#: `step_hook(step, decoded, chunks, model_ps)`: called once per processed step, after
#: the step's appends and before its finishes free their memory, with the sequences that
#: decoded a token in it and are still running, as (sequence id, KV length before the
#: token), its prefill chunks as (sequence id, first position, tokens) and the time
#: model's price of the step (ps; 0 without a model); it may return the step's duration
#: in picoseconds, which replaces the model's (a measured clock).
StepHook = Callable[[int, list[tuple[str, int]], list[tuple[str, int, int]], int], "int | None"]


class Engine:
    """Replays traces against one cache under a SchedulerConfig (see module docstring).

    The cache must be empty and is left empty after `run`. `time_model` prices steps
    (modeled seconds) and drives the `auto` preemption cost model (required for it).
    `step_hook` (see StepHook) lets a caller run each step for real, e.g. a model's
    forward pass over the cache, and time it; it needs token mode (every step visited).
    """

    def __init__(
        self,
        cache: KVCache,
        config: SchedulerConfig | None = None,
        time_model: TimeModel | None = None,
        step_hook: StepHook | None = None,
    ) -> None:
        self.cache = cache
        self.cfg = config or SchedulerConfig()
        self.tm = time_model
        self.step_hook = step_hook
        if self.cfg.preemption == "auto" and time_model is None:
            raise ConfigError("preemption 'auto' needs a time model (device profile)")
        self.ad = CacheAdapter(cache)
        if cache.request_ids():
            raise ConfigError("the engine needs an empty cache")

    # ------------------------------------------------------------------ validation
    def _check_fits(self, trace: Trace) -> None:
        cache, ad = self.cache, self.ad
        max_len = getattr(cache, "max_seq_len", None)
        for i, r in enumerate(trace.requests):
            total = r.prompt_len + r.output_len
            if r.beam_width > 1:
                self._check_beam_fits(i, r)
            if r.n >= CHILDREN:
                raise ConfigError(
                    f"trace line {i + 2}: request {r.id!r} has n={r.n}; the engine serves "
                    f"at most {CHILDREN - 1} sequences per request"
                )
            if not self.cfg.chunked_prefill and r.prompt_len > self.cfg.max_batched_tokens:
                raise RequestTooLargeError(
                    f"trace line {i + 2}: request {r.id!r} has a {r.prompt_len}-token prompt, "
                    f"over max_batched_tokens={self.cfg.max_batched_tokens} without chunked "
                    "prefill"
                )
            if max_len is not None and total - 1 > max_len:
                raise RequestTooLargeError(
                    f"trace line {i + 2}: request {r.id!r} needs {total - 1} tokens, past "
                    f"the cache's max_seq_len={max_len}; it could never finish"
                )
            need, room = self._footprint(r)
            if need > room:
                what = (
                    f"{need} blocks ({total} tokens) but only {room} can ever be admitted "
                    f"({cache.num_blocks} blocks, watermark {cache.watermark_blocks})"
                    if ad.paged
                    else f"a {need}-slot reservation; the cache has {room} slots"
                )
                raise RequestTooLargeError(f"trace line {i + 2}: request {r.id!r} needs {what}")

    def _footprint(self, r: TraceRequest) -> tuple[int, int]:
        """(most one sequence of `r` can come to hold, most the cache can ever give one
        request): blocks within the admissible pool (paged), slots of its reservation
        within the arena (contiguous); (0, 0) for other caches (nothing known)."""
        cache, ad = self.cache, self.ad
        total = r.prompt_len + r.output_len
        if ad.paged:
            return -(-total // ad.block_size), cache.num_blocks - cache.watermark_blocks
        if ad.contiguous:
            size = cache.max_seq_len if cache.policy == "max" else total
            if cache.policy == "pow2":
                size = min(next_pow2(total), cache.max_seq_len)
            return size, cache.capacity_tokens
        return 0, 0

    def _family_fits(self, r: TraceRequest) -> bool:
        """Whether the n samples of `r` are preempted as one unit: configured so
        (sample_preemption "request") and able to run to completion alone in the cache,
        each holding its own history (a unit that could not would never make progress);
        else each sample is preempted alone."""
        if self.cfg.sample_preemption == "sequence":
            return False
        need, room = self._footprint(r)
        return r.n * need <= room and (self.ad.paged or self.ad.contiguous)

    def _check_beam_fits(self, i: int, r: TraceRequest) -> None:
        """A beam group needs a paged cache, w sequences under max_num_seqs, and its
        worst case (every beam holding its history alone) within the admissible pool."""
        cache, ad, w = self.cache, self.ad, r.beam_width
        if not ad.paged:
            raise ConfigError(
                f"trace line {i + 2}: request {r.id!r} has beam_width={w}; beam search needs "
                "block sharing (a paged cache), the contiguous reference has none"
            )
        if w > self.cfg.max_num_seqs:
            raise RequestTooLargeError(
                f"trace line {i + 2}: request {r.id!r} has beam_width={w}, over "
                f"max_num_seqs={self.cfg.max_num_seqs}"
            )
        if 2 * w * r.output_len >= _ID_ROOM:
            raise ConfigError(
                f"trace line {i + 2}: request {r.id!r} may number {2 * w * r.output_len} "
                f"beam tokens; the engine numbers at most {_ID_ROOM - 1} per request"
            )
        usable = cache.num_blocks - cache.watermark_blocks
        need = max_group_blocks(w, r.prompt_len + r.output_len, ad.block_size)
        if need > usable:
            raise RequestTooLargeError(
                f"trace line {i + 2}: request {r.id!r} (beam_width={w}) can need {need} "
                f"blocks (every beam recomputed alone) but only {usable} can ever be admitted"
            )

    # ------------------------------------------------------------------ run
    def run(self, trace: Trace, progress: Callable[[int], None] | None = None) -> SimulationResult:
        """Simulate `trace` to completion; `progress(k)` is called as k sequences finish.

        The cyclic garbage collector is paused during the run: the engine and the cache
        allocate millions of small acyclic objects, and collection passes over them cost
        more than the simulation itself. Nothing the run creates needs cycle collection.
        """
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run(trace, progress)
        finally:
            if enabled:
                gc.enable()

    def _run(self, trace: Trace, progress: Callable[[int], None] | None = None) -> SimulationResult:
        t_wall = time.perf_counter()
        t_cpu = time.process_time()
        self._check_fits(trace)
        cfg, ad, cache, tm = self.cfg, self.ad, self.cache, self.tm
        hook = self.step_hook
        if hook is not None and cfg.mode != "token":
            raise ConfigError("a step hook needs mode='token' (every step visited)")
        decoded: list[tuple[Seq, int]] = []  # this step's decoders (hook only)
        event_mode = cfg.mode == "event"
        bs = ad.block_size
        hash_mode = cfg.hash_outputs
        # Synthetic output ids can only be matched by prompts that contain ids that large.
        big_prompt_ids = any(
            r.prompt is not None and r.prompt and max(r.prompt) >= SYNTH_BASE
            for r in trace.requests
        )
        reqs = trace.requests
        arrivals_ps = [round(r.arrival * 1e12) for r in reqs]
        next_arrival = 0
        seqs: list[Seq] = []

        waiting: list[tuple[tuple[int, int], Seq]] = []  # heap by order
        swapped: list[tuple[tuple[int, int], Seq]] = []
        running: list[Seq] = []  # sorted by order
        # decoder events, a calendar queue: step -> [(version, seq)], plus a heap of the
        # steps that have a bucket (an entry is stale once the sequence's version moved on)
        buckets: dict[int, list[tuple[int, Seq]]] = {}
        event_steps: list[int] = []
        prefilling: list[Seq] = []  # running, not yet decoding, sorted by order

        # decoder aggregates: logical KV length at the start of step t is A + D * t
        agg = {"A": 0, "D": 0, "sync": 0}

        def hashes(seq: Seq) -> bool:
            """Whether the sequence's output token ids go to the cache (so its full
            output blocks are indexed by the prefix cache). Fixed for a sequence."""
            return seq.hashed

        def new_seq(req: TraceRequest, index: int, child: int, prompt: Sequence[int]) -> Seq:
            seq = Seq(req, index, child, prompt)
            if ad.prefix and hash_mode != "never":
                seq.hashed = hash_mode == "always" or seq.out_tokens is not None or big_prompt_ids
            if req.beam_width > 1:  # a beam root: its history is kept explicitly
                seq.group = BeamGroup(index, req.beam_width, [seq])
                seq.out_tokens = []
            seqs.append(seq)
            return seq

        def new_beam(group: BeamGroup, parent: Seq, t: int, c: int) -> Seq:
            """A fork of `parent` (KV length c, decoding from step t + 1) that took another
            token for its last one (not in `seqs`: a group has one record, its root's)."""
            child = Seq(parent.req, group.index, group.next_child, parent.prompt)
            group.next_child += 1
            child.hashed, child.group, child.rec = parent.hashed, group, parent.rec
            child.out_tokens = [*parent.out_tokens[:-1], group.new_token()]
            child.generated = parent.generated
            cache.fork(parent.sid, child.sid)  # after its prefill a fork takes no blocks
            child.state = RUNNING
            child.cow = parent.cow = True
            add_running(child)
            start_decoding(child, t + 1, c, c)
            return child

        def c_at(seq: Seq, t: int) -> int:
            return seq.base_c + (t - seq.base_step)

        def start_decoding(seq: Seq, t: int, c: int, synced: int) -> None:
            seq.decoding = True
            seq.base_step, seq.base_c, seq.base_g, seq.synced = t, c, seq.generated, synced
            agg["A"] += c - t
            agg["D"] += 1
            agg["sync"] += synced
            schedule(seq, t)

        def stop_decoding(seq: Seq) -> None:
            if seq.decoding:
                agg["A"] -= seq.base_c - seq.base_step
                agg["D"] -= 1
                agg["sync"] -= seq.synced
                seq.decoding = False
                seq.version += 1

        def schedule(seq: Seq, t: int) -> None:
            """Queue the decoder's next event at or after step t (its state is at the
            start of step t): the step that generates its last token, that appends at a
            growth point, or that fills an indexed block. Token mode: every step."""
            version = seq.version = seq.version + 1
            nxt = t
            if event_mode and seq.group is None:  # beams fork and prune every step
                dt = t - seq.base_step
                c = seq.base_c + dt
                nxt = t + (seq.req.output_len - seq.base_g - dt - 1)
                if bs and not seq.cow:
                    gap = -c % bs  # tokens until the next block boundary
                    if seq.hashed:
                        gap = min(gap, (bs - 1 - c) % bs)
                else:
                    gap = ad.growth_point(seq, c) - c
                if gap < nxt - t:
                    nxt = t + gap
            seq.event_step = nxt
            bucket = buckets.get(nxt)
            if bucket is None:
                buckets[nxt] = [(version, seq)]
                heappush(event_steps, nxt)
            else:
                bucket.append((version, seq))

        def sync(seq: Seq, upto: int) -> None:
            """Flush a decoder's deferred appends so its cache length is `upto`."""
            n = upto - seq.synced
            if n > 0:
                ids = seq.tokens(seq.synced, upto) if hashes(seq) else None
                ad.append(seq, seq.synced, n, ids)
                agg["sync"] += n
                seq.synced = upto

        def rebase(seq: Seq, t: int, c: int, g: int) -> None:
            """Make (c, g) the decoder's logical state at the start of step t."""
            agg["A"] += (c - t) - (seq.base_c - seq.base_step)
            seq.base_step, seq.base_c, seq.base_g = t, c, g

        # ---------------------------------------------------------------- bookkeeping
        # epoch: bumped by every cache change an admission could observe
        st = {"epoch": 0, "fail_key": None, "preempted": False, "cursor": -1}
        st.update(swap_ps=0, dec=0, kv_read=0)
        totals = {"pre": 0, "swap": 0, "rec": 0, "gen": 0, "finished": 0, "overrides": 0}
        totals["events"] = 0  # decoder events + admissions + swap-ins + finishes
        finished_now: list[Seq] = []

        def bump() -> None:
            st["epoch"] += 1

        def remove_running(seq: Seq) -> None:
            running.remove(seq)
            if seq in prefilling:
                prefilling.remove(seq)

        def detach(victim: Seq, t: int) -> int:
            """Take a sequence out of the running batch; returns its KV length."""
            if victim.decoding:
                appended = 1 if victim.order < st["cursor"] else 0
                c = c_at(victim, t) + appended
                victim.generated = victim.base_g + (t - victim.base_step) + appended
                if not appended:  # it will not decode in this step after all
                    st["dec"] -= 1
                    st["kv_read"] -= c + 1
                sync(victim, c)
                stop_decoding(victim)
            else:
                c = victim.computed
                victim.parked = False
            remove_running(victim)
            return c

        def unit_of(seq: Seq, state: int) -> list[Seq]:
            """The sequences preempted and resumed with `seq`: its beam group (a group has
            one record, its root's), the members of its n-sample family in `state` that did
            not finish this step (a family preempted together is swapped together, so the
            swapped ones come back together), or itself."""
            if seq.group is not None:
                return seq.group.beams
            if seq.family is not None:
                return [s for s in seq.family if s.state == state and s not in finished_now]
            return [seq]

        def preempt(victim: Seq, t: int) -> None:
            """Preempt the victim's whole request: its beam group, the running sequences of
            its n-sample family, or itself. Swap all of them together (shared blocks
            copied once) when the policy or the cost model says so, every one is decoding
            and swap space holds them; else recompute them all (each requeued alone with
            all its tokens). A family is a unit only when it fits the cache whole
            (`_family_fits`), so a unit can always finish."""
            unit = unit_of(victim, RUNNING)
            records = [s.rec for s in unit] if victim.group is None else [unit[0].rec]
            st["preempted"] = True
            totals["pre"] += 1
            for rec in records:
                rec.preemptions += 1
            decoders = all(s.decoding for s in unit)
            lengths = [detach(s, t) for s in unit]
            sids = [s.sid for s in unit]
            use_swap = False
            blocks = 0
            if decoders and ad.can_swap:
                blocks = ad.distinct_blocks(sids)
                if cfg.preemption == "swap":
                    use_swap = True
                elif cfg.preemption == "auto":
                    assert tm is not None
                    use_swap = 2 * tm.swap_ps(blocks) <= tm.recompute_ps(sum(lengths))
            if use_swap:
                try:
                    cache.swap_out_group(sids)
                except CapacityError:
                    use_swap = False  # swap space full: recompute instead
            bump()
            for s, c in zip(unit, lengths, strict=True):
                if use_swap:
                    s.state, s.computed = SWAPPED, c
                    heappush(swapped, (s.order, s))
                else:
                    cache.free(s.sid)
                    s.state, s.computed = WAITING, 0
                    s.target = len(s.prompt) + s.generated
                    heappush(waiting, (s.order, s))
            if use_swap:
                if tm is not None:
                    st["swap_ps"] += tm.swap_ps(blocks)
                for rec in records:
                    rec.swaps += 1
                totals["swap"] += 1
            else:
                for rec in records:
                    rec.recomputes += 1
                totals["rec"] += 1

        def group_step(group: BeamGroup, t: int) -> None:
            """Decode one token for every beam of a group, or none: the group's whole step
            (a block or copy-on-write per beam, at worst) must fit, else a victim is
            preempted (perhaps the group itself). Then select (prune and fork) or finish."""
            beams = group.beams
            st["cursor"] = beams[0].order
            c = c_at(beams[0], t)
            g = beams[0].base_g + (t - beams[0].base_step)
            while sum(cache.blocks_needed_to_grow(b.sid, 1) for b in beams) > cache.pool.num_free:
                victim = choose_victim()
                preempt(victim, t)
                if victim.group is group:
                    return
            for b in beams:
                ad.append(b, c, 1, [b.token(c)] if b.hashed else None)  # fits: checked
                if hook is not None:
                    decoded.append((b, c))
                b.cow = False
                b.synced = c + 1
                agg["sync"] += 1
                b.generated = g + 1
                b.out_tokens.append(group.new_token())
                b.base_step, b.base_c, b.base_g = t + 1, c + 1, g + 1
            bump()
            if g + 1 >= beams[0].req.output_len:
                for b in beams:
                    b.version += 1  # no further events
                    finished_now.append(b)
                return
            select(group, t, c + 1)

        def select(group: BeamGroup, t: int, c: int) -> None:
            """The next beams choose their parents (KV length c): prune the unchosen,
            fork the rest."""
            old = group.beams
            pruned, forks = plan_selection(group.parent_counts())
            for i in pruned:
                beam = old[i]
                stop_decoding(beam)
                remove_running(beam)
                cache.free(beam.sid)
                beam.state = FINISHED
            gone = set(pruned)
            survivors = [b for i, b in enumerate(old) if i not in gone]
            group.beams = survivors
            for b in survivors:
                schedule(b, t + 1)
            for i, k in forks:
                for _ in range(k):
                    group.beams.append(new_beam(group, old[i], t, c))
            group.beams.sort(key=by_order)
            if pruned or forks:
                bump()

        def start_group(root: Seq, t: int) -> None:
            """The root's prefill sampled the first step: fork it into the w beams."""
            group = root.group
            assert group is not None
            root.out_tokens.append(group.new_token())
            if root.generated >= root.req.output_len:
                finished_now.append(root)
                return
            start_decoding(root, t + 1, root.computed, root.computed)
            for _ in range(group.width - 1):
                group.beams.append(new_beam(group, root, t, root.computed))
            bump()

        def resume_group(beam: Seq, t: int) -> None:
            """A recomputed beam finished its prefill: park it until all its group's beams
            have; then, as after a decode step, they all sample their next token and the
            group finishes or selects."""
            group = beam.group
            assert group is not None
            beam.parked = True
            if not all(b.parked for b in group.beams):
                return
            c = beam.computed
            for b in group.beams:
                b.parked = False
                b.generated += 1
                b.out_tokens.append(group.new_token())
                if b.generated >= b.req.output_len:
                    finished_now.append(b)
                else:
                    start_decoding(b, t + 1, c, c)
            if not finished_now or finished_now[-1].group is not group:
                select(group, t, c)

        def admit_group(group: BeamGroup, t: int) -> bool:
            """Re-admit every beam of a recomputed group, or none (False): the sum of
            their admission costs (an upper bound: one beam's revived prefix hits are
            free for the next) must keep the watermark."""
            need = sum(
                cache.blocks_needed_to_admit(b.tokens(0, b.target), salt=b.salt)
                for b in group.beams
            )
            if cache.pool.num_free - need < cache.watermark_blocks:
                return False
            for b in group.beams:
                heappop(waiting)  # the group's beams head the queue (adjacent orders)
                b.computed = cache.admit(
                    b.sid,
                    b.tokens(0, b.target),
                    salt=b.salt,
                    output_len=b.req.output_len - b.generated,
                )
                b.state = RUNNING
                add_running(b)
                prefilling.append(b)
            prefilling.sort(key=by_order)
            bump()
            totals["events"] += 1
            return True

        def prefill_group(group: BeamGroup, budget: int, chunks: list) -> int:
            """Queue this step's prefill chunks of a re-admitted group; returns the budget
            left."""
            for b in group.beams:
                take = min(b.target - b.computed, budget)
                if take > 0:
                    chunks.append((b, take))
                    budget -= take
            return budget

        def choose_victim() -> Seq:
            """The latest-arrived running sequence below the preemption bound (else the
            latest-arrived), never one that already finished in this step."""
            fallback = None
            for cand in reversed(running):
                if cand in finished_now:
                    continue
                if fallback is None:
                    fallback = cand
                if cand.rec.preemptions < cfg.max_preemptions:
                    return cand
            totals["overrides"] += 1
            assert fallback is not None
            return fallback

        def grow(seq: Seq, t: int, c: int) -> bool:
            """Append the decoder's step-t token at position c, preempting as needed.
            Returns False when the sequence itself was preempted."""
            ids = [seq.token(c)] if hashes(seq) else None
            while True:
                try:
                    ad.append(seq, c, 1, ids)
                    return True
                except CapacityError:
                    preempt(choose_victim(), t)
                    if seq.state != RUNNING:  # it was the victim, or in the victim's family
                        return False

        def flush_and_grow(seq: Seq, t: int, c: int) -> bool:
            """Deferred appends plus this step's token in one cache call when it fits;
            otherwise flush (never allocates) and grow with preemption."""
            n = c - seq.synced
            if n > 0:
                ids = seq.tokens(seq.synced, c + 1) if hashes(seq) else None
                try:
                    ad.append(seq, seq.synced, n + 1, ids)
                except CapacityError:
                    return grow_after_flush(seq, t, c)
                agg["sync"] += n
                seq.synced = c
                return True
            return grow(seq, t, c)

        def grow_after_flush(seq: Seq, t: int, c: int) -> bool:
            """The one-call append did not fit: flush the deferred appends (they never
            allocate) and grow by this step's token with preemption."""
            sync(seq, c)
            return grow(seq, t, c)

        def retire(t: int) -> None:
            for seq in sorted(finished_now, key=by_order):
                stop_decoding(seq)
                remove_running(seq)
                cache.free(seq.sid)
                bump()
                if seq.group is None:
                    done(seq, t)
                elif seq is seq.group.beams[-1]:  # a group finishes with its last beam
                    done(seq, t, seq.group.width)
            finished_now.clear()

        def done(seq: Seq, t: int, sequences: int = 1) -> None:
            """Record a finish: `sequences` = w for a beam group (w beams of
            output_len tokens each)."""
            seq.state = FINISHED
            seq.rec.finish_step = t
            seq.rec.generated = seq.generated
            totals["events"] += 1
            totals["gen"] += seq.generated * sequences
            totals["finished"] += 1

        def add_running(seq: Seq) -> None:
            lo, hi = 0, len(running)
            while lo < hi:
                mid = (lo + hi) // 2
                if running[mid].order < seq.order:
                    lo = mid + 1
                else:
                    hi = mid
            running.insert(lo, seq)

        def fork_children(parent: Seq, t: int) -> None:
            r = parent.req
            family = [parent] if self._family_fits(r) else None
            parent.family = family
            for k in range(1, r.n):
                child = new_seq(r, parent.index, k, parent.prompt)
                if family is not None:
                    child.family = family
                    family.append(child)
                child.rec.admit_step = parent.rec.admit_step
                child.rec.first_token_step = t
                child.rec.cached_tokens = parent.rec.cached_tokens
                child.generated = 1
                if r.output_len <= 1:
                    done(child, t)
                    continue
                forked = False
                if len(running) < cfg.max_num_seqs:
                    try:
                        cache.fork(parent.sid, child.sid)
                        forked = True
                    except CapacityError:
                        forked = False
                if forked:
                    bump()
                    child.state = RUNNING
                    child.cow = True
                    add_running(child)
                    start_decoding(child, t + 1, parent.computed, parent.computed)
                else:  # no room to fork: the child recomputes prompt + its first token
                    child.target = len(child.prompt) + 1
                    heappush(waiting, (child.order, child))
            parent.cow = True

        # memory-only paged caches take token counts directly (no KV to make)
        plain_append = cache.append_tokens if ad.paged and not ad.store_kv else None

        # ---------------------------------------------------------------- main loop
        timeline: list[StepRow] = []
        now_ps = 0
        t = 0
        processed = peak = barren = 0  # barren: consecutive steps without progress
        sum_live = sum_reserved = sum_running = 0
        n_total = len(reqs)
        if tm is None and any(a > 0 for a in arrivals_ps):
            raise ConfigError("arrivals after t=0 need a time model (device profile)")
        last_reported = 0

        def arrive(upto_ps: int) -> None:
            nonlocal next_arrival
            while next_arrival < n_total and arrivals_ps[next_arrival] <= upto_ps:
                r = reqs[next_arrival]
                seq = new_seq(r, next_arrival, 0, r.prompt_ids(next_arrival))
                heappush(waiting, (seq.order, seq))
                next_arrival += 1

        while True:
            arrive(now_ps)
            if not running and not waiting and not swapped:
                if next_arrival >= n_total:
                    break
                now_ps = max(now_ps, arrivals_ps[next_arrival])
                continue
            processed += 1
            st["preempted"] = False
            st["swap_ps"] = 0
            D = agg["D"]
            st["dec"] = D
            st["kv_read"] = agg["A"] + D * t + D  # each decoder reads its c + 1 tokens
            # -- 2. decode appends of the sequences whose event is now (all, in token mode)
            due: list[Seq] = []
            while event_steps and event_steps[0] <= t:
                for version, seq in buckets.pop(heappop(event_steps)):
                    if version == seq.version and seq.decoding:
                        due.append(seq)
            due.sort(key=by_order)
            totals["events"] += len(due)
            for seq in due:
                if not seq.decoding:
                    continue  # preempted earlier in this step
                if seq.group is not None:
                    if seq.group.stepped != t:
                        seq.group.stepped = t
                        group_step(seq.group, t)
                    continue
                st["cursor"] = seq.order
                dt = t - seq.base_step
                c = seq.base_c + dt
                g = seq.base_g + dt
                if bs and not seq.cow:
                    allocating = c % bs == 0
                else:
                    allocating = seq.cow or ad.growth_point(seq, c) == c
                n = c - seq.synced
                if plain_append is not None and not seq.hashed:
                    try:  # deferred appends and this step's token in one call
                        plain_append(seq.sid, n + 1)
                    except CapacityError:
                        if not grow_after_flush(seq, t, c):
                            continue
                    else:
                        agg["sync"] += n
                elif not flush_and_grow(seq, t, c):
                    continue
                if allocating or (seq.hashed and (c + 1) % bs == 0):
                    st["epoch"] += 1
                seq.cow = False
                seq.synced = c + 1
                agg["sync"] += 1
                seq.generated = g + 1
                if hook is not None:
                    decoded.append((seq, c))
                # the decoder's line c - t is unchanged, so the aggregates are too
                seq.base_step, seq.base_c, seq.base_g = t + 1, c + 1, g + 1
                if g + 1 >= seq.req.output_len:
                    seq.version += 1  # no further events
                    finished_now.append(seq)
                else:
                    schedule(seq, t + 1)
            st["cursor"] = NEVER
            decoders, kv_read = st["dec"], st["kv_read"]
            # -- 3. continuing prefills
            budget = cfg.max_batched_tokens - decoders
            chunks: list[tuple[Seq, int]] = []
            for seq in prefilling:
                if budget <= 0:
                    break
                rest = seq.target - seq.computed
                if not cfg.chunked_prefill and not seq.generated and rest > budget:
                    break  # a fresh prompt prefills whole (recomputation is always chunked)
                take = min(rest, budget)
                chunks.append((seq, take))
                budget -= take
            # -- 4. swap-in, then admission (not in a step that preempted)
            admission_failed = False
            epoch_before = st["epoch"]
            if not st["preempted"]:
                while swapped and len(running) < cfg.max_num_seqs and budget > 0:
                    seq = swapped[0][1]
                    group = unit_of(seq, SWAPPED)
                    if len(running) + len(group) > cfg.max_num_seqs:
                        break  # a group or family comes back whole or not at all
                    sids = [b.sid for b in group]
                    blocks = ad.distinct_blocks(sids)
                    try:
                        cache.swap_in_group(sids)
                    except CapacityError:
                        break
                    for b in group:
                        heappop(swapped)  # its members head the queue (adjacent orders)
                        b.state = RUNNING
                        add_running(b)
                        start_decoding(b, t + 1, b.computed, b.computed)
                    bump()
                    if tm is not None:
                        st["swap_ps"] += tm.swap_ps(blocks)
                    budget -= len(group)
                key = (st["epoch"], waiting[0][0] if waiting else None, len(running), budget)
                static_gate = cfg.batching == "static" and bool(running or swapped)
                if (
                    waiting
                    and not swapped
                    and not static_gate
                    and (not event_mode or key != st["fail_key"])
                ):
                    limit = cfg.max_num_seqs
                    if cfg.batching == "static" and cfg.static_batch_size:
                        limit = min(limit, cfg.static_batch_size)
                    static = cfg.batching == "static"  # a batch forms whole, prefills later
                    while waiting and (budget > 0 or static) and len(running) < limit:
                        seq = waiting[0][1]
                        if seq.group is not None:
                            if len(running) + seq.group.width > limit:
                                break  # room for all its beams
                            if seq.generated and not admit_group(seq.group, t):
                                break
                            if seq.generated:
                                budget = prefill_group(seq.group, budget, chunks)
                                continue
                        fresh = seq.target == len(seq.prompt) and not seq.generated
                        if not cfg.chunked_prefill and fresh and seq.target > budget and not static:
                            break
                        prompt = seq.prompt
                        if seq.target != len(seq.prompt):
                            prompt = tuple(seq.tokens(0, seq.target))
                        try:
                            cached = cache.admit(
                                seq.sid,
                                prompt,
                                salt=seq.salt,
                                output_len=seq.req.output_len - seq.generated,
                            )
                        except CapacityError:
                            break
                        heappop(waiting)
                        bump()
                        totals["events"] += 1
                        seq.state = RUNNING
                        seq.computed = cached
                        if seq.rec.admit_step < 0:
                            seq.rec.admit_step = t
                            seq.rec.cached_tokens = cached
                        add_running(seq)
                        prefilling.append(seq)
                        prefilling.sort(key=lambda s: s.order)
                        take = min(seq.target - cached, budget)
                        if take > 0:
                            chunks.append((seq, take))
                            budget -= take
                    if waiting:
                        admission_failed = not running and not cache.request_ids()
                        st["fail_key"] = (
                            st["epoch"],
                            waiting[0][0],
                            len(running),
                            budget,
                        )
            # -- 5. apply prefill chunks; completions sample their first token
            prefill_cost: list[tuple[int, int]] = []
            chunk_log = [(seq.sid, seq.computed, take) for seq, take in chunks] if hook else []
            for seq, take in chunks:
                start = seq.computed
                ids = None
                if seq.target > len(seq.prompt) and hashes(seq):
                    ids = seq.tokens(start, start + take)
                ad.append(seq, start, take, ids)
                bump()
                prefill_cost.append((start, take))
                seq.computed += take
                if seq.computed == seq.target:
                    prefilling.remove(seq)
                    if seq.group is not None and seq.generated:
                        resume_group(seq, t)
                        continue
                    seq.generated += 1
                    if seq.rec.first_token_step < 0:
                        seq.rec.first_token_step = t
                    if seq.req.n > 1 and not seq.forked:
                        seq.forked = True
                        fork_children(seq, t)
                    if seq.group is not None:
                        start_group(seq, t)
                        continue
                    if seq.generated >= seq.req.output_len:
                        finished_now.append(seq)
                    else:
                        start_decoding(seq, t + 1, seq.computed, seq.computed)
            # -- time of this step
            step_ps = 0
            if tm is not None:
                step_ps = tm.step_ps(decoders, kv_read, prefill_cost) + st["swap_ps"]
            if hook is not None:
                ran = [(s.sid, c) for s, c in decoded if s.state == RUNNING]
                decoded.clear()
                measured = hook(t, ran, chunk_log, step_ps)
                if measured is not None:
                    step_ps = int(measured)
            peak = max(peak, len(running))
            had_finishes = bool(finished_now)
            # -- 6. retire
            retire(t)
            free_b, used_b, cached_b, live_sync, reserved = ad.memory()
            live = live_sync + agg["A"] + agg["D"] * (t + 1) - agg["sync"]
            timeline.append(
                StepRow(
                    t,
                    1,
                    len(running),
                    agg["D"],
                    len(waiting),
                    len(swapped),
                    free_b,
                    used_b,
                    cached_b,
                    live,
                    reserved,
                    step_ps,
                )
            )
            sum_live += live
            sum_reserved += reserved
            sum_running += len(running)
            now_ps += step_ps
            if progress is not None and totals["finished"] != last_reported:
                progress(totals["finished"] - last_reported)
                last_reported = totals["finished"]
            if admission_failed:
                head = waiting[0][1]
                raise SchedulerError(
                    f"request {head.req.id!r} cannot be admitted even into an empty cache "
                    f"({head.target} prompt tokens)"
                )
            idle = not due and not chunks and epoch_before == st["epoch"] and not had_finishes
            if idle and not agg["D"] and next_arrival >= n_total and not st["preempted"]:
                raise SchedulerError(  # a bug guard: nothing can ever change again
                    f"the engine stalled at step {t} with {len(waiting)} waiting and "
                    f"{len(swapped)} swapped sequences and nothing running"
                )
            if decoders or chunks or had_finishes:
                barren = 0
            else:
                barren += 1
                if barren > _BARREN_STEP_LIMIT:
                    raise SchedulerError(  # a bug guard: preemption cycling (a livelock)
                        f"the engine made no progress for {barren} steps up to step {t} (no "
                        f"token decoded, no prefill, no finish) with {len(running)} running, "
                        f"{len(waiting)} waiting and {len(swapped)} swapped sequences"
                    )
            # -- 7. the next step: in event mode, skip the quiet stretch before it
            nxt = t + 1
            if event_mode and not prefilling and not had_finishes and not st["preempted"]:
                horizon = event_steps[0] if event_steps else NEVER
                D, A = agg["D"], agg["A"]
                adm_key = (
                    st["epoch"],
                    waiting[0][0] if waiting else None,
                    len(running),
                    cfg.max_batched_tokens - D,
                )
                gated = cfg.batching == "static" and bool(running or swapped)
                quiet = not swapped and (not waiting or gated or adm_key == st["fail_key"])
                if quiet and horizon > t + 1 and D:
                    stop = horizon
                    if not waiting and next_arrival < n_total:
                        stop = self._arrival_step(
                            t + 1, now_ps, arrivals_ps[next_arrival], A, D, tm, horizon
                        )
                    if stop > t + 1:
                        first, k = t + 1, stop - (t + 1)  # quiet steps first .. stop - 1
                        sum_t = (first + stop - 1) * k // 2
                        span_ps = 0
                        if tm is not None:  # step s reads A + D * s + D KV tokens
                            span_ps = tm.decode_span_ps(D, A + D + D * first, k)
                        base_live = live_sync + A - agg["sync"]
                        timeline.append(
                            StepRow(
                                first,
                                k,
                                len(running),
                                D,
                                len(waiting),
                                len(swapped),
                                free_b,
                                used_b,
                                cached_b,
                                base_live + D * (first + 1),
                                reserved,
                                span_ps,
                            )
                        )
                        sum_live += k * base_live + D * (sum_t + k)
                        sum_reserved += k * reserved
                        sum_running += k * len(running)
                        now_ps += span_ps
                        nxt = stop
            t = nxt

        if progress is not None and totals["finished"] != last_reported:
            progress(totals["finished"] - last_reported)
        if cache.request_ids():
            raise AssertionError(f"cache not empty after the run: {cache.request_ids()[:5]}")
        steps = t
        gen = totals["gen"]
        seconds = now_ps / 1e12
        result = SimulationResult(
            utilization=sum_live / sum_reserved if sum_reserved else 1.0,
            peak_concurrency=peak,
            preemptions=totals["pre"],
            swaps=totals["swap"],
            recomputes=totals["rec"],
            steps=steps,
            generated_tokens=gen,
            tokens_per_step=gen / steps if steps else 0.0,
            modeled_seconds=seconds,
            tokens_per_second=gen / seconds if seconds else 0.0,
            processed_steps=processed,
            wall_seconds=time.perf_counter() - t_wall,
            mean_running=sum_running / steps if steps else 0.0,
            records=[s.rec for s in seqs],
            timeline=timeline,
            info={
                "bound_overrides": totals["overrides"],
                "mode": cfg.mode,
                "events": totals["events"],
                "events_per_second": totals["events"] / max(time.perf_counter() - t_wall, 1e-9),
                "cpu_seconds": time.process_time() - t_cpu,
            },
        )
        return result

    @staticmethod
    def _arrival_step(
        first: int,
        now_ps: int,
        arrival_ps: int,
        A: int,
        D: int,
        tm: TimeModel | None,
        horizon: int,
    ) -> int:
        """The first step >= `first` whose start time reaches `arrival_ps`, when steps
        from `first` on decode D sequences of aggregate A (capped at `horizon`)."""
        kv_first = A + D + D * first

        def start_of(step: int) -> int:
            span = tm.decode_span_ps(D, kv_first, step - first) if tm is not None else 0
            return now_ps + span

        if start_of(first) >= arrival_ps:
            return first
        if tm is None or start_of(first + 1) == now_ps:
            return horizon
        lo, hi = first, horizon
        if hi >= NEVER or start_of(hi) >= arrival_ps:
            hi = min(hi, first + 1)
            while start_of(hi) < arrival_ps and hi < horizon:
                lo, hi = hi, min(horizon, first + 2 * (hi - first))
        if start_of(hi) < arrival_ps:
            return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if start_of(mid) >= arrival_ps:
                hi = mid
            else:
                lo = mid
        return hi
