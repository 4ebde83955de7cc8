// kvbench's CPU paged decode over fp8 K/V (float8_e4m3fn or float8_e5m2 pools), reading the
// blocks in place. A separate source from paged_attn.cpp (which holds the 16/32-bit decode
// and the prefill), built into the same library and registered as the torch operator
// `kvbench_fp8::paged_decode_fp8`, so neither file's code changes the other's.
//
// Semantics (workloads/fp8.py): a stored byte b of KV head h means float32(b) * scale[h].
// The kernel folds the scales out of the inner loops: a score is (q . k_bytes) *
// (softmax_scale * k_scale[h]) and the output (sum_t p_t v_bytes_t) / l * v_scale[h], all
// in float32 (the same value as dequantize-then-attend up to float32 rounding order; the
// conformance suite compares both with float64 attention over the dequantized K/V).
// Each block's K and V rows of the task's head are decoded once through a 256-entry table
// (exact, NaN bytes stay NaN) into a float buffer and used by the whole GQA group.
// Only tokens below a sequence's length are read. Tasks: one per (sequence, KV head), over
// ATen's thread pool. Inputs are validated in Python (kernels.ops) before any call.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

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

template <typename T>
inline float to_f(T x) {
  return float(x);
}

template <typename T>
void decode_fp8_impl(const torch::Tensor& query, const torch::Tensor& k_cache,
                     const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                     const torch::Tensor& seq_lens, const torch::Tensor& k_scale,
                     const torch::Tensor& v_scale, double scale, torch::Tensor& out,
                     const std::array<float, 256>& lut) {
  const int64_t B = query.size(0), Hq = query.size(1), D = query.size(2);
  const int64_t bs = k_cache.size(1), Hkv = k_cache.size(2), G = Hq / Hkv;
  const uint8_t* kc = reinterpret_cast<const uint8_t*>(k_cache.data_ptr());
  const uint8_t* vc = reinterpret_cast<const uint8_t*>(v_cache.data_ptr());
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
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(G * D), acc(G * D), kf(bs * D), vf(bs * D), s(G * bs), m(G), l(G);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / Hkv, h = task % Hkv, len = lens[b];
      const float sc = float(scale) * ks[h];
      for (int64_t r = 0; r < G; ++r) {
        const T* qr = q + b * qs_b + (h * G + r) * qs_h;
        for (int64_t d = 0; d < D; ++d) qf[size_t(r * D + d)] = to_f(qr[d]);
        m[size_t(r)] = -std::numeric_limits<float>::infinity();
        l[size_t(r)] = 0.f;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j * bs < len; ++j) {
        const int64_t nt = std::min(bs, len - j * bs);
        const int64_t base = int64_t(tables[b * ts + j]) * blk + h * D;
        for (int64_t t = 0; t < nt; ++t) {  // decode this block's rows of head h once
          const uint8_t* kr = kc + base + t * tok;
          const uint8_t* vr = vc + base + t * tok;
          float* kd = kf.data() + t * D;
          float* vd = vf.data() + t * D;
          for (int64_t d = 0; d < D; ++d) {
            kd[d] = lut[kr[d]];
            vd[d] = lut[vr[d]];
          }
        }
        for (int64_t r = 0; r < G; ++r) {
          const float* qr = qf.data() + r * D;
          float* sr = s.data() + r * bs;
          float mx = m[size_t(r)];
          for (int64_t t = 0; t < nt; ++t) {
            const float* kd = kf.data() + t * D;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; ++d) dot += qr[d] * kd[d];
            sr[t] = dot * sc;
            mx = std::max(mx, sr[t]);
          }
          const float alpha = std::exp(m[size_t(r)] - mx);
          float* ar = acc.data() + r * D;
          float sum = 0.f;
          for (int64_t d = 0; d < D; ++d) ar[d] *= alpha;
          for (int64_t t = 0; t < nt; ++t) {
            const float p = std::exp(sr[t] - mx);
            sum += p;
            const float* vd = vf.data() + t * D;
            for (int64_t d = 0; d < D; ++d) ar[d] += p * vd[d];
          }
          l[size_t(r)] = l[size_t(r)] * alpha + sum;
          m[size_t(r)] = mx;
        }
      }
      for (int64_t r = 0; r < G; ++r) {
        const float f = vs[h] / l[size_t(r)];
        T* orow = o + b * os_b + (h * G + r) * os_h;
        for (int64_t d = 0; d < D; ++d) orow[d] = T(acc[size_t(r * D + d)] * f);
      }
    }
  });
}

void paged_decode_fp8(torch::Tensor query, torch::Tensor k_cache, torch::Tensor v_cache,
                      torch::Tensor block_tables, torch::Tensor seq_lens, torch::Tensor k_scale,
                      torch::Tensor v_scale, double scale, torch::Tensor out, int64_t man,
                      int64_t bias) {
  TORCH_CHECK(man == 2 || man == 3, "fp8 mantissa bits must be 2 or 3, got ", man);
  static const std::array<float, 256> e4m3 = fp8_table(3, 7, false);
  static const std::array<float, 256> e5m2 = fp8_table(2, 15, true);
  TORCH_CHECK(bias == (man == 3 ? 7 : 15), "fp8 exponent bias ", bias, " for ", man, " bits");
  const auto& lut = man == 3 ? e4m3 : e5m2;
  switch (query.scalar_type()) {
    case at::kFloat:
      decode_fp8_impl<float>(query, k_cache, v_cache, block_tables, seq_lens, k_scale, v_scale,
                             scale, out, lut);
      break;
    case at::kHalf:
      decode_fp8_impl<c10::Half>(query, k_cache, v_cache, block_tables, seq_lens, k_scale,
                                 v_scale, scale, out, lut);
      break;
    case at::kBFloat16:
      decode_fp8_impl<c10::BFloat16>(query, k_cache, v_cache, block_tables, seq_lens, k_scale,
                                     v_scale, scale, out, lut);
      break;
    default:
      TORCH_CHECK(false, "unsupported query dtype ", query.scalar_type());
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvbench_fp8, m) {
  m.def(
      "paged_decode_fp8(Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor seq_lens, Tensor k_scale, Tensor v_scale, float scale, Tensor(a!) out, int man, "
      "int bias) -> ()");
  m.impl("paged_decode_fp8", c10::DispatchKey::CPU, TORCH_FN(paged_decode_fp8));
}
