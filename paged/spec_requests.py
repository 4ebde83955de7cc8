"""A layer-group serving request (`SpecRequest`: a block table per self-attention group,
its cross-attention pages, its prefill reservation) and the move of a group of them
between two block pools that swap is made of (`move_pages`), for
`paged.spec_serving.LayerGroupServingCache`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvbench.paged.block_pool import BlockPool

#: Table entry of a block that left its window (vLLM's null block).
NULL_BLOCK = -1


@dataclass
class SpecRequest:
    """One request's tables: a list of block ids per self-attention group (NULL_BLOCK
    where a block left the window), its cross-attention blocks, and its reservation."""

    prompt_len: int
    tables: list[list[int]]
    cross: list[int]
    seq_len: int = 0
    #: self-attention pages held (not NULL), summed over groups
    held: int = 0
    #: pages the prefill may come to hold (0 once the prompt is complete)
    floor: int = 0
    #: per group, the index of the first block still held
    first: list[int] = field(default_factory=list)
    #: its tables and cross pages hold CPU page ids (swap space) instead of device ones
    swapped: bool = False

    @property
    def outstanding(self) -> int:
        """Reserved pages not held yet (kept out of everyone else's free count)."""
        return self.floor - self.held if self.floor > self.held else 0


def entries(req: SpecRequest) -> list[int]:
    """Every page id the request's tables and cross pages hold (with repeats)."""
    return [b for t in req.tables for b in t if b != NULL_BLOCK] + req.cross


def move_pages(reqs: list[SpecRequest], src: BlockPool, dst: BlockPool) -> None:
    """Copy each distinct page of `reqs` from `src` into one new `dst` page (its fill
    kept), one reference per table entry, and release the `src` entries."""
    distinct = list(dict.fromkeys(b for req in reqs for b in entries(req)))
    to = dict(zip(distinct, dst.allocate_many(len(distinct)), strict=True))
    for old, new in to.items():
        dst.set_fill(new, src.fill[old])
    taken: set[int] = set()
    for req in reqs:
        src.release(entries(req))
        for table in req.tables:
            for j, b in enumerate(table):
                if b != NULL_BLOCK:
                    table[j] = to[b]
        req.cross = [to[b] for b in req.cross]
        for b in entries(req):
            if b in taken:
                dst.incref(b)
            taken.add(b)
