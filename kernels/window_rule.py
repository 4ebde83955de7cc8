"""Where a paged attention kernel starts reading a sequence, and how many tokens a launch
reads at most, in the kernels' terms (a `window` argument, per-sequence lengths and query
counts): the launch plan, the launchers' checks and the torch versions take these from
here, and each asks the attention kind's rule (`workloads.kv_rules`, the one table of
rules) rather than knowing any kind itself. The Triton and C++ kernel bodies apply the
same rule on the device, from the parameters the rule gives them (`KindRule.device_variant`,
`device_reach`, `cpu_window`).

A call's first new query of a sequence of L tokens with q new tokens sits at p = L - q
(decode: q = 1); blocks wholly before the first key it reads are never read, so their
table entries may be anything (-1 where a cache released them).
"""

from __future__ import annotations

from typing import overload

import torch

from kvbench.workloads.kv_rules import rule_for_window
from kvbench.workloads.kv_spec import KernelWindow


@overload
def window_start(lens: int, window: KernelWindow, q_lens: int = 1) -> int: ...
@overload
def window_start(
    lens: torch.Tensor, window: KernelWindow, q_lens: int | torch.Tensor = 1
) -> torch.Tensor: ...
def window_start(
    lens: int | torch.Tensor, window: KernelWindow, q_lens: int | torch.Tensor = 1
) -> int | torch.Tensor:
    """The first key position the first new query of each sequence reads (the rule's
    `first_kept` of position L - q_len; ints, or int64 tensors elementwise)."""
    return _start(lens, window, q_lens)


def _start(
    lens: int | torch.Tensor, window: KernelWindow, q_lens: int | torch.Tensor
) -> int | torch.Tensor:
    rule = rule_for_window(window)
    first_query = lens - q_lens
    if isinstance(first_query, torch.Tensor):
        return rule.first_kept_many(first_query)
    return rule.first_kept(first_query)


@overload
def first_block(lens: int, window: KernelWindow, block_size: int, q_lens: int = 1) -> int: ...
@overload
def first_block(
    lens: torch.Tensor, window: KernelWindow, block_size: int, q_lens: int | torch.Tensor = 1
) -> torch.Tensor: ...
def first_block(
    lens: int | torch.Tensor, window: KernelWindow, block_size: int, q_lens: int | torch.Tensor = 1
) -> int | torch.Tensor:
    """The first block (table column) a sequence's launch reads: the block holding
    `window_start` (0 for full attention)."""
    return _start(lens, window, q_lens) // block_size


def span(max_seq_len: int, block_size: int, window: KernelWindow, max_q_len: int = 1) -> int:
    """Tokens a launch reads per sequence at most, from its first block on (what sizes a
    decode's partitions and its gather): the rule's `read_span`."""
    return rule_for_window(window).read_span(max_seq_len, block_size, max_q_len)
