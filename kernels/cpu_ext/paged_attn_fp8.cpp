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
// Byte -> float32 conversion (`Fp8Vec`): VW bytes are widened to 32-bit lanes, the sign
// moved to bit 31 and the 7 exponent+mantissa bits placed right under fp32's exponent field,
// then one multiply by 2^(127 - bias) (2^120 for e4m3, 2^112 for e5m2) rebiases the exponent.
// That multiply is exact for every finite byte: normal bytes are normal fp32 values scaled
// by a power of two, and subnormal bytes (exponent 0) are fp32 subnormals whose product is
// the right normal value (this needs the FPU not to treat subnormal inputs as zero, MXCSR
// DAZ, which torch leaves off unless torch.set_flush_denormal(True); the exhaustive test
// would then fail). The top exponent is blended afterwards: e4m3fn has no inf and only
// S.1111.111 is NaN; e5m2's S.11111.00 is +-inf and S.11111.xx NaN. Only GCC vector
// extensions are used (no intrinsics), so the same code compiles to AVX-512, AVX2 or SSE
// (or scalar code on other machines). The 256-entry table of the first version stays as
// `Fp8Lut`, selected by the `_lut` operators so the two can be timed side by side.
//
// Only tokens below a sequence's length (decode) or at or below a query row's position
// (prefill) are read; with a sliding window (`window` > 0, HF / vLLM semantics: a query at
// position p sees keys p - window + 1 .. p) only from the first block the window touches
// (decode: the sequence's last `window` tokens; prefill: from the tile's first row's first
// key), and a block's tokens before the window are skipped, never multiplied by a zero
// probability (a NaN there, or a -1 table entry before the window, changes nothing). Inputs are validated in Python (kernels.ops, kernels.cpu_paged) before
// any call.
#include <torch/extension.h>

#include "vec_exp.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace {

#if defined(__AVX512F__)
#define F8_VW 16
#elif defined(__AVX__)
#define F8_VW 8
#else
#define F8_VW 4
#endif
constexpr int VW = F8_VW;
typedef float vf __attribute__((vector_size(VW * 4)));
typedef int32_t vi __attribute__((vector_size(VW * 4)));
typedef uint32_t vu __attribute__((vector_size(VW * 4)));
typedef uint8_t vb __attribute__((vector_size(VW)));
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

#define F8_INLINE inline __attribute__((always_inline))

// ---------------------------------------------------------------------------------------
// Conversions

// The float value of every fp8 byte: mantissa bits `man`, exponent bias `bias`; `has_inf`
// (e5m2) makes the top exponent inf / NaN, else (e4m3fn) only its all-ones mantissa is NaN.
std::array<float, 256> fp8_table(int man, int bias, bool has_inf) {
  std::array<float, 256> t{};
  const int ebits = 7 - man, emax = (1 << ebits) - 1;
  for (int b = 0; b < 256; ++b) {
    const int e = (b >> man) & emax, m = b & ((1 << man) - 1);
    const float sign = (b & 0x80) ? -1.f : 1.f;
    float v;
    if (e == emax && (has_inf || m == (1 << man) - 1)) {
      v = (has_inf && m == 0) ? std::numeric_limits<float>::infinity()
                              : std::numeric_limits<float>::quiet_NaN();
    } else if (e == 0) {
      v = std::ldexp(float(m), 1 - bias - man);
    } else {
      v = std::ldexp(float((1 << man) + m), e - bias - man);
    }
    t[size_t(b)] = sign * v;
  }
  return t;
}

// Table conversion (the first version): one load per byte.
template <int MAN>
struct Fp8Lut {
  static const std::array<float, 256>& table() {
    static const std::array<float, 256> t = fp8_table(MAN, MAN == 3 ? 7 : 15, MAN == 2);
    return t;
  }
  static F8_INLINE void row(const uint8_t* src, float* dst, int n) {
    const float* t = table().data();
    for (int i = 0; i < n; ++i) dst[i] = t[src[i]];
  }
  // VW bytes at p, one table load each.
  static F8_INLINE vf vec(const uint8_t* p) {
    const float* t = table().data();
    vf x;
    for (int i = 0; i < VW; ++i) x[i] = t[p[i]];
    return x;
  }
};

// Vector conversion: VW bytes at a time, see the file comment. MAN = 3 (e4m3fn, bias 7) or
// 2 (e5m2, bias 15).
template <int MAN>
struct Fp8Vec {
  static constexpr int BIAS = MAN == 3 ? 7 : 15;
  static constexpr int SHIFT = 23 - MAN;  // bit 0 of the mantissa goes to fp32 bit SHIFT

  // VW bytes at p widened to 32-bit lanes: one vpmovzxbd where AVX-512 / AVX2 exist (GCC
  // builds __builtin_convertvector of 16 bytes from scalar byte extracts and inserts).
  static F8_INLINE vu widen(const uint8_t* p) {
    vu u;
#if F8_VW == 16 && defined(__AVX512F__)
    const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    std::memcpy(&u, &w, sizeof(u));
#elif F8_VW == 8 && defined(__AVX2__)
    const __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    std::memcpy(&u, &w, sizeof(u));
#else
    vb b;
    std::memcpy(&b, p, sizeof(b));
    u = __builtin_convertvector(b, vu);
#endif
    return u;
  }

  // VW bytes at p as floats. e5m2 where F16C exists: each byte is the top byte of the
  // float16 with the same value (same exponent width and bias; inf and NaN included), so
  // one byte -> 16-bit interleave and one vcvtph2ps give it: 2-3 operations per vector
  // instead of from_lanes' ~9, and the same bits (F16C quiets a signalling NaN and keeps its
  // payload, as torch's conversion does; the exhaustive conversion test checks all 256).
  static F8_INLINE vf vec(const uint8_t* p) {
#if defined(__F16C__) && F8_VW == 8
    if constexpr (MAN == 2) {
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
      const __m256 x = _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), b));
      vf r;
      std::memcpy(&r, &x, sizeof(r));
      return r;
    }
#elif defined(__AVX512F__) && F8_VW == 16
    if constexpr (MAN == 2) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      const __m512 x = _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8));
      vf r;
      std::memcpy(&r, &x, sizeof(r));
      return r;
    }
#endif
    return from_lanes(widen(p));
  }

  static F8_INLINE vf vec(vb bytes) { return from_lanes(__builtin_convertvector(bytes, vu)); }

  // The float32 values of bytes held one per 32-bit lane.
  static F8_INLINE vf from_lanes(vu u) {
    const vu mag = u & 0x7fu;
    const vu sign = (u & 0x80u) << 24;
    vu bits = mag << SHIFT;
    vf x;
    std::memcpy(&x, &bits, sizeof(x));
    const vu rebias_bits = vu{} + (uint32_t(127 + 127 - BIAS) << 23);  // 2^(127 - bias)
    vf rebias;
    std::memcpy(&rebias, &rebias_bits, sizeof(rebias));
    x *= rebias;
    std::memcpy(&bits, &x, sizeof(bits));
    // The top exponent, with torch's bit patterns (its float8 -> float32 conversion keeps
    // the mantissa as the NaN payload, quiet bit set): S.1111.111 (e4m3fn, no inf) is
    // 0x7ff00000; S.11111.mm (e5m2) is inf for mm = 0, else 0x7f800000 | mm << 21 | quiet.
    if constexpr (MAN == 3) {
      bits = mag == 0x7fu ? vu{} + 0x7ff00000u : bits;
    } else {
      const vu mm = mag & 3u;
      const vu top = (vu{} + 0x7f800000u) | (mm << 21) | (mm != 0u ? vu{} + 0x400000u : vu{});
      bits = mag >= 0x7cu ? top : bits;
    }
    bits |= sign;
    std::memcpy(&x, &bits, sizeof(x));
    return x;
  }

  static F8_INLINE float one(uint8_t b) {
    vb v = {};
    v[0] = b;
    return vec(v)[0];
  }

  // dst[0, n) = the float values of src[0, n) (whole vectors, then the tail).
  static F8_INLINE void row(const uint8_t* src, float* dst, int n) {
    int i = 0;
    for (; i + VW <= n; i += VW) {
      const vf x = vec(src + i);
      std::memcpy(dst + i, &x, sizeof(x));
    }
    if (i < n) {
      vb b = {};
      std::memcpy(&b, src + i, size_t(n - i));
      const vf x = vec(b);
      std::memcpy(dst + i, &x, size_t(n - i) * sizeof(float));
    }
  }
};

// e4m3fn bytes known to hold no NaN pattern (0x7F / 0xFF; the caller scanned them,
// any_e4m3_nan) through float16 where F16C exists: the byte sign-extended to 16 bits,
// shifted left by 7, with bit 14 (a copy of the sign) cleared, is the float16 of its value
// times 2^-8 (float16's exponent bias is 8 more than e4m3's; subnormals included), exact;
// one vcvtph2ps and one multiply by 2^8 give the float32 value. 5 operations per vector
// instead of from_lanes' ~9. Elsewhere the general conversion.
struct Fp8E4m3Finite {
  static F8_INLINE vf vec(const uint8_t* p) {
#if defined(__F16C__) && F8_VW == 8
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7),
                                    _mm_set1_epi16(static_cast<short>(0xBF80)));
    const __m256 x = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.f));
    vf r;
    std::memcpy(&r, &x, sizeof(r));
    return r;
#elif defined(__AVX512F__) && F8_VW == 16
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7),
                                       _mm256_set1_epi16(static_cast<short>(0xBF80)));
    const __m512 x = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.f));
    vf r;
    std::memcpy(&r, &x, sizeof(r));
    return r;
#else
    return Fp8Vec<3>::vec(p);
#endif
  }
};

// True when rows t0 .. nt - 1 (stride bytes apart, D bytes each) may hold an e4m3fn NaN
// byte (0x7F or 0xFF); D not a multiple of 32 counts as "may" (the general path runs).
F8_INLINE bool any_e4m3_nan(const uint8_t* p, int64_t stride, int t0, int nt, int D) {
  typedef uint8_t v32 __attribute__((vector_size(32)));
  typedef int8_t m32 __attribute__((vector_size(32)));
  if (D % 32 != 0) return true;
  m32 hit = {};
  for (int t = t0; t < nt; ++t)
    for (int d = 0; d < D; d += 32) {
      v32 x;
      std::memcpy(&x, p + t * stride + d, sizeof(x));
      hit |= (m32)((x | 0x80) == 0xFF);
    }
  uint64_t w[4];
  std::memcpy(w, &hit, sizeof(w));
  return (w[0] | w[1] | w[2] | w[3]) != 0;
}

template <typename T>
inline float to_f(T x) {
  return float(x);
}

// e^x lane by lane for x <= 0 (vec_exp.h).
F8_INLINE vf vexp(vf x) { return kvb_cpu::vexp<vf, vi>(x); }

// ---------------------------------------------------------------------------------------
// Decode: tasks over (sequence, KV heads), see decode_fp8_impl. Per block and head:
//   1. scores of RN query rows x TN tokens at once (RN * TN = 8 independent FMA chains over
//      the head dim, each K vector loaded and converted once for RN rows), then one
//      horizontal sum each;
//   2. an online softmax per row over the block's scores, VW at a time (vector exp);
//   3. acc[r] = acc[r] * alpha + sum_t p[r][t] v[t], RN rows x 2 vectors of the head dim in
//      registers over the block's tokens, each V vector converted once for RN rows.
// Where the head dim is a multiple of VW, K and V bytes are converted as they are loaded
// (dec_dots_bytes, dec_pv_bytes); otherwise each row is first converted into a float
// buffer padded with zeros to Dp (dec_dots, dec_pv; tokens past the block's last are
// computed on stale finite rows and masked). The buffered form at head dim 128 took about
// 4x the time of the loaded form on one thread here: its stores 4K-alias the next rows'
// loads at this layout's strides. The first version (a table per byte, one FMA chain per
// dot product, a scalar P V update) took 2x-4x the buffered form's time.

// Sum of a vector's lanes.
F8_INLINE float hsum(vf v) {
  float s = 0.f;
#pragma GCC unroll 16
  for (int i = 0; i < VW; ++i) s += v[i];
  return s;
}

// s[r * sstride + t] = q_r . k_t (times scale) for RN rows (stride Dp) and TN tokens.
template <int RN, int TN>
F8_INLINE void dec_dots(const float* q, const float* k, int Dp, float scale, float* s,
                        int sstride) {
  vf a[RN][TN] = {};
  for (int d = 0; d < Dp; d += VW) {
    vf kv[TN];
#pragma GCC unroll 8
    for (int u = 0; u < TN; ++u) std::memcpy(&kv[u], k + u * Dp + d, sizeof(vf));
#pragma GCC unroll 8
    for (int r = 0; r < RN; ++r) {
      vf qv;
      std::memcpy(&qv, q + r * Dp + d, sizeof(vf));
#pragma GCC unroll 8
      for (int u = 0; u < TN; ++u) a[r][u] += qv * kv[u];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < RN; ++r)
#pragma GCC unroll 8
    for (int u = 0; u < TN; ++u) s[r * sstride + u] = hsum(a[r][u]) * scale;
}

// acc rows (RN, stride Dp) = acc * alpha[r] + sum_{t0 <= t < nt} p[r * pstride + t] * v[t]
// (rows before t0, a window's skipped tokens, are not read: 0 * NaN would poison acc).
template <int RN>
F8_INLINE void dec_pv(float* acc, const float* alpha, const float* p, int pstride,
                      const float* v, int Dp, int t0, int nt) {
  int d = 0;
  for (; d + 2 * VW <= Dp; d += 2 * VW) {
    vf a[RN][2];
#pragma GCC unroll 8
    for (int r = 0; r < RN; ++r) {
      std::memcpy(&a[r][0], acc + r * Dp + d, sizeof(vf));
      std::memcpy(&a[r][1], acc + r * Dp + d + VW, sizeof(vf));
      a[r][0] *= alpha[r];
      a[r][1] *= alpha[r];
    }
    for (int t = t0; t < nt; ++t) {
      vf v0, v1;
      std::memcpy(&v0, v + t * Dp + d, sizeof(vf));
      std::memcpy(&v1, v + t * Dp + d + VW, sizeof(vf));
#pragma GCC unroll 8
      for (int r = 0; r < RN; ++r) {
        const vf pb = vf{} + p[r * pstride + t];
        a[r][0] += pb * v0;
        a[r][1] += pb * v1;
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < RN; ++r) {
      std::memcpy(acc + r * Dp + d, &a[r][0], sizeof(vf));
      std::memcpy(acc + r * Dp + d + VW, &a[r][1], sizeof(vf));
    }
  }
  if (d < Dp) {  // one vector left
    vf a[RN];
#pragma GCC unroll 8
    for (int r = 0; r < RN; ++r) {
      std::memcpy(&a[r], acc + r * Dp + d, sizeof(vf));
      a[r] *= alpha[r];
    }
    for (int t = t0; t < nt; ++t) {
      vf v0;
      std::memcpy(&v0, v + t * Dp + d, sizeof(vf));
#pragma GCC unroll 8
      for (int r = 0; r < RN; ++r) a[r] += (vf{} + p[r * pstride + t]) * v0;
    }
#pragma GCC unroll 8
    for (int r = 0; r < RN; ++r) std::memcpy(acc + r * Dp + d, &a[r], sizeof(vf));
  }
}

// dec_dots with K read as bytes (rows kstride bytes apart) and converted as loaded, D a
// multiple of VW: no float copy of K is written (a copy's stores 4K-alias the next rows'
// loads at this layout's strides, which stalled those loads).
template <typename Conv, int RN, int TN>
F8_INLINE void dec_dots_bytes(const float* q, const uint8_t* k, int64_t kstride, int D,
                              float scale, float* s, int sstride) {
  vf a[RN][TN] = {};
  for (int d = 0; d < D; d += VW) {
    vf kv[TN];
#pragma GCC unroll 8
    for (int u = 0; u < TN; ++u) kv[u] = Conv::vec(k + u * kstride + d);
#pragma GCC unroll 8
    for (int r = 0; r < RN; ++r) {
      vf qv;
      std::memcpy(&qv, q + r * D + d, sizeof(vf));
#pragma GCC unroll 8
      for (int u = 0; u < TN; ++u) a[r][u] += qv * kv[u];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < RN; ++r)
#pragma GCC unroll 8
    for (int u = 0; u < TN; ++u) s[r * sstride + u] = hsum(a[r][u]) * scale;
}

// dec_pv with V read as bytes (rows vstride bytes apart), converted as loaded; D a multiple
// of VW.
template <typename Conv, int RN>
F8_INLINE void dec_pv_bytes(float* acc, const float* alpha, const float* p, int pstride,
                            const uint8_t* v, int64_t vstride, int D, int t0, int nt) {
  int d = 0;
  for (; d + 2 * VW <= D; d += 2 * VW) {
    vf a[RN][2];
#pragma GCC unroll 8
    for (int r = 0; r < RN; ++r) {
      std::memcpy(&a[r][0], acc + r * D + d, sizeof(vf));
      std::memcpy(&a[r][1], acc + r * D + d + VW, sizeof(vf));
      a[r][0] *= alpha[r];
      a[r][1] *= alpha[r];
    }
    for (int t = t0; t < nt; ++t) {
      const vf v0 = Conv::vec(v + t * vstride + d), v1 = Conv::vec(v + t * vstride + d + VW);
#pragma GCC unroll 8
      for (int r = 0; r < RN; ++r) {
        const vf pb = vf{} + p[r * pstride + t];
        a[r][0] += pb * v0;
        a[r][1] += pb * v1;
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < RN; ++r) {
      std::memcpy(acc + r * D + d, &a[r][0], sizeof(vf));
      std::memcpy(acc + r * D + d + VW, &a[r][1], sizeof(vf));
    }
  }
  if (d < D) {
    vf a[RN];
#pragma GCC unroll 8
    for (int r = 0; r < RN; ++r) {
      std::memcpy(&a[r], acc + r * D + d, sizeof(vf));
      a[r] *= alpha[r];
    }
    for (int t = t0; t < nt; ++t) {
      const vf v0 = Conv::vec(v + t * vstride + d);
#pragma GCC unroll 8
      for (int r = 0; r < RN; ++r) a[r] += (vf{} + p[r * pstride + t]) * v0;
    }
#pragma GCC unroll 8
    for (int r = 0; r < RN; ++r) std::memcpy(acc + r * D + d, &a[r], sizeof(vf));
  }
}

template <typename T, typename Conv>
void decode_fp8_impl(const torch::Tensor& query, const torch::Tensor& k_cache,
                     const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                     const torch::Tensor& seq_lens, const torch::Tensor& k_scale,
                     const torch::Tensor& v_scale, double scale, torch::Tensor& out,
                     int64_t window) {
  const int64_t B = query.size(0), Hq = query.size(1);
  const int64_t bs = k_cache.size(1), Hkv = k_cache.size(2);
  const int G = int(Hq / Hkv), D = int(query.size(2));
  const int Dp = (D + VW - 1) / VW * VW;           // padded row length (zeros past D)
  const int bsp = int((bs + 7) / 8 * 8);           // tokens the score pass may compute
  const int sst = (bsp + VW - 1) / VW * VW;        // score row stride (whole vectors)
  const uint8_t* kc = k_cache.data_ptr<uint8_t>();
  const uint8_t* vc = v_cache.data_ptr<uint8_t>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int64_t ts = block_tables.stride(0);
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const float* ks = k_scale.data_ptr<float>();
  const float* vs = v_scale.data_ptr<float>();
  const T* q = query.data_ptr<T>();
  T* o = out.data_ptr<T>();
  const int64_t qs_b = query.stride(0), qs_h = query.stride(1);
  const int64_t os_b = out.stride(0), os_h = out.stride(1);
  const int64_t tok = Hkv * D, blk = bs * tok;
  // Tasks: (sequence, range of HT KV heads). A task walks its sequence's blocks once and,
  // per block, its heads one after another, so a block's bytes are read as one stream
  // (its heads' rows share pages and lines' neighbours) and the next block is prefetched
  // while this one is computed. A task per (sequence, head) read each head's rows apart
  // (1 KiB strides at 8 heads x D 128), and waited on those loads most of its time.
  // Sequences are split into head ranges only where the batch leaves a thread without two
  // tasks (as cpu_paged.task_split does for the 16-bit decode).
  const bool fused = D % VW == 0;  // convert K and V as they are loaded (see dec_dots_bytes)
  const int64_t want = 2 * std::max<int64_t>(1, at::get_num_threads());
  const int64_t HT = B >= want ? Hkv : std::max<int64_t>(1, Hkv * B / want);
  const int64_t nh = (Hkv + HT - 1) / HT;
  at::parallel_for(0, B * nh, 1, [&](int64_t begin, int64_t end) {
    // zero-filled once: the padding columns stay 0 (conversions write D per row), and rows
    // past a block's end hold earlier finite rows or zeros
    const size_t rows = size_t(HT) * G;
    std::vector<float> qf(rows * Dp, 0.f), acc(rows * Dp), kf(size_t(bsp) * Dp, 0.f),
        vf_(size_t(bsp) * Dp, 0.f), s(size_t(G) * sst), m(rows), l(rows), alpha(rows);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / nh, h0 = task % nh * HT, h1 = std::min(Hkv, h0 + HT);
      const int64_t len = lens[b];
      // window > 0: positions lo .. len - 1 only; blocks wholly before lo are never read
      // (their table entries may be -1) and the first block's tokens before lo are skipped
      const int64_t lo = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      for (int64_t h = h0; h < h1; ++h)
        for (int r = 0; r < G; ++r) {
          const size_t row = size_t(h - h0) * G + r;
          const T* qr = q + b * qs_b + (h * G + r) * qs_h;
          for (int d = 0; d < D; ++d) qf[row * Dp + d] = to_f(qr[d]);
          m[row] = NEG_INF;
          l[row] = 0.f;
        }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = lo / bs; j * bs < len; ++j) {
        const int nt = int(std::min(bs, len - j * bs));
        const int ntp = (nt + 7) / 8 * 8;
        const int t0 = int(std::max<int64_t>(0, lo - j * bs));  // first token read
        if ((j + 1) * bs < len) {  // the next block's rows of these heads, during this one
          const int64_t next = int64_t(tables[b * ts + j + 1]) * blk;
          const int64_t nn = std::min(bs, len - (j + 1) * bs);
          for (int64_t t = 0; t < nn; ++t)
            for (int64_t x = h0 * D; x < h1 * D; x += 64) {
              __builtin_prefetch(kc + next + t * tok + x);
              __builtin_prefetch(vc + next + t * tok + x);
            }
        }
        for (int64_t h = h0; h < h1; ++h) {
          const int64_t base = int64_t(tables[b * ts + j]) * blk + h * D;
          const float sc = float(scale) * ks[h];
          const size_t r0 = size_t(h - h0) * G;  // this head's first state row
          float* qh = qf.data() + r0 * Dp;
          float* ah = acc.data() + r0 * Dp;
          const uint8_t* kb = kc + base;
          const uint8_t* vb_ = vc + base;
          int r = 0;
          // e4m3 rows without NaN bytes (all real data) take the float16 route
          bool finite = false;
          if constexpr (std::is_same_v<Conv, Fp8Vec<3>>)
            finite = fused && !any_e4m3_nan(kb, tok, t0, nt, D) && !any_e4m3_nan(vb_, tok, t0, nt, D);
          auto dots = [&](auto conv) {
            using C = decltype(conv);
            for (; r + 4 <= G; r += 4) {
              float* sr = s.data() + size_t(r) * sst;
              int t = t0;
              for (; t + 2 <= nt; t += 2)
                dec_dots_bytes<C, 4, 2>(qh + size_t(r) * Dp, kb + t * tok, tok, D, sc,
                                           sr + t, sst);
              for (; t < nt; ++t)
                dec_dots_bytes<C, 4, 1>(qh + size_t(r) * Dp, kb + t * tok, tok, D, sc,
                                           sr + t, sst);
            }
            for (; r < G; ++r) {
              float* sr = s.data() + size_t(r) * sst;
              int t = t0;
              for (; t + 8 <= nt; t += 8)
                dec_dots_bytes<C, 1, 8>(qh + size_t(r) * Dp, kb + t * tok, tok, D, sc,
                                           sr + t, sst);
              for (; t < nt; ++t)
                dec_dots_bytes<C, 1, 1>(qh + size_t(r) * Dp, kb + t * tok, tok, D, sc,
                                           sr + t, sst);
            }
          };
          if (fused) {  // D % VW == 0: K and V converted as loaded, only rows < nt read
            if (finite)
              dots(Fp8E4m3Finite{});
            else
              dots(Conv{});
          } else {
            for (int t = t0; t < nt; ++t) {  // convert this block's rows of head h once
              Conv::row(kb + t * tok, kf.data() + size_t(t) * Dp, D);
              Conv::row(vb_ + t * tok, vf_.data() + size_t(t) * Dp, D);
            }
            for (; r + 4 <= G; r += 4)
              for (int t = 0; t < ntp; t += 2)
                dec_dots<4, 2>(qh + size_t(r) * Dp, kf.data() + size_t(t) * Dp, Dp, sc,
                               s.data() + size_t(r) * sst + t, sst);
            for (; r < G; ++r)
              for (int t = 0; t < ntp; t += 8)
                dec_dots<1, 8>(qh + size_t(r) * Dp, kf.data() + size_t(t) * Dp, Dp, sc,
                               s.data() + size_t(r) * sst + t, sst);
          }
          for (int rr = 0; rr < G; ++rr) {  // online softmax of row rr over this block
            float* sr = s.data() + size_t(rr) * sst;
            const size_t st = r0 + rr;
            const vf ninf = vf{} + NEG_INF;
            vf vm = ninf;
            for (int t = 0; t < nt; t += VW) {  // (from 0: whole vectors, masked below t0)
              vf x;
              std::memcpy(&x, sr + t, sizeof(vf));
              vi idx;
              for (int i = 0; i < VW; ++i) idx[i] = t + i;
              x = (idx < nt) & (idx >= t0) ? x : ninf;
              std::memcpy(sr + t, &x, sizeof(vf));
              vm = x > vm ? x : vm;
            }
            float mx = m[st];
            for (int i = 0; i < VW; ++i) mx = std::max(mx, vm[i]);
            const vf mv = vf{} + mx;
            vf sum = {};
            for (int t = 0; t < nt; t += VW) {
              vf x;
              std::memcpy(&x, sr + t, sizeof(vf));
              vf p = vexp(x - mv);
              p = x == ninf ? vf{} : p;
              std::memcpy(sr + t, &p, sizeof(vf));
              sum += p;
            }
            const float a = m[st] == NEG_INF ? 0.f : std::exp(m[st] - mx);
            alpha[st] = a;
            l[st] = l[st] * a + hsum(sum);
            m[st] = mx;
          }
          r = 0;
          auto pv = [&](auto conv) {
            using C = decltype(conv);
            for (; r + 4 <= G; r += 4)
              dec_pv_bytes<C, 4>(ah + size_t(r) * Dp, alpha.data() + r0 + r,
                                 s.data() + size_t(r) * sst, sst, vb_, tok, D, t0, nt);
            for (; r < G; ++r)
              dec_pv_bytes<C, 1>(ah + size_t(r) * Dp, alpha.data() + r0 + r,
                                 s.data() + size_t(r) * sst, sst, vb_, tok, D, t0, nt);
          };
          if (fused) {
            if (finite)
              pv(Fp8E4m3Finite{});
            else
              pv(Conv{});
          } else {
            for (; r + 4 <= G; r += 4)
              dec_pv<4>(ah + size_t(r) * Dp, alpha.data() + r0 + r, s.data() + size_t(r) * sst,
                        sst, vf_.data(), Dp, t0, nt);
            for (; r < G; ++r)
              dec_pv<1>(ah + size_t(r) * Dp, alpha.data() + r0 + r, s.data() + size_t(r) * sst,
                        sst, vf_.data(), Dp, t0, nt);
          }
        }
      }
      for (int64_t h = h0; h < h1; ++h)
        for (int r = 0; r < G; ++r) {
          const size_t row = size_t(h - h0) * G + r;
          const float f = vs[h] / l[row];
          T* orow = o + b * os_b + (h * G + r) * os_h;
          for (int d = 0; d < D; ++d) orow[d] = T(acc[row * Dp + d] * f);
        }
    }
  });
}

// ---------------------------------------------------------------------------------------
// Prefill / extend: task = (sequence b, KV head h, tile of up to `tile` query tokens); the
// tile's G * tokens query rows (row r: token r / G, query head h * G + r % G, position
// pos0 + r / G) walk the keys 0 .. last position in chunks of KC keys:
//   1. the chunk's K bytes are converted (in registers, VW at a time) and stored transposed,
//      kt[d][t], so a score pass broadcasts one query element and multiplies a vector of
//      KC / VW keys at once (no horizontal sums); V is converted row-major, vv[t][d];
//   2. scores of RB rows x KC keys (query rows pre-scaled by softmax_scale * k_scale[h]),
//      keys past a row's position masked to -inf; an online softmax per row (running max m,
//      sum l; probabilities by the vector exp);
//   3. o[r][:] = o[r][:] * corr[r] + sum_t p[r][t] vv[t][:], RB rows x 2 vectors of the head
//      dim in registers over the chunk's keys.
// Rows are padded to a multiple of RB (zero queries at the last row's position, never
// stored). The output is o / l * v_scale[h] in the query dtype.
constexpr int KC = 2 * VW;  // keys per chunk
constexpr int RB = 4;       // query rows per register block

// Per-thread scratch of the prefill tasks (reused across a thread's tasks).
struct Fp8PrefillScratch {
  std::vector<float> q, o, m, l, corr, s, kt, vv;
  std::vector<int32_t> lim;
};

// Scores of RB rows x KC keys (keys cb ..), masked to -inf where a key lies after the row's
// position (key >= lim) or, with a sliding window (win > 0), before its window (key < lim -
// win).
template <int DC>
F8_INLINE void pf_scores(const float* q, int D, const float* kt, float* s, const int32_t* lim,
                         int cb, int win) {
  const int Dn = DC > 0 ? DC : D;
  vf a[RB][2] = {};
  for (int d = 0; d < Dn; ++d) {
    vf k0, k1;
    std::memcpy(&k0, kt + d * KC, sizeof(vf));
    std::memcpy(&k1, kt + d * KC + VW, sizeof(vf));
#pragma GCC unroll 4
    for (int i = 0; i < RB; ++i) {
      const vf qb = vf{} + q[i * Dn + d];
      a[i][0] += qb * k0;
      a[i][1] += qb * k1;
    }
  }
  vi idx;
  for (int i = 0; i < VW; ++i) idx[i] = cb + i;
#pragma GCC unroll 4
  for (int i = 0; i < RB; ++i) {
    const vi li = vi{} + lim[i];
    const vi first = vi{} + (win > 0 ? lim[i] - win : std::numeric_limits<int32_t>::min());
    const vf ninf = vf{} + NEG_INF;
    a[i][0] = (idx < li) & (idx >= first) ? a[i][0] : ninf;
    a[i][1] = (idx + VW < li) & (idx + VW >= first) ? a[i][1] : ninf;
    std::memcpy(s + i * KC, &a[i][0], sizeof(vf));
    std::memcpy(s + i * KC + VW, &a[i][1], sizeof(vf));
  }
}

// o rows [RB][Dn] (stride Dn) = o * corr + p (RB x nt, stride KC) times vv (nt x Dn).
template <int DC>
F8_INLINE void pf_pv(float* o, int D, const float* corr, const float* p, const float* vv,
                     int nt) {
  const int Dn = DC > 0 ? DC : D;
  int d = 0;
  for (; d + 2 * VW <= Dn; d += 2 * VW) {
    vf a[RB][2];
#pragma GCC unroll 4
    for (int i = 0; i < RB; ++i) {
      std::memcpy(&a[i][0], o + i * Dn + d, sizeof(vf));
      std::memcpy(&a[i][1], o + i * Dn + d + VW, sizeof(vf));
      a[i][0] *= corr[i];
      a[i][1] *= corr[i];
    }
    for (int t = 0; t < nt; ++t) {
      vf v0, v1;
      std::memcpy(&v0, vv + t * Dn + d, sizeof(vf));
      std::memcpy(&v1, vv + t * Dn + d + VW, sizeof(vf));
#pragma GCC unroll 4
      for (int i = 0; i < RB; ++i) {
        const vf pb = vf{} + p[i * KC + t];
        a[i][0] += pb * v0;
        a[i][1] += pb * v1;
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < RB; ++i) {
      std::memcpy(o + i * Dn + d, &a[i][0], sizeof(vf));
      std::memcpy(o + i * Dn + d + VW, &a[i][1], sizeof(vf));
    }
  }
  for (; d < Dn; ++d) {  // head dims that are not a multiple of 2 * VW
    for (int i = 0; i < RB; ++i) {
      float a = o[i * Dn + d] * corr[i];
      for (int t = 0; t < nt; ++t) a += p[i * KC + t] * vv[t * Dn + d];
      o[i * Dn + d] = a;
    }
  }
}

template <typename T, typename Conv, int DC>
void prefill_fp8_impl(const torch::Tensor& query, const torch::Tensor& k_cache,
                      const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                      const torch::Tensor& cu_seqlens_q, const torch::Tensor& seq_lens,
                      const torch::Tensor& k_scale, const torch::Tensor& v_scale, double scale,
                      torch::Tensor& out, int64_t tile, int64_t window) {
  const int64_t B = seq_lens.size(0), Hq = query.size(1);
  const int64_t bs = k_cache.size(1), Hkv = k_cache.size(2);
  const int G = int(Hq / Hkv), D = DC > 0 ? DC : int(k_cache.size(3));
  const uint8_t* kc = k_cache.data_ptr<uint8_t>();
  const uint8_t* vc = v_cache.data_ptr<uint8_t>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int64_t tstride = block_tables.stride(0);
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* cu = cu_seqlens_q.data_ptr<int32_t>();
  const float* ks = k_scale.data_ptr<float>();
  const float* vs = v_scale.data_ptr<float>();
  const T* q = query.data_ptr<T>();
  T* o = out.data_ptr<T>();
  const int64_t qs_t = query.stride(0), qs_h = query.stride(1);
  const int64_t os_t = out.stride(0), os_h = out.stride(1);
  const int64_t tok = Hkv * D;
  // window > 0: row p sees keys p - win + 1 .. p (positions are int32, so a window past
  // int32's range is the same as int32_max / 2, longer than any sequence)
  const int win = int(std::min<int64_t>(window, std::numeric_limits<int32_t>::max() / 2));
  struct Task {
    int64_t b, start;
    int h;
  };
  // (sequence, KV head, tile) order: a thread's consecutive tasks read the same K/V rows.
  std::vector<Task> tasks;
  for (int64_t b = 0; b < B; ++b)
    for (int h = 0; h < int(Hkv); ++h)
      for (int64_t s0 = cu[b]; s0 < cu[b + 1]; s0 += tile) tasks.push_back({b, s0, h});
  at::parallel_for(0, int64_t(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    Fp8PrefillScratch w;
    w.kt.resize(size_t(D) * KC);
    w.vv.resize(size_t(KC) * D);
    std::vector<float> krow_(static_cast<size_t>(D));  // one converted K row
    float* krow = krow_.data();
    for (int64_t task = begin; task < end; ++task) {
      const int h = tasks[size_t(task)].h;
      const int64_t b = tasks[size_t(task)].b, start = tasks[size_t(task)].start;
      const int64_t nq = std::min<int64_t>(start + tile, cu[b + 1]) - start;
      const int64_t pos0 = lens[b] - (cu[b + 1] - cu[b]) + (start - cu[b]);
      const int nr = int(nq * G), nrp = (nr + RB - 1) / RB * RB;
      const float qscale = float(scale) * ks[h];
      w.q.assign(size_t(nrp) * D, 0.f);
      w.o.assign(size_t(nrp) * D, 0.f);
      w.m.assign(size_t(nrp), NEG_INF);
      w.l.assign(size_t(nrp), 0.f);
      w.corr.resize(size_t(nrp));
      w.s.resize(size_t(nrp) * KC);
      w.lim.resize(size_t(nrp));
      for (int r = 0; r < nrp; ++r) {
        const int rr = std::min(r, nr - 1);
        w.lim[size_t(r)] = int32_t(pos0 + rr / G + 1);
        if (r >= nr) continue;
        const T* qr = q + (start + r / G) * qs_t + (int64_t(h) * G + r % G) * qs_h;
        float* dst = w.q.data() + size_t(r) * D;
        for (int d = 0; d < D; ++d) dst[d] = to_f(qr[d]) * qscale;
      }
      const int64_t keys = pos0 + nq;  // the tile sees keys lo .. keys - 1
      // window: the walk starts at the tile's first row's first key (blocks wholly before
      // it are never read; their table entries may be -1)
      const int64_t lo = win > 0 ? std::max<int64_t>(0, pos0 - win + 1) : 0;
      for (int64_t cb = lo; cb < keys; cb += KC) {
        const int nt = int(std::min<int64_t>(KC, keys - cb));
        int r0 = 0;  // rows before r0 see none of this chunk (rows are in position order)
        while (r0 < nr && w.lim[size_t(r0)] <= cb) ++r0;
        r0 = r0 / RB * RB;
        int r1 = nrp;  // nor do rows from r1 on, whose windows start after the chunk
        if (win > 0)
          while (r1 > r0 && int64_t(w.lim[size_t(r1 - 1)]) - win >= cb + nt) --r1;
        for (int t = 0; t < KC; ++t) {
          if (t < nt) {
            const int64_t pos = cb + t;
            const int64_t row = int64_t(tables[b * tstride + pos / bs]) * bs + pos % bs;
            const int64_t off = row * tok + int64_t(h) * D;
            Conv::row(kc + off, krow, D);
            for (int d = 0; d < D; ++d) w.kt[size_t(d) * KC + t] = krow[d];
            Conv::row(vc + off, w.vv.data() + size_t(t) * D, D);
          } else {  // keys past the chunk's end: zero K (masked anyway) and V
            for (int d = 0; d < D; ++d) w.kt[size_t(d) * KC + t] = 0.f;
          }
        }
        for (int r = r0; r < r1; r += RB) {
          float* s = w.s.data() + size_t(r) * KC;
          pf_scores<DC>(w.q.data() + size_t(r) * D, D, w.kt.data(), s, w.lim.data() + r,
                        int(cb), win);
          for (int i = 0; i < RB; ++i) {
            float* si = s + i * KC;
            vf x0, x1;
            std::memcpy(&x0, si, sizeof(vf));
            std::memcpy(&x1, si + VW, sizeof(vf));
            vf mxv = x0 > x1 ? x0 : x1;
            float mx = w.m[size_t(r + i)];
            for (int k = 0; k < VW; ++k) mx = std::max(mx, mxv[k]);
            // mx is -inf only for a row (rounded into the block) that sees none of this
            // chunk and nothing before: its p are 0 (selected below) and corr 0
            const vf mv = vf{} + mx;
            const vf ninf = vf{} + NEG_INF;
            vf p0 = vexp(x0 - mv), p1 = vexp(x1 - mv);
            p0 = x0 == ninf ? vf{} : p0;
            p1 = x1 == ninf ? vf{} : p1;
            std::memcpy(si, &p0, sizeof(vf));
            std::memcpy(si + VW, &p1, sizeof(vf));
            const vf ps = p0 + p1;
            float sum = 0.f;
            for (int k = 0; k < VW; ++k) sum += ps[k];
            const float c = w.m[size_t(r + i)] == NEG_INF ? 0.f : std::exp(w.m[size_t(r + i)] - mx);
            w.corr[size_t(r + i)] = c;
            w.l[size_t(r + i)] = w.l[size_t(r + i)] * c + sum;
            w.m[size_t(r + i)] = mx;
          }
          pf_pv<DC>(w.o.data() + size_t(r) * D, D, w.corr.data() + r, s, w.vv.data(), nt);
        }
      }
      const float vsh = vs[h];
      for (int r = 0; r < nr; ++r) {
        const float f = vsh / w.l[size_t(r)];
        T* orow = o + (start + r / G) * os_t + (int64_t(h) * G + r % G) * os_h;
        const float* acc = w.o.data() + size_t(r) * D;
        for (int d = 0; d < D; ++d) orow[d] = T(acc[d] * f);
      }
    }
  });
}

// ---------------------------------------------------------------------------------------
// Operators

void check_format(int64_t man, int64_t bias) {
  TORCH_CHECK(man == 2 || man == 3, "fp8 mantissa bits must be 2 or 3, got ", man);
  TORCH_CHECK(bias == (man == 3 ? 7 : 15), "fp8 exponent bias ", bias, " for ", man, " bits");
}

// Calls f(T{}, Conv{}) for the query dtype and the fp8 format (vector or table conversion).
template <bool LUT, typename F>
void dispatch(const torch::Tensor& query, int64_t man, F&& f) {
  auto by_conv = [&](auto t) {
    if (man == 3) {
      if constexpr (LUT) f(t, Fp8Lut<3>{}); else f(t, Fp8Vec<3>{});
    } else {
      if constexpr (LUT) f(t, Fp8Lut<2>{}); else f(t, Fp8Vec<2>{});
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
    decode_fp8_impl<decltype(t), decltype(conv)>(query, k_cache, v_cache, block_tables,
                                                 seq_lens, k_scale, v_scale, scale, out,
                                                 window);
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
  dispatch<false>(query, man, [&](auto t, auto conv) {
    using T = decltype(t);
    using C = decltype(conv);
    auto run = [&](auto dc) {
      prefill_fp8_impl<T, C, decltype(dc)::value>(query, k_cache, v_cache, block_tables,
                                                  cu_seqlens_q, seq_lens, k_scale, v_scale,
                                                  scale, out, tile, window);
    };
    switch (k_cache.size(3)) {
      case 64: run(std::integral_constant<int, 64>{}); break;
      case 128: run(std::integral_constant<int, 128>{}); break;
      default: run(std::integral_constant<int, 0>{}); break;
    }
  });
}

// out (float32, same length) = the float values of the bytes in `bytes` (uint8, 1-D,
// contiguous) through the decode's conversion: `lut` false the vector path (whole vectors
// and a partial tail), true the table. For the exhaustive conversion test.
void fp8_to_float(torch::Tensor bytes, torch::Tensor out, int64_t man, int64_t bias, bool lut) {
  check_format(man, bias);
  TORCH_CHECK(bytes.scalar_type() == at::kByte && bytes.dim() == 1 && bytes.is_contiguous(),
              "bytes must be a contiguous 1-D uint8 tensor");
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() &&
                  out.numel() == bytes.numel(),
              "out must be a contiguous float32 tensor of the bytes' length");
  const uint8_t* src = bytes.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  const int n = int(bytes.numel());
  if (man == 3) {
    lut ? Fp8Lut<3>::row(src, dst, n) : Fp8Vec<3>::row(src, dst, n);
  } else {
    lut ? Fp8Lut<2>::row(src, dst, n) : Fp8Vec<2>::row(src, dst, n);
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
  m.def("fp8_to_float(Tensor bytes, Tensor(a!) out, int man, int bias, bool lut) -> ()");
  m.impl("fp8_to_float", c10::DispatchKey::CPU, TORCH_FN(fp8_to_float));
}
