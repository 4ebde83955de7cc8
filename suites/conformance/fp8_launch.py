"""The keyword arguments the fp8 kernel tests pass alike to `ops.write_kv` and
`ops.paged_decode_attention`, typed so one dict of them type-checks at both calls."""

from __future__ import annotations

from typing import TypedDict

import torch


class _Fp8Scales(TypedDict):
    backend: str
    k_scale: torch.Tensor
    v_scale: torch.Tensor


class Fp8Launch(_Fp8Scales, total=False):
    """A backend, the fp8 pool's per-head K and V scales (dequantized value = stored value
    * scale) and, optionally, whether indices are checked on the host."""

    check_indices: bool
