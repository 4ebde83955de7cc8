"""The serving engine: one step is a fixed sequence of named phases.

`Engine.step` runs, in this order (each phase is a method; its docstring states what it
relies on and leaves, and `Engine.check` asserts those invariants between steps):

1. `arrivals`: requests whose modeled time has come join the waiting queue (FCFS),
   up to the `max_concurrency` cap of requests in flight;
2. `decode`: every due decoder appends its last token's KV, oldest first; when the cache
   cannot grow it, victims are preempted (`kvbench.paged.serving.engine.preempt`) until it fits
   or the decoder itself went;
3. `continue_prefills`: prefilling sequences continue their prompt within the budget;
4. unless this step preempted: `swap_in` (swapped units come back, oldest first, keeping
   the watermark), then `admit` (waiting sequences FCFS while the cache, max_num_seqs and
   the budget allow, chunking long prompts);
5. `prefill`: the chunks are appended; a completed prefill samples its first token
   (n-sample requests fork their children here, beam roots fork their beams);
6. `retire`: finished sequences free their memory; the step is priced and recorded
   (`engine.results.record_span`) and checked for progress (`engine.guards`);
7. `skip_quiet` (event mode): the stretch of steps in which nothing but non-allocating
   decode happens is skipped, its time and metrics summed in closed form.

Under `SchedulerConfig(policy="vllm-v1")` a step is vLLM v1's instead
(`engine.v1.V1Policy.step`: one budget over running requests in order, then waiting
ones), over the same state, decoder lines and records.

The phases are methods of `Engine`; what they share is passed, never inherited. The run
state is `st` (`state.EngineState`: queues, calendar, aggregates, totals, and the queue
operations add_running / remove_running / finish), and the phases call three named
collaborators built over it for each run (`Engine._collaborate`):

    lines       `decode.DecoderLines`: decoder lines, the event calendar, the cache appends
    preemption  `preempt.Preemption`: growth with preemption, victims, units, swap or
                recompute
    groups      `groups.Groups`: n-sample forks, beam steps and selection, a recomputed
                group's return

What the run produces (timeline rows, metric sums, the `SimulationResult`) is built in
`engine.results`; the bug guards that stop a run that cannot finish are `engine.guards`.

See `kvbench.paged.serving.engine` for the whole model (token bookkeeping, beams, event mode,
bad input).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Sequence
from heapq import heappop, heappush

from kvbench.paged.serving.beams import BeamGroup
from kvbench.paged.serving.engine.clock import arrival_step, span_ps
from kvbench.paged.serving.engine.decode import DecoderLines
from kvbench.paged.serving.engine.groups import Groups
from kvbench.paged.serving.engine.guards import check_progress
from kvbench.paged.serving.engine.invariants import check_state
from kvbench.paged.serving.engine.preempt import Preemption
from kvbench.paged.serving.engine.results import record_span, run_result
from kvbench.paged.serving.engine.sequence import (
    NEVER,
    RUNNING,
    SWAPPED,
    Seq,
    by_order,
)
from kvbench.paged.serving.engine.state import EngineState, StepHook
from kvbench.paged.serving.engine.v1 import V1Policy
from kvbench.paged.serving.engine.validate import check_trace
from kvbench.paged.serving.time_model import SchedulerConfig, SimulationResult, TimeModel
from kvbench.reference.contract import ServingCache
from kvbench.workloads.errors import CapacityError, ConfigError
from kvbench.workloads.prompt_ids import max_token_id
from kvbench.workloads.trace import SYNTH_BASE, Trace, TraceRequest

log = logging.getLogger(__name__)


class Engine:
    """Replays traces against one cache under a SchedulerConfig (module docstring).

    The cache must implement `ServingCache`, be empty, and is left empty after `run`.
    `time_model` prices steps (modeled seconds) and drives the `auto` preemption cost
    model (required for it). With `checked=True`, `check()` runs after every step.
    """

    def __init__(
        self,
        cache: ServingCache,
        config: SchedulerConfig | None = None,
        time_model: TimeModel | None = None,
        *,
        checked: bool = False,
        step_hook: StepHook | None = None,
    ) -> None:
        self.cache = cache
        self.cfg = config or SchedulerConfig()
        self.tm = time_model
        self.checked = checked
        self.step_hook = step_hook
        if step_hook is not None and self.cfg.mode != "token":
            raise ConfigError("a step hook needs mode='token' (every step visited)")
        if self.cfg.preemption == "auto" and time_model is None:
            raise ConfigError("preemption 'auto' needs a time model (device profile)")
        if not isinstance(cache, ServingCache):
            raise ConfigError(
                f"{type(cache).__name__} does not implement the serving accounting "
                "(kvbench.reference.contract.ServingCache)"
            )
        if cache.request_ids():
            raise ConfigError("the engine needs an empty cache")
        self.traits = cache.serving_traits()
        if time_model is not None:  # swaps priced at the cache's block size (TimeModel.for_cache)
            self.tm = time_model.for_cache(self.traits.block_size, self.traits.can_swap)
        #: Block boundaries are the only decode events unless appends also release
        #: blocks (sliding windows): then every event comes from `next_growth` (0 here).
        self.block_size = 0 if self.traits.releases_blocks else self.traits.block_size
        #: Live slots one deferred token adds (one per self-attention layer group).
        self.slots_per_token = self.traits.slots_per_token
        self.event_mode = self.cfg.mode == "event"
        # memory-only caches take token counts directly (no KV to make)
        self.plain_append = None if self.traits.store_kv else cache.append_tokens
        self.big_prompt_ids = False
        self.reqs: tuple[TraceRequest, ...] = ()
        self.arrivals_ps: list[int] = []
        self.progress: Callable[[int], None] | None = None
        self._collaborate(EngineState(cap=self.cfg.max_concurrency))
        #: vLLM v1's decisions instead of the phases below (`engine.v1`)
        self.v1 = V1Policy(self) if self.cfg.policy == "vllm-v1" else None

    def _collaborate(self, st: EngineState) -> None:
        """Take `st` as the run state and build the collaborators the phases call:
        decoder lines (`lines`), growth and preemption (`preemption`), groups."""
        self.st = st
        traits = self.traits
        self.lines = DecoderLines(
            st, self.cache, store_kv=traits.store_kv, block_size=self.block_size,
            event_mode=self.event_mode, windows=self.tm.windows if self.tm else (),
        )  # fmt: skip
        self.preemption = Preemption(
            st, self.cache, self.cfg, self.tm, self.lines, can_swap=traits.can_swap
        )
        self.groups = Groups(
            st, self.cache, self.cfg, self.lines, self.preemption, self._new_seq,
            watermark_blocks=traits.watermark_blocks, log_decoded=self.step_hook is not None,
        )  # fmt: skip

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

    def _run(self, trace: Trace, progress: Callable[[int], None] | None) -> SimulationResult:
        t_wall = time.perf_counter()
        t_cpu = time.process_time()
        check_trace(self.cache, self.traits, self.cfg, trace)
        self._begin(trace, progress)
        if self.checked:
            while self.step():
                self.check()
        else:
            while self.step():
                pass
        self._report_progress()
        if self.cache.request_ids():
            raise AssertionError(f"cache not empty after the run: {self.cache.request_ids()[:5]}")
        return run_result(self.st, self.cfg.mode, t_wall, t_cpu)

    def _begin(self, trace: Trace, progress: Callable[[int], None] | None) -> None:
        """A fresh run state (and collaborators) for `trace`."""
        self._collaborate(EngineState(cap=self.cfg.max_concurrency))
        self.progress = progress
        self.reqs = trace.requests
        # Synthetic output ids can only be matched by prompts that contain ids that large.
        self.big_prompt_ids = any(
            r.prompt is not None and r.prompt and max_token_id(r.prompt) >= SYNTH_BASE
            for r in self.reqs
        )
        if self.v1 is not None:
            self.v1.begin(self.reqs)
        self.arrivals_ps = [round(r.arrival * 1e12) for r in self.reqs]
        if self.tm is None and any(a > 0 for a in self.arrivals_ps):
            raise ConfigError("arrivals after t=0 need a time model (device profile)")

    def _new_seq(self, req: TraceRequest, index: int, child: int, prompt: Sequence[int]) -> Seq:
        """A sequence with its own record; `hashed` when its output ids go to the
        prefix cache; a beam root gets its group."""
        seq = Seq(req, index, child, prompt)
        mode = self.cfg.hash_outputs
        if self.traits.prefix_caching and mode != "never":
            seq.hashed = mode == "always" or seq.out_tokens is not None or self.big_prompt_ids
        if req.beam_width > 1:  # a beam root: its history is kept explicitly
            seq.group = BeamGroup(index, req.beam_width, [seq])
            seq.out_tokens = []
        self.st.seqs.append(seq)
        return seq

    # ------------------------------------------------------------------ one step
    def step(self) -> bool:
        """Run one iteration (the phases of the module docstring) at step `st.t`, or
        jump the clock to the next arrival when nothing is queued. False: all done."""
        if self.v1 is not None:
            return self.v1.step()
        st = self.st
        self.arrivals()
        if not st.running and not st.waiting and not st.swapped:
            return self.jump_to_next_arrival()
        t = st.t
        st.processed += 1
        st.preempted = False
        st.swap_ps = 0
        d = st.agg_d
        st.dec = d
        st.kv_read = st.agg_a + d * t + d  # each decoder reads its c + 1 tokens
        if st.win_d:  # each decoder past W reads c + 1 - W tokens less on its layers
            wins = zip(st.win_a, st.win_d, self.lines.windows, strict=True)
            st.kv_excess = [a + n * (t + 1 - w) for a, n, w in wins]
        due = self.decode(t)
        decoders, kv_read = st.dec, st.kv_read
        chunks, budget = self.continue_prefills(self.cfg.max_batched_tokens - decoders)
        admission_failed = False
        epoch_before = st.epoch
        if not st.preempted:
            budget = self.swap_in(t, budget)
            admission_failed = self.admit(t, budget, chunks)
        chunk_log = [(s.sid, s.computed, n) for s, n in chunks] if self.step_hook else []
        prefill_cost = self.prefill(t, chunks)
        step_ps = self._price(decoders, kv_read, prefill_cost)
        if self.step_hook is not None:
            step_ps = self._run_hook(t, chunk_log, step_ps)
        st.peak = max(st.peak, len(st.running))
        had_finishes = bool(st.finished_now)
        self.retire(t)
        occupancy = self._record_step(t, step_ps)
        self._stamp_times()
        self._report_progress()
        progressed = bool(decoders or chunks or had_finishes)
        idle = not due and not chunks and epoch_before == st.epoch and not had_finishes
        check_progress(st, t, len(self.reqs), admission_failed, idle, progressed)
        st.t = t + 1
        if self.event_mode and not st.prefilling and not had_finishes and not st.preempted:
            st.t = self.skip_quiet(t, occupancy)
        return True

    def jump_to_next_arrival(self) -> bool:
        """Nothing is queued: False when the trace is over, else the clock jumps to the
        next arrival (never backwards) and True. Both policies' idle step."""
        st = self.st
        if st.next_arrival >= len(self.reqs):
            return False
        st.now_ps = max(st.now_ps, self.arrivals_ps[st.next_arrival])
        return True

    def arrivals(self) -> None:
        """Phase 1: requests whose arrival time (picoseconds) is <= now join `waiting`,
        while fewer than `max_concurrency` requests are in flight (0: no cap). A request
        held back by the cap joins at the end of the step whose finish freed its slot
        (now), and its record's arrival is that time (`SchedulerConfig.max_concurrency`)."""
        st, arrivals_ps, reqs = self.st, self.arrivals_ps, self.reqs
        cap = self.cfg.max_concurrency
        if st.slot_freed:
            st.freed_ps, st.slot_freed = st.now_ps, False
        while st.next_arrival < len(reqs) and arrivals_ps[st.next_arrival] <= st.now_ps:
            if cap and st.in_flight >= cap:
                break
            i = st.next_arrival
            r = reqs[i]
            seq = self._new_seq(r, i, 0, r.prompt_ids(i))
            if cap and st.freed_ps > arrivals_ps[i]:
                seq.rec.arrival_s = st.freed_ps / 1e12
            heappush(st.waiting, (seq.order, seq))
            st.next_arrival += 1
            st.in_flight += 1

    def capped(self) -> bool:
        """Whether the concurrency cap holds the next arrival back now."""
        cap = self.cfg.max_concurrency
        return bool(cap) and self.st.in_flight >= cap

    def decode(self, t: int) -> list[Seq]:
        """Phase 2: every due decoder appends its step-t token (with its deferred ones)
        and generates one more, oldest first; a beam group steps as a whole. When the
        cache cannot grow it, victims are preempted (`Preemption`) until the append fits
        or the decoder itself was preempted. Returns the due decoders.

        Invariants after: every decoder still decoding is synced to its line or will be
        at its next event; a decoder that generated its last token is in finished_now
        with no queued event; `st.cursor` is NEVER."""
        st = self.st
        due = self.lines.due(t)
        bs = self.block_size
        plain_append = self.plain_append
        lines, preemption = self.lines, self.preemption
        schedule = lines.schedule
        finished_now = st.finished_now
        for seq in due:
            if not seq.decoding:
                continue  # preempted earlier in this step
            if seq.group is not None:
                if seq.group.stepped != t:
                    seq.group.stepped = t
                    self.groups.step(seq.group, t)
                continue
            st.cursor = seq.order
            dt = t - seq.base_step
            c = seq.base_c + dt
            g = seq.base_g + dt
            if bs and not seq.cow:
                allocating = c % bs == 0
            else:
                allocating = seq.cow or lines.growth_point(seq, c) == c
            n = c - seq.synced
            if plain_append is not None and not seq.hashed:
                try:  # deferred appends and this step's token in one call
                    plain_append(seq.sid, n + 1)
                except CapacityError:
                    if not preemption.grow_after_flush(seq, t, c):
                        continue
                else:
                    st.agg_sync += n
            elif not preemption.flush_and_grow(seq, t, c):
                continue
            if allocating or (seq.hashed and (c + 1) % bs == 0):
                st.epoch += 1
            seq.cow = False
            seq.synced = c + 1
            st.agg_sync += 1
            seq.generated = g + 1
            if self.step_hook is not None:
                st.decoded.append((seq, c))
            # the decoder's line c - t is unchanged, so the aggregates are too
            seq.base_step, seq.base_c, seq.base_g = t + 1, c + 1, g + 1
            if lines.windows:
                lines.classify(seq, c - t, c + 1)
            if g + 1 >= seq.req.output_len:
                seq.version += 1  # no further events
                finished_now.append(seq)
            else:
                schedule(seq, t + 1)
        st.cursor = NEVER
        return due

    def continue_prefills(self, budget: int) -> tuple[list[tuple[Seq, int]], int]:
        """Phase 3: this step's chunks of the sequences already prefilling, in order,
        within `budget` tokens (a fresh prompt without chunked prefill goes whole or
        waits; recomputation is always chunked). Returns (chunks, budget left)."""
        chunks: list[tuple[Seq, int]] = []
        chunked = self.cfg.chunked_prefill
        for seq in self.st.prefilling:
            if budget <= 0:
                break
            rest = seq.target - seq.computed
            if not chunked and not seq.generated and rest > budget:
                break
            take = min(rest, budget)
            chunks.append((seq, take))
            budget -= take
        return chunks, budget

    def swap_in(self, t: int, budget: int) -> int:
        """Phase 4a: swapped units (`Preemption.unit_of`) come back oldest first, whole or not at
        all, while max_num_seqs and the budget allow and the cache takes them (keeping
        the watermark); they decode from the next step. Returns the budget left.

        Relies on: a swapped unit's members head `swapped` (adjacent orders) and hold
        `computed` tokens in the cache. Leaves each returned member RUNNING and decoding
        with its line at (t + 1, computed), synced."""
        st, cfg, tm = self.st, self.cfg, self.tm
        swapped, running = st.swapped, st.running
        while swapped and len(running) < cfg.max_num_seqs and budget > 0:
            unit = self.preemption.unit_of(swapped[0][1], SWAPPED)
            if len(running) + len(unit) > cfg.max_num_seqs:
                break  # a group or family comes back whole or not at all
            sids = [s.sid for s in unit]
            blocks = self.cache.blocks_held(sids)
            try:
                self.cache.swap_in_group(sids)
            except CapacityError:
                break
            for s in unit:
                heappop(swapped)  # its members head the queue (adjacent orders)
                s.state = RUNNING
                st.add_running(s)
                self.lines.start(s, t + 1, s.computed, s.computed)
            st.epoch += 1
            if tm is not None:
                st.swap_ps += tm.swap_ps(blocks)
            budget -= len(unit)
        return budget

    def admit(self, t: int, budget: int, chunks: list[tuple[Seq, int]]) -> bool:
        """Phase 4b: admit waiting sequences FCFS (none while any is swapped, or while a
        static batch runs) while the cache admits them (watermark), max_num_seqs (or
        the static batch size) allows and budget remains; queue their first chunks.
        Event mode does not retry an admission that failed until the epoch, the queue
        head, the batch or the budget changed. Returns True when the queue head cannot
        be admitted even into an empty cache (the run must fail).

        Leaves each admitted sequence RUNNING and in `prefilling` (sorted) holding its
        prefix-cache hits (`computed`); `fail_key` records a failed attempt."""
        st, cfg = self.st, self.cfg
        waiting, running = st.waiting, st.running
        static = cfg.batching == "static"
        key = (st.epoch, waiting[0][0] if waiting else None, len(running), budget)
        if (
            not waiting
            or st.swapped
            or (static and bool(running or st.swapped))
            or (self.event_mode and key == st.fail_key)
        ):
            return False
        limit = cfg.max_num_seqs
        if static and cfg.static_batch_size:
            limit = min(limit, cfg.static_batch_size)
        while waiting and (budget > 0 or static) and len(running) < limit:
            seq = waiting[0][1]
            if seq.group is not None:
                if len(running) + seq.group.width > limit:
                    break  # room for all its beams
                if seq.generated:  # a recomputed group comes back whole
                    if not self.groups.admit(seq.group, t):
                        break
                    budget = self.groups.prefill(seq.group, budget, chunks)
                    continue
            fresh = seq.target == len(seq.prompt) and not seq.generated
            if not cfg.chunked_prefill and fresh and seq.target > budget and not static:
                break
            if not self._admit_one(seq, t):
                break
            take = min(seq.target - seq.computed, budget)
            if take > 0:
                chunks.append((seq, take))
                budget -= take
        if not waiting:
            return False
        st.fail_key = (st.epoch, waiting[0][0], len(running), budget)
        return not running and not self.cache.request_ids()

    def _admit_one(self, seq: Seq, t: int) -> bool:
        """Admit the queue head (its prompt, plus its generated tokens when it is
        recomputed); False, nothing changed, when the cache refuses."""
        st = self.st
        prompt = seq.prompt
        if seq.target != len(seq.prompt):
            prompt = tuple(seq.tokens(0, seq.target))
        try:
            cached = self.cache.admit(
                seq.sid, prompt, salt=seq.salt, output_len=seq.req.output_len - seq.generated
            )
        except CapacityError:
            return False
        heappop(st.waiting)
        st.epoch += 1
        st.events += 1
        seq.state = RUNNING
        seq.computed = cached
        if seq.rec.admit_step < 0:
            seq.rec.admit_step = t
            seq.rec.cached_tokens = cached
        st.add_running(seq)
        st.prefilling.append(seq)
        st.prefilling.sort(key=by_order)
        return True

    def prefill(self, t: int, chunks: list[tuple[Seq, int]]) -> list[tuple[int, int]]:
        """Phase 5: append this step's prefill chunks; a sequence whose prefill completes
        samples its first token (`_prefill_done`). Returns the (context, tokens) pairs
        the time model prices.

        Relies on: every chunk fits (admission reserved the prompt's blocks). Leaves a
        completed sequence out of `prefilling`: decoding from t + 1, parked (a
        recomputed beam), or in `finished_now`."""
        st = self.st
        cost: list[tuple[int, int]] = []
        for seq, take in chunks:
            start = seq.computed
            ids = None
            if seq.target > len(seq.prompt) and seq.hashed:
                ids = seq.tokens(start, start + take)
            self.lines.append(seq, start, take, ids)
            st.epoch += 1
            cost.append((start, take))
            seq.computed += take
            if seq.computed == seq.target:
                st.prefilling.remove(seq)
                self._prefill_done(seq, t)
        return cost

    def _prefill_done(self, seq: Seq, t: int) -> None:
        """The sequence's KV is complete: a recomputed beam waits for its group; any
        other samples a token (its first, or, recomputed, its next), forks its samples
        or beams on its first, and decodes from the next step or finishes."""
        if seq.group is not None and seq.generated:
            self.groups.resume(seq, t)
            return
        seq.generated += 1
        if seq.rec.first_token_step < 0:
            seq.rec.first_token_step = t
            self.st.first_now.append(seq.rec)
        if seq.req.n > 1 and not seq.forked:
            seq.forked = True
            self.groups.fork_children(seq, t)
        if seq.group is not None:
            self.groups.start(seq, t)
        elif seq.generated >= seq.req.output_len:
            self.st.finished_now.append(seq)
        else:
            self.lines.start(seq, t + 1, seq.computed, seq.computed)

    def _price(self, decoders: int, kv_read: int, prefill_cost: list[tuple[int, int]]) -> int:
        """Modeled picoseconds of this step (`TimeModel.step_ps`) plus its swaps (0
        without a model)."""
        tm = self.tm
        if tm is None:
            return 0
        return tm.step_ps(decoders, kv_read, prefill_cost, self.st.kv_excess) + self.st.swap_ps

    def _run_hook(self, t: int, chunks: list[tuple[str, int, int]], model_ps: int) -> int:
        """Hand the step to the step hook: the sequences that decoded in it and still
        run, its prefill chunks and its modeled price; its answer (if any) is the
        step's time."""
        st = self.st
        ran = [(s.sid, c) for s, c in st.decoded if s.state == RUNNING]
        st.decoded.clear()
        assert self.step_hook is not None
        measured = self.step_hook(t, ran, chunks, model_ps)
        return model_ps if measured is None else int(measured)

    def retire(self, t: int) -> None:
        """Phase 6: sequences that generated their last token free their memory at
        once, oldest first (a beam group with its last beam, as one record).

        Leaves `finished_now` empty, the finished sequences FINISHED and out of every
        queue and of the cache, their records' finish step set (time: `_stamp_times`)."""
        st = self.st
        for seq in sorted(st.finished_now, key=by_order):
            self.lines.stop(seq)
            st.remove_running(seq)
            self.cache.free(seq.sid)
            st.epoch += 1
            if seq.group is None:
                st.finish(seq, t)
            elif seq is seq.group.beams[-1]:  # a group finishes with its last beam
                st.finish(seq, t, seq.group.width)
        st.finished_now.clear()

    def _record_step(self, t: int, step_ps: int) -> tuple[int, int, int, int, int]:
        """Record step t (its timeline row, the metric sums, the clock); returns the
        cache's occupancy (read after retirement)."""
        st = self.st
        occupancy = self.cache.occupancy()
        deferred = st.agg_a + st.agg_d * (t + 1) - st.agg_sync
        live = occupancy[3] + (
            deferred if self.slots_per_token == 1 else deferred * self.slots_per_token
        )
        record_span(self.st, t, 1, occupancy, live, live, step_ps)
        return occupancy

    def _stamp_times(self) -> None:
        """Stamp this step's first tokens and finishes with the step's end (modeled
        seconds; the clock has just been advanced by the step)."""
        st = self.st
        if st.first_now or st.done_now:
            end_s = st.now_ps / 1e12
            for rec in st.first_now:
                rec.first_token_s = end_s
            for rec in st.done_now:
                rec.finish_s = end_s
            st.first_now.clear()
            st.done_now.clear()

    def _report_progress(self) -> None:
        st = self.st
        if self.progress is not None and st.finished != st.last_reported:
            self.progress(st.finished - st.last_reported)
            st.last_reported = st.finished

    def skip_quiet(self, t: int, occupancy: tuple[int, int, int, int, int]) -> int:
        """Phase 7 (event mode, after a step with no prefill left, no finish and no
        preemption): the next step to visit. Steps before the next decoder event (and,
        with an empty queue, before the next arrival) in which admission would fail
        again and nothing is swapped are quiet: only non-allocating decodes. They are
        recorded as one timeline row and priced in closed form (`clock`)."""
        st, cfg = self.st, self.cfg
        horizon = st.event_steps[0] if st.event_steps else NEVER
        d, a = st.agg_d, st.agg_a
        key = (st.epoch, st.waiting[0][0] if st.waiting else None, len(st.running))
        gated = cfg.batching == "static" and bool(st.running or st.swapped)
        retry = (*key, cfg.max_batched_tokens - d) != st.fail_key
        quiet = not st.swapped and (not st.waiting or gated or not retry)
        if not (quiet and horizon > t + 1 and d):
            return t + 1
        stop = horizon
        if not st.waiting and st.next_arrival < len(self.reqs) and not self.capped():
            arrival = self.arrivals_ps[st.next_arrival]
            stop = arrival_step(t + 1, st.now_ps, arrival, a, d, self.tm, horizon, self._wins())
        if stop <= t + 1:
            return t + 1
        first, k = t + 1, stop - (t + 1)  # quiet steps first .. stop - 1
        sum_t = (first + stop - 1) * k // 2
        cost = span_ps(self.tm, first, k, a, d, self._wins())
        m = self.slots_per_token  # live slots per deferred token
        if m == 1:
            base_live = occupancy[3] + a - st.agg_sync
            live_sum = k * base_live + d * (sum_t + k)
            live_first = base_live + d * (first + 1)
        else:
            live_first = occupancy[3] + m * (a - st.agg_sync + d * (first + 1))
            live_sum = k * occupancy[3] + m * (k * (a - st.agg_sync) + d * (sum_t + k))
        record_span(st, first, k, occupancy, live_first, live_sum, cost)
        return stop

    def _wins(self) -> tuple[tuple[int, int, int], ...]:
        """(window, win_a, win_d) per window of the time model (`clock.span_ps`)."""
        st = self.st
        return tuple(zip(self.lines.windows, st.win_a, st.win_d, strict=True))

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        """Assert the invariants every phase relies on, between steps (tests call it,
        or pass checked=True): see `kvbench.paged.serving.engine.invariants`."""
        if self.v1 is not None:
            self.v1.check()
            return
        check_state(self.st, self.cache, self.cfg, self.lines)
