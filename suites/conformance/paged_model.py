"""Test helpers for the paged-cache suites: deterministic K/V and whole-state comparison.

K and V of a token are a deterministic function of (token id, position, salt, layer) and,
through a rolling digest, of every token before it: the KV of position p depends on the
salt and the whole prefix tokens[0..p], as in a real model. A wrong prefix-cache hit
(another salt, another prefix, a broken key chain) or a lost copy therefore shows up as
wrong data, not as a coincidentally equal tensor.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from kvbench.workloads.geometry import KVGeometry

_MOD = (1 << 61) - 1
_P = 1_000_003


def salt_seed(salt: str | None) -> int:
    """A 61-bit start value for the rolling digest of a request with this salt."""
    raw = b"\x00" if salt is None else b"\x01" + salt.encode()
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "little") % _MOD


def digests(tokens: Sequence[int], salt: str | None) -> list[int]:
    """digest[p] = h(digest[p-1], token p, p): one per position, chaining the prefix."""
    out, d = [], salt_seed(salt)
    for pos, tok in enumerate(tokens):
        d = (d * 6364136223846793005 + (tok + 1) * 1442695040888963407 + pos) % _MOD
        out.append(d)
    return out


def kv_for(
    geometry: KVGeometry,
    dtype: torch.dtype,
    tokens: Sequence[int],
    salt: str | None,
    start: int,
    end: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [num_layers, end - start, num_kv_heads, head_dim] of positions start..end-1
    of a request whose true token ids are `tokens` (len >= end)."""
    d = torch.tensor(digests(tokens[:end], salt)[start:end], dtype=torch.int64) % (1 << 31)
    width = geometry.num_kv_heads * geometry.head_dim
    idx = torch.arange(width, dtype=torch.int64) * 2 + 1
    out = []
    for tag in (1, 2):
        layers = []
        for layer in range(geometry.num_layers):
            mult = idx + layer * 7919 + tag * 104_729
            x = (d[:, None] * mult[None, :]) % _P
            x = x.to(torch.float64) / _P - 0.5
            layers.append(x.reshape(end - start, geometry.num_kv_heads, geometry.head_dim))
        out.append(torch.stack(layers).to(dtype))
    return out[0], out[1]


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bytes."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
