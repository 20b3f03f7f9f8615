#pragma once
// The fixed affine fake-quantize formula with an integer zero point (Note [Zero point modes] in
// ops/cpu/affine_kernel.cpp), as inline functions that compile for the host and for CUDA
// devices, so a device kernel cannot drift from the scalar reference:
//   inv = 1.0f / s                       (float32 reciprocal, also for float64 input)
//   q   = nearbyint(x * inv) + z
//   out = (clamp(q, qmin, qmax) - z) * s  (NaN stays NaN; +-inf saturate)
//   mask = qmin <= q <= qmax              (straight-through gradient: dx = dy * mask)

#include <cmath>

#if defined(__CUDACC__)
#define MQBENCH_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MQBENCH_HOST_DEVICE inline
#endif

namespace mqbench {
namespace ops {
namespace detail {

template <typename T>
struct AffineScalars {
  T s, inv, z, lo, hi;
};

/// Parameters in the compute type T from the float32 scale and zero point.
template <typename T>
MQBENCH_HOST_DEVICE AffineScalars<T> affine_scalars(float s, float z, long long qmin,
                                                    long long qmax) {
  return {static_cast<T>(s), static_cast<T>(1.0f / s), static_cast<T>(z), static_cast<T>(qmin),
          static_cast<T>(qmax)};
}

template <typename T>
MQBENCH_HOST_DEVICE T affine_quant(T x, const AffineScalars<T>& p) {
  return nearbyint(x * p.inv) + p.z;
}

template <typename T>
MQBENCH_HOST_DEVICE T affine_fake_quant(T x, const AffineScalars<T>& p) {
  T q = affine_quant(x, p);
  // fmin/fmax would drop a NaN; comparisons keep it (a NaN q fails both tests).
  q = q < p.lo ? p.lo : q;
  q = q > p.hi ? p.hi : q;
  return (q - p.z) * p.s;
}

template <typename T>
MQBENCH_HOST_DEVICE bool affine_in_range(T x, const AffineScalars<T>& p) {
  const T q = affine_quant(x, p);
  return q >= p.lo && q <= p.hi;
}

}  // namespace detail
}  // namespace ops
}  // namespace mqbench
