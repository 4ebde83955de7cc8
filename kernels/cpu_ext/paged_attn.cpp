// kvbench's CPU paged attention: decode and prefill/extend that read K/V blocks where they
// lie in the pool (no gathered copy of the context). Built at first use by
// kvbench.kernels.cpu_paged (torch.utils.cpp_extension, -O3 -march=native, OpenMP through
// at::parallel_for); inputs are validated in Python before any call reaches this file.
//
// Layouts (one layer): k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim],
// contiguous; block_tables int32 [batch, max_blocks] (row stride free); seq_lens int32
// [batch]; cu_seqlens_q int32 [batch + 1]. Query head h reads KV head h / group, so each KV
// head is loaded once for its whole group of query heads (GQA / MQA).
// Math: fp32 accumulation with an online softmax (running max m, sum l, unnormalized
// output acc) for fp32, fp16 and bf16 inputs; the output is stored in the input dtype.
// Only tokens below a sequence's length (decode) or at or below a query row's position
// (prefill) are read, so unwritten slots (NaN, garbage) never reach a result.
#include <torch/extension.h>

#include "vec_exp.h"
#include "fp8_decode.h"  // fp8 conversions, for the fp8 prefill (prefill_impl over Fp8Elem)
#include "task_counter.h"  // for_each_task: the decode's tasks by a shared counter

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
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

// Vector width in floats, from what the compiler may use (-march=native).
#if defined(__AVX512F__)
#define VW 16
#elif defined(__AVX__)
#define VW 8
#else
#define VW 4
#endif
typedef float vf __attribute__((vector_size(VW * 4)));
typedef int32_t vi __attribute__((vector_size(VW * 4)));
typedef uint16_t vh __attribute__((vector_size(VW * 2)));
typedef uint32_t vu __attribute__((vector_size(VW * 4)));


constexpr int QCHUNK = 4;    // query rows whose dot products share one pass over a K row
constexpr int KPAIR = 2;     // K rows (tokens) one pass scores at once: QCHUNK * KPAIR chains
constexpr int VPAIR = 2;     // VW-wide columns of V one pass accumulates at once
constexpr int MAX_BS = 256;  // tokens per block the score rows hold (multiple of VW)
constexpr int TILE = 16;     // tokens a decode computes (and prefetches) at a time
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

inline float bf16_to_f(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Loads VW elements (or one) of T as fp32, and stores one fp32 as T.
template <typename T>
struct Ld;

#define KVB_PAIR_INLINE inline __attribute__((always_inline))

template <>
struct Ld<float> {
  static inline vf vec(const float* p) {
    vf v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  static inline float one(const float* p) { return *p; }
  static inline void store(float* p, float x) { *p = x; }
};

template <>
struct Ld<c10::BFloat16> {
  static inline vf vec(const c10::BFloat16* p) {
    vh h;
    std::memcpy(&h, p, sizeof(h));
    vu u = __builtin_convertvector(h, vu) << 16;
    vf v;
    std::memcpy(&v, &u, sizeof(v));
    return v;
  }
  static inline float one(const c10::BFloat16* p) { return bf16_to_f(p->x); }
  static inline void store(c10::BFloat16* p, float x) { p->x = f_to_bf16(x); }
};

template <>
struct Ld<c10::Half> {
  // F16C's vcvtph2ps converts a whole vector in one instruction; the generic _Float16
  // conversion compiles to a slower sequence on CPUs without AVX512-FP16.
  static inline vf vec(const c10::Half* p) {
#if VW == 16 && defined(__AVX512F__)
    const __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    vf v;
    std::memcpy(&v, &f, sizeof(v));
    return v;
#elif VW == 8 && defined(__F16C__)
    const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    vf v;
    std::memcpy(&v, &f, sizeof(v));
    return v;
#else
    vf v;
    for (int i = 0; i < VW; ++i) v[i] = float(p[i]);
    return v;
#endif
  }
  static inline float one(const c10::Half* p) { return float(*p); }
  static inline void store(c10::Half* p, float x) { *p = c10::Half(x); }
};

// bf16 K/V read two vectors at a time in the decode (head dims that are a multiple of
// 2 * VW): one 2 * VW-element load holds the elements as 32-bit pairs, whose high halves are
// the odd elements as fp32 once the low halves are masked off, and whose low halves are the
// even elements once shifted up 16 bits: two integer operations per 2 * VW elements where a
// widening load and a shift per VW elements were needed. The dot products and P V then run
// in an order where each 2 * VW group of the head dim holds its even elements first, then
// its odd ones: the query is permuted so on the way in and the output back on the way out.
struct Bf16Pair {
  uint16_t x;
};

template <>
struct Ld<Bf16Pair> {
  static inline vf vec(const Bf16Pair* p) {
    return Ld<c10::BFloat16>::vec(reinterpret_cast<const c10::BFloat16*>(p));
  }
  static inline float one(const Bf16Pair* p) { return bf16_to_f(p->x); }
  // Elements [0, 2 VW) at p: ev gets the even ones, od the odd ones (as fp32).
  static KVB_PAIR_INLINE void pair(const Bf16Pair* p, vf& ev, vf& od) {
    vu u;
    std::memcpy(&u, p, sizeof(u));
    const vu e = u << 16, o = u & 0xffff0000u;
    std::memcpy(&ev, &e, sizeof(ev));
    std::memcpy(&od, &o, sizeof(od));
  }
};

// Whether decode over T reads pairs (see Bf16Pair).
template <typename T>
constexpr bool kPairs = std::is_same<T, Bf16Pair>::value;

// An fp8 pool element (MAN = 3: e4m3fn, 2: e5m2), for the prefill over fp8 K/V: its K and V
// rows are packed to fp32 through fp8_decode.h's conversions, the values times 1 / kMul
// (e4m3: 2^-8, exact; the query and output scales take the kMul back), so the fp8 prefill
// is this file's prefill with a different packing step (issue 39 item 2).
template <int MAN>
struct Fp8Elem {
  uint8_t b;
};

template <int MAN>
struct Ld<Fp8Elem<MAN>> {
  static constexpr int kMan = MAN;
  static constexpr float kMul = kvb_fp8::Fp8Fast<MAN>::kMul;
  static inline vf vec(const Fp8Elem<MAN>* p) {
    return kvb_fp8::Fp8Exact<MAN>::vec(reinterpret_cast<const uint8_t*>(p));
  }
  static inline float one(const Fp8Elem<MAN>* p) { return kvb_fp8::Fp8Exact<MAN>::one(p->b); }
};

template <typename T>
constexpr bool kFp8 = false;
template <int MAN>
constexpr bool kFp8<Fp8Elem<MAN>> = true;

// Where head-dim element d sits in the pair order.
inline int pair_slot(int d) {
  const int g = d / (2 * VW), i = d % (2 * VW);
  return g * 2 * VW + (i % 2) * VW + i / 2;
}

// A vector's lanes folded into one by `op` (a lane-wise binary function that also takes two
// floats), halving the vector at each step: hsum and hmax below.
template <typename Op>
inline float hreduce(vf v, Op op) {
  typedef float v4 __attribute__((vector_size(16)));
#if VW == 16
  typedef float v8 __attribute__((vector_size(32)));
  const v8 a = op(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
  v4 c = op(__builtin_shufflevector(a, a, 0, 1, 2, 3), __builtin_shufflevector(a, a, 4, 5, 6, 7));
#elif VW == 8
  v4 c = op(__builtin_shufflevector(v, v, 0, 1, 2, 3), __builtin_shufflevector(v, v, 4, 5, 6, 7));
#else
  v4 c = v;
#endif
  c = op(c, __builtin_shufflevector(c, c, 2, 3, 0, 1));
  return op(c[0], c[1]);
}

// Sum of a vector's lanes, as (c0 + c2) + (c1 + c3) of its halved 4-lane form.
inline float hsum(vf v) {
  return hreduce(v, [](auto a, auto b) { return a + b; });
}

// Largest of a vector's lanes.
inline float hmax(vf v) {
  return hreduce(v, [](auto a, auto b) { return a > b ? a : b; });
}

#define KVB_INLINE inline __attribute__((always_inline))

// Keeps v in a register: GCC otherwise folds a loaded K or V vector into every FMA that
// uses it as a memory operand, loading it once per query row (12 loads per 8 FMAs instead
// of 6), and the loads, not the FMAs, then bound the loop.
#if defined(__x86_64__) || defined(__i386__)
#define KVB_IN_REGISTER(v) asm("" : "+x"(v))
#else
#define KVB_IN_REGISTER(v) ((void)0)
#endif

#if VW >= 8
typedef float v8f __attribute__((vector_size(32)));

// Pairwise sums of neighbouring lanes, AVX's hadd: [a0+a1, a2+a3, b0+b1, b2+b3, a4+a5, ...].
KVB_INLINE v8f hadd8(v8f a, v8f b) {
  return __builtin_shufflevector(a, b, 0, 2, 8, 10, 4, 6, 12, 14) +
         __builtin_shufflevector(a, b, 1, 3, 9, 11, 5, 7, 13, 15);
}

// out[i] = the sum of a[i]'s lanes for i < 8, in one tree of 7 vector additions (8 separate
// hsums cost about ten times the instructions, a third of a K pass at head dim 128).
KVB_INLINE void hsum8(const vf* a, float scale, float* out) {
  v8f x[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
#if VW == 16
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

// e^x lane by lane for x <= 0 (vec_exp.h).
inline vf vexp(vf x) { return kvb_cpu::vexp<vf, vi>(x); }

// Dot products of RN query rows (fp32, row stride D) with TN K rows (kr, kr + ks, ...),
// times scale, written to s[r * MAX_BS + u] for token u. RN and TN are compile-time counts so
// the RN * TN sums stay in registers: that many independent FMA chains hide the FMA latency,
// and each query vector loaded serves TN tokens.
template <int RN, int TN, typename T>
KVB_INLINE void dots(const float* q, int D, const T* kr, int64_t ks, float scale, float* s) {
  const int DV = D / VW * VW;
  vf a[RN][TN] = {};
  if constexpr (kPairs<T>) {  // D % (2 VW) == 0 here; q is in the pair order
    for (int d = 0; d < DV; d += 2 * VW) {
      vf ke[TN], ko[TN];
#pragma GCC unroll 4
      for (int u = 0; u < TN; ++u) {
        Ld<T>::pair(kr + u * ks + d, ke[u], ko[u]);
        KVB_IN_REGISTER(ke[u]);
        KVB_IN_REGISTER(ko[u]);
      }
#pragma GCC unroll 8
      for (int r = 0; r < RN; ++r) {
        vf qe, qo;
        std::memcpy(&qe, q + r * D + d, sizeof(qe));
        std::memcpy(&qo, q + r * D + d + VW, sizeof(qo));
#pragma GCC unroll 4
        for (int u = 0; u < TN; ++u) {
          a[r][u] += qe * ke[u];
          a[r][u] += qo * ko[u];
        }
      }
    }
  } else
  for (int d = 0; d < DV; d += VW) {
    vf kv[TN];
#pragma GCC unroll 4
    for (int u = 0; u < TN; ++u) {
      kv[u] = Ld<T>::vec(kr + u * ks + d);
      KVB_IN_REGISTER(kv[u]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < RN; ++r) {
      vf qv;
      std::memcpy(&qv, q + r * D + d, sizeof(qv));
      KVB_IN_REGISTER(qv);
#pragma GCC unroll 4
      for (int u = 0; u < TN; ++u) a[r][u] += qv * kv[u];
    }
  }
  static_assert(RN * TN <= 8, "the sums of one pass fit one 8-lane reduction");
  float sums[8];
#if VW >= 8
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
      for (int d = DV; d < D; ++d) tail += q[r * D + d] * Ld<T>::one(kr + u * ks + d);
      s[r * MAX_BS + u] = sums[r * TN + u] + tail * scale;
    }
}

// dots<RN, TN> for a row count known only at run time (nr - r0 < QCHUNK rows left).
template <int TN, typename T>
inline void dots_rows(const float* q, int nr, int D, const T* kr, int64_t ks, float scale,
                      float* s) {
  int r = 0;
  for (; r + QCHUNK <= nr; r += QCHUNK)
    dots<QCHUNK, TN, T>(q + r * D, D, kr, ks, scale, s + r * MAX_BS);
  switch (nr - r) {
    case 3: dots<3, TN, T>(q + r * D, D, kr, ks, scale, s + r * MAX_BS); break;
    case 2: dots<2, TN, T>(q + r * D, D, kr, ks, scale, s + r * MAX_BS); break;
    case 1: dots<1, TN, T>(q + r * D, D, kr, ks, scale, s + r * MAX_BS); break;
    default: break;
  }
}

// Scores of nr query rows against the nt K rows at k (token stride ks):
// s[r * MAX_BS + t] for r < nr, t < nt. Tokens go KPAIR at a time.
template <typename T>
inline void scores(const float* q, int nr, int D, const T* k, int64_t ks, int nt, float scale,
                   float* s) {
  int t = 0;
  for (; t + KPAIR <= nt; t += KPAIR) dots_rows<KPAIR, T>(q, nr, D, k + t * ks, ks, scale, s + t);
  for (; t < nt; ++t) dots_rows<1, T>(q, nr, D, k + t * ks, ks, scale, s + t);
}

// One row's online-softmax step over one block: scores sr[0, n) (tokens n .. nt - 1 are
// masked) become e^(s - m_new) with exact zeros past n; m and l are updated and acc
// rescaled. n <= 0: the row sees none of the block (its probabilities are all zero).
inline void row_softmax(float* sr, int n, int nt, float& m, float& l, float* acc, int D) {
  const int ntv = (nt + VW - 1) / VW * VW;
  if (n <= 0) {
    std::fill(sr, sr + ntv, 0.f);
    return;
  }
  const int nv = n / VW * VW;
  vf vm = vf{} + NEG_INF;
  for (int t = 0; t < nv; t += VW) {
    vf x;
    std::memcpy(&x, sr + t, sizeof(x));
    vm = x > vm ? x : vm;
  }
  float bm = hmax(vm);
  for (int t = nv; t < n; ++t) bm = std::max(bm, sr[t]);
  const float mn = std::max(m, bm);
  // exp only when the running max moved (0 on the row's first block, where m = -inf).
  const float corr = mn == m ? 1.f : std::exp(m - mn);
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

// Requests (into L2) a strided byte range line by line, a few lines per call: `rows` rows of
// `rowb` bytes, `stride` bytes apart. Issuing a whole block's prefetches at once stalls on
// the core's queue of outstanding misses; spread over the arithmetic they overlap with it.
struct Prefetcher {
  const char* base = nullptr;
  int64_t rows = 0, rowb = 0, stride = 0, row = 0, off = 0;

  Prefetcher(const char* b, int64_t r, int64_t rb, int64_t st)
      : base(b), rows(r), rowb(rb), stride(st) {}

  int64_t lines() const { return rows * ((rowb + 63) / 64); }

  inline void step(int64_t n) {
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

// Lines per step for `calls` evenly spaced steps over `lines` lines (at least one).
inline int64_t per_call(int64_t lines, int64_t calls) { return (lines + calls - 1) / std::max<int64_t>(1, calls); }

// acc[r][d0 .. d0 + CW * VW) += sum_{t < nt} p[r][t] * v[t][d0 ..) for RN rows and CW
// vector columns held in registers (RN * CW independent FMA chains; each probability
// broadcast serves CW columns).
template <int RN, int CW, typename T>
KVB_INLINE void pv_column(float* acc, int D, const float* p, const T* v, int64_t vs, int nt) {
  vf a[RN][CW];
#pragma GCC unroll 8
  for (int r = 0; r < RN; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < CW; ++c) std::memcpy(&a[r][c], acc + r * D + c * VW, sizeof(vf));
  for (int t = 0; t < nt; ++t) {
    vf vv[CW];
    if constexpr (kPairs<T> && CW == 2) {  // columns d .. d + 2 VW in the pair order
      Ld<T>::pair(v + t * vs, vv[0], vv[1]);
      KVB_IN_REGISTER(vv[0]);
      KVB_IN_REGISTER(vv[1]);
    } else {
#pragma GCC unroll 4
      for (int c = 0; c < CW; ++c) {
        vv[c] = Ld<T>::vec(v + t * vs + c * VW);
        KVB_IN_REGISTER(vv[c]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < RN; ++r) {
      const float pr = p[r * MAX_BS + t];
#pragma GCC unroll 4
      for (int c = 0; c < CW; ++c) a[r][c] += pr * vv[c];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < RN; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < CW; ++c) std::memcpy(acc + r * D + c * VW, &a[r][c], sizeof(vf));
}

// pv_column<RN, CW> for a row count known only at run time.
template <int CW, typename T>
inline void pv_rows(float* acc, int nr, int D, const float* p, const T* v, int64_t vs, int nt) {
  int r = 0;
  for (; r + QCHUNK <= nr; r += QCHUNK)
    pv_column<QCHUNK, CW, T>(acc + r * D, D, p + r * MAX_BS, v, vs, nt);
  switch (nr - r) {
    case 3: pv_column<3, CW, T>(acc + r * D, D, p + r * MAX_BS, v, vs, nt); break;
    case 2: pv_column<2, CW, T>(acc + r * D, D, p + r * MAX_BS, v, vs, nt); break;
    case 1: pv_column<1, CW, T>(acc + r * D, D, p + r * MAX_BS, v, vs, nt); break;
    default: break;
  }
}

// acc[r] += sum_t p[r][t] * V[t] for rows [0, nr) over the nt V rows at v (token stride vs).
// Columns go VPAIR vectors at a time, then one vector, then lane by lane (D % VW).
// With a prefetcher, `per_step` of its lines are requested before each column group, so
// the next block streams in at the pace of the arithmetic.
template <typename T>
inline void pv(float* acc, int nr, int D, const float* p, const T* v, int64_t vs, int nt,
               Prefetcher* pf = nullptr, int64_t per_step = 0) {
  const int DV = D / VW * VW;
  int d = 0;
  for (; d + VPAIR * VW <= DV; d += VPAIR * VW) {
    if (pf) pf->step(per_step);
    pv_rows<VPAIR, T>(acc + d, nr, D, p, v + d, vs, nt);
  }
  for (; d < DV; d += VW) {
    if (pf) pf->step(per_step);
    pv_rows<1, T>(acc + d, nr, D, p, v + d, vs, nt);
  }
  for (d = DV; d < D; ++d)
    for (int r = 0; r < nr; ++r) {
      float x = acc[r * D + d];
      for (int t = 0; t < nt; ++t) x += p[r * MAX_BS + t] * Ld<T>::one(v + t * vs + d);
      acc[r * D + d] = x;
    }
}

struct Geo {
  int64_t num_blocks, bs, hkv, D, hq, group;
};

// The first key a query at position pos reads, by the kernels' signed `window` argument
// (kernels/cpu_paged.py passes it): > 0 a sliding window (pos - window + 1, at least 0),
// < 0 chunked local attention of -window tokens (the chunk's start, floor(pos / C) * C),
// 0 full attention (0). The one place these kernels know the attention kinds.
inline int64_t first_key(int64_t pos, int64_t window) {
  if (window > 0) return std::max<int64_t>(0, pos - window + 1);
  if (window < 0 && pos > 0) return pos - pos % -window;
  return 0;
}

// Decode task: sequence with block table `table` and length len, KV heads [h0, h1), its
// logical blocks [j0, j1), reading positions lo .. len - 1 only (lo > 0: a sliding window
// whose first block j0 is partial; its tokens before lo are skipped, not read). Writes the unnormalized state of query heads h0*G .. h1*G - 1
// into pacc [Hq][D], pm [Hq], pl [Hq].
// Each block is read twice in address order per head group: the K pass walks it token by
// token (a token's heads are one contiguous row), the V pass head by head with the group's
// accumulators in registers. While one block is computed the next one's K and V rows are
// prefetched into L2, spread over the passes so the prefetches never come in one burst.
// DC: the head dim when fixed at compile time (see with_head_dim), 0 when read from g.D.
template <typename T, int DC>
void decode_task(const T* q, int64_t qs_h, const T* kc, const T* vc, const int32_t* table,
                 int64_t len, const Geo& g, int h0, int h1, int64_t j0, int64_t j1, float scale,
                 float* pacc, float* pm, float* pl, std::vector<float>& buf, int64_t lo = 0) {
  const int D = DC > 0 ? DC : int(g.D), G = int(g.group), nh = h1 - h0;
  const int nrows = nh * G;
  buf.resize(size_t(nrows) * D + size_t(nrows) * MAX_BS);
  float* qf = buf.data();
  float* s = qf + size_t(nrows) * D;  // [nrows][MAX_BS] scores, then probabilities
  float* acc = pacc + size_t(h0) * G * D;
  float* m = pm + h0 * G;
  float* l = pl + h0 * G;
  for (int r = 0; r < nrows; ++r) {
    const T* qr = q + (h0 * G + r) * qs_h;
    if constexpr (kPairs<T>) {  // the pair order: each 2 VW group's even elements, then odd
      for (int d = 0; d < D; ++d)
        qf[r * D + pair_slot(d)] = Ld<T>::one(qr + d);
    } else {
      for (int d = 0; d < D; ++d) qf[r * D + d] = Ld<T>::one(qr + d);
    }
    m[r] = NEG_INF;
    l[r] = 0.f;
  }
  std::memset(acc, 0, sizeof(float) * size_t(nrows) * D);
  const int64_t tok = g.hkv * D;  // elements per token row
  const int64_t blk = g.bs * tok;
  const int64_t rowb = int64_t(nh) * D * sizeof(T);  // bytes of this task's heads in a row
  const int64_t strideb = tok * sizeof(T);
  // A block is computed in tiles of at most TILE tokens (tiles start at multiples of TILE
  // within the block; a window's first tile is cut at its first key), and the next tile
  // is the one prefetched: the rest of this block, or the next block's first tile. At
  // blocks of up to TILE tokens a tile is the block. Larger blocks are not prefetched
  // whole while the current one is computed, which at 32 tokens x 8 heads x 128 x fp32
  // (128 KiB of K and as much of V a block) fills a 512 KiB L2 with two blocks in flight:
  // single-threaded at 8 x 4096, blocks of 32 took 1.13x the time of blocks of 16.
  for (int64_t j = j0; j < j1; ++j) {
    const int64_t pb = table[j];
    const int64_t end = std::min<int64_t>(g.bs, len - j * g.bs);  // tokens of this block
    for (int64_t t0 = std::max<int64_t>(0, lo - j * g.bs); t0 < end;) {  // window: skip its first tokens
      const int64_t t1 = std::min<int64_t>(end, (t0 / TILE + 1) * TILE);
      const int nt = int(t1 - t0);
      const T* kb = kc + pb * blk + t0 * tok + int64_t(h0) * D;
      const T* vb = vc + pb * blk + t0 * tok + int64_t(h0) * D;
      // The next tile of this sequence streams in while this one is computed: its K rows
      // during the K pass (a share before each (token pair, head) call), its V rows during
      // the V pass (a share before each (head, column group) call).
      int64_t pn = pb, at = 0, nn = 0;  // next tile: block, first token, tokens
      if (t1 < end) {
        at = t1;
        nn = std::min<int64_t>(end, t1 + TILE) - t1;
      } else if (j + 1 < j1) {
        pn = table[j + 1];
        nn = std::min<int64_t>({g.bs, int64_t(TILE), len - (j + 1) * g.bs});
      }
      Prefetcher kpf((const char*)(kc + pn * blk + at * tok + int64_t(h0) * D), nn, rowb, strideb);
      Prefetcher vpf((const char*)(vc + pn * blk + at * tok + int64_t(h0) * D), nn, rowb, strideb);
      const int64_t kstep = per_call(kpf.lines(), int64_t((nt + KPAIR - 1) / KPAIR) * nh);
      const int64_t vstep = per_call(vpf.lines(), int64_t(nh) * ((D / VW + VPAIR - 1) / VPAIR));
      for (int t = 0; t < nt; t += KPAIR) {
        const int tn = std::min(KPAIR, nt - t);
        for (int h = 0; h < nh; ++h) {
          kpf.step(kstep);
          scores<T>(qf + size_t(h) * G * D, G, D, kb + t * tok + int64_t(h) * D, tok, tn, scale,
                    s + size_t(h) * G * MAX_BS + t);
        }
      }
      kpf.step(kpf.lines());
      for (int r = 0; r < nrows; ++r)
        row_softmax(s + size_t(r) * MAX_BS, nt, nt, m[r], l[r], acc + size_t(r) * D, D);
      for (int h = 0; h < nh; ++h) {
        pv<T>(acc + size_t(h) * G * D, G, D, s + size_t(h) * G * MAX_BS, vb + int64_t(h) * D, tok,
              nt, &vpf, vstep);
      }
      vpf.step(vpf.lines());
      t0 = t1;
    }
  }
}

// The decode tasks come from a shared counter: for_each_task (task_counter.h).

template <typename T, int DC>
void decode_impl(const torch::Tensor& query, const torch::Tensor& k_cache,
                 const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                 const torch::Tensor& seq_lens, double scale, torch::Tensor& out,
                 int64_t max_seq_len, int64_t partition_blocks, int64_t heads_per_task,
                 int64_t window) {
  // bf16 at a compile-time head dim that is a multiple of 2 VW reads pairs (Bf16Pair): the
  // partial states are then in the pair order, put back as the output is stored.
  constexpr bool pairs = std::is_same<T, c10::BFloat16>::value && (DC > 0) &&
                         (DC % (2 * VW) == 0);
  using K = typename std::conditional<pairs, Bf16Pair, T>::type;
  const auto slot = [](int64_t d) { return kPairs<K> ? int64_t(pair_slot(int(d))) : d; };
  const int64_t B = query.size(0);
  Geo g{k_cache.size(0), k_cache.size(1), k_cache.size(2), k_cache.size(3), query.size(1), 0};
  g.group = g.hq / g.hkv;
  // window != 0: a sequence reads from the first block its window (or chunk, < 0) touches,
  // so at most |window| + bs - 1 tokens from a block boundary; 0: full attention.
  const int64_t reach = window < 0 ? -window : window;
  const int64_t span = reach > 0 ? std::min(max_seq_len, reach + g.bs - 1) : max_seq_len;
  const int64_t used_blocks = (span + g.bs - 1) / g.bs;
  const int64_t P = std::max<int64_t>(1, (used_blocks + partition_blocks - 1) / partition_blocks);
  const int64_t HT = (g.hkv + heads_per_task - 1) / heads_per_task;
  const T* q = query.data_ptr<T>();
  const T* kc = k_cache.data_ptr<T>();
  const T* vc = v_cache.data_ptr<T>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int64_t tstride = block_tables.stride(0);
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int64_t qs_b = query.stride(0), qs_h = query.stride(1);
  const int64_t D = DC > 0 ? DC : g.D, Hq = g.hq;
  T* o = out.data_ptr<T>();
  const int64_t os_b = out.stride(0), os_h = out.stride(1);
  // Partial states per (sequence, partition): acc [Hq][D], m and l [Hq].
  std::vector<float> acc(size_t(B * P * Hq * D)), mm(size_t(B * P * Hq)), ll(size_t(B * P * Hq));
  for_each_task(B * HT * P, [&](int64_t task, std::vector<float>& buf) {
    const int64_t b = task / (HT * P), ht = (task / P) % HT, p = task % P;
    const int64_t len = lens[b];
    const int64_t lo = first_key(len - 1, window);
    const int64_t j0 = lo / g.bs + p * partition_blocks;
    const int64_t j1 = std::min((len + g.bs - 1) / g.bs, j0 + partition_blocks);
    const int h0 = int(ht * heads_per_task);
    const int h1 = int(std::min(g.hkv, h0 + heads_per_task));
    float* pm = mm.data() + (b * P + p) * Hq;
    float* pl = ll.data() + (b * P + p) * Hq;
    if (j0 >= j1) {  // a partition past this sequence's length contributes nothing
      for (int64_t r = h0 * g.group; r < h1 * g.group; ++r) pm[r] = NEG_INF;
      return;
    }
    float* pacc = acc.data() + (b * P + p) * Hq * D;
    decode_task<K, DC>(reinterpret_cast<const K*>(q + b * qs_b), qs_h,
                       reinterpret_cast<const K*>(kc), reinterpret_cast<const K*>(vc),
                       tables + b * tstride, len, g, h0, h1, j0, j1, float(scale), pacc, pm,
                       pl, buf, lo);
    if (P == 1) {  // one partition: normalize here, with no second parallel region
      for (int64_t r = h0 * g.group; r < h1 * g.group; ++r) {
        const float inv = 1.f / pl[r];
        T* orow = o + b * os_b + r * os_h;
        for (int64_t d = 0; d < D; ++d) Ld<T>::store(orow + d, pacc[r * D + slot(d)] * inv);
      }
    }
  });
  if (P == 1) return;
  // Merge the partitions and normalize: sum_p e^(m_p - M) acc_p / sum_p e^(m_p - M) l_p.
  at::parallel_for(0, B * Hq, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> row(D);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / Hq, h = i % Hq;
      float M = NEG_INF;
      for (int64_t p = 0; p < P; ++p) M = std::max(M, mm[(b * P + p) * Hq + h]);
      float L = 0.f;
      std::fill(row.begin(), row.end(), 0.f);
      for (int64_t p = 0; p < P; ++p) {
        const float mp = mm[(b * P + p) * Hq + h];
        if (mp == NEG_INF) continue;
        const float w = std::exp(mp - M);
        L += w * ll[(b * P + p) * Hq + h];
        const float* a = acc.data() + ((b * P + p) * Hq + h) * D;
        for (int64_t d = 0; d < D; ++d) row[d] += w * a[d];
      }
      const float inv = 1.f / L;
      T* orow = o + b * os_b + h * os_h;
      for (int64_t d = 0; d < D; ++d) Ld<T>::store(orow + d, row[slot(d)] * inv);
    }
  });
}

// ---- Prefill / extend: each task a pair of small GEMMs per chunk of keys ----------------
// A task holds the query rows of one (sequence, KV head, tile of query tokens): the tile's
// tokens times the GQA group, in position order. For each chunk of PF_CHUNK keys it
//   1. scores S^T = K Q^T with the rows across vector lanes (panels of VW rows, Q packed
//      once per task as [panel][d][lane]): a PF_MT x PF_NR register tile, each broadcast K
//      element feeding PF_NR FMAs and each Q vector PF_MT, no horizontal sums;
//   2. runs the online softmax for VW rows at once (running max, correction and sum are
//      vectors; exp by the polynomial vexp), masking causally only on chunks that reach
//      past a panel's first position;
//   3. accumulates O^T += V^T P^T with O^T [panel][d][lane] (rows across lanes again): a
//      PF_MT x PF_NR register tile, each V element broadcast into PF_NR FMAs and each
//      probability vector (the softmax's own layout) feeding PF_MT; a panel's running-max
//      correction is one vector multiply as its accumulators are loaded.
// Each chunk's K and V rows are first packed into contiguous fp32 scratch (see
// prefill_impl for why).
constexpr int PF_MT = 6;      // keys (scores) / head-dim elements (P V) per micro-tile
constexpr int PF_NR = 2;      // row panels (VW rows each) per micro-tile
constexpr int PF_CHUNK = 48;  // keys per softmax step (a multiple of PF_MT)
constexpr int PF_ROWS = PF_NR * VW;  // rows are padded to a multiple of this

// The float at p in every lane: one broadcast load (`vf{} + x` would add 0 to keep -0.0's
// sign, a dependent add before each broadcast in the micro-kernels below).
KVB_INLINE vf splat(const float* p) {
#if VW == 16 && defined(__AVX512F__)
  const __m512 x = _mm512_set1_ps(*p);
#elif VW == 8 && defined(__AVX__)
  const __m256 x = _mm256_broadcast_ss(p);
#else
  const vf x = {*p, *p, *p, *p};
#endif
  vf v;
  std::memcpy(&v, &x, sizeof(v));
  return v;
}

// st[i * spanel + m * VW + lane] = sum_d k[m][d] * qt[i * qpanel + d * VW + lane] for MT keys
// and NR panels (the scale is already in q).
template <int MT, int NR, int DC>
KVB_INLINE void pf_scores(const float* const* kp, const float* qt, int D, int64_t qpanel,
                          float* st, int64_t spanel) {
  const int Dn = DC > 0 ? DC : D;
  const float* k[MT];
#pragma GCC unroll 8
  for (int m = 0; m < MT; ++m) k[m] = kp[m];
  vf a[MT][NR] = {};
#pragma GCC unroll 4
  for (int d = 0; d < Dn; ++d) {
    vf q[NR];
#pragma GCC unroll 4
    for (int i = 0; i < NR; ++i) {
      std::memcpy(&q[i], qt + i * qpanel + d * VW, sizeof(vf));
      KVB_IN_REGISTER(q[i]);
    }
#pragma GCC unroll 8
    for (int m = 0; m < MT; ++m) {
      const vf kb = splat(k[m] + d);
#pragma GCC unroll 4
      for (int i = 0; i < NR; ++i) a[m][i] += kb * q[i];
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MT; ++m)
#pragma GCC unroll 4
    for (int i = 0; i < NR; ++i) std::memcpy(st + i * spanel + m * VW, &a[m][i], sizeof(vf));
}

// pf_scores for the keys [0, nt) of a chunk and the panels of one panel group.
template <int DC>
inline void pf_scores_keys(const float* const* kp, int nt, const float* qt, int D,
                           int64_t qpanel, float* st, int64_t spanel) {
  int t = 0;
  for (; t + PF_MT <= nt; t += PF_MT)
    pf_scores<PF_MT, PF_NR, DC>(kp + t, qt, D, qpanel, st + t * VW, spanel);
  switch (nt - t) {
    case 5: pf_scores<5, PF_NR, DC>(kp + t, qt, D, qpanel, st + t * VW, spanel); break;
    case 4: pf_scores<4, PF_NR, DC>(kp + t, qt, D, qpanel, st + t * VW, spanel); break;
    case 3: pf_scores<3, PF_NR, DC>(kp + t, qt, D, qpanel, st + t * VW, spanel); break;
    case 2: pf_scores<2, PF_NR, DC>(kp + t, qt, D, qpanel, st + t * VW, spanel); break;
    case 1: pf_scores<1, PF_NR, DC>(kp + t, qt, D, qpanel, st + t * VW, spanel); break;
    default: break;
  }
}

// O^T += V^T P^T with the rows across the vector lanes, the score pass's shape mirrored:
// ot[i * opanel + (d0 + m) * VW + lane] = ot[..] * corr[i * VW + lane]
//   + sum_{t < nt} v[t * vs + d0 + m] * p[i * spanel + t * VW + lane]
// for MT head-dim elements (each broadcast from V) and NR panels of VW rows (each a vector
// of the probabilities exactly as the softmax left them: no transpose, no store of P in
// another layout; a row's correction is one vector multiply per panel).
template <int MT, int NR>
KVB_INLINE void pf_pv(float* ot, int64_t opanel, const float* corr, const float* p,
                      int64_t spanel, const float* v, int64_t vs, int nt) {
  vf a[MT][NR];
#pragma GCC unroll 4
  for (int i = 0; i < NR; ++i) {
    vf c;
    std::memcpy(&c, corr + i * VW, sizeof(vf));
#pragma GCC unroll 8
    for (int m = 0; m < MT; ++m) {
      std::memcpy(&a[m][i], ot + i * opanel + m * VW, sizeof(vf));
      a[m][i] *= c;
    }
  }
  for (int t = 0; t < nt; ++t) {
    vf pv[NR];
#pragma GCC unroll 4
    for (int i = 0; i < NR; ++i) {
      std::memcpy(&pv[i], p + i * spanel + t * VW, sizeof(vf));
      KVB_IN_REGISTER(pv[i]);
    }
    const float* vt = v + t * vs;
#pragma GCC unroll 8
    for (int m = 0; m < MT; ++m) {
      const vf vb = splat(vt + m);
#pragma GCC unroll 4
      for (int i = 0; i < NR; ++i) a[m][i] += vb * pv[i];
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MT; ++m)
#pragma GCC unroll 4
    for (int i = 0; i < NR; ++i) std::memcpy(ot + i * opanel + m * VW, &a[m][i], sizeof(vf));
}

// dst[0, n) = src[0, n) as fp32 (whole vectors, then the tail).
template <typename T>
KVB_INLINE void to_f32(const T* src, float* dst, int n) {
  int d = 0;
  if constexpr (kFp8<T>) {  // the fast route (float16) unless an e4m3 row holds a NaN byte
    using Fast = kvb_fp8::Fp8Fast<Ld<T>::kMan>;
    const uint8_t* b = reinterpret_cast<const uint8_t*>(src);
    if (!Fast::kScan || !kvb_fp8::any_e4m3_nan(b, 0, 1, n)) {
      for (; d + 2 * VW <= n; d += 2 * VW) {  // 16 bytes per load with AVX2
        vf x, y;
        Fast::pair(b + d, x, y);
        std::memcpy(dst + d, &x, sizeof(vf));
        std::memcpy(dst + d + VW, &y, sizeof(vf));
      }
      for (; d + VW <= n; d += VW) {
        const vf x = Fast::vec(b + d);
        std::memcpy(dst + d, &x, sizeof(vf));
      }
      for (; d < n; ++d) dst[d] = Fast::one(b[d]);
      return;
    }
  }
  for (; d + VW <= n; d += VW) {
    const vf x = Ld<T>::vec(src + d);
    std::memcpy(dst + d, &x, sizeof(vf));
  }
  for (; d < n; ++d) dst[d] = Ld<T>::one(src + d);
}

// Per-thread scratch of one prefill task (reused across its tasks).
struct PrefillScratch {
  std::vector<float> qt, st, o, m, l, corr, kv;
  std::vector<int32_t> lim;
  std::vector<const float*> kp;
};

// Packs (converts to fp32) the K and V rows of keys cb .. cb + nt - 1 of one sequence (its
// block table) and KV head (hoff: the head's offset in a token row of tok elements) into
// contiguous scratch k[t * D] and v[t * D], and points kp[t] at each K row.
template <typename T>
inline void pf_pack_chunk(const T* kc, const T* vc, const int32_t* table, int64_t bs, int64_t tok,
                          int64_t hoff, int D, int64_t cb, int nt, float* k, float* v,
                          const float** kp) {
  for (int t = 0; t < nt; ++t) {
    const int64_t pos = cb + t;
    const int64_t row = int64_t(table[pos / bs]) * bs + pos % bs;
    to_f32<T>(kc + row * tok + hoff, k + size_t(t) * D, D);
    kp[t] = k + size_t(t) * D;
  }
  for (int t = 0; t < nt; ++t) {
    const int64_t pos = cb + t;
    const int64_t row = int64_t(table[pos / bs]) * bs + pos % bs;
    to_f32<T>(vc + row * tok + hoff, v + size_t(t) * D, D);
  }
}

// O^T += V^T P^T for the row panels [r0, r1) (multiples of PF_ROWS) over a chunk of nt keys
// whose V rows lie packed in v (vs floats apart): panel groups outer, PF_MT head-dim elements
// at a time, so a panel group's probabilities stay in L1 while its columns pass.
template <int DC>
inline void pf_pv_rows(PrefillScratch& w, int r0, int r1, int D, const float* v, int64_t vs,
                       int nt) {
  const int Dn = DC > 0 ? DC : D;
  const int64_t spanel = int64_t(PF_CHUNK) * VW, opanel = int64_t(Dn) * VW;
  for (int r = r0; r < r1; r += PF_ROWS) {
    float* ot = w.o.data() + (r / VW) * opanel;
    const float* c = w.corr.data() + r;
    const float* p = w.st.data() + (r / VW) * spanel;
    int d = 0;
    for (; d + PF_MT <= Dn; d += PF_MT)
      pf_pv<PF_MT, PF_NR>(ot + d * VW, opanel, c, p, spanel, v + d, vs, nt);
    switch (Dn - d) {
      case 5: pf_pv<5, PF_NR>(ot + d * VW, opanel, c, p, spanel, v + d, vs, nt); break;
      case 4: pf_pv<4, PF_NR>(ot + d * VW, opanel, c, p, spanel, v + d, vs, nt); break;
      case 3: pf_pv<3, PF_NR>(ot + d * VW, opanel, c, p, spanel, v + d, vs, nt); break;
      case 2: pf_pv<2, PF_NR>(ot + d * VW, opanel, c, p, spanel, v + d, vs, nt); break;
      case 1: pf_pv<1, PF_NR>(ot + d * VW, opanel, c, p, spanel, v + d, vs, nt); break;
      default: break;
    }
  }
}

// The online-softmax step of panel rows [0, VW) at st (keys [0, nt) of the chunk whose first
// key sits at position cb): row lanes whose position limit lim (position + 1) is at most
// cb + t see key t as zero probability, and with a sliding window (> 0) so do those whose
// lim - window exceeds cb + t (the key lies before the row's window), with a chunk of C
// (window = -C) those whose chunk start (lim - 1) - (lim - 1) % C does. Scores become
// probabilities in place; m, l and corr (the factor the row's accumulators take) are updated.
inline void pf_softmax_panel(float* st, int nt, int cb, const int32_t* limp, float* mp,
                             float* lp, float* cp, int window) {
  vf mo, lo;
  vi lim;
  std::memcpy(&mo, mp, sizeof(vf));
  std::memcpy(&lo, lp, sizeof(vf));
  std::memcpy(&lim, limp, sizeof(vi));
  const vf ninf = vf{} + NEG_INF;
  // rows are in position order: lane 0 sees least, lane VW - 1 starts latest
  const bool upper = limp[0] < cb + nt;
  const bool lower = window != 0 && first_key(limp[VW - 1] - 1, window) > cb;
  const bool masked = upper || lower;
  vi first = vi{} + std::numeric_limits<int32_t>::min();
  if (window > 0) {
    first = lim - window;
  } else if (window < 0) {
    const vi last = lim - 1;
    first = last - last % (vi{} - window);
  }
  vf vm = ninf;
  if (masked) {
    for (int t = 0; t < nt; ++t) {
      vf x;
      std::memcpy(&x, st + t * VW, sizeof(vf));
      const vi key = vi{} + (cb + t);
      x = (key < lim) & (key >= first) ? x : ninf;
      vm = x > vm ? x : vm;
    }
  } else {
    for (int t = 0; t < nt; ++t) {
      vf x;
      std::memcpy(&x, st + t * VW, sizeof(vf));
      vm = x > vm ? x : vm;
    }
  }
  const vf mn = mo > vm ? mo : vm;
  // 1 where the max holds (also -inf == -inf: a row that has seen nothing yet)
  const vf corr = mn == mo ? vf{} + 1.f : vexp(mo - mn);
  const vf ms = mn == ninf ? vf{} : mn;
  vf vs = {};
  for (int t = 0; t < nt; ++t) {
    vf x;
    std::memcpy(&x, st + t * VW, sizeof(vf));
    x = vexp(x - ms);
    if (masked) {
      const vi key = vi{} + (cb + t);
      x = (key < lim) & (key >= first) ? x : vf{};
    }
    std::memcpy(st + t * VW, &x, sizeof(vf));
    vs += x;
  }
  const vf ln = lo * corr + vs;
  std::memcpy(mp, &mn, sizeof(vf));
  std::memcpy(lp, &ln, sizeof(vf));
  std::memcpy(cp, &corr, sizeof(vf));
}

// Prefill / extend: task = (sequence b, KV head h, tile of up to `tile` query tokens); the
// tile's G * tokens query rows walk the keys up to the tile's last position in chunks of
// PF_CHUNK keys, each row masked causally at its own position. With a sliding window (> 0)
// row p sees keys p - window + 1 .. p: the walk starts at the tile's first row's first key
// (keys before it are never read, nor their block-table entries), each chunk runs only the
// row panels that see some of it, and the rest of a row's window edge is masked. Each
// chunk's K and V rows are packed just before its two GEMMs (packing the next chunk during
// this one's GEMMs, double-buffered, measured 1.07-1.52x the time: see docs/cpu-kernel.md).
// DC as for decode_task.
// KT: the pools' element type (T, or Fp8Elem for fp8 K/V, whose per-KV-head scales ksc and
// vsc, times the conversion's kMul, then scale the queries and the output).
template <typename T, int DC, typename KT = T>
void prefill_impl(const torch::Tensor& query, const torch::Tensor& k_cache,
                  const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                  const torch::Tensor& cu_seqlens_q, const torch::Tensor& seq_lens, double scale,
                  torch::Tensor& out, int64_t tile, int64_t window,
                  const float* ksc = nullptr, const float* vsc = nullptr) {
  const int64_t B = seq_lens.size(0);
  Geo g{k_cache.size(0), k_cache.size(1), k_cache.size(2), k_cache.size(3), query.size(1), 0};
  g.group = g.hq / g.hkv;
  const int G = int(g.group), D = DC > 0 ? DC : int(g.D);
  // A chunk's K and V rows are packed (converted) into contiguous fp32 scratch, whatever
  // the dtype: in place, its rows lie a token stride apart (4 KiB at 8 KV heads x D 128
  // fp32), so they all map to the same L1 sets, and each pass, which reads every row for a
  // few head-dim elements at a time, would fetch them from L2 again and again.
  const T* q = query.data_ptr<T>();
  const KT* kc = static_cast<const KT*>(k_cache.data_ptr());
  const KT* vc = static_cast<const KT*>(v_cache.data_ptr());
  T* o = out.data_ptr<T>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int64_t tstride = block_tables.stride(0);
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* cu = cu_seqlens_q.data_ptr<int32_t>();
  const int64_t qs_t = query.stride(0), qs_h = query.stride(1);
  const int64_t os_t = out.stride(0), os_h = out.stride(1);
  // Tasks in (sequence, KV head, tile) order: a thread's consecutive tasks read the same
  // K/V rows, which the previous task left in L3.
  struct Task {
    int64_t b, start;
    int h;
  };
  std::vector<Task> tasks;
  for (int64_t b = 0; b < B; ++b)
    for (int h = 0; h < int(g.hkv); ++h)
      for (int64_t s0 = cu[b]; s0 < cu[b + 1]; s0 += tile) tasks.push_back({b, s0, h});
  const int64_t tok = g.hkv * D;
  const float fscale = float(scale);
  const int64_t half = std::numeric_limits<int32_t>::max() / 2;
  const int win = int(std::clamp<int64_t>(window, -half, half));
  at::parallel_for(0, int64_t(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    PrefillScratch w;
    for (int64_t task = begin; task < end; ++task) {
      const int h = tasks[task].h;
      const int64_t b = tasks[task].b, start = tasks[task].start;
      const int64_t nq = std::min<int64_t>(start + tile, cu[b + 1]) - start;
      const int64_t pos0 = lens[b] - (cu[b + 1] - cu[b]) + (start - cu[b]);  // first row's position
      const int nr = int(nq * G);
      const int nrp = (nr + PF_ROWS - 1) / PF_ROWS * PF_ROWS;
      const int64_t qpanel = int64_t(D) * VW, spanel = int64_t(PF_CHUNK) * VW;
      w.qt.assign(size_t(nrp) * D, 0.f);
      w.st.resize(size_t(nrp) * PF_CHUNK);
      w.o.assign(size_t(nrp) * D, 0.f);  // O^T: [panel][d][lane]
      w.m.assign(size_t(nrp), NEG_INF);
      w.l.assign(size_t(nrp), 0.f);
      w.corr.resize(size_t(nrp));
      w.lim.resize(size_t(nrp));
      w.kp.resize(PF_CHUNK);
      w.kv.resize(size_t(2) * PF_CHUNK * D);  // [K chunk][V chunk], fp32
      float* kd = w.kv.data();
      float* vd = kd + size_t(PF_CHUNK) * D;
      float qs = fscale, os = 1.f;  // fp8: the head's K and V scales (times kMul)
      if constexpr (kFp8<KT>) {
        qs *= ksc[h] * Ld<KT>::kMul;
        os = vsc[h] * Ld<KT>::kMul;
      }
      // Q^T panels, scaled; pad rows (zeros) share the last row's position
      for (int r = 0; r < nrp; ++r) {
        const int rr = std::min(r, nr - 1);
        w.lim[r] = int32_t(pos0 + rr / G + 1);
        if (r >= nr) continue;
        const T* qr = q + (start + r / G) * qs_t + (int64_t(h) * G + r % G) * qs_h;
        float* dst = w.qt.data() + (r / VW) * qpanel + r % VW;
        for (int d = 0; d < D; ++d) dst[d * VW] = Ld<T>::one(qr + d) * qs;
      }
      const int64_t keys = pos0 + nq;  // the tile sees keys lo .. keys - 1
      const int64_t lo = first_key(pos0, win);
      for (int64_t cb = lo; cb < keys; cb += PF_CHUNK) {
        const int nt = int(std::min<int64_t>(PF_CHUNK, keys - cb));
        // the rows that see some of this chunk: from the first whose limit passes cb (rows
        // are in position order) to the last whose window starts within it
        int r0 = 0;
        while (r0 < nr && w.lim[r0] <= cb) ++r0;
        r0 = r0 / PF_ROWS * PF_ROWS;
        int r1 = nr;
        if (win != 0)
          while (r1 > r0 && first_key(w.lim[r1 - 1] - 1, win) >= cb + nt) --r1;
        r1 = std::min(nrp, (r1 + PF_ROWS - 1) / PF_ROWS * PF_ROWS);
        pf_pack_chunk<KT>(kc, vc, tables + b * tstride, g.bs, tok, int64_t(h) * D, D, cb, nt, kd,
                          vd, w.kp.data());
        for (int r = r0; r < r1; r += PF_ROWS)
          pf_scores_keys<DC>(w.kp.data(), nt, w.qt.data() + (r / VW) * qpanel, D, qpanel,
                             w.st.data() + (r / VW) * spanel, spanel);
        for (int r = r0; r < r1; r += VW)
          pf_softmax_panel(w.st.data() + (r / VW) * spanel, nt, int(cb), w.lim.data() + r,
                           w.m.data() + r, w.l.data() + r, w.corr.data() + r, win);
        pf_pv_rows<DC>(w, r0, r1, D, vd, D, nt);
      }
      for (int r = 0; r < nr; ++r) {
        const float inv = os / w.l[r];
        T* orow = o + (start + r / G) * os_t + (int64_t(h) * G + r % G) * os_h;
        const float* acc = w.o.data() + size_t(r / VW) * D * VW + r % VW;
        for (int d = 0; d < D; ++d) Ld<T>::store(orow + d, acc[d * VW] * inv);
      }
    }
  });
}

// First (sequence, logical block) a prefill reads whose table entry lies outside
// [0, num_blocks), as b * max_blocks + j; -1 when every one is in the pool. Sequence b's n_b
// new tokens read its blocks up to its length; with a sliding window (> 0) only from the
// block of its first new token's first key, max(0, L - n_b - window + 1), on.
int64_t first_bad_entry_prefill(const torch::Tensor& block_tables, const torch::Tensor& cu_seqlens_q,
                                const torch::Tensor& seq_lens, int64_t block_size,
                                int64_t num_blocks, int64_t window) {
  const int32_t* t = block_tables.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* cu = cu_seqlens_q.data_ptr<int32_t>();
  const int64_t B = block_tables.size(0), W = block_tables.size(1), st = block_tables.stride(0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t used = std::min<int64_t>(W, (int64_t(lens[b]) + block_size - 1) / block_size);
    const int64_t first = first_key(int64_t(lens[b]) - (cu[b + 1] - cu[b]), window) / block_size;
    for (int64_t j = first; j < used; ++j) {
      const int32_t x = t[b * st + j];
      if (x < 0 || x >= num_blocks) return b * W + j;
    }
  }
  return -1;
}

// First (sequence, logical block) whose table entry lies outside [0, num_blocks) within the
// sequence's length, as b * max_blocks + j; -1 when every used entry is in the pool. With a
// sliding window (> 0), blocks wholly before a sequence's window are not read or checked.
int64_t first_bad_entry_windowed(const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                                 int64_t block_size, int64_t num_blocks, int64_t window) {
  const int32_t* t = block_tables.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int64_t B = block_tables.size(0), W = block_tables.size(1), st = block_tables.stride(0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t used = std::min<int64_t>(W, (int64_t(lens[b]) + block_size - 1) / block_size);
    const int64_t first = first_key(int64_t(lens[b]) - 1, window) / block_size;
    for (int64_t j = first; j < used; ++j) {
      const int32_t x = t[b * st + j];
      if (x < 0 || x >= num_blocks) return b * W + j;
    }
  }
  return -1;
}

int64_t first_bad_entry(const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                        int64_t block_size, int64_t num_blocks) {
  return first_bad_entry_windowed(block_tables, seq_lens, block_size, num_blocks, 0);
}

}  // namespace

// Binds scalar_t to the C++ type of a float32 / float16 / bfloat16 tensor and runs BODY.
#define KVB_DISPATCH(DT, ...)                                                 \
  [&] {                                                                       \
    switch (DT) {                                                             \
      case at::kFloat: { using scalar_t = float; __VA_ARGS__ } break;         \
      case at::kHalf: { using scalar_t = c10::Half; __VA_ARGS__ } break;      \
      case at::kBFloat16: { using scalar_t = c10::BFloat16; __VA_ARGS__ } break; \
      default: TORCH_CHECK(false, "unsupported dtype ", DT);                  \
    }                                                                         \
  }()

// Calls f(std::integral_constant<int, DC>) with DC = D for the common head dims 64, 128 and
// 256, else DC = 0 (D read at run time). A compile-time head dim lets the loops over D
// unroll fully: fp32 decode at D = 128 took 0.87-0.92 of the time with L2-resident blocks.
template <typename F>
void with_head_dim(int64_t D, F&& f) {
  switch (D) {
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    case 256: f(std::integral_constant<int, 256>{}); break;
    default: f(std::integral_constant<int, 0>{}); break;
  }
}

// window > 0: sliding-window decode (each sequence's last `window` tokens); < 0: chunked
// local attention of -window tokens (the newest token's chunk); 0: full.
void paged_decode_windowed(torch::Tensor query, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor block_tables, torch::Tensor seq_lens, double scale,
                           torch::Tensor out, int64_t max_seq_len, int64_t partition_blocks,
                           int64_t heads_per_task, int64_t window) {
  TORCH_CHECK(k_cache.size(1) <= MAX_BS, "block_size above ", MAX_BS);
  TORCH_CHECK(partition_blocks >= 1 && heads_per_task >= 1, "bad task split");
  KVB_DISPATCH(query.scalar_type(), {
    with_head_dim(k_cache.size(3), [&](auto dc) {
      decode_impl<scalar_t, decltype(dc)::value>(query, k_cache, v_cache, block_tables, seq_lens,
                                                 scale, out, max_seq_len, partition_blocks,
                                                 heads_per_task, window);
    });
  });
}

void paged_decode(torch::Tensor query, torch::Tensor k_cache, torch::Tensor v_cache,
                  torch::Tensor block_tables, torch::Tensor seq_lens, double scale,
                  torch::Tensor out, int64_t max_seq_len, int64_t partition_blocks,
                  int64_t heads_per_task) {
  paged_decode_windowed(query, k_cache, v_cache, block_tables, seq_lens, scale, out, max_seq_len,
                        partition_blocks, heads_per_task, 0);
}

// window > 0: sliding-window prefill/extend (row p sees keys p - window + 1 .. p); < 0:
// chunked local of C = -window (row p sees its chunk's keys up to p); 0: full.
void paged_prefill_windowed(torch::Tensor query, torch::Tensor k_cache, torch::Tensor v_cache,
                            torch::Tensor block_tables, torch::Tensor cu_seqlens_q,
                            torch::Tensor seq_lens, double scale, torch::Tensor out, int64_t tile,
                            int64_t window) {
  TORCH_CHECK(k_cache.size(1) <= MAX_BS, "block_size above ", MAX_BS);
  TORCH_CHECK(tile >= 1, "tile must be >= 1");
  KVB_DISPATCH(query.scalar_type(), {
    with_head_dim(k_cache.size(3), [&](auto dc) {
      prefill_impl<scalar_t, decltype(dc)::value>(
          query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, out, tile,
          window);
    });
  });
}

// The fp8 prefill (kvbench_fp8::paged_prefill_fp8, registered by paged_attn_fp8.cpp, which
// checks its arguments): this file's prefill over fp8 pools (uint8 views; man 3 e4m3fn, 2
// e5m2) with float32 K and V scales per KV head.
void kvb_paged_prefill_fp8(const torch::Tensor& query, const torch::Tensor& k_cache,
                           const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                           const torch::Tensor& cu_seqlens_q, const torch::Tensor& seq_lens,
                           const torch::Tensor& k_scale, const torch::Tensor& v_scale,
                           double scale, torch::Tensor& out, int64_t man, int64_t tile,
                           int64_t window) {
  TORCH_CHECK(k_cache.size(1) <= MAX_BS, "block_size above ", MAX_BS);
  const float* ks = k_scale.data_ptr<float>();
  const float* vs = v_scale.data_ptr<float>();
  KVB_DISPATCH(query.scalar_type(), {
    with_head_dim(k_cache.size(3), [&](auto dc) {
      constexpr int DC = decltype(dc)::value;
      if (man == 3)
        prefill_impl<scalar_t, DC, Fp8Elem<3>>(query, k_cache, v_cache, block_tables,
                                               cu_seqlens_q, seq_lens, scale, out, tile, window,
                                               ks, vs);
      else
        prefill_impl<scalar_t, DC, Fp8Elem<2>>(query, k_cache, v_cache, block_tables,
                                               cu_seqlens_q, seq_lens, scale, out, tile, window,
                                               ks, vs);
    });
  });
}

void paged_prefill(torch::Tensor query, torch::Tensor k_cache, torch::Tensor v_cache,
                   torch::Tensor block_tables, torch::Tensor cu_seqlens_q, torch::Tensor seq_lens,
                   double scale, torch::Tensor out, int64_t tile) {
  paged_prefill_windowed(query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, out,
                         tile, 0);
}

int64_t vector_width() { return VW; }

// The core's FMA peak as this build reaches it: on every thread of ATen's pool, `iters`
// rounds of 12 independent vector FMA chains (more than the FMA latency times the FMA
// ports, so the chains never wait), built with the kernels' flags. Returns the FLOPs done
// (2 per lane per FMA); the caller times the call. The prefill's arithmetic rate is judged
// against it (`kvbench bench --only kernel.prefill`: fma_peak_fraction).
int64_t fma_probe(int64_t iters) {
  constexpr int CHAINS = 12;
  const int64_t threads = at::get_num_threads();
  const int64_t rounds = iters;  // a local: the loop bound stays in a register
  std::vector<float> sink(size_t(threads), 0.f);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // no barrier on the chains: an asm operand per array element made GCC keep the
      // array on the stack (a load and a store around every FMA, 1/4 of the peak)
      vf a[CHAINS];
      for (int c = 0; c < CHAINS; ++c) a[c] = vf{} + 1e-3f * float(c + 1);
      const vf x = vf{} + 0.999999f, y = vf{} + 1e-7f;
      for (int64_t it = 0; it < rounds; ++it) {
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS; ++c) a[c] = a[c] * x + y;
      }
      vf s = {};
      for (int c = 0; c < CHAINS; ++c) s += a[c];
      sink[size_t(i)] = hsum(s);  // keeps the chains live
    }
  });
  volatile float keep = 0.f;
  for (float v : sink) keep = keep + v;
  (void)keep;
  return threads * iters * CHAINS * VW * 2;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "paged decode attention, blocks read in place");
  m.def("paged_prefill", &paged_prefill, "paged prefill/extend attention, blocks read in place");
  m.def("first_bad_entry", &first_bad_entry, "first block-table entry outside the pool, or -1");
  m.def("paged_decode_windowed", &paged_decode_windowed,
        "paged decode attention over each sequence's last `window` tokens (0: all)");
  m.def("first_bad_entry_windowed", &first_bad_entry_windowed,
        "first_bad_entry skipping the blocks wholly before each sequence's window");
  m.def("paged_prefill_windowed", &paged_prefill_windowed,
        "paged prefill/extend attention, each row over its last `window` keys (0: all)");
  m.def("first_bad_entry_prefill", &first_bad_entry_prefill,
        "first block-table entry a (windowed) prefill reads outside the pool, or -1");
  m.def("vector_width", &vector_width, "floats per vector register the build uses");
  m.def("fma_probe", &fma_probe, "FLOPs of a peak-rate FMA loop on every thread (time it)");
}
