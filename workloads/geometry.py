"""KV geometry: how many bytes one token's keys and values occupy.

A token's KV footprint is 2 (K and V) x layers x KV heads x head dim x bytes per element.
Everything else (block bytes, capacity, concurrency) derives from this one number.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

from kvbench.workloads.block_size import check_block_size
from kvbench.workloads.errors import ConfigError

#: Bytes per element of every KV dtype kvbench knows. fp8 variants are 1 byte.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}

_DTYPE_ALIASES = {
    "fp32": "float32",
    "f32": "float32",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp8": "fp8_e4m3",
    "e4m3": "fp8_e4m3",
    "e5m2": "fp8_e5m2",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
}


def canonical_dtype(name: str) -> str:
    """Return the canonical dtype name for `name` (accepts aliases such as fp16, bf16)."""
    key = str(name).lower().removeprefix("torch.")
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {name!r}; known: {', '.join(DTYPE_BYTES)}")
    return key


def require_positive(name: str, value: object, maximum: int | None = None) -> int:
    """`value` as an int if it is a whole number >= 1 (and <= `maximum` when given), else
    ConfigError naming it. The one positive-integer check of kvbench: sizes, counts and
    lengths everywhere go through it (a bool is not a number here)."""
    whole = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    n = int(value) if whole else 0  # type: ignore[call-overload]
    if n < 1 or (maximum is not None and n > maximum):
        if maximum is None:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        raise ConfigError(f"{name} must be an integer in [1, {maximum:,}], got {value!r}")
    return n


@dataclass(frozen=True)
class KVGeometry:
    """Shape of a model's KV cache.

    Attributes:
        num_layers: transformer layers that hold KV.
        num_kv_heads: key/value heads per layer (after GQA/MQA grouping).
        head_dim: elements per head.
        dtype: canonical KV dtype name (see DTYPE_BYTES).
        num_q_heads: query heads per layer; a multiple of num_kv_heads. Defaults to
            num_kv_heads (MHA). Only attention cares; capacity math does not.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "float16"
    num_q_heads: int | None = None

    def __post_init__(self) -> None:
        require_positive("num_layers", self.num_layers)
        require_positive("num_kv_heads", self.num_kv_heads)
        require_positive("head_dim", self.head_dim)
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        q = self.num_kv_heads if self.num_q_heads is None else self.num_q_heads
        require_positive("num_q_heads", q)
        if q % self.num_kv_heads:
            raise ConfigError(
                f"num_q_heads={q} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        object.__setattr__(self, "num_q_heads", q)

    @property
    def dtype_bytes(self) -> int:
        """Bytes per KV element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def group_size(self) -> int:
        """Query heads that share one KV head (1 = MHA, num_q_heads = MQA)."""
        assert self.num_q_heads is not None
        return self.num_q_heads // self.num_kv_heads

    @property
    def bytes_per_token_per_layer(self) -> int:
        """K and V bytes of one token in one layer."""
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        """K and V bytes of one token across all layers."""
        return self.num_layers * self.bytes_per_token_per_layer

    def bytes_per_block(self, block_size: int) -> int:
        """Bytes of one paged block of `block_size` tokens across all layers."""
        return check_block_size(block_size) * self.bytes_per_token

    def bytes_for_tokens(self, tokens: int) -> int:
        """Bytes of `tokens` tokens of KV across all layers."""
        if tokens < 0:
            raise ConfigError(f"tokens must be >= 0, got {tokens!r}")
        return tokens * self.bytes_per_token

    def with_dtype(self, dtype: str) -> KVGeometry:
        """The same geometry with another KV dtype."""
        return KVGeometry(
            self.num_layers, self.num_kv_heads, self.head_dim, dtype, self.num_q_heads
        )


_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


def parse_bytes(text: str | int | float, *, decimal_gb_as_mib: bool = False) -> int:
    """Parse a size such as '42GB', '8 GiB', '512MiB' or a plain number of bytes.

    KB/MB/GB are decimal (10^3), KiB/MiB/GiB binary (2^10). With `decimal_gb_as_mib`,
    "N GB" is read as N x 1,000 MiB, the convention [PA-deep-dive] uses for its "42 GB" pool
    (42,000 MiB = 8,400 blocks of 5 MiB).
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if not math.isfinite(text) or text <= 0:
            raise ConfigError(f"size must be a positive finite number, got {text!r}")
        return int(text)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ConfigError(f"cannot parse size {text!r}; use e.g. '42GB', '8GiB', '512MiB'")
    number, unit = float(match.group(1)), match.group(2).lower()
    if number <= 0:
        raise ConfigError(f"size must be positive, got {text!r}")
    scale = 1000 * 1024**2 if decimal_gb_as_mib and unit == "gb" else _UNITS[unit]
    if not math.isfinite(number * scale) or number * scale >= 2**80:
        raise ConfigError(f"size {text!r} is too large (at most a zettabyte)")
    return round(number * scale)
