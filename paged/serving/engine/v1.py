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
  generated), as vLLM hashes every block: generated blocks are shareable.

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from heapq import heappop, heappush
from itertools import pairwise
from typing import TYPE_CHECKING

from kvbench.paged.serving.engine.clock import arrival_step, span_ps
from kvbench.paged.serving.engine.sequence import NEVER, RUNNING, WAITING, Seq
from kvbench.workloads.errors import CapacityError, ConfigError
from kvbench.workloads.trace import TraceRequest

if TYPE_CHECKING:
    from kvbench.paged.serving.engine.engine import Engine


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

    def __init__(self, engine: Engine) -> None:
        self.e = engine
        cfg = engine.cfg
        if cfg.policy != "vllm-v1":
            raise ConfigError(f"V1Policy needs policy='vllm-v1', got {cfg.policy!r}")
        cache = engine.cache
        traits = engine.traits
        self.prefix = traits.prefix_caching
        self.hit_of: Callable[..., int] | None = getattr(cache, "prefix_hit", None)
        if self.prefix and self.hit_of is None:
            raise ConfigError(
                f"{type(cache).__name__} caches prefixes but has no prefix_hit(): the "
                "vllm-v1 policy sizes a first chunk from the hit before it allocates"
            )
        self.bs = traits.block_size
        self.stats = V1Stats()
        self.on_step: Callable[[V1Decision], None] | None = None

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def ids(seq: Seq, a: int, b: int) -> list[int]:
        """Token ids of positions a .. b - 1 (prompt, then generated)."""
        prompt = seq.prompt
        p = len(prompt)
        if b <= p:
            return list(prompt[a:b])
        out = [seq.token(i) for i in range(max(a, p), b)]
        return list(prompt[a:p]) + out if a < p else out

    def _grow(self, seq: Seq, start: int, n: int) -> None:
        """Append n tokens from `start` (their ids keyed when the cache caches
        prefixes); CapacityError, nothing changed, when they do not fit."""
        self.e.lines.append(seq, start, n, self.ids(seq, start, start + n) if self.prefix else None)

    def _preempt(self, victim: Seq) -> None:
        """Recompute: free the victim, reset it and queue it at its arrival place."""
        st = self.e.st
        self.e.cache.free(victim.sid)
        if victim in st.prefilling:
            st.prefilling.remove(victim)
        victim.state, victim.decoding, victim.computed = WAITING, False, 0
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
        hit = self.hit_of(tokens, salt=seq.salt) if self.hit_of is not None and self.prefix else 0
        n = total - hit
        if 0 < thr < n:
            n = thr
        if not e.cfg.chunked_prefill and n > budget:
            return None
        n = min(n, budget)
        if self.bs and cache.blocks_needed_to_admit(tokens, salt=seq.salt) > cache.num_free_blocks:
            return None  # the whole sequence must fit now (scheduler_reserve_full_isl)
        part = tokens if hit + n == total else tokens[: hit + n]
        try:
            cached = cache.admit(
                seq.sid, part, salt=seq.salt, output_len=seq.req.output_len - seq.generated
            )
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
        e.arrivals()
        running, waiting = st.running, st.waiting
        if not running and not waiting:
            if st.next_arrival >= len(e.reqs):
                return False
            st.now_ps = max(st.now_ps, e.arrivals_ps[st.next_arrival])
            return True
        t = st.t
        st.processed += 1
        st.preempted = False
        budget = cfg.max_batched_tokens
        thr = cfg.long_prefill_token_threshold if len(running) + len(waiting) > 1 else 0
        sched: list[tuple[Seq, int, int]] = []
        dec = self.on_step is not None
        decision = V1Decision(t) if dec else None
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            start = seq.computed
            n = len(seq.prompt) + seq.generated - start
            if 0 < thr < n:
                n = thr
            if n > budget:
                n = budget
            while True:
                try:
                    self._grow(seq, start, n)
                    break
                except CapacityError:
                    victim = running.pop()
                    self._preempt(victim)
                    if decision is not None:
                        decision.preempted.append(victim.sid)
                    if victim is seq:
                        break
            if seq.state is not RUNNING:
                break
            sched.append((seq, start, n))
            budget -= n
            i += 1
        admitted = False
        if not st.preempted:
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
                if seq.rec.admit_step < 0:
                    seq.rec.admit_step = t
                    seq.rec.cached_tokens = hit
                running.append(seq)
                st.prefilling.append(seq)
                self._grow(seq, hit, n)
                sched.append((seq, hit, n))
                budget -= n
                if decision is not None:
                    decision.hits[seq.sid] = hit
        self._finish_step(t, sched, decision, admitted)
        return True

    def _finish_step(
        self, t: int, sched: list[tuple[Seq, int, int]], decision: V1Decision | None, admitted: bool
    ) -> None:
        """The model's part: sample, finish and free, price and record step t; then,
        in event mode, skip the quiet stretch that follows."""
        e = self.e
        st = e.st
        decoders = kv_read = 0
        chunks: list[tuple[int, int]] = []
        wins = e.lines.windows
        excess = [0] * len(wins)
        finished: list[Seq] = []
        for seq, start, n in sched:
            seq.computed = start + n
            if seq.decoding:
                decoders += 1
                kv_read += start + 1
                for k, w in enumerate(wins):
                    if start + 1 > w:
                        excess[k] += start + 1 - w
            else:
                chunks.append((start, n))
            if seq.computed < len(seq.prompt) + seq.generated:
                continue  # a chunk of a prefill that goes on
            if not seq.decoding:
                seq.decoding = True
                st.prefilling.remove(seq)
            seq.generated += 1
            if seq.rec.first_token_step < 0:
                seq.rec.first_token_step = t
                st.first_now.append(seq.rec)
            if seq.generated >= seq.req.output_len:
                finished.append(seq)
        st.kv_excess = excess
        step_ps = e._price(decoders, kv_read, chunks)
        if e.step_hook is not None:  # decoders (id, context) and chunks (id, start, n)
            ran = [(s.sid, a) for s, a, n in sched if s.decoding and s not in finished]
            log = [(s.sid, a, n) for s, a, n in sched if not (s.decoding and a == s.computed - 1)]
            measured = e.step_hook(t, ran, log, step_ps)
            step_ps = step_ps if measured is None else int(measured)
        st.peak = max(st.peak, len(st.running))
        for seq in finished:
            st.running.remove(seq)
            seq.decoding = False
            e.cache.free(seq.sid)
            st.epoch += 1
            st.finish(seq, t)
        st.agg_d = decoders
        occupancy = e.cache.occupancy()
        e._record(t, 1, occupancy, occupancy[3], occupancy[3], step_ps)
        e._stamp_times()
        e._report_progress()
        if decision is not None and self.on_step is not None:
            decision.scheduled = {s.sid: n for s, _, n in sched}
            decision.finished = [s.sid for s in finished]
            decision.used_blocks = occupancy[1]
            self.on_step(decision)
        self._guard(t, bool(sched or finished), admitted)
        st.t = t + 1
        quiet = not chunks and not finished and not admitted and not st.preempted
        if e.event_mode and quiet and decoders and decoders == len(st.running):
            self._skip(t + 1, occupancy)

    def _guard(self, t: int, progressed: bool, admitted: bool) -> None:
        """A queue head that can never be admitted (nothing running, nothing held):
        SchedulerError instead of looping."""
        from kvbench.paged.serving.engine.validate import SchedulerError

        st = self.e.st
        if progressed or admitted or st.running:
            st.barren = 0
            return
        if st.waiting and not self.e.cache.request_ids():
            head = st.waiting[0][1]
            raise SchedulerError(
                f"request {head.req.id!r} cannot be admitted even into an empty cache "
                f"({len(head.prompt) + head.generated} tokens)"
            )

    def _skip(self, first: int, occupancy: tuple[int, int, int, int, int]) -> None:
        """Event mode: run the quiet steps first .. stop - 1 (module docstring) as one
        append per decoder and one timeline row."""
        e = self.e
        st = e.st
        bs = self.bs
        wins = e.lines.windows
        watch_fills = bool(st.waiting) and self.prefix
        k = NEVER
        total = 0
        for seq in st.running:
            c = seq.computed  # KV length at the start of step `first`
            total += c
            j = seq.req.output_len - seq.generated - 1  # steps before its last token
            if bs:
                j = min(j, (-c) % bs)  # before the step that needs a block
                if watch_fills:
                    j = min(j, (-c - 1) % bs)  # before the step that fills one
            for w in wins:
                if c < w:
                    j = min(j, w - c)  # before its context passes the window
            k = min(k, j)
        if k <= 0 or k >= NEVER:
            return
        d = len(st.running)
        a = total - d * first
        if st.next_arrival < len(e.reqs) and not e.capped():
            arrival = e.arrivals_ps[st.next_arrival]
            wins_agg = self._wins(first)
            stop = arrival_step(first, st.now_ps, arrival, a, d, e.tm, first + k, wins_agg)
            k = min(k, stop - first)
            if k <= 0:
                return
        cost = span_ps(e.tm, first, k, a, d, self._wins(first))
        for seq in st.running:
            c = seq.computed
            self._grow(seq, c, k)
            seq.computed = c + k
            seq.generated += k
        base = occupancy[3]
        live_first = base + d
        live_sum = k * base + d * k * (k + 1) // 2
        st.agg_d = d
        e._record(first, k, occupancy, live_first, live_sum, cost)
        st.t = first + k

    def _wins(self, first: int) -> tuple[tuple[int, int, int], ...]:
        """(window, a_W, d_W) of the running decoders at step `first` (`clock`)."""
        out = []
        for w in self.e.lines.windows:
            past = [s.computed for s in self.e.st.running if s.computed >= w]
            out.append((w, sum(past) - len(past) * first, len(past)))
        return tuple(out)

    def begin(self, requests: Sequence[TraceRequest]) -> None:
        """Refuse what vLLM v1's scheduler has no rule for here: n-sample and beam
        requests (vLLM's front end splits n samples into requests before it)."""
        for i, r in enumerate(requests):
            if r.n > 1 or r.beam_width > 1:
                raise ConfigError(
                    f"trace line {i + 2}: request {r.id!r} has n={r.n}, beam_width="
                    f"{r.beam_width}; the vllm-v1 policy schedules single sequences"
                )
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
        for s in running:
            assert cache.seq_len(s.sid) == s.computed, f"{s.sid}: cache length != computed"
            assert s.decoding == (s not in st.prefilling), f"{s.sid}: decoding flag"
            total = len(s.prompt) + s.generated
            assert s.computed == total - 1 if s.decoding else s.computed < total, s.sid
