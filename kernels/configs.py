"""Which Triton kernel configuration each call uses, decided in one place.

The launchers (`kernels.triton_ops`) and the ahead-of-time compile check (`kernels.aot`)
both call these functions, so the AOT table covers exactly the configurations the dispatch
can choose. Everything that varies per call but does not change the compiled code (block
size, head count, sequence lengths, partition size, head_dim within its padded size) is a
runtime argument; what does change it (element type, padded head dim, query-head rows per
program, single vs split partition) is a compile-time constant listed here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvbench.workloads import fp8
from kvbench.workloads.errors import ConfigError

#: Q/K/V dtypes the Triton kernels are compiled for.
DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
#: Padded head dims (powers of two, at least 64 so that tiny test head dims reuse the
#: variants real models use). Head dims 64, 80, 96, 128 and 256 map to 64, 128, 128, 128
#: and 256; any head_dim in 1..256 is accepted.
HEAD_DIM_PADS: tuple[int, ...] = (64, 128, 256)
MAX_HEAD_DIM = 256
#: Query-head rows per decode program: the smallest that holds the GQA group, so a K/V
#: tile is read once per group; groups larger than the last are split into chunks.
DECODE_QH: tuple[int, ...] = (16, 32, 64)
#: Default KV tokens per decode partition; one partition covers contexts up to this.
DEFAULT_PARTITION = 512
#: Partitions merged per step of the decode reduction.
REDUCE_CHUNK = 16
#: Elements per program of the row-copy kernel.
COPY_BLOCK = 1024
#: Integer element types the copy kernel moves data as (by element size in bytes).
COPY_AS: dict[int, torch.dtype] = {1: torch.int8, 2: torch.int16, 4: torch.int32}
#: Query dtypes the Triton decode reads fp8 K/V with (dequantized to the query dtype).
FP8_QUERY_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)

TRITON_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
}


#: Triton's default software-pipelining depth (`num_stages`) for loops.
DEFAULT_STAGES = 3


@dataclass(frozen=True)
class KernelConfig:
    """One compiled variant of a kernel: its constexprs, warps, pipelining stages, the
    element type of its data pointers (`dtype`), and an optional cap on the registers per
    thread (`maxnreg`, passed to ptxas; None: the compiler's choice). The cap changes only
    register allocation, never values."""

    kernel: str
    dtype: torch.dtype
    constexprs: dict[str, object] = field(hash=False)
    num_warps: int = 4
    num_stages: int = DEFAULT_STAGES
    maxnreg: int | None = None

    def launch_options(self) -> dict[str, int]:
        """The compile options of a GPU launch or an ahead-of-time compile (`num_warps`,
        `num_stages`, and `maxnreg` where a cap is set)."""
        cap = {} if self.maxnreg is None else {"maxnreg": self.maxnreg}
        return {"num_warps": self.num_warps, "num_stages": self.num_stages, **cap}

    def describe(self) -> dict[str, object]:
        """A flat, JSON-friendly description (used by the AOT table and result rows);
        `num_stages` appears only where it is not Triton's default and `maxnreg` only where
        a cap is set, so the keys of variants that keep the defaults stay as they were."""
        stages = {} if self.num_stages == DEFAULT_STAGES else {"num_stages": self.num_stages}
        cap = {} if self.maxnreg is None else {"maxnreg": self.maxnreg}
        return {
            "dtype": TRITON_DTYPE_NAMES[self.dtype],
            "num_warps": self.num_warps,
            **stages,
            **cap,
            **self.constexprs,
        }

    def int_constexpr(self, name: str) -> int:
        """The integer constexpr `name` (a tile size, a head count): TypeError, naming it,
        if the variant holds a flag, string or float there instead."""
        value = self.constexprs[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{self.kernel} constexpr {name}={value!r} is not an integer")
        return value


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def head_dim_pad(head_dim: int) -> int:
    """Padded head dim for `head_dim` (power of two, >= 64); ConfigError above 256."""
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ConfigError(f"head_dim={head_dim} is outside the Triton kernels' 1..{MAX_HEAD_DIM}")
    return max(HEAD_DIM_PADS[0], _next_pow2(head_dim))


def _dot_precision(dtype: torch.dtype) -> str:
    # ieee for float32 so the oracle comparison is meaningful (no TF32 rounding).
    return "ieee" if dtype == torch.float32 else "tf32"


def copy_config(element_size: int, src_identity: bool) -> KernelConfig:
    """Row-copy kernel for elements of `element_size` bytes (moved as integers)."""
    if element_size not in COPY_AS:
        raise ConfigError(f"no copy kernel for {element_size}-byte elements")
    return KernelConfig(
        "copy_rows",
        COPY_AS[element_size],
        {"BLOCK": COPY_BLOCK, "SRC_IDENTITY": src_identity},
    )


def decode_qh(
    group: int, d_pad: int, dtype: torch.dtype = torch.float16, *, kv_fp8: bool = False
) -> int:
    """Query-head rows per decode program for a GQA group of `group` heads: the smallest of
    `DECODE_QH` that holds the group, capped where a bigger one would spill registers
    (float32 tiles are twice the size and its ieee tl.dot runs on FMA units; fp8 K/V
    (`kv_fp8`) at head dim 256 stop at 16: 32 rows hold 255 registers and spill 8-80
    bytes on sm_80 and sm_90, 48 bytes with 8 warps, so a group of 32 reads its fp8 K/V
    twice, as many bytes as 16-bit K/V read once)."""
    if dtype == torch.float32 or (kv_fp8 and d_pad > 128):
        limit = 16
    else:
        limit = DECODE_QH[-1] if d_pad <= 64 else 32
    for qh in DECODE_QH:
        if qh >= group or qh == limit:
            return qh
    return limit


#: Software-pipelining stages of the 16-bit decode loop (vLLM's decode stage 1 uses 2 as
#: well): a third stage costs another K/V tile of registers and shared memory. Measured on
#: a GPU (H200, 2026-11-28, docs/gpu-tiles.md): at 64 tokens per step 3 or 4 stages were
#: 1-3% slower than 2 with the default partition.
DECODE_STAGES = 2

#: KV tokens per step of the 16-bit decode where the wide tile fits (`DECODE_WIDE`).
#: Measured on a GPU (H200, Triton 3.6, 2026-11-28; fp16, 32 query / 8 KV heads, head dim
#: 128, block 16, CUDA graphs; docs/gpu-tiles.md): the 16-token tile read K/V at
#: 2.1-2.5 TB/s; 64 tokens, 4 warps, 2 stages was 1.44x faster at batch 32 x 1024 tokens,
#: 1.57x at 32 x 4096 (3.90 TB/s against a measured copy rate of 4.04 TB/s read + write)
#: and 1.62x at 8 x 2048 (1.995x with 256-token partitions; each the 6th-fastest of a
#: CUDA-graph sample, one sample per variant), outputs within 1.2e-4 of the 16-token
#: tile's. 8 warps were slower except at 8 x 2048 with 512-token partitions (1.70x).
#: Its static cost (`kvbench kernels`, Triton 3.9): 128 registers split / 122-124 single
#: on sm_80 and sm_90, 38,912 B shared, no spills (the 16-token tile: 64-72 registers,
#: 12,800 B), so 4 programs of 4 warps per SM.
DECODE_WIDE_TILE_N = 64
#: (padded head dim, QH, fp8 K/V) of the 16-bit decode variants that take
#: `DECODE_WIDE_TILE_N`: those whose wide tile compiles without spills on sm_80 and sm_90
#: in at most 128 registers per thread (the measured variant's occupancy), split and
#: single. Head dim 128 QH 16 was measured; head dim 64 QH 32 (112 / 118 registers split,
#: 96 single, 24,576 B; 101-106 and 80 at 32 tokens, 4 programs per SM either way) was
#: not timed. The others keep their tiles, by the AOT compile: head dim 128 QH 32 takes
#: 168 (sm_80) / 204 (sm_90) registers at 64 tokens (152 / 162 at 32: 3 programs per SM
#: drop to 2 on sm_90); head dim 64 QH 64 196 on sm_80; fp8 K/V at head dim 128 spill
#: 16-32 B on sm_80 (split); head dim 64 QH 16 keeps its 56-register cap, under which 64
#: tokens spill 8-88 B (uncapped: 62-72 registers, no spills; not timed); head dim 256
#: already takes 128 registers at 16 tokens (QH 16, split).
DECODE_WIDE: frozenset[tuple[int, int, bool]] = frozenset({(128, 16, False), (64, 32, False)})


#: Register cap (per thread) of the 16-bit head-dim-64 decode with 16 query-head rows:
#: vLLM's Triton decode needs 56 at this shape, and uncapped ptxas gives kvbench's 64 on
#: sm_80 (single and split) and 68 on sm_90 (split). At 56 the single-partition variant
#: (32 tokens per step) and the split variant at 16 tokens per step compile without spills
#: on sm_80 and sm_90, fp16 and bf16, full and sliding-window (`kvbench kernels`).
DECODE_D64_MAXNREG = 56


def _decode_capped(dtype: torch.dtype, d_pad: int, qh: int, kv_fp8: dict[str, int]) -> bool:
    """Whether the decode variant takes `DECODE_D64_MAXNREG`: 16-bit queries and K/V
    (fp8 K/V dequantizes in registers and is not capped), head dim 64, QH 16."""
    return dtype != torch.float32 and not kv_fp8 and d_pad == 64 and qh == 16


def _windowed(
    constexprs: dict[str, object], windowed: bool, chunked: bool = False
) -> dict[str, object]:
    """The constexprs of the sliding-window variant: WINDOWED is listed only when True, so
    the full-attention variants keep the keys (and baselines) they always had; CHUNKED
    (chunked local attention, `window` read as the chunk) likewise, on top of WINDOWED."""
    if chunked:
        return {**constexprs, "WINDOWED": True, "CHUNKED": True}
    return {**constexprs, "WINDOWED": True} if windowed else constexprs


def fp8_constexprs(kv_dtype: torch.dtype | None) -> dict[str, int]:
    """The constexprs that select fp8 K/V in the kernels: mantissa bits and exponent bias
    of the format (`workloads.fp8`), or nothing for 16/32-bit K/V."""
    if kv_dtype is None or not fp8.is_fp8(kv_dtype):
        return {}
    fmt = fp8.fp8_format(kv_dtype)
    return {"FP8_MAN": fmt.mantissa_bits, "FP8_BIAS": 1 - fmt.min_exponent}


def quantize_config(dtype: torch.dtype, kv_dtype: torch.dtype) -> KernelConfig:
    """fp8 write kernel: `dtype` rows quantized to the fp8 format `kv_dtype`."""
    fmt = fp8.fp8_format(kv_dtype)
    return KernelConfig(
        "quantize_rows",
        dtype,
        {
            "BLOCK": COPY_BLOCK,
            "MAN": fmt.mantissa_bits,
            "BIAS": 1 - fmt.min_exponent,
            "MAX": fmt.max,
        },
    )


def decode_config(
    dtype: torch.dtype,
    head_dim: int,
    group: int,
    single: bool,
    kv_dtype: torch.dtype | None = None,
    *,
    windowed: bool = False,
    chunked: bool = False,
) -> KernelConfig:
    """Stage-1 split-KV decode kernel (`kv_dtype` fp8: K/V bytes dequantized in
    registers, same tiles as the query dtype's; ConfigError for a float32 query). KV tile
    sizes are chosen so that no variant spills; for 16-bit types the common GQA case (QH
    16) at head dim 128 takes the 64-token tile measured fastest on a GPU
    (`DECODE_WIDE_TILE_N`, 1.44-2.0x the 16-token tile on an H200), which costs 128
    registers and 38,912 B shared where vLLM's Triton decode takes 72 and 21,504 B
    (`kvbench kernels --peers`); so does head dim 64 with QH 32 (`DECODE_WIDE`).
    `windowed`: the sliding-window variant (same tiles); `chunked`: the chunked-local one."""
    d_pad = head_dim_pad(head_dim)
    kv_fp8 = fp8_constexprs(kv_dtype)
    _check_fp8_query(dtype, kv_fp8, "decode")
    qh = decode_qh(group, d_pad, dtype, kv_fp8=bool(kv_fp8))
    # float32: a [TILE_N, D_PAD] tile of 4096 elements. 16-bit: the measured wide tile
    # where it fits (`DECODE_WIDE`); elsewhere 16 tokens where QH is 16 and head dims
    # reach 128, 32 otherwise (QH 32 at TILE_N 16 spills at head dim 128).
    small = 16 if qh == 16 and d_pad >= 128 else 32
    capped = _decode_capped(dtype, d_pad, qh, kv_fp8)
    if capped and not single:
        small = 16  # at 56 registers the 32-token split tile spills 12-20 B; 16 fits
    if (d_pad, qh, bool(kv_fp8)) in DECODE_WIDE:
        small = DECODE_WIDE_TILE_N
    tile_n = 4096 // d_pad if dtype == torch.float32 else small
    return KernelConfig(
        "paged_decode",
        dtype,
        _windowed(
            {
                "QH": qh,
                "D_PAD": d_pad,
                "TILE_N": tile_n,
                "SINGLE": single,
                "DOT_PRECISION": _dot_precision(dtype),
                "DOT_F32": False,
                **kv_fp8,
            },
            windowed,
            chunked,
        ),
        # float32 keeps Triton's 3: at 2 its QH-16 split variant spills at head dim 128
        num_stages=DEFAULT_STAGES if dtype == torch.float32 else DECODE_STAGES,
        maxnreg=DECODE_D64_MAXNREG if capped else None,
    )


def reduce_config(
    dtype: torch.dtype, head_dim: int, *, windowed: bool = False, chunked: bool = False
) -> KernelConfig:
    """Stage-2 log-sum-exp merge of decode partitions (`windowed`: of the sliding-window
    variant's partitions; `chunked`: the chunked-local one's)."""
    d_pad = head_dim_pad(head_dim)
    return KernelConfig(
        "paged_decode_reduce",
        dtype,
        _windowed(
            {"D_PAD": d_pad, "P_CHUNK": REDUCE_CHUNK if d_pad <= 128 else REDUCE_CHUNK // 2},
            windowed,
            chunked,
        ),
    )


#: Query rows per prefill program by the rows a sequence's new tokens make (longest new run
#: x GQA group): up to 64 rows (short extends, decode-sized chunks) take 16-row tiles, which
#: spread a short run over more programs; up to 256 take 32; longer prefills take 64, which
#: read each K/V tile once for four times the rows. Capped per dtype and head dim below.
PREFILL_TIERS: tuple[tuple[int, int], ...] = ((64, 16), (256, 32))
PREFILL_BLOCK_M: tuple[int, ...] = (16, 32, 64)
#: Software-pipelining stages of the prefill loop: two K/V tiles in flight, as in vLLM's
#: unified 2D kernel's shared-memory budget (a third costs a tile of K and V more).
PREFILL_STAGES = 2
#: Warps of the 64-row prefill tile at head dim 128 (16-bit; fp8 K/V stop at 32 rows
#: there). Measured on a GPU (H200, Triton 3.6, 2026-11-28; fp16, 32 query / 8 KV heads,
#: block 16, CUDA graphs; docs/gpu-tiles.md): with 32 keys per step and 2 stages, 4 warps
#: ran 1.24x (2 x 128 new tokens over 2048), 1.16x (2 x 128 over 4096) and 1.57x
#: (4 x 512 over 4096) faster than 8 (84-154 TFLOP/s), same outputs. Faster variants
#: measured there spill on sm_80 (Triton 3.9, `kvbench kernels`): 64 keys per step with
#: 4 warps (1.57-1.76x) 140 B, 128 rows with 64 keys and 8 warps (1.28-1.71x) 56 B, 128
#: rows with 32 keys and 4 warps (1.90x at 4 x 512, 0.93x at 2 x 128) 428 B, so they are
#: not chosen. Static cost at 4 warps: 236 registers on sm_80, 166 on sm_90 (8 warps:
#: 154 / 102), 36,864 / 49,152 B shared, no spills; 2 programs of 4 warps per SM on
#: sm_80 (8 warps per SM, as the 8-warp tile's one program).
PREFILL_M64_D128_WARPS = 4


def prefill_block_m(rows: int) -> int:
    """BLOCK_M for a prefill whose longest sequence brings `rows` query rows (new tokens x
    GQA group), before the dtype / head-dim cap of `prefill_config`."""
    for limit, block_m in PREFILL_TIERS:
        if rows <= limit:
            return block_m
    return PREFILL_BLOCK_M[-1]


def _prefill_cap(dtype: torch.dtype, d_pad: int, kv_fp8: bool = False) -> int:
    """The largest BLOCK_M that compiles without spills (float32 tiles are twice the size
    and its ieee tl.dot runs on FMA units; head dim 256 doubles every row). fp8 K/V
    (`kv_fp8`) take half the rows from head dim 128 on: dequantizing a 64-row tile's K/V
    at head dim 128 holds 250-255 registers on sm_80 with 8 warps (one block per SM),
    32 rows 188 with 4; 32 rows at head dim 256 hold 228-242, 16 rows 162."""
    if dtype == torch.float32:
        return 32 if d_pad <= 64 else 16
    if kv_fp8 and d_pad > 64:
        return 32 if d_pad <= 128 else 16
    return 64 if d_pad <= 128 else 32


def _check_fp8_query(dtype: torch.dtype, kv_fp8: dict[str, int], kernel: str) -> None:
    """fp8 K/V are dequantized to the query dtype, which must be 16-bit."""
    if kv_fp8 and dtype not in FP8_QUERY_DTYPES:
        raise ConfigError(
            f"the Triton {kernel} reads fp8 K/V with {FP8_QUERY_DTYPES} queries, not {dtype}"
        )


def prefill_config(
    dtype: torch.dtype,
    head_dim: int,
    rows: int | None = None,
    kv_dtype: torch.dtype | None = None,
    *,
    windowed: bool = False,
    chunked: bool = False,
) -> KernelConfig:
    """Paged prefill/extend kernel; rows are (query token, query head) pairs.

    `rows` (the longest sequence's new tokens x GQA group) picks the tile
    (`prefill_block_m`); None picks the longest-prefill tile. 16 rows with 4 warps, 32
    with 4, 64 with 8, except 64 rows at head dim 128 with 4 (`PREFILL_M64_D128_WARPS`,
    measured on a GPU); 32 keys per step, 16 at head dim 256 and for 64 rows at head dim
    64. The tiles other than the measured one cost at most vLLM's unified 2D kernel
    compiled at the same BLOCK_M and warps (fp16 / bf16, sm_80 and sm_90;
    `kvbench kernels --peers`); none spills.

    `kv_dtype` fp8: K/V bytes dequantized in registers (16-bit queries only, ConfigError
    otherwise), with the caps of `_prefill_cap`; `windowed`: the sliding-window variant,
    same tiles as its full twin; `chunked`: the chunked-local variant, likewise."""
    d_pad = head_dim_pad(head_dim)
    kv_fp8 = fp8_constexprs(kv_dtype)
    _check_fp8_query(dtype, kv_fp8, "prefill")
    cap = _prefill_cap(dtype, d_pad, bool(kv_fp8))
    block_m = min(cap, PREFILL_BLOCK_M[-1] if rows is None else prefill_block_m(rows))
    # 16 keys per step at head dim 256, and at head dim 64 with 64 rows: 32 there costs
    # 138 registers on sm_80 against vLLM's 127 at the same tile (16: 97; sm_90 64 vs 74)
    tile_n = 16 if d_pad > 128 or (d_pad <= 64 and block_m >= 64) else 32
    warps = 8 if block_m >= 64 or (d_pad > 128 and block_m >= 32) else 4
    if block_m == 64 and d_pad == 128:
        warps = PREFILL_M64_D128_WARPS
    return KernelConfig(
        "paged_prefill",
        dtype,
        _windowed(
            {
                "BLOCK_M": block_m,
                "D_PAD": d_pad,
                "TILE_N": tile_n,
                "DOT_PRECISION": _dot_precision(dtype),
                "DOT_F32": False,
                **kv_fp8,
            },
            windowed,
            chunked,
        ),
        num_warps=warps,
        num_stages=PREFILL_STAGES,
    )


def prefill_configs(
    dtype: torch.dtype,
    head_dim: int,
    kv_dtype: torch.dtype | None = None,
    *,
    windowed: bool = False,
    chunked: bool = False,
) -> list[KernelConfig]:
    """Every prefill tile the dispatch can pick for `dtype` and `head_dim` (fp8
    `kv_dtype`, `windowed`, `chunked` as for `prefill_config`), smallest first."""
    out: list[KernelConfig] = []
    for rows in (*(limit for limit, _ in PREFILL_TIERS), None):
        cfg = prefill_config(dtype, head_dim, rows, kv_dtype, windowed=windowed, chunked=chunked)
        if cfg not in out:
            out.append(cfg)
    return out


#: The attention variants every decode, reduce and prefill configuration compiles in:
#: (windowed, chunked) for full attention, a sliding window and chunked local attention.
VARIANTS: tuple[tuple[bool, bool], ...] = ((False, False), (True, False), (True, True))


def all_configs() -> list[KernelConfig]:
    """Every configuration the dispatch can choose, each once."""
    seen: dict[tuple, KernelConfig] = {}

    def add(cfg: KernelConfig) -> None:
        key = (cfg.kernel, cfg.dtype, tuple(sorted(cfg.constexprs.items())), cfg.num_warps,
               cfg.maxnreg)  # fmt: skip
        seen.setdefault(key, cfg)

    for size in sorted(COPY_AS):
        for identity in (True, False):
            add(copy_config(size, identity))
    for dtype in DTYPES:
        for d_pad in HEAD_DIM_PADS:
            for group in (1, *DECODE_QH, 2 * DECODE_QH[-1]):
                for single in (True, False):
                    for windowed, chunked in VARIANTS:
                        add(decode_config(dtype, d_pad, group, single, windowed=windowed,
                                          chunked=chunked))  # fmt: skip
            for windowed, chunked in VARIANTS:
                add(reduce_config(dtype, d_pad, windowed=windowed, chunked=chunked))
                for cfg in prefill_configs(dtype, d_pad, windowed=windowed, chunked=chunked):
                    add(cfg)
    for fmt in fp8.FORMATS.values():
        for dtype in DTYPES:
            add(quantize_config(dtype, fmt.dtype))
        for dtype in FP8_QUERY_DTYPES:
            for d_pad in HEAD_DIM_PADS:
                for group in (1, *DECODE_QH, 2 * DECODE_QH[-1]):
                    for single in (True, False):
                        for windowed, chunked in VARIANTS:
                            add(decode_config(dtype, d_pad, group, single, fmt.dtype,
                                              windowed=windowed, chunked=chunked))  # fmt: skip
                for windowed, chunked in VARIANTS:
                    for cfg in prefill_configs(
                        dtype, d_pad, fmt.dtype, windowed=windowed, chunked=chunked
                    ):
                        add(cfg)
    return list(seen.values())
