"""The capacity plan behind `kvbench capacity`: every figure for one model and budget."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvbench.workloads import capacity as cap
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE, check_block_size
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry, require_positive


@dataclass(frozen=True)
class CapacityPlan:
    """What a KV budget (per tensor-parallel rank) holds for one model.

    Sizes in bytes, counts in blocks, tokens or requests.
    """

    model: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    tp: int
    kv_heads_per_rank: int
    kv_sharding: str
    bytes_per_token: int
    bytes_per_token_per_rank: int
    block_size: int
    bytes_per_block_per_rank: int
    kv_budget_per_rank: int
    blocks: int
    token_slots: int
    avg_len: int
    max_len: int
    paged_concurrent_requests: int
    paged_concurrent_requests_block_rounded: int
    contiguous_concurrent_requests: int
    contiguous_utilization_at_avg: float
    paged_utilization_at_avg: float
    tail_allowance: float
    max_len_request_bytes_per_rank: float
    max_len_requests_admissible: int

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def plan_capacity(
    model: str,
    geometry: KVGeometry,
    kv_budget_per_rank: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    avg_len: int = 500,
    max_len: int = 2048,
    tp: int = 1,
    tail_allowance: float = cap.DEFAULT_TAIL_ALLOWANCE,
) -> CapacityPlan:
    """Compute the whole plan; raises ConfigError naming any bad value."""
    check_block_size(block_size)
    for name, value in (("avg_len", avg_len), ("max_len", max_len)):
        require_positive(name, value)
    if avg_len > max_len:
        raise ConfigError(
            f"avg_len={avg_len} is above max_len={max_len}: requests cannot average more than "
            "the longest a request may be"
        )
    per_rank_token = cap.bytes_per_token_per_rank(geometry, tp)
    per_rank_geometry = KVGeometry(
        geometry.num_layers,
        cap.kv_heads_per_rank(geometry.num_kv_heads, tp),
        geometry.head_dim,
        geometry.dtype,
    )
    blocks = cap.blocks_in_budget(per_rank_geometry, kv_budget_per_rank, block_size)
    return CapacityPlan(
        model=model,
        num_layers=geometry.num_layers,
        num_kv_heads=geometry.num_kv_heads,
        head_dim=geometry.head_dim,
        dtype=geometry.dtype,
        tp=tp,
        kv_heads_per_rank=per_rank_geometry.num_kv_heads,
        kv_sharding=cap.kv_sharding(geometry.num_kv_heads, tp),
        bytes_per_token=geometry.bytes_per_token,
        bytes_per_token_per_rank=per_rank_token,
        block_size=block_size,
        bytes_per_block_per_rank=per_rank_geometry.bytes_per_block(block_size),
        kv_budget_per_rank=kv_budget_per_rank,
        blocks=blocks,
        token_slots=blocks * block_size,
        avg_len=avg_len,
        max_len=max_len,
        paged_concurrent_requests=cap.paged_concurrency(
            per_rank_geometry, kv_budget_per_rank, block_size, avg_len
        ),
        paged_concurrent_requests_block_rounded=cap.paged_concurrency(
            per_rank_geometry, kv_budget_per_rank, block_size, avg_len, round_to_blocks=True
        ),
        contiguous_concurrent_requests=cap.contiguous_concurrency(
            per_rank_geometry, kv_budget_per_rank, max_len
        ),
        contiguous_utilization_at_avg=min(avg_len, max_len) / max_len,
        paged_utilization_at_avg=avg_len / cap.slots_for_tokens(avg_len, block_size),
        tail_allowance=tail_allowance,
        max_len_request_bytes_per_rank=cap.request_bytes_per_rank(
            geometry, max_len, tp, tail_allowance
        ),
        max_len_requests_admissible=cap.admissible_requests_per_rank(
            geometry, max_len, tp, kv_budget_per_rank, tail_allowance
        ),
    )
