"""Capacity math: what fits in a KV budget, paged versus contiguous, per TP rank.

All functions are pure and exact (integers where the quantity is a count). They are the
formulas the seeds use; the `paged` and `reference` caches measure the same quantities
from real allocations, and the tests check the two agree.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from kvbench.workloads.block_size import check_block_size
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry, require_positive

#: [KV-capacity] applies the PagedAttention paper's "under 4%" tail waste as a 1.04 factor.
DEFAULT_TAIL_ALLOWANCE = 1.04


def blocks_for_tokens(tokens: int, block_size: int) -> int:
    """Blocks needed to hold `tokens` tokens: ceil(tokens / block_size)."""
    check_block_size(block_size)
    if tokens < 0:
        raise ConfigError(f"tokens must be >= 0, got {tokens!r}")
    return -(-tokens // block_size)


def watermark_blocks(watermark: float, num_blocks: int) -> int:
    """Blocks admission keeps free: the least integer >= watermark * num_blocks.
    ConfigError naming the value unless `watermark` is a number in [0, 1)."""
    if isinstance(watermark, bool) or not isinstance(watermark, numbers.Real):
        raise ConfigError(f"watermark must be a number in [0, 1), got {watermark!r}")
    if not 0.0 <= float(watermark) < 1.0:
        raise ConfigError(f"watermark must be in [0, 1), got {watermark!r}")
    return math.ceil(round(float(watermark) * num_blocks, 9))


def slots_for_tokens(tokens: int, block_size: int) -> int:
    """Token slots a paged cache allocates for `tokens` live tokens (whole blocks)."""
    return blocks_for_tokens(tokens, block_size) * block_size


def blocks_in_budget(geometry: KVGeometry, kv_budget_bytes: int, block_size: int) -> int:
    """Whole blocks of `block_size` tokens that fit in `kv_budget_bytes`."""
    require_positive("kv_budget_bytes", kv_budget_bytes)
    return kv_budget_bytes // geometry.bytes_per_block(block_size)


def tokens_in_budget(geometry: KVGeometry, kv_budget_bytes: int, block_size: int) -> int:
    """Token slots in the whole blocks that fit in the budget."""
    return blocks_in_budget(geometry, kv_budget_bytes, block_size) * block_size


def paged_concurrency(
    geometry: KVGeometry,
    kv_budget_bytes: int,
    block_size: int,
    avg_len: int,
    round_to_blocks: bool = False,
) -> int:
    """Requests of average length `avg_len` a paged cache holds at once.

    By default the pool's token slots divided by the average length (the seed's figure,
    which treats the last-block tail as negligible); with `round_to_blocks`, each request
    rounds up to whole blocks (the exact figure for requests all of length `avg_len`).
    """
    require_positive("avg_len", avg_len)
    blocks = blocks_in_budget(geometry, kv_budget_bytes, block_size)
    if round_to_blocks:
        return blocks // blocks_for_tokens(avg_len, block_size)
    return blocks * block_size // avg_len


def contiguous_concurrency(geometry: KVGeometry, kv_budget_bytes: int, max_len: int) -> int:
    """Requests a contiguous cache holds at once when each reserves `max_len` slots."""
    require_positive("max_len", max_len)
    require_positive("kv_budget_bytes", kv_budget_bytes)
    return kv_budget_bytes // geometry.bytes_for_tokens(max_len)


def utilization(live_tokens: int, reserved_tokens: int) -> float:
    """Fraction of reserved slots that hold live KV."""
    require_positive("reserved_tokens", reserved_tokens)
    return live_tokens / reserved_tokens


@dataclass(frozen=True)
class ReservationWaste:
    """Contiguous max-length reservation against what requests actually hold (bytes)."""

    reserved_bytes: int
    live_bytes: int

    @property
    def unused_fraction(self) -> float:
        """Share of the reservation that holds no live KV."""
        return 1.0 - self.live_bytes / self.reserved_bytes


def reservation_waste(
    geometry: KVGeometry, live_lengths: Sequence[int], max_len: int
) -> ReservationWaste:
    """Bytes reserved at `max_len` per request against bytes live at `live_lengths`."""
    require_positive("max_len", max_len)
    for n in live_lengths:
        if n < 0 or n > max_len:
            raise ConfigError(f"live length {n!r} is outside [0, max_len={max_len}]")
    if not live_lengths:
        raise ConfigError("live_lengths is empty")
    reserved = geometry.bytes_for_tokens(max_len * len(live_lengths))
    live = geometry.bytes_for_tokens(sum(live_lengths))
    return ReservationWaste(reserved, live)


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """KV heads each tensor-parallel rank stores.

    As serving engines lay them out (vLLM, SGLang, TensorRT-LLM): evenly sharded when the
    heads divide by the ranks; with fewer heads than ranks, and the ranks a multiple of
    the heads, each head is replicated on tp / heads ranks, so each rank holds one.
    Any other split (8 KV heads over 3 ranks) is refused with ConfigError, as the
    engines refuse it.
    """
    require_positive("num_kv_heads", num_kv_heads)
    require_positive("tp", tp)
    if num_kv_heads % tp == 0:
        return num_kv_heads // tp
    if tp % num_kv_heads == 0:
        return 1
    raise ConfigError(
        f"tp={tp} cannot split {num_kv_heads} KV heads: serving engines need the KV heads "
        f"to divide by the tensor-parallel ranks, or the ranks by the heads (tp in "
        f"{', '.join(str(t) for t in _valid_tp(num_kv_heads))}, ...)"
    )


def _valid_tp(num_kv_heads: int) -> list[int]:
    """Tensor-parallel sizes that split `num_kv_heads` heads: its divisors, then 2x and
    4x the heads (the first eight)."""
    divisors = [t for t in range(1, num_kv_heads + 1) if num_kv_heads % t == 0]
    return [*divisors, 2 * num_kv_heads, 4 * num_kv_heads][:8]


def kv_sharding(num_kv_heads: int, tp: int) -> str:
    """'sharded' (each rank its own heads) or 'replicated' (each head on tp / heads
    ranks), matching kv_heads_per_rank; ConfigError for a split no engine makes."""
    kv_heads_per_rank(num_kv_heads, tp)
    return "sharded" if num_kv_heads % tp == 0 else "replicated"


def bytes_per_token_per_rank(geometry: KVGeometry, tp: int) -> int:
    """KV bytes of one token on one tensor-parallel rank."""
    heads = kv_heads_per_rank(geometry.num_kv_heads, tp)
    return 2 * geometry.num_layers * heads * geometry.head_dim * geometry.dtype_bytes


def request_bytes_per_rank(
    geometry: KVGeometry, seq_len: int, tp: int, tail_allowance: float = DEFAULT_TAIL_ALLOWANCE
) -> float:
    """Bytes one request of `seq_len` tokens takes on each rank, times the tail allowance."""
    require_positive("seq_len", seq_len)
    if not math.isfinite(tail_allowance) or tail_allowance < 1.0:
        raise ConfigError(f"tail_allowance must be >= 1.0, got {tail_allowance!r}")
    return seq_len * bytes_per_token_per_rank(geometry, tp) * tail_allowance


def admissible_requests_per_rank(
    geometry: KVGeometry,
    seq_len: int,
    tp: int,
    rank_budget_bytes: int,
    tail_allowance: float = DEFAULT_TAIL_ALLOWANCE,
) -> int:
    """Fully occupied requests of `seq_len` tokens that fit one rank's KV budget."""
    require_positive("rank_budget_bytes", rank_budget_bytes)
    per_request = request_bytes_per_rank(geometry, seq_len, tp, tail_allowance)
    return int(rank_budget_bytes // per_request)


@dataclass(frozen=True)
class PrefixSharing:
    """Blocks needed with and without sharing one common prefix across requests."""

    blocks_without_sharing: int
    blocks_with_sharing: int
    blocks_saved: int

    @property
    def saved_fraction(self) -> float:
        """Share of the unshared prefix blocks that sharing saves."""
        return self.blocks_saved / self.blocks_without_sharing


def prefix_sharing(num_requests: int, prefix_tokens: int, block_size: int) -> PrefixSharing:
    """Prefix blocks for `num_requests` requests that share `prefix_tokens` tokens.

    With sharing, one physical copy of the prefix's blocks serves every request: full
    blocks are shared for good, and the partial last block is shared until a request
    writes into it (copy-on-write), which is how [KV-capacity] counts 63 blocks for 100
    requests sharing 1,000 tokens at block 16 (99.0% saved).
    """
    require_positive("num_requests", num_requests)
    require_positive("prefix_tokens", prefix_tokens)
    per_request = blocks_for_tokens(prefix_tokens, block_size)
    without = num_requests * per_request
    return PrefixSharing(without, per_request, without - per_request)
