"""A request's block table in one layer group of the layer-group cache (`paged.layer_groups`)."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Table entry of a released block (vLLM's null block); kernels never read it.
NULL_BLOCK = -1


@dataclass
class GroupTable:
    """One request's table in one group."""

    blocks: list[int] = field(default_factory=list)  # logical -> physical, or NULL_BLOCK
    seq_len: int = 0  # tokens written (cross-attention: the encoder length)
    kept_from: int = 0  # first position still held (sliding window)
