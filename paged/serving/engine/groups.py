"""Sequence groups: the n samples of a request and the beams of a beam search (the
engine's collaborator for them).

n samples: the request prefills once; at its first token the parent forks n - 1
children that share its blocks (copy-on-write), or, with no room (or no seat under
max_num_seqs), a child queues to recompute prompt + its first token. When the family
fits the cache whole it is preempted and resumed as one unit (`Preemption.unit_of`).

Beam groups (`kvbench.paged.serving.beams`): the root's prefill forks it into w beams; each later
step the group decodes a token per beam, or none when the whole step (a block or a
copy-on-write per beam) does not fit; then it selects (prunes and forks). A group is
preempted, swapped, recomputed, re-admitted and resumed as a unit, so it is never split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from heapq import heappop, heappush

from kvbench.paged.serving.beams import BeamGroup, plan_selection
from kvbench.paged.serving.engine.decode import DecoderLines
from kvbench.paged.serving.engine.preempt import Preemption
from kvbench.paged.serving.engine.sequence import FINISHED, RUNNING, Seq, by_order
from kvbench.paged.serving.engine.state import EngineState
from kvbench.paged.serving.time_model import SchedulerConfig
from kvbench.reference.contract import ServingCache
from kvbench.workloads.errors import CapacityError
from kvbench.workloads.trace import TraceRequest

#: `new_seq(request, index, child, prompt)`: a new record-holding sequence of the run.
NewSeq = Callable[[TraceRequest, int, int, Sequence[int]], Seq]


class Groups:
    """Forks, beam steps, selection, and a recomputed group's return."""

    def __init__(
        self,
        st: EngineState,
        cache: ServingCache,
        cfg: SchedulerConfig,
        lines: DecoderLines,
        preemption: Preemption,
        new_seq: NewSeq,
        *,
        watermark_blocks: int,
        log_decoded: bool,
    ) -> None:
        self.st = st
        self.cache = cache
        self.cfg = cfg
        self.lines = lines
        self.preemption = preemption
        self.new_seq = new_seq
        #: Blocks the cache's admission keeps free (a group re-admits under it).
        self.watermark_blocks = watermark_blocks
        #: Record each decoded beam in `st.decoded` (for a step hook).
        self.log_decoded = log_decoded

    def fork_children(self, parent: Seq, t: int) -> None:
        """The parent of an n-sample request sampled its first token: fork its n - 1
        children (sharing its blocks), or queue those that find no room to recompute."""
        st, cfg, r = self.st, self.cfg, parent.req
        family = [parent] if self.preemption.family_fits(r) else None
        parent.family = family
        for k in range(1, r.n):
            child = self.new_seq(r, parent.index, k, parent.prompt)
            if family is not None:
                child.family = family
                family.append(child)
            child.rec.admit_step = parent.rec.admit_step
            child.rec.arrival_s = parent.rec.arrival_s  # later under a concurrency cap
            child.rec.first_token_step = t
            st.first_now.append(child.rec)
            child.rec.cached_tokens = parent.rec.cached_tokens
            child.generated = 1
            if r.output_len <= 1:
                st.finish(child, t)
                continue
            forked = False
            if len(st.running) < cfg.max_num_seqs:
                try:
                    self.cache.fork(parent.sid, child.sid)
                    forked = True
                except CapacityError:
                    forked = False
            if forked:
                st.epoch += 1
                child.state = RUNNING
                child.cow = True
                st.add_running(child)
                self.lines.start(child, t + 1, parent.computed, parent.computed)
            else:  # no room to fork: the child recomputes prompt + its first token
                child.target = len(child.prompt) + 1
                heappush(st.waiting, (child.order, child))
        parent.cow = True

    def _new_beam(self, group: BeamGroup, parent: Seq, t: int, c: int) -> Seq:
        """A fork of `parent` (KV length c, decoding from step t + 1) that took another
        token for its last one (not in `seqs`: a group has one record, its root's)."""
        child = Seq(parent.req, group.index, group.next_child, parent.prompt)
        group.next_child += 1
        child.hashed, child.group, child.rec = parent.hashed, group, parent.rec
        child.out_tokens = [*parent.history()[:-1], group.new_token()]
        child.generated = parent.generated
        self.cache.fork(parent.sid, child.sid)  # after its prefill a fork takes no blocks
        child.state = RUNNING
        child.cow = parent.cow = True
        self.st.add_running(child)
        self.lines.start(child, t + 1, c, c)
        return child

    def step(self, group: BeamGroup, t: int) -> None:
        """Decode one token for every beam of a group, or none: the group's whole step
        (a block or copy-on-write per beam, at worst) must fit, else a victim is
        preempted (perhaps the group itself). Then select (prune and fork) or finish."""
        st, cache = self.st, self.cache
        beams = group.beams
        st.cursor = beams[0].order
        c = beams[0].base_c + (t - beams[0].base_step)
        g = beams[0].base_g + (t - beams[0].base_step)
        while sum(cache.blocks_needed_to_grow(b.sid, 1) for b in beams) > cache.num_free_blocks:
            victim = self.preemption.choose_victim()
            self.preemption.preempt(victim, t)
            if victim.group is group:
                return
        for b in beams:
            self.lines.append(b, c, 1, [b.token(c)] if b.hashed else None)  # fits: checked
            b.cow = False
            b.synced = c + 1
            st.agg_sync += 1
            b.generated = g + 1
            if self.log_decoded:
                st.decoded.append((b, c))
            b.history().append(group.new_token())
            b.base_step, b.base_c, b.base_g = t + 1, c + 1, g + 1
            if self.lines.windows:
                self.lines.classify(b, c - t, c + 1)
        st.epoch += 1
        if g + 1 >= beams[0].req.output_len:
            for b in beams:
                b.version += 1  # no further events
                st.finished_now.append(b)
            return
        self._select(group, t, c + 1)

    def _select(self, group: BeamGroup, t: int, c: int) -> None:
        """The next beams choose their parents (KV length c): prune the unchosen,
        fork the rest."""
        old = group.beams
        pruned, forks = plan_selection(group.parent_counts())
        for i in pruned:
            beam = old[i]
            self.lines.stop(beam)
            self.st.remove_running(beam)
            self.cache.free(beam.sid)
            beam.state = FINISHED
        gone = set(pruned)
        survivors = [b for i, b in enumerate(old) if i not in gone]
        group.beams = survivors
        for b in survivors:
            self.lines.schedule(b, t + 1)
        for i, k in forks:
            for _ in range(k):
                group.beams.append(self._new_beam(group, old[i], t, c))
        group.beams.sort(key=by_order)
        if pruned or forks:
            self.st.epoch += 1

    def start(self, root: Seq, t: int) -> None:
        """The root's prefill sampled the first step: fork it into the w beams."""
        group = root.group
        assert group is not None
        root.history().append(group.new_token())
        if root.generated >= root.req.output_len:
            self.st.finished_now.append(root)
            return
        self.lines.start(root, t + 1, root.computed, root.computed)
        for _ in range(group.width - 1):
            group.beams.append(self._new_beam(group, root, t, root.computed))
        self.st.epoch += 1

    def resume(self, beam: Seq, t: int) -> None:
        """A recomputed beam finished its prefill: park it until all its group's beams
        have; then, as after a decode step, they all sample their next token and the
        group finishes or selects."""
        group = beam.group
        assert group is not None
        beam.parked = True
        if not all(b.parked for b in group.beams):
            return
        c = beam.computed
        finished_now = self.st.finished_now
        for b in group.beams:
            b.parked = False
            b.generated += 1
            b.history().append(group.new_token())
            if b.generated >= b.req.output_len:
                finished_now.append(b)
            else:
                self.lines.start(b, t + 1, c, c)
        if not finished_now or finished_now[-1].group is not group:
            self._select(group, t, c)

    def admit(self, group: BeamGroup, t: int) -> bool:
        """Re-admit every beam of a recomputed group, or none (False): the sum of
        their admission costs (an upper bound: one beam's revived prefix hits are
        free for the next) must keep the watermark."""
        st, cache = self.st, self.cache
        need = sum(
            cache.blocks_needed_to_admit(b.tokens(0, b.target), salt=b.salt) for b in group.beams
        )
        if cache.num_free_blocks - need < self.watermark_blocks:
            return False
        for b in group.beams:
            heappop(st.waiting)  # the group's beams head the queue (adjacent orders)
            b.computed = cache.admit(
                b.sid,
                b.tokens(0, b.target),
                salt=b.salt,
                output_len=b.req.output_len - b.generated,
            )
            b.state = RUNNING
            st.add_running(b)
            st.prefilling.append(b)
        st.prefilling.sort(key=by_order)
        st.epoch += 1
        st.events += 1
        return True

    @staticmethod
    def prefill(group: BeamGroup, budget: int, chunks: list[tuple[Seq, int]]) -> int:
        """Queue this step's prefill chunks of a re-admitted group; returns the budget
        left."""
        for b in group.beams:
            take = min(b.target - b.computed, budget)
            if take > 0:
                chunks.append((b, take))
                budget -= take
        return budget
