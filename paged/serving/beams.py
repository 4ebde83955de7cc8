"""Beam-search groups for the serving engine.

A request with beam_width w > 1 is served as one group of w beams that decode in
lockstep: its prompt is prefilled once (one sequence), the first sampled step forks it
into w beams that share every prompt block, and after every later decode step the group
*selects*: the w new beams choose their parents among the w current ones. A beam chosen
k times continues and is forked k - 1 times (the forks share all of its blocks, copy-on-write
on their next append); a beam chosen 0 times is pruned (freed at once). After output_len
tokens all w beams finish together.

The selection is a seeded function of (request index, selection number) only, so every
run of the engine - token or event mode, tensors or memory-only - makes the same choices:
the w parents are drawn uniformly with replacement. Real beam searches concentrate on
fewer parents and so share at least as much as this model does.

Each beam holds its own output token ids (forks copy their parent's history and append a
new id), so its KV is a function of its own history: a swapped or recomputed beam comes
back with exactly the KV it had.

Memory rules the engine keeps for a group (see `paged.serving.engine.groups`): a group decodes a step
only when its whole step fits (every beam's new block or copy-on-write), so it is never
split by preemption; it is preempted, swapped, recomputed, re-admitted and resumed as a
unit; it is admitted only when w sequences fit under max_num_seqs.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvbench.workloads.trace import SYNTH_BASE

#: Generated ids of group i are SYNTH_BASE * (i + 1) + _FIRST_ID + k, k = 0, 1, ... (above
#: the synthetic prompt ids of request i, below those of request i + 1).
_FIRST_ID = SYNTH_BASE // 2


@dataclass
class BeamGroup:
    """The beams of one request (`beams` holds engine sequences, alive ones only)."""

    index: int  # the request's position in its trace
    width: int
    beams: list[Any] = field(default_factory=list)
    selections: int = 0
    next_child: int = 1  # child number of the next forked beam (0 is the root)
    issued: int = 0  # generated ids handed out so far
    stepped: int = -1  # the last engine step the group decoded

    def new_token(self) -> int:
        """A generated id no other sequence of any request uses."""
        token = SYNTH_BASE * (self.index + 1) + _FIRST_ID + self.issued
        self.issued += 1
        return token

    def parent_counts(self) -> list[int]:
        """How many of the next w beams each current beam (by position) parents.

        Seeded by (request index, selection number); the counts sum to `width`."""
        rng = random.Random(self.index * 1_000_003 + self.selections)
        self.selections += 1
        counts = [0] * len(self.beams)
        for _ in range(self.width):
            counts[rng.randrange(len(self.beams))] += 1
        return counts


def max_group_blocks(width: int, total_tokens: int, block_size: int) -> int:
    """Blocks a group can need at worst: every beam holding its whole history alone
    (after a recompute, which loses the sharing)."""
    return width * -(-total_tokens // block_size)


def plan_selection(counts: Sequence[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """(positions to prune, [(position, forks)]) for the parent counts of a selection."""
    pruned = [i for i, k in enumerate(counts) if k == 0]
    forks = [(i, k - 1) for i, k in enumerate(counts) if k > 1]
    return pruned, forks
