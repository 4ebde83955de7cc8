"""PyTorch's FlexAttention paged attention (`torch.nn.attention.experimental._paged_attention.
PagedAttention` + `flex_attention`) as an attention peer ("torch-flex-paged").

Layout: one pool per layer for K and one for V, `[1, num_kv_heads, num_blocks *
block_size, head_dim]` (PagedAttention's: a flat token axis of pages). A decode step
builds, outside the timed callable, PagedAttention's page table and physical-to-logical
map from the block tables, a logical block mask (key index < the sequence's length) and
its conversion to physical pages (`convert_logical_block_mask`), then runs
`flex_attention(q, k, v, block_mask, enable_gqa=True)` with one query token per sequence.

On a CPU `flex_attention` runs eagerly (unfused: it scores the whole pool and masks, so
it is a correctness peer here, not a speed one: `timed=False`); on a GPU it is the same
call. Available wherever torch ships the experimental PagedAttention (torch >= 2.6).
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from kvbench.suites.peers.base import (
    AttentionTraits,
    PeerSpec,
    PeerUnavailableError,
    basic_unsupported,
)

_MODULE = "torch.nn.attention.experimental._paged_attention"


def probe() -> str | None:
    """None when this torch ships FlexAttention's PagedAttention, else why not."""
    try:
        found = importlib.util.find_spec(_MODULE) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        return f"torch {torch.__version__} has no {_MODULE} (FlexAttention paged attention)"
    return None


def _load() -> SimpleNamespace:
    why = probe()
    if why is not None:
        raise PeerUnavailableError(why)
    import torch.nn.attention.flex_attention as flex
    from torch.nn.attention.experimental._paged_attention import PagedAttention

    return SimpleNamespace(flex=flex, PagedAttention=PagedAttention)


class FlexPagedAttention:
    """FlexAttention over PagedAttention's page table as an AttentionAdapter."""

    name = "torch-flex-paged"
    traits = AttentionTraits(
        layout="[1, num_kv_heads, num_blocks * block_size, head_dim] (K and V separate; "
        "PagedAttention's flat page axis)",
        # Eager (CPU) flex_attention scores the whole pool and multiplies the masked
        # probabilities (0) by every V row: NaN anywhere in the pool reaches the output.
        needs_finite_tail=True,
    )

    def __init__(self) -> None:
        self._t = _load()

    def unsupported(
        self,
        dtype: torch.dtype,
        block_size: int,
        head_dim: int,
        num_q_heads: int,
        num_kv_heads: int,
    ) -> str | None:
        return basic_unsupported(dtype, num_q_heads, num_kv_heads)

    def make_cache(
        self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> SimpleNamespace:
        shape = (1, num_kv_heads, num_blocks * block_size, head_dim)
        return SimpleNamespace(
            k=torch.zeros(shape, dtype=dtype),
            v=torch.zeros(shape, dtype=dtype),
            num_blocks=num_blocks,
            block_size=block_size,
        )

    def write(
        self, cache: Any, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        slots = slot_mapping.to(torch.int64)
        cache.k[0, :, slots, :] = key.transpose(0, 1).to(cache.k.dtype)
        cache.v[0, :, slots, :] = value.transpose(0, 1).to(cache.v.dtype)

    def fill_(self, cache: Any, value: float) -> None:
        cache.k.fill_(value)
        cache.v.fill_(value)

    def decode_fn(
        self,
        cache: Any,
        query: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
    ) -> Callable[[], torch.Tensor]:
        flex = self._t.flex
        batch = query.shape[0]
        bs, n_pages = cache.block_size, cache.num_blocks
        tables = block_tables.to(torch.int64)
        lens = seq_lens.to(torch.int64)
        paged = self._t.PagedAttention(n_pages, bs, batch, device=str(query.device))
        used = -(-lens // bs)
        for b in range(batch):
            n = int(used[b])
            paged.page_table[b, :n] = tables[b, :n]
            paged.physical_to_logical[b, tables[b, :n]] = torch.arange(n)
        max_blocks = int(used.max()) if batch else 1

        def visible(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            return kv_idx < lens[b]

        logical = flex.create_block_mask(
            visible, batch, None, 1, max_blocks * bs, device=str(query.device), BLOCK_SIZE=(1, bs)
        )
        mask = paged.convert_logical_block_mask(logical, kv_len=lens)
        q = query.unsqueeze(2)  # [B, Hq, 1, D]
        k = cache.k.expand(batch, -1, -1, -1)
        v = cache.v.expand(batch, -1, -1, -1)

        def run() -> torch.Tensor:
            with warnings.catch_warnings():  # "use torch.compile": eager is the point here
                warnings.simplefilter("ignore", UserWarning)
                out = flex.flex_attention(q, k, v, block_mask=mask, scale=scale, enable_gqa=True)
            return out.squeeze(2)

        return run


def peer_spec() -> PeerSpec:
    """FlexAttention paged attention (correctness peer on CPU)."""
    return PeerSpec(
        name=FlexPagedAttention.name,
        attention=FlexPagedAttention,
        probe=probe,
        version=lambda: torch.__version__,
        description="PyTorch FlexAttention with PagedAttention's page table (eager on CPU)",
        timed=False,
    )
