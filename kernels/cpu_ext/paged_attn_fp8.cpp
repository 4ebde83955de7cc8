// kvbench's CPU paged attention over fp8 K/V (float8_e4m3fn or float8_e5m2 pools), reading
// the blocks in place: decode and prefill/extend. A separate source from paged_attn.cpp
// (which holds the 16/32-bit kernels), built into the same library and registered as torch
// operators under `kvbench_fp8::`, so neither file's code changes the other's.
//
// Layouts as in paged_attn.cpp: k_cache, v_cache [num_blocks, block_size, num_kv_heads,
// head_dim] of bytes (the fp8 pools viewed as uint8), contiguous; block_tables int32
// [batch, max_blocks] (row stride free); seq_lens int32 [batch]; cu_seqlens_q int32
// [batch + 1]; k_scale, v_scale float32 [num_kv_heads]. Query head h reads KV head h / group.
//
// Semantics (workloads/fp8.py): a stored byte b of KV head h means float32(b) * scale[h].
// The kernels fold the scales out of the inner loops: a score is (q . k_bytes) *
// (softmax_scale * k_scale[h]) and the output (sum_t p_t v_bytes_t) / l * v_scale[h], all
// in float32 (the same value as dequantize-then-attend up to float32 rounding order; the
// conformance suite compares both with float64 attention over the dequantized K/V).
//
// The byte -> float32 conversions and the decode's core live in fp8_decode.h (free of
// torch, so a scratch harness can time them alone); see its comment. The 256-entry table
// of the first version stays as `Fp8Lut`, selected by the `_lut` operators so the two can
// be timed side by side.
//
// Only tokens below a sequence's length (decode) or at or below a query row's position
// (prefill) are read; with a sliding window (`window` > 0, HF / vLLM semantics: a query at
// position p sees keys p - window + 1 .. p) only from the first block the window touches
// (decode: the sequence's last `window` tokens; prefill: from the tile's first row's first
// key), and a block's tokens before the window are skipped, never multiplied by a zero
// probability (a NaN there, or a -1 table entry before the window, changes nothing). Inputs are validated in Python (kernels.ops, kernels.cpu_paged) before
// any call.
#include <torch/extension.h>

#include "fp8_decode.h"
#include "task_counter.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

// The prefill over fp8 K/V is paged_attn.cpp's prefill with an fp8 packing step (defined
// there, so the two prefills share their GEMMs, softmax and task split).
void kvb_paged_prefill_fp8(const torch::Tensor& query, const torch::Tensor& k_cache,
                           const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                           const torch::Tensor& cu_seqlens_q, const torch::Tensor& seq_lens,
                           const torch::Tensor& k_scale, const torch::Tensor& v_scale,
                           double scale, torch::Tensor& out, int64_t man, int64_t tile,
                           int64_t window);

namespace {

using namespace kvb_fp8;

template <typename T>
inline float to_f(T x) {
  return float(x);
}

// ---------------------------------------------------------------------------------------
// Decode: tasks over (sequence, range of KV heads); each runs kvb_fp8::decode_task (the
// block loop, the conversions and the register-blocked K and V passes; see fp8_decode.h).
// Tasks split a sequence's heads only where the batch leaves a thread without two tasks
// (as cpu_paged.task_split does for the 16-bit decode); the threads take them from a shared
// counter (for_each_task, task_counter.h), as the 16-bit decode does.
// One thread's scratch for decode tasks (query rows in float32, the output accumulator,
// running max and sum, a block's scores), sized on its first task.
struct DecodeScratch {
  std::vector<float> qf, acc, m, l, s;
  void size(size_t rows, size_t D) {
    qf.resize(rows * D);
    acc.resize(rows * D);
    m.resize(rows);
    l.resize(rows);
    s.resize(rows * MAX_BS);
  }
};

template <typename T, int MAN, bool LUT>
void decode_fp8_impl(const torch::Tensor& query, const torch::Tensor& k_cache,
                     const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                     const torch::Tensor& seq_lens, const torch::Tensor& k_scale,
                     const torch::Tensor& v_scale, double scale, torch::Tensor& out,
                     int64_t window) {
  const int64_t B = query.size(0), Hq = query.size(1);
  const int64_t bs = k_cache.size(1), Hkv = k_cache.size(2);
  const int G = int(Hq / Hkv), D = int(query.size(2));
  const DecodeGeo g{k_cache.data_ptr<uint8_t>(), v_cache.data_ptr<uint8_t>(), bs, Hkv, D, G,
                    float(scale), k_scale.data_ptr<float>()};
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int64_t ts = block_tables.stride(0);
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const float* vs = v_scale.data_ptr<float>();
  const T* q = query.data_ptr<T>();
  T* o = out.data_ptr<T>();
  const int64_t qs_b = query.stride(0), qs_h = query.stride(1);
  const int64_t os_b = out.stride(0), os_h = out.stride(1);
  const int64_t want = 2 * std::max<int64_t>(1, at::get_num_threads());
  const int64_t HT = B >= want ? Hkv : std::max<int64_t>(1, Hkv * B / want);
  const int64_t nh = (Hkv + HT - 1) / HT;
  const float vmul = out_mul<MAN, LUT>();
  const size_t rows = size_t(HT) * G;
  for_each_task<DecodeScratch>(B * nh, [&](int64_t task, DecodeScratch& w) {
    if (w.qf.empty()) w.size(rows, size_t(D));
    float *qf = w.qf.data(), *acc = w.acc.data(), *m = w.m.data(), *l = w.l.data();
    const int64_t b = task / nh, h0 = task % nh * HT, h1 = std::min(Hkv, h0 + HT);
    const int64_t len = lens[b];
    // window > 0: positions lo .. len - 1 only; blocks wholly before lo are never read
    // (their table entries may be -1) and the first block's tokens before lo are skipped
    const int64_t lo = window > 0 ? std::max<int64_t>(0, len - window) : 0;
    for (int64_t h = h0; h < h1; ++h)
      for (int r = 0; r < G; ++r) {
        const T* qr = q + b * qs_b + (h * G + r) * qs_h;
        float* dst = qf + (size_t(h - h0) * G + r) * D;
        for (int d = 0; d < D; ++d) dst[d] = to_f(qr[d]);
      }
    decode_task<MAN, LUT>(g, tables + b * ts, len, lo, int(h0), int(h1), qf, acc, m, l,
                          w.s.data());
    for (int64_t h = h0; h < h1; ++h)
      for (int r = 0; r < G; ++r) {
        const size_t row = size_t(h - h0) * G + r;
        const float f = vs[h] * vmul / l[row];
        T* orow = o + b * os_b + (h * G + r) * os_h;
        for (int d = 0; d < D; ++d) orow[d] = T(acc[row * D + d] * f);
      }
  });
}

// ---------------------------------------------------------------------------------------
// Operators

void check_format(int64_t man, int64_t bias) {
  TORCH_CHECK(man == 2 || man == 3, "fp8 mantissa bits must be 2 or 3, got ", man);
  TORCH_CHECK(bias == (man == 3 ? 7 : 15), "fp8 exponent bias ", bias, " for ", man, " bits");
}

// Calls f(T{}, Conv{}) for the query dtype and the fp8 format (Conv::kMan: its mantissa
// bits), the table conversion where LUT.
template <bool LUT, typename F>
void dispatch(const torch::Tensor& query, int64_t man, F&& f) {
  auto by_conv = [&](auto t) {
    if (man == 3) {
      if constexpr (LUT) f(t, Fp8Lut<3>{}); else f(t, Fp8Vec<3>{});
    } else {
      if constexpr (LUT) f(t, Fp8Lut<2>{}); else f(t, Fp8Fast<2>{});
    }
  };
  switch (query.scalar_type()) {
    case at::kFloat: by_conv(float{}); break;
    case at::kHalf: by_conv(c10::Half{}); break;
    case at::kBFloat16: by_conv(c10::BFloat16{}); break;
    default: TORCH_CHECK(false, "unsupported query dtype ", query.scalar_type());
  }
}

template <bool LUT>
void decode_op(torch::Tensor query, torch::Tensor k_cache, torch::Tensor v_cache,
               torch::Tensor block_tables, torch::Tensor seq_lens, torch::Tensor k_scale,
               torch::Tensor v_scale, double scale, torch::Tensor out, int64_t man,
               int64_t bias, int64_t window) {
  check_format(man, bias);
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: full attention), got ", window);
  dispatch<LUT>(query, man, [&](auto t, auto conv) {
    decode_fp8_impl<decltype(t), decltype(conv)::kMan, LUT>(query, k_cache, v_cache,
                                                           block_tables, seq_lens, k_scale,
                                                           v_scale, scale, out, window);
  });
}

void paged_decode_fp8(torch::Tensor query, torch::Tensor k_cache, torch::Tensor v_cache,
                      torch::Tensor block_tables, torch::Tensor seq_lens, torch::Tensor k_scale,
                      torch::Tensor v_scale, double scale, torch::Tensor out, int64_t man,
                      int64_t bias, int64_t window) {
  decode_op<false>(query, k_cache, v_cache, block_tables, seq_lens, k_scale, v_scale, scale,
                   out, man, bias, window);
}

void paged_decode_fp8_lut(torch::Tensor query, torch::Tensor k_cache, torch::Tensor v_cache,
                          torch::Tensor block_tables, torch::Tensor seq_lens,
                          torch::Tensor k_scale, torch::Tensor v_scale, double scale,
                          torch::Tensor out, int64_t man, int64_t bias, int64_t window) {
  decode_op<true>(query, k_cache, v_cache, block_tables, seq_lens, k_scale, v_scale, scale,
                  out, man, bias, window);
}

void paged_prefill_fp8(torch::Tensor query, torch::Tensor k_cache, torch::Tensor v_cache,
                       torch::Tensor block_tables, torch::Tensor cu_seqlens_q,
                       torch::Tensor seq_lens, torch::Tensor k_scale, torch::Tensor v_scale,
                       double scale, torch::Tensor out, int64_t man, int64_t bias,
                       int64_t tile, int64_t window) {
  check_format(man, bias);
  TORCH_CHECK(tile >= 1, "tile must be >= 1, got ", tile);
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: full attention), got ", window);
  kvb_paged_prefill_fp8(query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, k_scale,
                        v_scale, scale, out, man, tile, window);
}

// out (float32, same length) = the float values of the bytes in `bytes` (uint8, 1-D,
// contiguous) through one of the kernels' conversions, for the exhaustive conversion test:
// mode 0 the general vector conversion (whole vectors and a partial tail), 1 the table, 2
// the decode's fast route (Fp8Fast: through float16 where F16C exists; e4m3 at 2^-8,
// multiplied back here by 256, exact; e4m3's NaN bytes come out finite on that route, which
// is why the decode scans a block for them first).
void fp8_to_float(torch::Tensor bytes, torch::Tensor out, int64_t man, int64_t bias,
                  int64_t mode) {
  check_format(man, bias);
  TORCH_CHECK(mode >= 0 && mode <= 2, "mode must be 0 (vector), 1 (table) or 2 (fast), got ",
              mode);
  TORCH_CHECK(bytes.scalar_type() == at::kByte && bytes.dim() == 1 && bytes.is_contiguous(),
              "bytes must be a contiguous 1-D uint8 tensor");
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() &&
                  out.numel() == bytes.numel(),
              "out must be a contiguous float32 tensor of the bytes' length");
  const uint8_t* src = bytes.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  const int n = int(bytes.numel());
  auto fast = [&](auto conv) {
    using C = decltype(conv);
    int i = 0;
    for (; i + 2 * VW <= n; i += 2 * VW) {
      vf lo, hi;
      C::pair(src + i, lo, hi);
      lo *= C::kMul;
      hi *= C::kMul;
      std::memcpy(dst + i, &lo, sizeof(vf));
      std::memcpy(dst + i + VW, &hi, sizeof(vf));
    }
    for (; i + VW <= n; i += VW) {
      const vf x = C::vec(src + i) * C::kMul;
      std::memcpy(dst + i, &x, sizeof(vf));
    }
    for (; i < n; ++i) dst[i] = C::one(src[i]) * C::kMul;
  };
  if (man == 3) {
    if (mode == 2) fast(Fp8Fast<3>{});
    else mode == 1 ? Fp8Lut<3>::row(src, dst, n) : Fp8Vec<3>::row(src, dst, n);
  } else {
    if (mode == 2) fast(Fp8Fast<2>{});
    else mode == 1 ? Fp8Lut<2>::row(src, dst, n) : Fp8Vec<2>::row(src, dst, n);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvbench_fp8, m) {
  m.def(
      "paged_decode_fp8(Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor seq_lens, Tensor k_scale, Tensor v_scale, float scale, Tensor(a!) out, int man, "
      "int bias, int window) -> ()");
  m.impl("paged_decode_fp8", c10::DispatchKey::CPU, TORCH_FN(paged_decode_fp8));
  m.def(
      "paged_decode_fp8_lut(Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor seq_lens, Tensor k_scale, Tensor v_scale, float scale, Tensor(a!) out, int man, "
      "int bias, int window) -> ()");
  m.impl("paged_decode_fp8_lut", c10::DispatchKey::CPU, TORCH_FN(paged_decode_fp8_lut));
  m.def(
      "paged_prefill_fp8(Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor cu_seqlens_q, Tensor seq_lens, Tensor k_scale, Tensor v_scale, float scale, "
      "Tensor(a!) out, int man, int bias, int tile, int window) -> ()");
  m.impl("paged_prefill_fp8", c10::DispatchKey::CPU, TORCH_FN(paged_prefill_fp8));
  m.def("fp8_to_float(Tensor bytes, Tensor(a!) out, int man, int bias, int mode) -> ()");
  m.impl("fp8_to_float", c10::DispatchKey::CPU, TORCH_FN(fp8_to_float));
}
