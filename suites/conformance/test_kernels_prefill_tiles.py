"""Every prefill tile the dispatch can pick, run under the Triton interpreter against the
float64 oracle.

The Triton prefill takes its tile (BLOCK_M query rows per program) by the rows the longest
sequence's new tokens bring (new tokens x GQA group, `kernels.configs.prefill_block_m`):
16 rows for short extends, 32 and 64 for longer prefills, capped per dtype and head dim.
Each configuration `configs.all_configs()` lists for the prefill kernel is driven here by a
batch whose longest run selects exactly it (the launch is recorded and checked), with a
cached prefix, a second shorter sequence and rows that do not fill the last tile; the
output is held to the oracle within the dtype's tolerance. A wrong tile choice fails the
recorded-configuration check; a tile whose masking or indexing is wrong fails the oracle.
The fp8 tiles run over fp8 pools (the oracle over the dequantized K/V) and the windowed
tiles with a sliding window.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvbench.kernels import configs, ops, triton_ops
from kvbench.reference import oracle
from kvbench.suites.conformance.test_kernels_attention import make_paged
from kvbench.suites.conformance.test_kernels_fp8 import _fp8_batch
from kvbench.workloads import fp8
from kvbench.workloads.kv_spec import KVCacheSpec

GROUP = 4
#: A head dim whose padded size is each D_PAD (96 and 160 are not powers of two: the masked
#: columns are exercised too).
HEAD_DIM_OF_PAD = {64: 64, 128: 96, 256: 160}


def _prefill_tiles() -> list[configs.KernelConfig]:
    return [c for c in configs.all_configs() if c.kernel == "paged_prefill"]


#: fp8 K/V format of a configuration, by its FP8_MAN constexpr.
FP8_BY_MAN = {3: torch.float8_e4m3fn, 2: torch.float8_e5m2}
#: Sliding window of the windowed tiles' runs: shorter than the runs, not a block multiple.
WINDOW = 7
#: Chunk of the chunked-local tiles' runs (a whole block of the runs' 16-token blocks).
CHUNK = 16


def _kv_dtype(cfg: configs.KernelConfig) -> torch.dtype | None:
    man = cfg.constexprs.get("FP8_MAN")
    return None if man is None else FP8_BY_MAN[int(man)]  # type: ignore[call-overload]


def _new_tokens_for(cfg: configs.KernelConfig) -> int:
    """The fewest new tokens (group of GROUP) whose rows select `cfg`'s BLOCK_M."""
    head_dim = HEAD_DIM_OF_PAD[cfg.int_constexpr("D_PAD")]
    windowed = bool(cfg.constexprs.get("WINDOWED"))
    chunked = bool(cfg.constexprs.get("CHUNKED"))
    for q_len in range(1, 200):
        chosen = configs.prefill_config(
            cfg.dtype, head_dim, q_len * GROUP, _kv_dtype(cfg), windowed=windowed, chunked=chunked
        )
        if chosen == cfg:
            return q_len
    raise AssertionError(f"no query count selects {cfg.describe()}")


def _id(cfg: configs.KernelConfig) -> str:
    c = cfg.constexprs
    man = c.get("FP8_MAN")
    fp8 = "" if man is None else f"-fp8e{7 - int(man)}m{man}"  # type: ignore[call-overload]
    window = (
        "-chunked_local" if c.get("CHUNKED") else "-sliding_window" if c.get("WINDOWED") else ""
    )
    return f"{configs.TRITON_DTYPE_NAMES[cfg.dtype]}-D{c['D_PAD']}-M{c['BLOCK_M']}{fp8}{window}"


def test_tiles_follow_the_query_count() -> None:
    """16 rows for short extends, larger tiles only for longer runs, never above the cap."""
    f16 = torch.float16
    assert configs.prefill_config(f16, 128, 1).constexprs["BLOCK_M"] == 16
    assert configs.prefill_config(f16, 128, 64).constexprs["BLOCK_M"] == 16
    assert configs.prefill_config(f16, 128, 65).constexprs["BLOCK_M"] == 32
    assert configs.prefill_config(f16, 128, 512).constexprs["BLOCK_M"] == 64
    assert configs.prefill_config(torch.float32, 128, 4096).constexprs["BLOCK_M"] == 16
    assert configs.prefill_config(f16, 256, 4096).constexprs["BLOCK_M"] == 32
    sizes = [c.int_constexpr("BLOCK_M") for c in configs.prefill_configs(f16, 128)]
    assert sizes == [16, 32, 64]


@pytest.mark.parametrize("cfg", _prefill_tiles(), ids=_id)
def test_every_prefill_tile_matches_oracle(cfg: configs.KernelConfig) -> None:
    """16/32-bit K/V against the float64 oracle; fp8 K/V (`fp8` in the id) against float64
    attention over the dequantized K/V; windowed tiles (`sliding_window`) with a window of
    `WINDOW` tokens, chunked-local tiles (`chunked_local`) with chunks of `CHUNK`, the
    oracle masking likewise."""
    dtype = cfg.dtype
    head_dim = HEAD_DIM_OF_PAD[cfg.int_constexpr("D_PAD")]
    kv_dtype = _kv_dtype(cfg)
    chunked = bool(cfg.constexprs.get("CHUNKED"))
    window = WINDOW if cfg.constexprs.get("WINDOWED") and not chunked else None
    kernel_window = KVCacheSpec.chunked_local(CHUNK) if chunked else window
    chunk = CHUNK if chunked else None
    q_len = _new_tokens_for(cfg)
    # a cached prefix of 9 tokens before the long run; a shorter second sequence
    lens, q_lens = [q_len + 9, 5], [q_len, 3]
    seed = cfg.int_constexpr("BLOCK_M") + head_dim
    gen = torch.Generator().manual_seed(seed)
    k_scale: torch.Tensor | None = None  # fp8 pools' scales; None: not fp8
    v_scale: torch.Tensor | None = None
    if kv_dtype is None:
        pb = make_paged(lens, 1, head_dim, 16, dtype, gen)
        k_cache, v_cache, tables, seq_lens = pb.k_cache, pb.v_cache, pb.block_tables, pb.seq_lens
        keys, values = pb.keys, pb.values
    else:
        k_cache, v_cache, tables, seq_lens, keys, values, ks, vs = _fp8_batch(
            lens, 1, head_dim, 16, kv_dtype, True, seed
        )
        k_scale, v_scale = ks, vs
        fmt = fp8.fp8_format(kv_dtype)
        keys = [fp8.dequantize(fp8.quantize(k, ks, fmt), ks, torch.float64) for k in keys]
        values = [fp8.dequantize(fp8.quantize(v, vs, fmt), vs, torch.float64) for v in values]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn((int(cu[-1]), GROUP, head_dim), generator=gen).to(dtype)
    out = torch.full_like(q, float("nan"))
    used: list[configs.KernelConfig] = []
    real = triton_ops._launch

    def record(
        cfg: configs.KernelConfig, grid: tuple[int, ...], device: torch.device, *args: Any
    ) -> Any:
        used.append(cfg)
        return real(cfg, grid, device, *args)

    triton_ops._launch = record
    try:
        ops.paged_prefill_attention(
            q, k_cache, v_cache, tables, cu, seq_lens, out=out, backend="triton",
            window=kernel_window, k_scale=k_scale, v_scale=v_scale,
        )  # fmt: skip
    finally:
        triton_ops._launch = real
    assert used == [cfg]
    ref = torch.cat(
        [
            oracle.extend_attention(
                q[cu[b] : cu[b + 1]], keys[b], values[b], window=window, chunk=chunk
            )
            for b in range(2)
        ]
    )
    err = oracle.relative_error(out, ref)
    assert err <= oracle.tolerance(dtype), f"{_id(cfg)} q_lens={q_lens}: relative error {err}"
