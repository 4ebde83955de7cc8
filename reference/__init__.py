"""Reference: the contiguous KV cache and the float64 attention oracle, the simplest
code that is obviously right. Imports only torch and `workloads`."""

from kvbench.reference.contiguous import ContiguousKVCache
from kvbench.reference.contract import CacheStats, KVCache
from kvbench.reference.oracle import batched_decode_attention, decode_attention, extend_attention

__all__ = [
    "CacheStats",
    "ContiguousKVCache",
    "KVCache",
    "batched_decode_attention",
    "decode_attention",
    "extend_attention",
]
