"""Growth and preemption: the engine's collaborator that grows a decoder by its token,
preempting others (or itself) when the cache cannot, and decides which sequences go and
how (swap or recompute).

One rule says what is preempted and resumed together (`unit_of`): a beam group always
(it has one record, its root's), the running samples of an n-sample request when the
family fits the cache whole (`family_fits`), otherwise the sequence alone. The
victim is the latest-arrived running sequence below the preemption bound. A unit is
swapped (its blocks to the CPU pool, shared blocks copied once) when the policy or the
cost model says so, every member is decoding and swap space holds them; else each
member is recomputed (freed and requeued with all its tokens).
"""

from __future__ import annotations

from heapq import heappush

from kvbench.paged.serving.engine.decode import DecoderLines
from kvbench.paged.serving.engine.sequence import RUNNING, SWAPPED, WAITING, Seq, SeqState
from kvbench.paged.serving.engine.state import EngineState
from kvbench.paged.serving.time_model import SchedulerConfig, TimeModel
from kvbench.reference.contract import ServingCache
from kvbench.workloads.errors import CapacityError
from kvbench.workloads.trace import TraceRequest


class Preemption:
    """Growth with preemption, victims and units, swap or recompute (module docstring)."""

    def __init__(
        self,
        st: EngineState,
        cache: ServingCache,
        cfg: SchedulerConfig,
        tm: TimeModel | None,
        lines: DecoderLines,
        *,
        can_swap: bool,
    ) -> None:
        self.st = st
        self.cache = cache
        self.cfg = cfg
        self.tm = tm
        self.lines = lines
        #: The cache has swap space (else every preemption recomputes).
        self.can_swap = can_swap

    def family_fits(self, r: TraceRequest) -> bool:
        """Whether the n samples of `r` are preempted as one unit: configured so
        (sample_preemption "request") and able to run to completion alone in the cache,
        each holding its own history (a unit that could not would never make progress);
        else each sample is preempted alone."""
        if self.cfg.sample_preemption == "sequence":
            return False
        fp = self.cache.footprint(r.prompt_len + r.output_len)
        return r.n * fp.need <= fp.room

    def unit_of(self, seq: Seq, state: SeqState) -> list[Seq]:
        """The sequences preempted and resumed with `seq`: its beam group (a group has
        one record, its root's), the members of its n-sample family in `state` that did
        not finish this step (a family preempted together is swapped together, so the
        swapped ones come back together), or itself."""
        if seq.group is not None:
            return seq.group.beams
        if seq.family is not None:
            done = self.st.finished_now
            return [s for s in seq.family if s.state is state and s not in done]
        return [seq]

    def choose_victim(self) -> Seq:
        """The latest-arrived running sequence below the preemption bound (else the
        latest-arrived), never one that already finished in this step."""
        st = self.st
        fallback = None
        for cand in reversed(st.running):
            if cand in st.finished_now:
                continue
            if fallback is None:
                fallback = cand
            if cand.rec.preemptions < self.cfg.max_preemptions:
                return cand
        st.overrides += 1
        assert fallback is not None, "a preemption with nothing running to preempt"
        return fallback

    def _detach(self, victim: Seq, t: int) -> int:
        """Take a sequence out of the running batch; returns its KV length. A decoder
        that already appended this step (its order is before the cursor) keeps the
        token; one that had not is no longer counted among this step's decodes."""
        st = self.st
        if victim.decoding:
            appended = 1 if victim.order < st.cursor else 0
            c = victim.base_c + (t - victim.base_step) + appended
            victim.generated = victim.base_g + (t - victim.base_step) + appended
            if not appended:  # it will not decode in this step after all
                st.dec -= 1
                st.kv_read -= c + 1
                for k in range(victim.nabove):  # it was past these windows at step t
                    st.kv_excess[k] -= c + 1 - self.lines.windows[k]
            self.lines.sync(victim, c)
            self.lines.stop(victim)
        else:
            c = victim.computed
            victim.parked = False
        st.remove_running(victim)
        return c

    def preempt(self, victim: Seq, t: int) -> None:
        """Preempt the victim's unit (`unit_of`): swap all of it together (shared
        blocks copied once) when the policy or the cost model says so, every member is
        decoding and swap space holds them; else recompute them all (each requeued
        alone with all its tokens). A family is a unit only when it fits the cache
        whole (`family_fits`), so a unit can always finish.

        Expects every member RUNNING; leaves each SWAPPED (in `swapped`, with
        computed = its KV length) or WAITING (in `waiting`, its cache entry freed)."""
        st, cfg, tm = self.st, self.cfg, self.tm
        unit = self.unit_of(victim, RUNNING)
        assert unit and all(s.state is RUNNING for s in unit), "preempting a non-running unit"
        records = [s.rec for s in unit] if victim.group is None else [unit[0].rec]
        st.preempted = True
        st.preemptions += 1
        for rec in records:
            rec.preemptions += 1
        decoders = all(s.decoding for s in unit)
        lengths = [self._detach(s, t) for s in unit]
        sids = [s.sid for s in unit]
        use_swap = False
        blocks = 0
        if decoders and self.can_swap:
            blocks = self.cache.blocks_held(sids)
            if cfg.preemption == "swap":
                use_swap = True
            elif cfg.preemption == "auto":
                assert tm is not None
                use_swap = 2 * tm.swap_ps(blocks) <= tm.recompute_ps(sum(lengths))
        if use_swap:
            try:
                self.cache.swap_out_group(sids)
            except CapacityError:
                use_swap = False  # swap space full: recompute instead
        st.epoch += 1
        self._requeue(unit, lengths, use_swap)
        if use_swap:
            if tm is not None:
                st.swap_ps += tm.swap_ps(blocks)
            for rec in records:
                rec.swaps += 1
            st.swaps += 1
        else:
            for rec in records:
                rec.recomputes += 1
            st.recomputes += 1

    def _requeue(self, unit: list[Seq], lengths: list[int], swapped: bool) -> None:
        """Queue the preempted unit: swapped (KV kept on the CPU) or waiting to be
        recomputed (cache entry freed; it prefills prompt + generated tokens again)."""
        st = self.st
        for s, c in zip(unit, lengths, strict=True):
            if swapped:
                s.state, s.computed = SWAPPED, c
                heappush(st.swapped, (s.order, s))
            else:
                self.cache.free(s.sid)
                s.state, s.computed = WAITING, 0
                s.target = len(s.prompt) + s.generated
                heappush(st.waiting, (s.order, s))

    def grow(self, seq: Seq, t: int, c: int) -> bool:
        """Append the decoder's step-t token at position c, preempting as needed.
        Returns False when the sequence itself was preempted."""
        ids = [seq.token(c)] if seq.hashed else None
        while True:
            try:
                self.lines.append(seq, c, 1, ids)
                return True
            except CapacityError:
                self.preempt(self.choose_victim(), t)
                if seq.state is not RUNNING:  # it was the victim, or in the victim's unit
                    return False

    def flush_and_grow(self, seq: Seq, t: int, c: int) -> bool:
        """Deferred appends plus this step's token in one cache call when it fits;
        otherwise flush (never allocates) and grow with preemption."""
        n = c - seq.synced
        if n > 0:
            ids = seq.tokens(seq.synced, c + 1) if seq.hashed else None
            try:
                self.lines.append(seq, seq.synced, n + 1, ids)
            except CapacityError:
                return self.grow_after_flush(seq, t, c)
            self.st.agg_sync += n
            seq.synced = c
            return True
        return self.grow(seq, t, c)

    def grow_after_flush(self, seq: Seq, t: int, c: int) -> bool:
        """The one-call append did not fit: flush the deferred appends (they never
        allocate) and grow by this step's token with preemption."""
        self.lines.sync(seq, c)
        return self.grow(seq, t, c)
