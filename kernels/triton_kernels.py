"""The Triton kernel bodies, as plain functions wrapped twice: compiled and interpreted.

Each body is wrapped once as a `JITFunction` (compiled for CUDA and, ahead of time, for
sm_80/sm_90 by `kernels.aot`) and once as an `InterpretedFunction` (runs on CPU tensors),
so whether the interpreter is used is decided per call, not by the environment at import
time. Bodies call no jitted helpers of their own except the two fp8 bit conversions,
which `triton_ops` runs interpreted for CPU tensors as it does triton.language's helpers.

GPU rules kept here although the interpreter does not enforce them: every `tl.arange` size
is a power of two, every `tl.dot` operand is at least 16 on each side, every load and store
that can pass a boundary is masked, and offsets into the K/V pools and the other large
tensors are computed in int64. `DOT_F32` upcasts tl.dot operands to float32 (after the
same rounding of the probabilities to the input dtype): the interpreter's tl.dot mishandles
bfloat16, so the launchers set it for bfloat16 on CPU only; compiled variants never do. Scores are kept in the log2 domain (the scale passed in is
softmax_scale * log2(e)) and everything accumulates in float32.
"""

from __future__ import annotations

import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

#: Initial running maximum: finite so that fully masked rows give exp2(-inf) = 0, not NaN.
NEG_BIG = tl.constexpr(-1.0e30)


def _copy_rows(
    src_ptr,
    dst_ptr,
    src_rows_ptr,
    dst_rows_ptr,
    row_len,
    src_row_stride,
    dst_row_stride,
    BLOCK: tl.constexpr,
    SRC_IDENTITY: tl.constexpr,
):
    """Copy row `src_rows[i]` (or row i when SRC_IDENTITY) of `src` onto row `dst_rows[i]`
    of `dst`; a negative destination row is skipped. Grid: (rows, cdiv(row_len, BLOCK)).

    Serves write_kv (token rows into cache slots), copy_blocks and swap_blocks (block rows).
    """
    i = tl.program_id(0)
    chunk = tl.program_id(1)
    dst_row = tl.load(dst_rows_ptr + i).to(tl.int64)
    if dst_row >= 0:
        if SRC_IDENTITY:  # noqa: SIM108 (a constexpr branch, not a runtime select)
            src_row = i.to(tl.int64)
        else:
            src_row = tl.load(src_rows_ptr + i).to(tl.int64)
        cols = chunk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < row_len
        x = tl.load(src_ptr + src_row * src_row_stride + cols, mask=mask)
        tl.store(dst_ptr + dst_row * dst_row_stride + cols, x, mask=mask)


def _fp8_bits_to_f32(bits, MAN: tl.constexpr, HAS_INF: tl.constexpr):
    """fp8 bytes (any 8-bit integer tensor) -> float32 holding each value exactly, times
    2^(BIAS - 15) (1 for e5m2, 2^-8 for e4m3fn: the kernels fold the inverse into their
    scales, an exact product). The byte's sign, exponent and mantissa are placed in
    float16's fields and the hardware float16 -> float32 conversion does the rest: e5m2
    has float16's exponent width and bias (its byte is a float16's top byte, inf and NaN
    included); e4m3fn's 4-bit exponent sits in the low bits of float16's, whose bias is 8
    more, so every e4m3fn value, subnormals included, lands on float16 exactly at 2^-8 of
    itself. e4m3fn has no inf and one NaN pattern per sign (exponent and mantissa all
    ones), which would land on a finite float16 and is replaced by float16's NaN. A few
    integer operations and one conversion per element, the same code on sm_80 (no fp8
    instructions), sm_90 and the interpreter (whose fp8 conversions are wrong for NaN)."""
    b = bits.to(tl.uint8, bitcast=True).to(tl.uint16)
    if HAS_INF:
        h = b << 8
    else:
        h = ((b & 0x80) << 8) | ((b & 0x7F) << (10 - MAN))
        h = tl.where((b & 0x7F) == 0x7F, 0x7E00, h)  # float16 quiet NaN
    return h.to(tl.float16, bitcast=True).to(tl.float32)


def _f32_to_fp8_bits(x, MAN: tl.constexpr, BIAS: tl.constexpr, MAX: tl.constexpr):
    """float32 `x` (already multiplied by 1/scale) -> fp8 bytes (uint8): saturate to
    +-MAX, round to nearest even on the format's grid in float32 arithmetic ((a + c) - c
    with c = 1.5 * 2^(23 + ulp exponent)), then assemble the bits; a non-finite `x` gives
    NaN (0x7F). Bit-identical to `workloads.fp8.quantize` on every backend."""
    finite = tl.abs(x) < float("inf")
    y = tl.minimum(tl.maximum(x, -MAX), MAX)
    a = tl.where(finite, tl.abs(y), 0.0)
    e = ((a.to(tl.uint32, bitcast=True) >> 23).to(tl.int32) - 127).to(tl.int32)
    ulp_e = tl.maximum(e, 1 - BIAS) - MAN
    magic_bits = ((ulp_e + (23 + 127)) << 23) | 0x400000
    shifted = a + magic_bits.to(tl.float32, bitcast=True)
    r = shifted - magic_bits.to(tl.float32, bitcast=True)
    rb = r.to(tl.uint32, bitcast=True)
    re = (rb >> 23).to(tl.int32) - 127
    normal = ((re + BIAS) << MAN) | ((rb >> (23 - MAN)) & ((1 << MAN) - 1)).to(tl.int32)
    # subnormal: r in steps of 2^(emin - MAN), the ulps `shifted` holds above the magic
    sub = shifted.to(tl.int32, bitcast=True) - magic_bits
    bits = tl.where(re >= 1 - BIAS, normal, sub)
    sign = ((x.to(tl.uint32, bitcast=True) >> 31) << 7).to(tl.int32)
    bits = tl.where(finite, bits | sign, 0x7F)
    return bits.to(tl.uint8)


def _quantize_rows(
    src_ptr,
    dst_ptr,
    dst_rows_ptr,
    inv_scale_ptr,
    row_len,
    head_dim,
    src_row_stride,
    dst_row_stride,
    BLOCK: tl.constexpr,
    MAN: tl.constexpr,
    BIAS: tl.constexpr,
    MAX: tl.constexpr,
):
    """fp8 write: token row i of `src` (float, [num_kv_heads * head_dim]) times its
    head's 1/scale, quantized (`_f32_to_fp8_bits`), into byte row `dst_rows[i]` of `dst`
    (the cache viewed as uint8); a negative row is skipped. Grid: (rows, cdiv(row_len,
    BLOCK))."""
    i = tl.program_id(0)
    chunk = tl.program_id(1)
    dst_row = tl.load(dst_rows_ptr + i).to(tl.int64)
    if dst_row >= 0:
        cols = chunk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < row_len
        inv = tl.load(inv_scale_ptr + cols // head_dim, mask=mask, other=1.0)
        x = tl.load(src_ptr + i.to(tl.int64) * src_row_stride + cols, mask=mask, other=0.0)
        q = _f32_to_fp8_bits(x.to(tl.float32) * inv, MAN, BIAS, MAX)
        tl.store(dst_ptr + dst_row * dst_row_stride + cols, q, mask=mask)


def _paged_decode(
    q_ptr,
    k_ptr,
    v_ptr,
    tables_ptr,
    lens_ptr,
    out_ptr,
    part_out_ptr,
    part_max_ptr,
    part_sum_ptr,
    scale_log2,
    num_q_heads,
    group,
    n_chunks,
    head_dim,
    block_size,
    partition_size,
    max_parts,
    stride_qb,
    stride_qh,
    stride_table,
    stride_ob,
    stride_oh,
    stride_kblock,
    stride_ktok,
    stride_khead,
    k_scale_ptr,
    v_scale_ptr,
    window,
    QH: tl.constexpr,
    D_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    SINGLE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
    FP8_MAN: tl.constexpr = 0,
    FP8_BIAS: tl.constexpr = 0,
    WINDOWED: tl.constexpr = False,
    CHUNKED: tl.constexpr = False,
):
    """Stage 1 of split-KV paged decode. Grid: (batch, num_kv_heads * n_chunks, parts).

    One program takes one sequence, one KV head, up to QH query heads of that head's group
    (all of them when group <= QH) and one partition of `partition_size` KV tokens, so each
    K/V tile is read once for the whole group. With SINGLE (one partition covers every
    sequence) it writes the output; otherwise the partition's own normalized output, its
    max score and its sum of exponentials for `_paged_decode_reduce`.

    fp8 K/V (FP8_MAN > 0: 3 for e4m3fn, 2 for e5m2): each tile is loaded as bytes and
    converted in registers to the query dtype (`_fp8_bits_to_f32`; every fp8 value, at
    2^(bias - 15) of itself, is a float16 and a bfloat16 value, so nothing rounds), then
    used as a 16/32-bit tile; the scales are applied in float32, `k_scale[kv_head]` to the
    scores and `v_scale[kv_head]` to the output. Rounding the scaled K/V to float16 (the
    first version) put the decode 3.0-3.3e-3 from float64 attention over the dequantized
    K/V, over the 2e-3 bound. `k_scale_ptr` / `v_scale_ptr` are unused otherwise.

    WINDOWED (sliding window of `window` tokens): the sequence is read from the first
    block its window touches (table and positions shifted by the blocks skipped, which
    are never loaded; partitions cover the shifted length), and the token loop starts at
    the window's first token, so that block's earlier tokens are not loaded either. A
    partition left with no visible token stores l = 0 and a zero output, which the
    reduction weighs by 0. Both together: only the window's tiles are loaded, then
    dequantized. With CHUNKED too, `window` is the attention chunk C (Llama 4's chunked
    local attention): the query at L - 1 reads from floor((L - 1) / C) x C, the same way.
    """
    seq = tl.program_id(0)
    kv_head = tl.program_id(1) // n_chunks
    chunk = tl.program_id(1) % n_chunks
    part = tl.program_id(2)
    seq_len = tl.load(lens_ptr + seq)
    if WINDOWED:
        if CHUNKED:  # the newest query's chunk start, in the shifted coordinates below
            skipped = ((seq_len - 1) - (seq_len - 1) % window) // block_size
            lo = (seq_len - 1) - (seq_len - 1) % window - skipped * block_size
        else:
            skipped = tl.maximum(seq_len - window, 0) // block_size
        seq_len = seq_len - skipped * block_size
    start = part * partition_size
    if start < seq_len:
        end = tl.minimum(start + partition_size, seq_len)
        rows = chunk * QH + tl.arange(0, QH)
        row_ok = rows < group
        q_head = (kv_head * group + rows).to(tl.int64)
        d = tl.arange(0, D_PAD)
        d_ok = d < head_dim
        q = tl.load(
            q_ptr + seq.to(tl.int64) * stride_qb + q_head[:, None] * stride_qh + d[None, :],
            mask=row_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        m_i = tl.full([QH], NEG_BIG, dtype=tl.float32)
        l_i = tl.zeros([QH], dtype=tl.float32)
        acc = tl.zeros([QH, D_PAD], dtype=tl.float32)
        table_row = tables_ptr + seq.to(tl.int64) * stride_table
        if WINDOWED:
            table_row = table_row + skipped
        head_off = kv_head.to(tl.int64) * stride_khead
        qk_scale = scale_log2
        if FP8_MAN > 0:  # times 2^(15 - bias), which `_fp8_bits_to_f32` leaves out (exact)
            k_scale = tl.load(k_scale_ptr + kv_head) * (1 << (15 - FP8_BIAS))
            v_scale = tl.load(v_scale_ptr + kv_head) * (1 << (15 - FP8_BIAS))
            qk_scale = scale_log2 * k_scale
        begin = start
        if WINDOWED:  # the first block's tokens before the window: the loop starts past them
            begin = tl.maximum(start, lo) if CHUNKED else tl.maximum(start, seq_len - window)
        for t0 in range(begin, end, TILE_N):
            tok = t0 + tl.arange(0, TILE_N)
            tok_ok = tok < end
            block = tl.load(table_row + tok // block_size, mask=tok_ok, other=0).to(tl.int64)
            kv_off = block * stride_kblock + (tok % block_size).to(tl.int64) * stride_ktok
            kv_off = kv_off + head_off
            kv_mask = tok_ok[:, None] & d_ok[None, :]
            k = tl.load(k_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0)
            if FP8_MAN > 0:  # exact in float16 and bfloat16: the scale goes on the scores
                k = _fp8_bits_to_f32(k, FP8_MAN, FP8_MAN == 2).to(q.dtype)
            if DOT_F32:
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
            s = s * qk_scale
            s = tl.where(tok_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0)
            if FP8_MAN > 0:  # exact, as K: the scale goes on the output
                v = _fp8_bits_to_f32(v, FP8_MAN, FP8_MAN == 2).to(q.dtype)
            if DOT_F32:
                pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        if FP8_MAN > 0:
            acc = acc * v_scale
        out_mask = row_ok[:, None] & d_ok[None, :]
        denom = l_i
        if WINDOWED:
            denom = tl.where(l_i > 0, l_i, 1.0)
        if SINGLE:
            o = acc / denom[:, None]
            o_off = seq.to(tl.int64) * stride_ob + q_head[:, None] * stride_oh + d[None, :]
            tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=out_mask)
        else:
            idx = (seq.to(tl.int64) * num_q_heads + q_head) * max_parts + part
            tl.store(part_max_ptr + idx, m_i, mask=row_ok)
            tl.store(part_sum_ptr + idx, l_i, mask=row_ok)
            o = acc / denom[:, None]
            tl.store(part_out_ptr + idx[:, None] * head_dim + d[None, :], o, mask=out_mask)


def _paged_decode_reduce(
    out_ptr,
    part_out_ptr,
    part_max_ptr,
    part_sum_ptr,
    lens_ptr,
    num_q_heads,
    head_dim,
    partition_size,
    max_parts,
    stride_ob,
    stride_oh,
    window,
    block_size,
    D_PAD: tl.constexpr,
    P_CHUNK: tl.constexpr,
    WINDOWED: tl.constexpr = False,
    CHUNKED: tl.constexpr = False,
):
    """Stage 2 of split-KV decode: merge a sequence's partitions by log-sum-exp.
    Grid: (batch, num_q_heads). out = sum_p w_p o_p / sum_p w_p, w_p = l_p 2^(m_p - M).
    WINDOWED: the partitions cover the length from the window's first block, as stage 1
    (CHUNKED: from the chunk's first block)."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(lens_ptr + seq)
    if WINDOWED:
        if CHUNKED:
            seq_len = seq_len - ((seq_len - 1) - (seq_len - 1) % window) // block_size * block_size
        else:
            seq_len = seq_len - tl.maximum(seq_len - window, 0) // block_size * block_size
    n_parts = (seq_len + partition_size - 1) // partition_size
    base = (seq.to(tl.int64) * num_q_heads + head) * max_parts
    p = tl.arange(0, P_CHUNK)
    d = tl.arange(0, D_PAD)
    d_ok = d < head_dim
    big = tl.full([P_CHUNK], NEG_BIG, dtype=tl.float32)
    m_all = tl.max(big, 0)
    for p0 in range(0, n_parts, P_CHUNK):
        ok = p0 + p < n_parts
        m_p = tl.load(part_max_ptr + base + p0 + p, mask=ok, other=NEG_BIG)
        m_all = tl.maximum(m_all, tl.max(m_p, 0))
    total = tl.sum(tl.zeros([P_CHUNK], dtype=tl.float32), 0)
    acc = tl.zeros([D_PAD], dtype=tl.float32)
    for p0 in range(0, n_parts, P_CHUNK):
        ok = p0 + p < n_parts
        m_p = tl.load(part_max_ptr + base + p0 + p, mask=ok, other=NEG_BIG)
        l_p = tl.load(part_sum_ptr + base + p0 + p, mask=ok, other=0.0)
        w = tl.where(ok, l_p * tl.exp2(m_p - m_all), 0.0)
        total += tl.sum(w, 0)
        o = tl.load(
            part_out_ptr + (base + p0 + p)[:, None] * head_dim + d[None, :],
            mask=ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        acc += tl.sum(w[:, None] * o, 0)
    res = acc / total
    o_off = seq.to(tl.int64) * stride_ob + head.to(tl.int64) * stride_oh + d
    tl.store(out_ptr + o_off, res.to(out_ptr.dtype.element_ty), mask=d_ok)


def _paged_prefill(
    q_ptr,
    k_ptr,
    v_ptr,
    tables_ptr,
    cu_q_ptr,
    lens_ptr,
    out_ptr,
    scale_log2,
    group,
    heads_per_prog,
    tokens_per_prog,
    n_chunks,
    head_dim,
    block_size,
    stride_qt,
    stride_qh,
    stride_table,
    stride_ot,
    stride_oh,
    stride_kblock,
    stride_ktok,
    stride_khead,
    k_scale_ptr,
    v_scale_ptr,
    window,
    BLOCK_M: tl.constexpr,
    D_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
    FP8_MAN: tl.constexpr = 0,
    FP8_BIAS: tl.constexpr = 0,
    WINDOWED: tl.constexpr = False,
    CHUNKED: tl.constexpr = False,
):
    """Paged prefill/extend attention. Grid: (batch, num_kv_heads * n_chunks, q_tiles).

    A program's BLOCK_M rows are `tokens_per_prog` query tokens x `heads_per_prog` query
    heads of one KV head's group (row r: token r // heads_per_prog, head r %
    heads_per_prog), so K/V tiles are shared by the group. Query token i of a sequence
    with n new tokens and L total sits at position L - n + i and sees keys 0 .. L - n + i.

    fp8 K/V (FP8_MAN > 0): each tile is converted in registers exactly as in
    `_paged_decode` (to the query dtype without rounding; the scales applied in float32 to
    the scores and the output).

    WINDOWED (sliding window of `window` tokens): the query at position p sees keys
    p - window + 1 .. p. The key loop starts at the first key the program's earliest
    query sees, so blocks wholly before it (their table entries included) are never
    loaded; keys inside the loop but before a later row's window are masked. With
    CHUNKED too, `window` is the attention chunk C: the query at p sees keys
    floor(p / C) x C .. p, started and masked the same way.
    """
    seq = tl.program_id(0)
    kv_head = tl.program_id(1) // n_chunks
    chunk = tl.program_id(1) % n_chunks
    q_tile = tl.program_id(2)
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    seq_len = tl.load(lens_ptr + seq)
    tok0 = q_tile * tokens_per_prog
    if tok0 < q_len:
        r = tl.arange(0, BLOCK_M)
        r_tok = r // heads_per_prog
        r_head = chunk * heads_per_prog + r % heads_per_prog
        tok = tok0 + r_tok
        row_ok = (r_tok < tokens_per_prog) & (tok < q_len) & (r_head < group)
        q_head = (kv_head * group + r_head).to(tl.int64)
        q_row = (q_start + tok).to(tl.int64)
        d = tl.arange(0, D_PAD)
        d_ok = d < head_dim
        io_mask = row_ok[:, None] & d_ok[None, :]
        q = tl.load(
            q_ptr + q_row[:, None] * stride_qt + q_head[:, None] * stride_qh + d[None, :],
            mask=io_mask,
            other=0.0,
        )
        context = seq_len - q_len
        q_pos = context + tok
        kv_end = context + tl.minimum(tok0 + tokens_per_prog, q_len)
        m_i = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
        table_row = tables_ptr + seq.to(tl.int64) * stride_table
        head_off = kv_head.to(tl.int64) * stride_khead
        qk_scale = scale_log2
        if FP8_MAN > 0:  # times 2^(15 - bias), which `_fp8_bits_to_f32` leaves out (exact)
            k_scale = tl.load(k_scale_ptr + kv_head) * (1 << (15 - FP8_BIAS))
            v_scale = tl.load(v_scale_ptr + kv_head) * (1 << (15 - FP8_BIAS))
            qk_scale = scale_log2 * k_scale
        kv_begin = 0
        if WINDOWED:  # the earliest query's first key: nothing before it is loaded
            if CHUNKED:
                kv_begin = (context + tok0) - (context + tok0) % window
            else:
                kv_begin = tl.maximum(context + tok0 - window + 1, 0)
        for t0 in range(kv_begin, kv_end, TILE_N):
            kt = t0 + tl.arange(0, TILE_N)
            k_ok = kt < kv_end
            block = tl.load(table_row + kt // block_size, mask=k_ok, other=0).to(tl.int64)
            kv_off = block * stride_kblock + (kt % block_size).to(tl.int64) * stride_ktok
            kv_off = kv_off + head_off
            kv_mask = k_ok[:, None] & d_ok[None, :]
            k = tl.load(k_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
            if FP8_MAN > 0:  # exact in float16 and bfloat16: the scale goes on the scores
                k = _fp8_bits_to_f32(k, FP8_MAN, FP8_MAN == 2).to(q.dtype)
            if DOT_F32:
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
            s = s * qk_scale
            visible = k_ok[None, :] & (kt[None, :] <= q_pos[:, None])
            if WINDOWED:
                if CHUNKED:
                    visible = visible & (kt[None, :] >= q_pos[:, None] - q_pos[:, None] % window)
                else:
                    visible = visible & (kt[None, :] > q_pos[:, None] - window)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
            if FP8_MAN > 0:  # exact, as K: the scale goes on the output
                v = _fp8_bits_to_f32(v, FP8_MAN, FP8_MAN == 2).to(q.dtype)
            if DOT_F32:
                pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        if FP8_MAN > 0:
            acc = acc * v_scale
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_off = q_row[:, None] * stride_ot + q_head[:, None] * stride_oh + d[None, :]
        tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=io_mask)


#: Kernel name -> compiled (JIT) version; `kernels.aot` compiles these.
_BODIES = (_copy_rows, _quantize_rows, _paged_decode, _paged_decode_reduce, _paged_prefill)
JIT: dict[str, JITFunction] = {fn.__name__.lstrip("_"): JITFunction(fn) for fn in _BODIES}
#: Kernel name -> interpreted version, used for CPU tensors.
INTERPRETED: dict[str, InterpretedFunction] = {
    fn.__name__.lstrip("_"): InterpretedFunction(fn) for fn in _BODIES
}
#: The jitted fp8 conversions the bodies call (a JITFunction is what Triton's code generator
#: resolves a call to; under the interpreter `triton_ops` runs them interpreted).
_fp8_bits_to_f32 = JITFunction(_fp8_bits_to_f32)  # type: ignore[assignment]
_f32_to_fp8_bits = JITFunction(_f32_to_fp8_bits)  # type: ignore[assignment]
