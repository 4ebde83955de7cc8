"""Where a paged attention kernel starts reading a sequence, and how many tokens a decode
launch reads at most: the one place the kernels' launchers, checks and torch versions
take these from (the Triton and C++ kernel bodies apply the same rule on the device).

A query at position p with a sliding window of W tokens reads keys max(0, p - W + 1) .. p;
a call's first query of a sequence of L tokens with q new tokens sits at p = L - q (decode:
q = 1). Blocks wholly before that first key are never read, so their table entries may
be anything (-1 where a cache released them). Full attention (W None) reads from 0.

Kept in one module so that when the attention kinds get one table of rules (issue 38
item 1) these functions ask it instead of knowing the sliding window themselves.
"""

from __future__ import annotations

from typing import overload

import torch


@overload
def window_start(lens: int, window: int | None, q_lens: int = 1) -> int: ...
@overload
def window_start(
    lens: torch.Tensor, window: int | None, q_lens: int | torch.Tensor = 1
) -> torch.Tensor: ...
def window_start(
    lens: int | torch.Tensor, window: int | None, q_lens: int | torch.Tensor = 1
) -> int | torch.Tensor:
    """The first key position the first new query of each sequence reads: 0 for full
    attention, else max(0, L - q_len - window + 1) (ints, or int64 tensors elementwise)."""
    return _start(lens, window, q_lens)


def _start(
    lens: int | torch.Tensor, window: int | None, q_lens: int | torch.Tensor
) -> int | torch.Tensor:
    if window is None:
        return 0 if isinstance(lens, int) else torch.zeros_like(lens)
    start = lens - q_lens - window + 1
    if isinstance(start, torch.Tensor):
        return start.clamp(min=0)
    return max(0, start)


@overload
def first_block(lens: int, window: int | None, block_size: int, q_lens: int = 1) -> int: ...
@overload
def first_block(
    lens: torch.Tensor, window: int | None, block_size: int, q_lens: int | torch.Tensor = 1
) -> torch.Tensor: ...
def first_block(
    lens: int | torch.Tensor, window: int | None, block_size: int, q_lens: int | torch.Tensor = 1
) -> int | torch.Tensor:
    """The first block (table column) a sequence's launch reads: the block holding
    `window_start` (0 for full attention)."""
    return _start(lens, window, q_lens) // block_size


def span(max_seq_len: int, block_size: int, window: int | None, max_q_len: int = 1) -> int:
    """Tokens a launch reads per sequence at most, from its first block on (what sizes a
    decode's partitions and its gather): the longest length for full attention; with a
    window, the first query's window plus the part of its first block before it plus the
    later queries' keys, window + block_size - 1 + max_q_len - 1 (decode: window +
    block_size - 1), never more than the longest length."""
    if window is None:
        return max_seq_len
    return min(max_seq_len, window + block_size - 1 + max_q_len - 1)
