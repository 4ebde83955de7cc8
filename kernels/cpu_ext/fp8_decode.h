// The fp8 paged decode's core, free of torch so a scratch harness can time it alone:
// conversions of fp8 bytes to float32 vectors, and one decode task (a sequence's range of
// KV heads over its blocks). Included by paged_attn_fp8.cpp, which validates nothing here
// (inputs are checked in Python) and runs the tasks in parallel.
//
// Layouts as in paged_attn.cpp: k_cache, v_cache [num_blocks, block_size, num_kv_heads,
// head_dim] bytes; a byte b of KV head h means float32(b) * scale[h].
//
// Structure (issue 39 item 2; the fp16 decode's, paged_attn.cpp's decode_task): per block,
//   1. K pass in address order, two tokens at a time, every head of the task: scores of up to
//      4 query rows x 2 tokens (8 independent FMA chains; each K vector converted once for
//      the 4 rows and kept in a register), summed by one 8-way horizontal tree;
//   2. an online softmax per row (no exp when the running max holds);
//   3. V pass head by head: acc rows += p V, 4 rows x 2 vectors in registers, each V vector
//      converted once for the 4 rows.
// The next block's K and V lines are prefetched into L2 a few before each call, spread over
// the two passes (a burst of a whole block's prefetches stalls on the core's miss queue).
// Conversion: 2 VW bytes at a time where F16C exists (16-byte loads with AVX2):
//   - e5m2: each byte is the top byte of the float16 of the same value (same exponent width
//     and bias, inf and NaN included): a byte interleave and vcvtph2ps;
//   - e4m3fn: the byte sign-extended to 16 bits, shifted left 7, bit 14 (a copy of the sign)
//     cleared, is the float16 of its value times 2^-8 (subnormals included, exact); vcvtph2ps.
//     The 2^8 is folded into the head's score and output scales (exact: a power of two).
//     The NaN bytes 0x7F / 0xFF would land on +-1.875 * 2^8 * 2^-8, so a block whose K or V
//     rows hold one (a 2-instruction max scan per 32 bytes) is converted the general way
//     (Fp8Vec, also at 2^-8), which keeps NaN.
// The general conversion (Fp8Vec, any ISA): VW bytes widened to 32-bit lanes, the sign moved
// to bit 31 and the 7 exponent+mantissa bits placed under fp32's exponent field, then one
// multiply by 2^(127 - bias + PRE) (exact for every finite byte, subnormals included, as
// long as the FPU does not treat subnormal inputs as zero: MXCSR DAZ, off unless
// torch.set_flush_denormal(True)); the top exponent blended to torch's inf / NaN bits.
#pragma once

#include "vec_exp.h"

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

namespace kvb_fp8 {

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
constexpr int MAX_BS = 256;  // tokens per block the score rows hold

#define F8_INLINE inline __attribute__((always_inline))

// Keeps v in a register (GCC otherwise may rematerialize a converted vector per use).
#if defined(__x86_64__) || defined(__i386__)
#define F8_IN_REGISTER(v) asm("" : "+x"(v))
#else
#define F8_IN_REGISTER(v) ((void)0)
#endif

// ---------------------------------------------------------------------------------------
// Conversions

// The float value of every fp8 byte: mantissa bits `man`, exponent bias `bias`; `has_inf`
// (e5m2) makes the top exponent inf / NaN, else (e4m3fn) only its all-ones mantissa is NaN.
inline std::array<float, 256> fp8_table(int man, int bias, bool has_inf) {
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
  static constexpr int kMan = MAN;
  static constexpr float kMul = 1.f;     // the values are the bytes' own
  static constexpr bool kScan = false;   // NaN bytes convert to NaN
  static const std::array<float, 256>& table() {
    static const std::array<float, 256> t = fp8_table(MAN, MAN == 3 ? 7 : 15, MAN == 2);
    return t;
  }
  static F8_INLINE void row(const uint8_t* src, float* dst, int n) {
    const float* t = table().data();
    for (int i = 0; i < n; ++i) dst[i] = t[src[i]];
  }
  static F8_INLINE vf vec(const uint8_t* p) {
    const float* t = table().data();
    vf x;
    for (int i = 0; i < VW; ++i) x[i] = t[p[i]];
    return x;
  }
  static F8_INLINE void pair(const uint8_t* p, vf& lo, vf& hi) {
    lo = vec(p);
    hi = vec(p + VW);
  }
  static F8_INLINE float one(uint8_t b) { return table()[b]; }
};

// General vector conversion, see the file comment. MAN = 3 (e4m3fn, bias 7) or 2 (e5m2,
// bias 15); the values come out times 2^PRE (exact).
template <int MAN, int PRE = 0>
struct Fp8Vec {
  static constexpr int kMan = MAN;
  static constexpr int BIAS = MAN == 3 ? 7 : 15;
  static constexpr int SHIFT = 23 - MAN;  // bit 0 of the mantissa goes to fp32 bit SHIFT
  static constexpr float kMul = PRE == 0 ? 1.f : float(1u << (-PRE));
  static constexpr bool kScan = false;

  // VW bytes at p widened to 32-bit lanes (one vpmovzxbd with AVX-512 / AVX2).
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

  static F8_INLINE vf vec(const uint8_t* p) { return from_lanes(widen(p)); }
  static F8_INLINE vf vec(vb bytes) { return from_lanes(__builtin_convertvector(bytes, vu)); }
  static F8_INLINE void pair(const uint8_t* p, vf& lo, vf& hi) {
    lo = vec(p);
    hi = vec(p + VW);
  }

  // The float32 values (times 2^PRE) of bytes held one per 32-bit lane.
  static F8_INLINE vf from_lanes(vu u) {
    const vu mag = u & 0x7fu;
    const vu sign = (u & 0x80u) << 24;
    vu bits = mag << SHIFT;
    vf x;
    std::memcpy(&x, &bits, sizeof(x));
    const vu rebias_bits = vu{} + (uint32_t(127 + 127 - BIAS + PRE) << 23);
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

#if defined(__F16C__) && (F8_VW == 8 || (F8_VW == 16 && defined(__AVX512F__)))
#define F8_HALF_ROUTE 1
// 2 VW bytes at p as the float16 patterns of their values (e4m3: times 2^-8), in order.
template <int MAN>
F8_INLINE void half_bits(const uint8_t* p, __m128i& a, __m128i& b) {  // AVX2: 16 bytes
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (MAN == 2) {
    a = _mm_unpacklo_epi8(_mm_setzero_si128(), x);
    b = _mm_unpackhi_epi8(_mm_setzero_si128(), x);
  } else {
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(x), 7),
                                       _mm256_set1_epi16(static_cast<short>(0xBF80)));
    a = _mm256_castsi256_si128(h);
    b = _mm256_extracti128_si256(h, 1);
  }
}
#if F8_VW == 16
template <int MAN>
F8_INLINE __m256i half_bits16(const uint8_t* p) {  // AVX-512: 16 bytes -> 16 halves
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (MAN == 2) return _mm256_slli_epi16(_mm256_cvtepu8_epi16(x), 8);
  return _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(x), 7),
                          _mm256_set1_epi16(static_cast<short>(0xBF80)));
}
#endif
#endif

// The fast conversion of a format: through float16 where F16C exists (see the file
// comment), else the general one. MAN = 3: values at 2^-8 (kMul = 256), and blocks must be
// scanned for NaN bytes first (kScan) where the float16 route runs.
template <int MAN>
struct Fp8Fast {
  static constexpr int kMan = MAN;
#ifdef F8_HALF_ROUTE
  static constexpr float kMul = MAN == 3 ? 256.f : 1.f;
  static constexpr bool kScan = MAN == 3;
  static F8_INLINE vf vec(const uint8_t* p) {
#if F8_VW == 8
    __m128i h;
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    if constexpr (MAN == 2) {
      h = _mm_unpacklo_epi8(_mm_setzero_si128(), x);
    } else {
      h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(x), 7),
                        _mm_set1_epi16(static_cast<short>(0xBF80)));
    }
    const __m256 f = _mm256_cvtph_ps(h);
#else
    const __m512 f = _mm512_cvtph_ps(half_bits16<MAN>(p));
#endif
    vf r;
    std::memcpy(&r, &f, sizeof(r));
    return r;
  }
  static F8_INLINE void pair(const uint8_t* p, vf& lo, vf& hi) {
#if F8_VW == 8
    __m128i a, b;
    half_bits<MAN>(p, a, b);
    const __m256 x = _mm256_cvtph_ps(a), y = _mm256_cvtph_ps(b);
    std::memcpy(&lo, &x, sizeof(lo));
    std::memcpy(&hi, &y, sizeof(hi));
#else
    lo = vec(p);
    hi = vec(p + VW);
#endif
  }
  static F8_INLINE float one(uint8_t b) { return Fp8Vec<MAN>::one(b) / kMul; }
  // dst[0, n) = the values of src[0, n) (e5m2 only: e4m3's route is scaled and NaN-blind).
  static F8_INLINE void row(const uint8_t* src, float* dst, int n) {
    static_assert(MAN == 2, "row() is the e5m2 prefill's conversion");
    int i = 0;
    for (; i + VW <= n; i += VW) {
      const vf x = vec(src + i);
      std::memcpy(dst + i, &x, sizeof(x));
    }
    for (; i < n; ++i) dst[i] = one(src[i]);
  }
#else
  using G = Fp8Vec<MAN, MAN == 3 ? -8 : 0>;
  static constexpr float kMul = G::kMul;
  static constexpr bool kScan = false;
  static F8_INLINE vf vec(const uint8_t* p) { return G::vec(p); }
  static F8_INLINE void pair(const uint8_t* p, vf& lo, vf& hi) { G::pair(p, lo, hi); }
  static F8_INLINE float one(uint8_t b) { return G::one(b); }
  static F8_INLINE void row(const uint8_t* src, float* dst, int n) {
    static_assert(MAN == 2, "row() is the e5m2 prefill's conversion");
    G::row(src, dst, n);
  }
#endif
};

// The conversion a block falls back to when its scan found a NaN byte: exact, NaN kept, at
// the fast route's scale.
template <int MAN>
using Fp8Exact = Fp8Vec<MAN, MAN == 3 ? -8 : 0>;

// True when some byte of `rows` rows (rowb bytes each, stride bytes apart) is an e4m3fn
// NaN (0x7F or 0xFF); rowb not a multiple of 32 counts as "may" (the exact path runs).
// Two instructions per 32 bytes: a signed and an unsigned running maximum.
F8_INLINE bool any_e4m3_nan(const uint8_t* p, int64_t stride, int rows, int64_t rowb) {
  typedef uint8_t v32u __attribute__((vector_size(32)));
  typedef int8_t v32s __attribute__((vector_size(32)));
  if (rowb % 32 != 0) return true;
  v32u mu = {};
  v32s ms = v32s{} + static_cast<int8_t>(-128);
  for (int t = 0; t < rows; ++t)
    for (int64_t d = 0; d < rowb; d += 32) {
      v32u x;
      std::memcpy(&x, p + t * stride + d, sizeof(x));
      mu = x > mu ? x : mu;
      const v32s s = (v32s)x;
      ms = s > ms ? s : ms;
    }
  uint64_t w[4], z[4];
  const v32u hit_u = (v32u)(mu == 0xFF), hit_s = (v32u)(ms == 0x7F);
  std::memcpy(w, &hit_u, sizeof(w));
  std::memcpy(z, &hit_s, sizeof(z));
  return (w[0] | w[1] | w[2] | w[3] | z[0] | z[1] | z[2] | z[3]) != 0;
}

// ---------------------------------------------------------------------------------------
// Horizontal sums and the softmax

inline float hsum(vf v) {
  float s = 0.f;
#pragma GCC unroll 16
  for (int i = 0; i < VW; ++i) s += v[i];
  return s;
}

inline float hmax(vf v) {
  float s = v[0];
#pragma GCC unroll 16
  for (int i = 1; i < VW; ++i) s = std::max(s, v[i]);
  return s;
}

#if F8_VW >= 8
typedef float v8f __attribute__((vector_size(32)));

// Pairwise sums of neighbouring lanes, AVX's hadd: [a0+a1, a2+a3, b0+b1, b2+b3, a4+a5, ...].
F8_INLINE v8f hadd8(v8f a, v8f b) {
  return __builtin_shufflevector(a, b, 0, 2, 8, 10, 4, 6, 12, 14) +
         __builtin_shufflevector(a, b, 1, 3, 9, 11, 5, 7, 13, 15);
}

// out[i] = the sum of a[i]'s lanes times scale, i < 8, in one tree of vector additions.
F8_INLINE void hsum8(const vf* a, float scale, float* out) {
  v8f x[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
#if F8_VW == 16
    x[i] = __builtin_shufflevector(a[i], a[i], 0, 1, 2, 3, 4, 5, 6, 7) +
           __builtin_shufflevector(a[i], a[i], 8, 9, 10, 11, 12, 13, 14, 15);
#else
    x[i] = a[i];
#endif
  }
  const v8f u0 = hadd8(hadd8(x[0], x[1]), hadd8(x[2], x[3]));
  const v8f u1 = hadd8(hadd8(x[4], x[5]), hadd8(x[6], x[7]));
  const v8f r = (__builtin_shufflevector(u0, u1, 0, 1, 2, 3, 8, 9, 10, 11) +
                 __builtin_shufflevector(u0, u1, 4, 5, 6, 7, 12, 13, 14, 15)) *
                scale;
  std::memcpy(out, &r, sizeof(r));
}
#endif

F8_INLINE vf vexp(vf x) { return kvb_cpu::vexp<vf, vi>(x); }

// One row's online-softmax step over one block's n scores sr[0, n): they become
// e^(s - m_new) with exact zeros up to the next whole vector; m, l are updated and the
// row's acc (D floats) rescaled when the running max moved.
F8_INLINE void row_softmax(float* sr, int n, float& m, float& l, float* acc, int D) {
  const int nv = n / VW * VW, ntv = (n + VW - 1) / VW * VW;
  vf vm = vf{} + NEG_INF;
  for (int t = 0; t < nv; t += VW) {
    vf x;
    std::memcpy(&x, sr + t, sizeof(x));
    vm = x > vm ? x : vm;
  }
  float bm = hmax(vm);
  for (int t = nv; t < n; ++t) bm = std::max(bm, sr[t]);
  const float mn = std::max(m, bm);
  const float corr = mn == m ? 1.f : std::exp(m - mn);  // 0 on the first block (m = -inf)
  for (int t = n; t < ntv; ++t) sr[t] = -1e30f;
  vf vs = {};
  for (int t = 0; t < ntv; t += VW) {
    vf x;
    std::memcpy(&x, sr + t, sizeof(x));
    x = vexp(x - mn);
    x = x < 1e-30f ? vf{} : x;  // the -1e30 pads become exact zeros
    std::memcpy(sr + t, &x, sizeof(x));
    vs += x;
  }
  l = l * corr + hsum(vs);
  m = mn;
  if (corr != 1.f)
    for (int d = 0; d < D; ++d) acc[d] *= corr;
}

// ---------------------------------------------------------------------------------------
// Prefetching the next block into L2, a few lines per call.
struct Prefetcher {
  const char* base = nullptr;
  int64_t rows = 0, rowb = 0, stride = 0, row = 0, off = 0;

  Prefetcher(const char* b, int64_t r, int64_t rb, int64_t st)
      : base(b), rows(r), rowb(rb), stride(st) {}

  int64_t lines() const { return rows * ((rowb + 63) / 64); }

  F8_INLINE void step(int64_t n) {
    while (n > 0 && row < rows) {
      const char* p = base + row * stride + off;
      const int64_t here = std::min(n, (rowb - off + 63) / 64);
      for (int64_t i = 0; i < here; ++i) __builtin_prefetch(p + i * 64, 0, 1);
      n -= here;
      off += here * 64;
      if (off >= rowb) {
        off = 0;
        ++row;
      }
    }
  }
};

inline int64_t per_call(int64_t lines, int64_t calls) {
  return (lines + calls - 1) / std::max<int64_t>(1, calls);
}

// ---------------------------------------------------------------------------------------
// Decode kernels

// s[r * MAX_BS + u] = (q_r . k_u) * scale for RN query rows (fp32, stride D) and TN K rows
// of bytes (k + u * ks), converted by C as they are loaded.
template <int RN, int TN, typename C>
F8_INLINE void dots(const float* q, int D, const uint8_t* k, int64_t ks, float scale, float* s) {
  const int D2 = D / (2 * VW) * (2 * VW), DV = D / VW * VW;
  vf a[RN][TN] = {};
  for (int d = 0; d < D2; d += 2 * VW) {
    vf k0[TN], k1[TN];
#pragma GCC unroll 4
    for (int u = 0; u < TN; ++u) {
      C::pair(k + u * ks + d, k0[u], k1[u]);
      F8_IN_REGISTER(k0[u]);
      F8_IN_REGISTER(k1[u]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < RN; ++r) {
      vf q0, q1;
      std::memcpy(&q0, q + r * D + d, sizeof(vf));
      std::memcpy(&q1, q + r * D + d + VW, sizeof(vf));
#pragma GCC unroll 4
      for (int u = 0; u < TN; ++u) {
        a[r][u] += q0 * k0[u];
        a[r][u] += q1 * k1[u];
      }
    }
  }
  if (D2 < DV) {  // one vector left
    vf kv[TN];
#pragma GCC unroll 4
    for (int u = 0; u < TN; ++u) kv[u] = C::vec(k + u * ks + D2);
#pragma GCC unroll 8
    for (int r = 0; r < RN; ++r) {
      vf qv;
      std::memcpy(&qv, q + r * D + D2, sizeof(vf));
#pragma GCC unroll 4
      for (int u = 0; u < TN; ++u) a[r][u] += qv * kv[u];
    }
  }
  static_assert(RN * TN <= 8, "the sums of one pass fit one 8-lane reduction");
  float sums[8];
#if F8_VW >= 8
  vf all[8] = {};
#pragma GCC unroll 8
  for (int i = 0; i < RN * TN; ++i) all[i] = a[i / TN][i % TN];
  hsum8(all, scale, sums);
#else
#pragma GCC unroll 8
  for (int i = 0; i < RN * TN; ++i) sums[i] = hsum(a[i / TN][i % TN]) * scale;
#endif
#pragma GCC unroll 8
  for (int r = 0; r < RN; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < TN; ++u) {
      float tail = 0.f;  // lanes past the last whole vector (D % VW of them)
      for (int d = DV; d < D; ++d) tail += q[r * D + d] * C::one(k[u * ks + d]);
      s[r * MAX_BS + u] = sums[r * TN + u] + tail * scale;
    }
}

// dots<RN, TN> for nr rows (4 at a time, then the rest).
template <int TN, typename C>
F8_INLINE void dots_rows(const float* q, int nr, int D, const uint8_t* k, int64_t ks,
                         float scale, float* s) {
  int r = 0;
  for (; r + 4 <= nr; r += 4) dots<4, TN, C>(q + r * D, D, k, ks, scale, s + r * MAX_BS);
  switch (nr - r) {
    case 3: dots<3, TN, C>(q + r * D, D, k, ks, scale, s + r * MAX_BS); break;
    case 2: dots<2, TN, C>(q + r * D, D, k, ks, scale, s + r * MAX_BS); break;
    case 1: dots<1, TN, C>(q + r * D, D, k, ks, scale, s + r * MAX_BS); break;
    default: break;
  }
}

// acc[r][0 .. CW VW) += sum_{t < nt} p[r][t] v[t][0 ..) for RN rows, CW vector columns
// (CW = 2: one pair conversion per token), V bytes converted by C as loaded.
template <int RN, int CW, typename C>
F8_INLINE void pv_column(float* acc, int D, const float* p, const uint8_t* v, int64_t vs,
                         int nt) {
  vf a[RN][CW];
#pragma GCC unroll 8
  for (int r = 0; r < RN; ++r)
#pragma GCC unroll 2
    for (int c = 0; c < CW; ++c) std::memcpy(&a[r][c], acc + r * D + c * VW, sizeof(vf));
  for (int t = 0; t < nt; ++t) {
    vf vv[CW];
    if constexpr (CW == 2) {
      C::pair(v + t * vs, vv[0], vv[1]);
    } else {
      vv[0] = C::vec(v + t * vs);
    }
#pragma GCC unroll 2
    for (int c = 0; c < CW; ++c) F8_IN_REGISTER(vv[c]);
#pragma GCC unroll 8
    for (int r = 0; r < RN; ++r) {
      const vf pr = vf{} + p[r * MAX_BS + t];
#pragma GCC unroll 2
      for (int c = 0; c < CW; ++c) a[r][c] += pr * vv[c];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < RN; ++r)
#pragma GCC unroll 2
    for (int c = 0; c < CW; ++c) std::memcpy(acc + r * D + c * VW, &a[r][c], sizeof(vf));
}

template <int CW, typename C>
F8_INLINE void pv_rows(float* acc, int nr, int D, const float* p, const uint8_t* v, int64_t vs,
                       int nt) {
  int r = 0;
  for (; r + 4 <= nr; r += 4) pv_column<4, CW, C>(acc + r * D, D, p + r * MAX_BS, v, vs, nt);
  switch (nr - r) {
    case 3: pv_column<3, CW, C>(acc + r * D, D, p + r * MAX_BS, v, vs, nt); break;
    case 2: pv_column<2, CW, C>(acc + r * D, D, p + r * MAX_BS, v, vs, nt); break;
    case 1: pv_column<1, CW, C>(acc + r * D, D, p + r * MAX_BS, v, vs, nt); break;
    default: break;
  }
}

// acc rows [0, nr) += p V over the nt V rows at v (stride vs); with a prefetcher, `per_step`
// of its lines before each column group.
template <typename C>
F8_INLINE void pv(float* acc, int nr, int D, const float* p, const uint8_t* v, int64_t vs, int nt,
                  Prefetcher& pf, int64_t per_step) {
  const int D2 = D / (2 * VW) * (2 * VW), DV = D / VW * VW;
  int d = 0;
  for (; d < D2; d += 2 * VW) {
    pf.step(per_step);
    pv_rows<2, C>(acc + d, nr, D, p, v + d, vs, nt);
  }
  if (d < DV) {
    pf.step(per_step);
    pv_rows<1, C>(acc + d, nr, D, p, v + d, vs, nt);
  }
  for (d = DV; d < D; ++d)
    for (int r = 0; r < nr; ++r) {
      float x = acc[r * D + d];
      for (int t = 0; t < nt; ++t) x += p[r * MAX_BS + t] * C::one(v[t * vs + d]);
      acc[r * D + d] = x;
    }
}

// What one decode task reads: the pools, their geometry and the scales.
struct DecodeGeo {
  const uint8_t* kc;
  const uint8_t* vc;
  int64_t bs, hkv;
  int D, G;
  float scale;       // softmax scale
  const float* ks;   // [hkv] K scales
};

// One block's K pass, softmax and V pass through conversion C (rows t0 .. t0 + n of the
// block at kb / vb, already offset to the task's first head and to t0).
template <typename C>
F8_INLINE void decode_block(const DecodeGeo& g, int h0, int nh, const uint8_t* kb,
                            const uint8_t* vb, int n, const float* qf, float* acc, float* m,
                            float* l, float* s, Prefetcher& kpf, Prefetcher& vpf) {
  const int D = g.D, G = g.G;
  const int64_t tok = g.hkv * D;
  const int64_t kstep = per_call(kpf.lines(), int64_t((n + 1) / 2) * nh);
  const int64_t vstep = per_call(vpf.lines(), int64_t(nh) * ((D + 2 * VW - 1) / (2 * VW)));
  for (int t = 0; t < n; t += 2) {
    for (int h = 0; h < nh; ++h) {
      kpf.step(kstep);
      const float sc = g.scale * g.ks[h0 + h] * C::kMul;
      const float* qh = qf + size_t(h) * G * D;
      float* sh = s + size_t(h) * G * MAX_BS + t;
      if (t + 2 <= n)
        dots_rows<2, C>(qh, G, D, kb + t * tok + int64_t(h) * D, tok, sc, sh);
      else
        dots_rows<1, C>(qh, G, D, kb + t * tok + int64_t(h) * D, tok, sc, sh);
    }
  }
  kpf.step(kpf.lines());
  for (int r = 0; r < nh * G; ++r)
    row_softmax(s + size_t(r) * MAX_BS, n, m[r], l[r], acc + size_t(r) * D, D);
  for (int h = 0; h < nh; ++h)
    pv<C>(acc + size_t(h) * G * D, G, D, s + size_t(h) * G * MAX_BS, vb + int64_t(h) * D, tok, n,
          vpf, vstep);
  vpf.step(vpf.lines());
}

// Decode task: one sequence (block table `table`, length len, window start lo: positions
// lo .. len - 1 only), KV heads [h0, h1). qf: the task's query rows as float32
// [(h1 - h0) * G][D]; on return acc [rows][D] holds sum p v (values at the conversion's
// scale: the caller multiplies by v_scale * kMul / l), m and l the softmax state. s:
// scratch [rows][MAX_BS]. MAN: 3 (e4m3fn) or 2 (e5m2).
template <int MAN, bool LUT = false>
void decode_task(const DecodeGeo& g, const int32_t* table, int64_t len, int64_t lo, int h0,
                 int h1, const float* qf, float* acc, float* m, float* l, float* s) {
  using Fast = typename std::conditional<LUT, Fp8Lut<MAN>, Fp8Fast<MAN>>::type;
  using Exact = Fp8Exact<MAN>;
  static_assert(!Fast::kScan || Fast::kMul == Exact::kMul, "a NaN block's values share the scale");
  const int D = g.D, nh = h1 - h0, rows = nh * g.G;
  for (int r = 0; r < rows; ++r) {
    m[r] = NEG_INF;
    l[r] = 0.f;
  }
  std::memset(acc, 0, sizeof(float) * size_t(rows) * D);
  const int64_t tok = g.hkv * D, blk = g.bs * tok;
  const int64_t rowb = int64_t(nh) * D;  // bytes of this task's heads in a token row
  const int64_t nblocks = (len + g.bs - 1) / g.bs;
  for (int64_t j = lo / g.bs; j < nblocks; ++j) {
    const int64_t t0 = std::max<int64_t>(0, lo - j * g.bs);  // window: skip these tokens
    const int n = int(std::min<int64_t>(g.bs, len - j * g.bs) - t0);
    const int64_t off = int64_t(table[j]) * blk + t0 * tok + int64_t(h0) * D;
    const uint8_t* kb = g.kc + off;
    const uint8_t* vb = g.vc + off;
    const bool more = j + 1 < nblocks;
    const int64_t pn = more ? table[j + 1] : table[j];
    const int64_t nn = more ? std::min<int64_t>(g.bs, len - (j + 1) * g.bs) : 0;
    Prefetcher kpf(reinterpret_cast<const char*>(g.kc + pn * blk + int64_t(h0) * D), nn, rowb, tok);
    Prefetcher vpf(reinterpret_cast<const char*>(g.vc + pn * blk + int64_t(h0) * D), nn, rowb, tok);
    if (Fast::kScan && (any_e4m3_nan(kb, tok, n, rowb) || any_e4m3_nan(vb, tok, n, rowb)))
      decode_block<Exact>(g, h0, nh, kb, vb, n, qf, acc, m, l, s, kpf, vpf);
    else
      decode_block<Fast>(g, h0, nh, kb, vb, n, qf, acc, m, l, s, kpf, vpf);
  }
}

// The multiplier of a finished row's acc: v_scale[h] * kMul / l (the fast and exact
// conversions of a format share kMul).
template <int MAN, bool LUT = false>
constexpr float out_mul() {
  using Fast = typename std::conditional<LUT, Fp8Lut<MAN>, Fp8Fast<MAN>>::type;
  return Fast::kMul;
}

}  // namespace kvb_fp8
