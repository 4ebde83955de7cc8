"""vLLM v1's scheduling decisions (`SchedulerConfig(policy="vllm-v1")`).

The rules of vLLM 0.32's `vllm.v1.core.sched.scheduler.Scheduler.schedule` with the FCFS
policy, its `KVCacheManager.allocate_slots` and `get_computed_blocks` (one full-attention
KV group, no speculative decoding, no connector), restated over kvbench's cache contract:

* One token budget per step, `max_batched_tokens`. No phases: a request is owed
  `num_tokens - computed` tokens (its prompt, or prompt + generated tokens after a
  recompute, or the one token it sampled last step); a prefill chunk is cut to
  `long_prefill_token_threshold` while more than one request is running or waiting, and
  to the budget left.
* Running requests first, in the running list's order (admission order; decodes and
  unfinished chunked prefills alike take budget in that order). Each one's chunk is
  allocated at once (blocks for computed + chunk tokens: allocation is per chunk, never
  the whole prompt ahead); when the cache cannot, the LAST running request is preempted
  by recompute (its blocks freed, tail first as the cache frees; computed reset; put at
  the FRONT of the waiting queue), again until the chunk fits or the request itself was
  the victim, which ends the running pass.
* Waiting requests FCFS, only in a step that preempted nothing, while budget is left
  and fewer than `max_num_seqs` run: the prefix-cache hit of all its tokens (full
  blocks, the last token always recomputed), then the chunk (threshold, budget; without
  chunked prefill a chunk over the budget stops the pass); admitted only when the WHOLE
  sequence would fit the free blocks now (vLLM's `scheduler_reserve_full_isl`, default
  on: hits that sit evictable count as taken) - then only the chunk is allocated. The
  first refusal stops the pass. No watermark (vLLM's `watermark` defaults to 0).
* After the step (the model "runs"): every request whose computed tokens reached its
  tokens samples one; one that has all its output tokens finishes and frees its blocks
  in scheduling order.
* Every full block is keyed by its token ids when its tokens are scheduled (prompt or
  generated), as vLLM hashes every block: generated blocks are shareable. Over a
  memory-only PagedKVCache the keys come from each sequence's whole chain, hashed once
  at its first admission (`v1_keys`: the admission's probe walks it, appends carry no
  ids); elsewhere each append hands the cache its ids.

Prefix-cache statistics are counted as vLLM's `PrefixCacheStats` (`V1Stats`): each
admission adds all of its tokens to the queries and its hit to the hits (separately for
recomputed requests, vLLM's `preempted_*`).

The running list here is always in arrival order, and the waiting queue (a heap by
arrival order) equals vLLM's deque: a preempted request is the youngest running one,
younger than nothing waiting but requests never admitted, so putting it at the front of
the deque is inserting it in arrival order.

Event mode (`mode="event"`): after a step that only decoded (no chunk, admission,
preemption or finish), the following steps repeat it exactly until a decoder reaches a
block boundary, a window of the time model, or its last token, or (with requests
waiting) fills a block, or a request arrives: those quiet steps are run as one append
per decoder and one timeline row priced in closed form (`clock.span_ps`), the same
decisions and times as stepping them (the property suite compares both modes).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from heapq import heappop, heappush
from itertools import pairwise
from typing import Protocol

from kvbench.paged.serving.engine.decode import DecoderLines
from kvbench.paged.serving.engine.sequence import RUNNING, WAITING, Seq, by_order
from kvbench.paged.serving.engine.state import EngineState, StepHook
from kvbench.paged.serving.engine.v1_keys import KeyChains
from kvbench.paged.serving.engine.validate import SchedulerError
from kvbench.paged.serving.time_model import SchedulerConfig
from kvbench.reference.contract import ServingCache, ServingTraits
from kvbench.workloads.errors import CapacityError, ConfigError
from kvbench.workloads.trace import BlockTokenIds, TraceRequest


class V1Host(Protocol):
    """What the vllm-v1 step needs of its engine (`engine.Engine` is one): its state,
    cache and configuration, and the phases it shares with the paper's policy. Named
    here so this module does not import the engine, which imports it."""

    cache: ServingCache
    cfg: SchedulerConfig
    st: EngineState
    lines: DecoderLines
    traits: ServingTraits
    event_mode: bool
    big_prompt_ids: bool
    step_hook: StepHook | None

    def arrivals(self) -> None: ...

    def jump_to_next_arrival(self) -> bool: ...

    def retire(self, t: int) -> None: ...

    def skip_quiet(self, t: int, occupancy: tuple[int, int, int, int, int]) -> int: ...

    def _price(self, decoders: int, kv_read: int, prefill_cost: list[tuple[int, int]]) -> int: ...

    def _record_step(self, t: int, step_ps: int) -> tuple[int, int, int, int, int]: ...

    def _stamp_times(self) -> None: ...

    def _report_progress(self) -> None: ...


@dataclass(slots=True)
class V1Stats:
    """vLLM's PrefixCacheStats over a run: admissions (`requests`), their tokens
    (`queries`) and prefix-hit tokens (`hits`); `preempted_*` for recomputed ones."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0


@dataclass(slots=True)
class V1Decision:
    """One step's decisions (what a vLLM SchedulerOutput and its update name):
    scheduled tokens per request id in scheduling order, preempted ids, finished ids,
    the prefix-hit tokens of each admission, and the cache's used blocks after it."""

    step: int
    scheduled: dict[str, int] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)
    used_blocks: int = 0


class V1Policy:
    """The vllm-v1 step of an `Engine` (module docstring); `on_step` (token mode) is
    given every step's `V1Decision`."""

    def __init__(self, engine: V1Host) -> None:
        self.e = engine
        cfg = engine.cfg
        if cfg.policy != "vllm-v1":
            raise ConfigError(f"V1Policy needs policy='vllm-v1', got {cfg.policy!r}")
        cache = engine.cache
        traits = engine.traits
        self.prefix = traits.prefix_caching
        self.hit_of: Callable[..., tuple[int, int]] | None = getattr(cache, "prefix_hit", None)
        if self.prefix and self.hit_of is None:
            raise ConfigError(
                f"{type(cache).__name__} caches prefixes but has no prefix_hit(): the "
                "vllm-v1 policy sizes a first chunk from the hit before it allocates"
            )
        self.bs = traits.block_size
        #: whole-sequence key chains (`v1_keys`): appends then carry no ids and each
        #: admission hashes nothing; None where the cache cannot take them (ids path)
        self.keys = KeyChains.of(cache)
        #: the chain-keyed append (`KeyChains.append`) or None (`_append`'s loop)
        self.fast = None if self.keys is None else self.keys.append
        self.stats = V1Stats()
        self.on_step: Callable[[V1Decision], None] | None = None
        #: contexts of the decoders the budget starved in this step (not priced)
        self.starved: list[int] = []

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def ids(seq: Seq, a: int, b: int) -> list[int]:
        """Token ids of positions a .. b - 1 (prompt, then generated)."""
        prompt = seq.prompt
        p = len(prompt)
        if b <= p:
            return list(prompt[a:b])
        lo = max(a, p)
        given = seq.out_tokens
        if given is None:  # synthetic outputs: consecutive ids from out_base
            out = list(range(seq.out_base + lo - p, seq.out_base + b - p))
        else:
            out = list(given[lo - p : b - p])
        return list(prompt[a:p]) + out if a < p else out

    def _grow(self, seq: Seq, start: int, n: int) -> None:
        """Append n tokens from `start` (their ids keyed when the cache caches
        prefixes: from the sequence's chain, `v1_keys`, or given with the append);
        CapacityError, nothing changed, when they do not fit."""
        if self.keys is not None:  # a memory-only cache, keyed from the chain
            self.e.cache.append_tokens(seq.sid, n)
            return
        self.e.lines.append(seq, start, n, self.ids(seq, start, start + n) if self.prefix else None)

    def _preempt(self, victim: Seq) -> None:
        """Recompute: free the victim (a decoder's deferred tokens flushed first, so its
        full blocks are keyed as vLLM's are), reset it and queue it at its place."""
        e = self.e
        st = e.st
        if victim.decoding:
            t = st.t
            c = victim.base_c + (t - victim.base_step)
            victim.generated = victim.base_g + (t - victim.base_step)
            if c > victim.synced:  # deferred tokens, keyed as vLLM keys them
                self._grow(victim, victim.synced, c - victim.synced)
                st.agg_sync += c - victim.synced
                victim.synced = c
            e.lines.stop(victim)
        elif victim in st.prefilling:
            st.prefilling.remove(victim)
        e.cache.free(victim.sid)
        victim.state, victim.computed = WAITING, 0
        victim.target = len(victim.prompt) + victim.generated
        heappush(st.waiting, (victim.order, victim))
        victim.rec.preemptions += 1
        victim.rec.recomputes += 1
        st.preemptions += 1
        st.recomputes += 1
        st.preempted = True
        st.epoch += 1

    def _admit(self, seq: Seq, budget: int, thr: int) -> tuple[int, int] | None:
        """Admit the queue head as vLLM does (module docstring): (hit, chunk), or None,
        nothing changed, when it does not fit or its chunk is over the budget without
        chunked prefill."""
        e = self.e
        cache = e.cache
        total = len(seq.prompt) + seq.generated
        tokens = seq.prompt if total == len(seq.prompt) else self.ids(seq, 0, total)
        hit = need = 0
        chains = self.keys
        if chains is not None:
            hit, need = chains.probe(seq, total)
        elif self.hit_of is not None:
            hit, need = self.hit_of(tokens, salt=seq.salt)
        elif self.bs:
            need = cache.blocks_needed_to_admit(tokens, salt=seq.salt)
        n = total - hit
        if 0 < thr < n:
            n = thr
        if not e.cfg.chunked_prefill and n > budget:
            return None
        n = min(n, budget)
        if self.bs and need > cache.num_free_blocks:
            return None  # the whole sequence must fit now (scheduler_reserve_full_isl)
        if hit + n == total:
            part = tokens
        elif type(tokens) is BlockTokenIds:  # a described prompt's head, not listed
            part = tokens.head(hit + n)
        else:
            part = tokens[: hit + n]
        try:
            # the hint counts every token still to come after `part`: the rest of a
            # chunked prompt as well as the output (an oracle reservation holds them all)
            to_come = total - len(part) + seq.req.output_len - seq.generated
            if chains is not None:
                cached = chains.admit(seq, part, to_come)
            else:
                cached = cache.admit(seq.sid, part, salt=seq.salt, output_len=to_come)
        except CapacityError:
            return None
        assert cached == hit, f"{seq.sid}: admitted with {cached} cached tokens, probed {hit}"
        s = self.stats
        if seq.rec.preemptions:
            s.preempted_requests += 1
            s.preempted_queries += total
            s.preempted_hits += hit
        else:
            s.requests += 1
            s.queries += total
            s.hits += hit
        return hit, n

    # ------------------------------------------------------------------ one step
    def step(self) -> bool:
        """One vLLM v1 step at `st.t` (or a jump of the clock to the next arrival when
        nothing is queued); False when the run is over."""
        e = self.e
        st, cfg = e.st, e.cfg
        joined = st.next_arrival
        e.arrivals()
        if st.next_arrival != joined:
            st.epoch += 1  # the queue grew: the chunk threshold may apply now
        running, waiting = st.running, st.waiting
        if not running and not waiting:
            return e.jump_to_next_arrival()
        t = st.t
        st.processed += 1
        st.preempted = False
        thr = cfg.long_prefill_token_threshold if len(running) + len(waiting) > 1 else 0
        log = V1Decision(t) if self.on_step is not None else None
        chunks, decoded, used = self._run_running(t, thr, log)
        admitted = False
        if not st.preempted:
            admitted = self._admit_waiting(t, cfg.max_batched_tokens - used, thr, chunks, log)
        self._finish_step(t, chunks, decoded, admitted, log)
        return True

    def _run_running(
        self, t: int, thr: int, log: V1Decision | None
    ) -> tuple[list[tuple[Seq, int, int]], list[tuple[Seq, int]], int]:
        """The running pass: budget in running order (a decoder 1 token, a prefill its
        chunk), allocation with recompute preemption of the last running request; the
        decoders with no event this step advance on their lines without a cache call.
        Returns the prefill chunks (seq, start, n), the decoders that appended here
        (seq, context) and the budget used."""
        e = self.e
        st, lines = e.st, e.lines
        running = st.running
        budget = e.cfg.max_batched_tokens
        items = lines.due(t)  # in order already
        if st.prefilling:
            items = sorted((*items, *st.prefilling), key=by_order)
        fast = self.fast
        bs, windows, schedule, finished_now = (
            self.bs,
            lines.windows,
            lines.schedule,
            st.finished_now,
        )
        chunks: list[tuple[Seq, int, int]] = []
        decoded: list[tuple[Seq, int]] = []
        chunked = prefills_before = 0
        cutoff = -1  # running index from which nothing gets budget
        last_seq: Seq | None = None  # the last item that took budget
        broke = False
        for seq in items:
            if seq.state is not RUNNING:
                continue  # preempted earlier in this step
            # its running index j <= len(running) - 1: a decoder needs j only where the
            # budget left before it, budget - (j - prefills_before) - chunked, may be 0
            if not seq.decoding or budget - chunked - len(running) + 1 + prefills_before <= 0:
                j = bisect_left(running, seq.order, key=by_order)
                left = budget - (j - prefills_before) - chunked
                if left <= 0:
                    cutoff, broke = j, True
                    break
            last_seq = seq
            if seq.decoding:
                c = seq.base_c + (t - seq.base_step)
                n = c + 1 - seq.synced
                # a decoder's append keyed from its chain, inline (`_append`'s first try)
                if not (fast is not None and fast(seq.sid, n)) and not self._append_slow(
                    seq, seq.synced, n, log
                ):
                    broke = True
                    break
                # the decoder appended its step-t token at position c (with its deferred
                # ones): synced, its line rebased (the aggregates unchanged), its next
                # event queued or its finish noted (inline: 20k decoder events a replay)
                g = seq.base_g + (t - seq.base_step)
                st.agg_sync += c + 1 - seq.synced
                seq.synced = c + 1
                if not bs or c % bs == 0 or (seq.hashed and (c + 1) % bs == 0):
                    # allocated a block, or filled one a prompt could match; a contiguous
                    # cache may have relocated (its gaps, and so what it admits, changed)
                    st.epoch += 1
                seq.generated = g + 1
                seq.base_step, seq.base_c, seq.base_g = t + 1, c + 1, g + 1
                if windows:
                    lines.classify(seq, c - t, c + 1)
                if g + 1 >= seq.req.output_len:
                    seq.version += 1  # no further events
                    finished_now.append(seq)
                else:
                    schedule(seq, t + 1)
                decoded.append((seq, c))
            else:
                start = seq.computed
                n = len(seq.prompt) + seq.generated - start
                if 0 < thr < n:
                    n = thr
                n = min(n, left)
                if not self._append(seq, start, n, log):
                    broke = True
                    break
                st.epoch += 1  # a chunk took memory and filled blocks a prompt may match
                chunks.append((seq, start, n))
                chunked += n
                prefills_before += 1
        # the decoders after the last item take a token each, if left: the items took
        # spent = (last + 1 - prefills_before) + chunked, the rest len(running) - 1 - last
        if not broke and len(running) - prefills_before + chunked > budget:
            last = -1 if last_seq is None else bisect_left(running, last_seq.order, key=by_order)
            cutoff = last + 1 + (budget - (last + 1 - prefills_before) - chunked)
        if st.preempted:
            return chunks, decoded, budget  # no admission after a preemption
        if cutoff >= 0:
            self._starve(t, running[cutoff:])
            return chunks, decoded, budget
        return chunks, decoded, len(running) - len(st.prefilling) + chunked

    def _append(self, seq: Seq, start: int, n: int, log: V1Decision | None) -> bool:
        """Append n tokens of `seq` from `start`, preempting the last running request
        until they fit; False when `seq` itself was preempted."""
        fast = self.fast
        if fast is not None and fast(seq.sid, n):
            return True  # a decoder's append keyed from its chain, inline
        return self._append_slow(seq, start, n, log)

    def _append_slow(self, seq: Seq, start: int, n: int, log: V1Decision | None) -> bool:
        """`_append` past its chain-keyed try (which declined: nothing changed)."""
        st = self.e.st
        plain = self.e.cache.append_tokens if self.keys is not None else None
        while True:
            try:
                if plain is not None:  # `_grow` over a memory-only cache, keyed by chains
                    plain(seq.sid, n)
                else:
                    self._grow(seq, start, n)
                return True
            except CapacityError:
                victim = st.running.pop()
                self._preempt(victim)
                if log is not None:
                    log.preempted.append(victim.sid)
                if victim is seq:
                    return False

    def _starve(self, t: int, seqs: list[Seq]) -> None:
        """The budget ran out before these running requests: a decoder among them
        does not advance in step t (its line restarts at t + 1 where it is now)."""
        lines = self.e.lines
        for seq in seqs:
            if not seq.decoding:
                continue
            c = seq.base_c + (t - seq.base_step)
            g = seq.base_g + (t - seq.base_step)
            synced = seq.synced
            lines.stop(seq)
            seq.generated = g
            self.starved.append(c)
            lines.start(seq, t + 1, c, synced)

    def _admit_waiting(
        self,
        t: int,
        budget: int,
        thr: int,
        chunks: list[tuple[Seq, int, int]],
        log: V1Decision | None,
    ) -> bool:
        """Waiting requests FCFS while budget and max_num_seqs allow and the cache
        admits them (event mode does not retry a refusal until the cache, the queue
        head, the running count or the budget changed: `fail_key`)."""
        e = self.e
        st, cfg = e.st, e.cfg
        waiting, running = st.waiting, st.running
        admitted = False
        if not waiting:
            return False
        key = (st.epoch, waiting[0][0], len(running), budget)
        if e.event_mode and key == st.fail_key:
            return False
        while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            seq = waiting[0][1]
            got = self._admit(seq, budget, thr)
            if got is None:
                break
            hit, n = got
            heappop(waiting)
            admitted = True
            st.epoch += 1
            st.events += 1
            seq.state, seq.computed = RUNNING, hit
            # output blocks are keyed at every append (`_grow`); their fills are events
            # only where a prompt could hold output ids (the engine's "auto" rule)
            seq.hashed = self.prefix and (seq.out_tokens is not None or e.big_prompt_ids)
            if seq.rec.admit_step < 0:
                seq.rec.admit_step = t
                seq.rec.cached_tokens = hit
            running.append(seq)
            st.prefilling.append(seq)
            self._grow(seq, hit, n)
            chunks.append((seq, hit, n))
            budget -= n
            if log is not None:
                log.hits[seq.sid] = hit
        if waiting:
            st.fail_key = (st.epoch, waiting[0][0], len(running), budget)
        return admitted

    def _finish_step(
        self,
        t: int,
        chunks: list[tuple[Seq, int, int]],
        decoded: list[tuple[Seq, int]],
        admitted: bool,
        log: V1Decision | None,
    ) -> None:
        """The model's part: chunks advance, completed prefills sample and become
        decoders; price, retire, record step t; then (event mode) skip what is quiet."""
        e = self.e
        st, lines = e.st, e.lines
        wins = lines.windows
        d = st.agg_d
        kv_read = st.agg_a + d * t + d  # every decoder's c + 1 (a starved one's c)
        excess = [a + n * (t + 1 - w) for a, n, w in zip(st.win_a, st.win_d, wins, strict=True)]
        for c in self.starved:  # a starved decoder reads nothing in step t
            d -= 1
            kv_read -= c
            for k, w in enumerate(wins):
                if c > w:
                    excess[k] -= c - w
        self.starved.clear()
        st.kv_excess = excess
        cost: list[tuple[int, int]] = []
        finished = st.finished_now
        for seq, start, n in chunks:
            seq.computed = start + n
            cost.append((start, n))
            if seq.computed < len(seq.prompt) + seq.generated:
                continue  # a chunk of a prefill that goes on
            st.prefilling.remove(seq)
            seq.generated += 1
            if seq.rec.first_token_step < 0:
                seq.rec.first_token_step = t
                st.first_now.append(seq.rec)
            if seq.generated >= seq.req.output_len:
                finished.append(seq)
            else:
                lines.start(seq, t + 1, seq.computed, seq.computed)
        step_ps = e._price(d, kv_read, cost)
        if e.step_hook is not None:  # token mode: every decoder appended here
            ran = [(s.sid, c) for s, c in decoded if s.state is RUNNING]
            logged = [(s.sid, a, n) for s, a, n in chunks]
            measured = e.step_hook(t, ran, logged, step_ps)
            step_ps = step_ps if measured is None else int(measured)
        st.peak = max(st.peak, len(st.running))
        had_finishes = bool(finished)
        if self.keys is not None:
            for seq in finished:
                self.keys.drop(seq)
        if log is not None:
            sched = [(s, 1) for s, _ in decoded] + [(s, n) for s, _, n in chunks]
            sched.sort(key=lambda x: x[0].order)
            log.scheduled = {s.sid: n for s, n in sched}
            log.finished = sorted(s.sid for s in finished)
        e.retire(t)
        occupancy = e._record_step(t, step_ps)
        e._stamp_times()
        e._report_progress()
        if log is not None and self.on_step is not None:
            log.used_blocks = occupancy[1]
            self.on_step(log)
        self._guard(bool(decoded or chunks or had_finishes or d), admitted)
        st.t = t + 1
        if e.event_mode and not st.prefilling and not had_finishes and not st.preempted:
            st.t = e.skip_quiet(t, occupancy)

    def _guard(self, progressed: bool, admitted: bool) -> None:
        """A queue head that can never be admitted (nothing running, nothing held):
        SchedulerError instead of looping."""
        st = self.e.st
        if progressed or admitted or st.running:
            return
        if st.waiting and not self.e.cache.request_ids():
            head = st.waiting[0][1]
            raise SchedulerError(
                f"request {head.req.id!r} cannot be admitted even into an empty cache "
                f"({len(head.prompt) + head.generated} tokens)"
            )

    def begin(self, requests: Sequence[TraceRequest]) -> None:
        """Refuse what vLLM v1's scheduler has no rule for here: n-sample and beam
        requests (vLLM's front end splits n samples into requests before it)."""
        for i, r in enumerate(requests):
            if r.n > 1 or r.beam_width > 1:
                raise ConfigError(
                    f"trace line {i + 2}: request {r.id!r} has n={r.n}, beam_width="
                    f"{r.beam_width}; the vllm-v1 policy schedules single sequences"
                )
        if self.keys is not None:
            self.keys.plan(requests, self.e.big_prompt_ids)
        self.stats = V1Stats()

    def check(self) -> None:
        """Invariants between steps: queues and states agree, the cache holds exactly
        the running requests at their computed lengths, running in arrival order."""
        st, cache = self.e.st, self.e.cache
        running = st.running
        assert all(a.order < b.order for a, b in pairwise(running)), "running order"
        assert len(running) <= self.e.cfg.max_num_seqs, "over max_num_seqs"
        assert all(s.state is RUNNING for s in running), "a running sequence is not RUNNING"
        assert all(s.state is WAITING for _, s in st.waiting), "a waiting one is not WAITING"
        assert set(cache.request_ids()) == {s.sid for s in running}, "cache != running"
        t = st.t
        decoders = [s for s in running if s.decoding]
        for s in running:
            assert s.decoding == (s not in st.prefilling), f"{s.sid}: decoding flag"
            if not s.decoding:
                assert cache.seq_len(s.sid) == s.computed, f"{s.sid}: cache length != computed"
                assert s.computed < len(s.prompt) + s.generated, f"{s.sid}: prefill done"
                continue
            c = s.base_c + (t - s.base_step)
            assert cache.seq_len(s.sid) == s.synced <= c, f"{s.sid}: synced past its line"
            assert c == len(s.prompt) + s.base_g + (t - s.base_step) - 1, f"{s.sid}: line"
            assert s.event_step >= t, f"{s.sid}: an event in the past"
        assert st.agg_d == len(decoders), "decoder count"
        assert st.agg_a == sum(s.base_c - s.base_step for s in decoders), "aggregate A"
        assert st.agg_sync == sum(s.synced for s in decoders), "synced sum"
