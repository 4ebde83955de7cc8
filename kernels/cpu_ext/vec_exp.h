// The vector exponential both CPU kernels (paged_attn.cpp, paged_attn_fp8.cpp) use for their
// online softmax, written once: each file instantiates it with its own vector types.
#pragma once

#include <cstring>

namespace kvb_cpu {

// e^x lane by lane for x <= 0 (scores minus their running max): Cody-Waite range reduction
// and a degree-6 polynomial (relative error ~2e-7); inputs below -87 give ~1e-38 (the
// callers mask what must be exactly zero). VF: a GCC float vector, VI: the int32 vector of
// the same lane count.
template <typename VF, typename VI>
inline __attribute__((always_inline)) VF vexp(VF x) {
  const VF lo = VF{} - 87.0f;
  x = x < lo ? lo : x;
  const VF magic = VF{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const VF t = x * 1.44269504088896341f + magic;
  const VF n = t - magic;
  VF r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  VF p = VF{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  VI ti;
  std::memcpy(&ti, &t, sizeof(ti));
  const VI e = (ti - 0x4B400000 + 127) << 23;
  VF scale;
  std::memcpy(&scale, &e, sizeof(scale));
  return p * scale;
}

}  // namespace kvb_cpu
