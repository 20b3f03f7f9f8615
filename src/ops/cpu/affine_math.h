#pragma once
// Affine quantization arithmetic shared by the affine and PACT kernels: per-run parameters and
// the unclamped quantized value q, in scalar and vector form (Note [Zero point modes] in
// affine_kernel.cpp). Per-capability: include only from MQBENCH_VEC_KERNEL_SOURCES.

#include <algorithm>
#include <cmath>

#include "ops/cpu/loops.h"

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {

template <typename T>
struct AffineParams {
  T s, inv, z, lo, hi;
  Vec<T> vs, vinv, vz, vlo, vhi;
};

template <typename T>
AffineParams<T> make_affine_params(float s, float z, int64_t qmin, int64_t qmax, bool round_z) {
  AffineParams<T> p;
  const float inv = 1.0f / s;
  if (round_z) {
    z = std::min(std::max(std::nearbyint(z), static_cast<float>(qmin)), static_cast<float>(qmax));
  }
  p.s = static_cast<T>(s);
  p.inv = static_cast<T>(inv);
  p.z = static_cast<T>(z);
  p.lo = static_cast<T>(qmin);
  p.hi = static_cast<T>(qmax);
  p.vs = Vec<T>(p.s);
  p.vinv = Vec<T>(p.inv);
  p.vz = Vec<T>(p.z);
  p.vlo = Vec<T>(p.lo);
  p.vhi = Vec<T>(p.hi);
  return p;
}

// NaN-propagating clamp (std::max/min return their first argument when it is NaN).
template <typename T>
inline T clamp_nan(T v, T lo, T hi) {
  return std::min(std::max(v, lo), hi);
}

template <typename T, bool kFloatZp>
struct AffineBase {
  int64_t qmin, qmax;
  bool round_z;
  using Params = AffineParams<T>;

  Params params(float s, float z) const { return make_affine_params<T>(s, z, qmin, qmax, round_z); }

  static T quant(T x, const Params& p) {
    return kFloatZp ? std::nearbyint(x * p.inv + p.z) : std::nearbyint(x * p.inv) + p.z;
  }
  static Vec<T> quant(const Vec<T>& x, const Params& p) {
    return kFloatZp ? (x * p.vinv + p.vz).round() : (x * p.vinv).round() + p.vz;
  }
};

}  // namespace MQBENCH_CPU_CAPABILITY
}  // namespace cpu
}  // namespace mqbench
